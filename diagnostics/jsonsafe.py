"""Turn arbitrary property values into JSON-safe ones."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps(..., allow_nan=False)`` accepts.

    Containers are converted recursively; non-finite floats and every other object
    (tensors, dtypes, shapes, ...) become their ``str()``, so a report never fails to write.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(item) for item in value), key=repr)
    return str(value)
