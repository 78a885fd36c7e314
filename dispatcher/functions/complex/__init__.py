"""Complex tensors as real `[..., 2]` tensors: the operators torchlib lacks for them.

`movement` holds the table, the helpers on (real, imaginary) pairs and the shape and
data-movement operators; `creation` and `arithmetic` register the rest. Importing the
package registers every function, in this order.
"""

# creation before arithmetic: the order the table had in one module
from dispatcher.functions.complex import creation  # noqa: F401 - registers its functions
from dispatcher.functions.complex import arithmetic  # noqa: F401 - registers its functions
from dispatcher.functions.complex.movement import COMPLEX_DOMAIN, COMPLEX_FUNCTIONS, component_dtype

__all__ = ["COMPLEX_DOMAIN", "COMPLEX_FUNCTIONS", "component_dtype"]
