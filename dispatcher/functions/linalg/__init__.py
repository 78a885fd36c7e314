"""Linear algebra ONNX has no operator for, written out step by step as LAPACK computes it.

`steps` holds the table, the size limits and the algorithms (LU, triangular solves,
Cholesky, Householder QR); `factorizations` and `spectral` register the ATen operators
built from them. Importing the package registers every function, in this order.
"""

from dispatcher.functions.linalg import factorizations, spectral  # noqa: F401 - they register their functions
from dispatcher.functions.linalg.steps import LINALG_DOMAIN, LINALG_FUNCTIONS, MAX_EIGH_SIZE, MAX_UNROLLED_SIZE

__all__ = ["LINALG_DOMAIN", "LINALG_FUNCTIONS", "MAX_EIGH_SIZE", "MAX_UNROLLED_SIZE"]
