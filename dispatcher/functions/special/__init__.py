"""Special functions ONNX has no operator for: gamma and its relatives (`gamma`), Bessel
functions (`bessel`) and the error function family (`error_function`).

`gamma` holds the table and the series helpers the others use. Importing the package
registers every function, in this order.
"""

from dispatcher.functions.special import bessel, error_function  # noqa: F401 - they register their functions
from dispatcher.functions.special.gamma import SPECIAL_DOMAIN, SPECIAL_FUNCTIONS

__all__ = ["SPECIAL_DOMAIN", "SPECIAL_FUNCTIONS"]
