"""The switches a capture runs under: size-oblivious reasoning for dims of example size
0 or 1, torch's symbolic replacements of `math` functions, and sizes equal in the example
kept apart. All are private to torch and reached here only."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def keep_size_one_dims_dynamic(enabled: bool = True) -> Iterator[None]:
    """Capture with size-oblivious reasoning on backed sizes: torch.export then keeps a
    dynamic dim whose example size is 0 or 1 symbolic instead of specializing it (its
    default "0/1 specialization"). The switch is private to torch: reached here only."""
    if not enabled:
        yield
        return
    import torch.fx.experimental._config as shape_config

    with shape_config.patch(backed_size_oblivious=True), _python_bool_arguments():
        yield


@contextlib.contextmanager
def sizes_kept_apart() -> Iterator[None]:
    """Capture with torch's duck shaping off: dims of equal example size get symbols of their
    own instead of one shared symbol (a model's states of different lengths that happen to
    be equal in the example). The switch is private to torch: reached here only."""
    import torch.fx.experimental._config as shape_config

    with shape_config.patch(use_duck_shape=False):
        yield


# math functions whose symbolic replacement (torch._sym_<name>) torch.export's graph
# verifier accepts; the others (cos, log2, ...) still fix the dim to its example value
_SYMBOLIC_MATH = ("sqrt",)


@contextlib.contextmanager
def symbolic_math() -> Iterator[None]:
    """`math.sqrt(x.size(1))` in non-strict capture would turn the size into a Python
    float and fix the dim to its example value; torch's drop-in replacements keep it
    symbolic (and call math's own function on plain numbers). Strict capture does the
    same substitution; this does it for the duration of a non-strict capture."""
    originals = {name: getattr(math, name) for name in _SYMBOLIC_MATH}
    try:
        for name, original in originals.items():
            setattr(math, name, _symbolic_or_plain(getattr(torch, f"_sym_{name}"), original))
        yield
    finally:
        for name, function in originals.items():
            setattr(math, name, function)


def _symbolic_or_plain(symbolic: Any, plain: Any) -> Any:
    def function(value: Any) -> Any:
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            return symbolic(value)
        return plain(value)

    function.__name__ = function.__qualname__ = plain.__name__
    return function


@contextlib.contextmanager
def _python_bool_arguments() -> Iterator[None]:
    """Size comparisons stay SymBools under size-oblivious reasoning where they used to be
    decided (transformers: `is_causal = q_len > 1 and mask is None`), and
    scaled_dot_product_attention takes only a Python bool: decide it on the way in, which
    records the guard as evaluating it in the model would have."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def attention(*args: Any, **kwargs: Any) -> Any:
        kwargs = {key: bool(value) if isinstance(value, torch.SymBool) else value for key, value in kwargs.items()}
        return original(*args, **kwargs)

    functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original
