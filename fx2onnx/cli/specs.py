"""The command line's small languages: model specs, input specs and dynamic-dim specs.

Parsing only: nothing here imports the user's code or makes tensors, so every argument
is checked before any work starts. A malformed spec raises `UsageError` (exit code 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch


class UsageError(ValueError):
    """A command-line argument is wrong; the message says which and how to write it."""


# -- model: path/to/file.py:Name or package.module:name -----------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """Where the model is: a Python file or an importable module, and an attribute path."""

    source: str  # a file path ending in .py, or a dotted module name
    attribute: str  # e.g. "MyModel" or "build.model"
    is_file: bool


_IDENTIFIER_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_model_spec(text: str) -> ModelSpec:
    """`models/net.py:Net` or `mypkg.models:make_net`."""
    source, colon, attribute = text.rpartition(":")
    if not colon or not source or not attribute:
        raise UsageError(
            f"model '{text}': write it as path/to/file.py:Name or package.module:name "
            "(Name: a class, a factory function, a module instance or a plain function)."
        )
    if not _IDENTIFIER_PATH.match(attribute):
        raise UsageError(f"model '{text}': '{attribute}' is not a Python name (e.g. MyModel or build.model).")
    is_file = source.endswith(".py") or "/" in source or "\\" in source
    if not is_file and not _IDENTIFIER_PATH.match(source):
        raise UsageError(f"model '{text}': '{source}' is neither a .py file nor a dotted module name.")
    return ModelSpec(source, attribute, is_file)


# -- inputs: [name=]2x16[:float32[:low..high]] -----------------------------------------------

_DTYPE_ALIASES = {
    "float": torch.float32, "fp32": torch.float32, "half": torch.float16, "fp16": torch.float16,
    "bf16": torch.bfloat16, "double": torch.float64, "fp64": torch.float64, "long": torch.int64,
    "int": torch.int32, "short": torch.int16, "bool": torch.bool, "cfloat": torch.complex64,
}


def parse_dtype(text: str) -> torch.dtype:
    """A torch dtype by its name (`float32`, `int64`, `bool`) or a usual alias (`fp16`)."""
    name = text.strip().lower().removeprefix("torch.")
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    known = "float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8, bool, complex64"
    raise UsageError(f"unknown dtype '{text}'; known: {known}.")


@dataclass(frozen=True)
class InputSpec:
    """One example input made from a shape and a dtype (values random, ints in a range)."""

    name: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    low: int = 0
    high: int = 2  # integers are drawn from [low, high)

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.name or '(positional)'}={dims}:{str(self.dtype).removeprefix('torch.')}"


_SHAPE = re.compile(r"^\d+(x\d+)*$")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


def parse_input_spec(text: str) -> InputSpec:
    """`x=2x16:float32`, `ids=1x128:int64:0..30522`, `2x3` (float32), `n=scalar:int64`.

    >>> parse_input_spec("ids=1x128:int64:0..1000")
    InputSpec(name='ids', shape=(1, 128), dtype=torch.int64, low=0, high=1000)
    >>> parse_input_spec("2x3").describe()
    '(positional)=2x3:float32'
    """
    usage = "write it as [name=]2x16[:dtype[:low..high]], e.g. ids=1x128:int64:0..1000"
    name, equals, rest = text.partition("=")
    if not equals:
        name, rest = None, text
    elif not _NAME.match(name):
        raise UsageError(f"input '{text}': '{name}' is not a parameter name; {usage}.")
    shape_text, _, tail = rest.partition(":")
    dtype_text, _, range_text = tail.partition(":")
    shape_text = shape_text.strip().lower()
    if shape_text in ("", "scalar", "()"):
        shape: tuple[int, ...] = ()
    elif _SHAPE.match(shape_text):
        shape = tuple(int(d) for d in shape_text.split("x"))
    else:
        raise UsageError(f"input '{text}': '{shape_text}' is not a shape; {usage}.")
    dtype = parse_dtype(dtype_text) if dtype_text else torch.float32
    low, high = 0, 2
    if range_text:
        match = _RANGE.match(range_text.strip())
        if match is None:
            raise UsageError(f"input '{text}': value range '{range_text}' must be low..high; {usage}.")
        low, high = int(match.group(1)), int(match.group(2))
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise UsageError(f"input '{text}': a value range applies to integer dtypes only.")
        if high <= low:
            raise UsageError(f"input '{text}': the range {low}..{high} is empty (high is excluded).")
    return InputSpec(name, shape, dtype, low, high)


def make_example(spec: InputSpec, shape: tuple[int, ...] | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random tensor for `spec` (of `shape` when given: the same input at another size)."""
    size = spec.shape if shape is None else shape
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, size, generator=generator).bool()
    if spec.dtype.is_floating_point or spec.dtype.is_complex:
        return torch.randn(size, generator=generator, dtype=torch.float32).to(spec.dtype)
    return torch.randint(spec.low, spec.high, size, generator=generator, dtype=spec.dtype)


# -- dynamic dims: x=0:batch,1:seq  or  x=0,1 -----------------------------------------------


@dataclass(frozen=True)
class DynamicSpec:
    """Which dims of one input are dynamic, with the name each gets (None: torch decides)."""

    input_name: str
    dims: dict[int, str | None] = field(default_factory=dict)


def parse_dynamic_spec(text: str) -> DynamicSpec:
    """`x=0:batch,1:seq` (named dims) or `x=0` (torch.export names it).

    >>> parse_dynamic_spec("x=0:batch,2")
    DynamicSpec(input_name='x', dims={0: 'batch', 2: None})
    """
    usage = "write it as input=dim[:name],... e.g. x=0:batch,1:seq (or --dynamic alone for every dim)"
    name, equals, rest = text.partition("=")
    if not equals or not _NAME.match(name) or not rest:
        raise UsageError(f"dynamic dims '{text}': {usage}.")
    dims: dict[int, str | None] = {}
    for item in rest.split(","):
        index_text, _, dim_name = item.strip().partition(":")
        if not index_text.isdigit():
            raise UsageError(f"dynamic dims '{text}': '{index_text}' is not a dim index; {usage}.")
        if dim_name and not _NAME.match(dim_name):
            raise UsageError(f"dynamic dims '{text}': '{dim_name}' is not a valid dim name (letters, digits, _).")
        dims[int(index_text)] = dim_name or None
    return DynamicSpec(name, dims)


__all__ = [
    "DynamicSpec", "InputSpec", "ModelSpec", "UsageError", "make_example", "parse_dtype",
    "parse_dynamic_spec", "parse_input_spec", "parse_model_spec",
]
