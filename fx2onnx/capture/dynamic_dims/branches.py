"""Branches the model's code took on its dynamic sizes, which the ONNX model keeps.

Where the model's code compares a dynamic size (torchvision's Swin: "shift the windows
only when the padded feature map is larger than one window"), the capture follows the
branch the example takes and torch.export keeps the condition as a guard on the inputs.
A bound on one dim becomes that dim's range; a condition on an expression of the dims
(`(h // 4 + (7 - h // 4 % 7) % 7) > 7`) is checked nowhere, neither by the exported
program nor by the ONNX model, which then computes something else where it fails. This
finds those conditions after capture, so that the user hears of them at export, with the
line that branched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fx2onnx.capture.dynamic_dims.guards import guards_with_places, is_torch_file, user_input_nodes

# a condition printed in a warning is cut at this length (feature-map arithmetic of deep
# networks nests a dozen levels)
_MAX_CONDITION_TEXT = 240


@dataclass(frozen=True)
class BranchConditions:
    """The conditions on the inputs' dynamic dims that one line of the model's code
    made the capture assume, and fail for some inputs (texts in terms of
    ``input.shape[i]``, each with sizes where it is false)."""

    filename: str
    line: int
    conditions: tuple[str, ...]


def branch_conditions(program: torch.export.ExportedProgram, leaves: Sequence[Any]) -> list[BranchConditions]:
    """Per line of the model's code (not torch's), in order of first appearance, the
    conditions on expressions of the dynamic input dims that the capture assumed and
    that are false at some sizes the dims' ranges allow. ``leaves`` are the example's
    input leaves in the order of the program's user inputs (the sizes it was captured at).
    A condition true at every size tried (`_sizes_to_try`: near the example's, a
    quarter of it, four times it) is left out: most are (a count of anchors is
    positive; an attention mask is as long as the cache and the new tokens)."""
    names, example_sizes = _input_dims(program, leaves)
    found: dict[tuple[str, int], list[str]] = {}
    for guard in guards_with_places(program):
        expr, filename, line = guard.condition, guard.place.file, guard.place.line
        if filename is None or line is None or is_torch_file(filename):
            continue
        symbols = expr.free_symbols
        if not symbols or not symbols <= names.keys() or _range_or_equality(expr):
            continue
        false_at = _false_at(expr, example_sizes, program.range_constraints)
        if false_at is None:
            continue
        text = _renamed(expr, names)
        if len(text) > _MAX_CONDITION_TEXT:
            text = text[: _MAX_CONDITION_TEXT - 3] + "..."
        if false_at:
            text += " (false at " + ", ".join(f"{names[symbol]} = {size}" for symbol, size in false_at.items()) + ")"
        texts = found.setdefault((filename, line), [])
        if text not in texts:
            texts.append(text)
    return [BranchConditions(filename, line, tuple(texts)) for (filename, line), texts in found.items()]


def _renamed(expr: Any, names: dict[Any, str]) -> str:
    return str(expr.xreplace({symbol: sympy.Symbol(names[symbol]) for symbol in expr.free_symbols}))


def _range_or_equality(expr: Any) -> bool:
    """A bound on one dim (its range says it) or two dims equal (they share a name in
    the ONNX model): nothing the user needs to hear of separately."""
    if len(expr.free_symbols) == 1 and not expr.atoms(sympy.Function):
        return True
    return isinstance(expr, sympy.Eq) and all(isinstance(side, sympy.Symbol) for side in expr.args)


def _false_at(expr: Any, example_sizes: dict[Any, int], ranges: Mapping[Any, Any]) -> dict[Any, int] | None:
    """Sizes (of the condition's dims that differ from the example's) where ``expr`` is
    false, the nearest to the example first; {} when it cannot be evaluated; None when
    it holds at every size tried."""
    symbols = sorted(expr.free_symbols, key=str)
    if any(symbol not in example_sizes for symbol in symbols):
        return {}
    for point in _sizes_to_try(symbols, example_sizes, ranges):
        value = expr.xreplace({symbol: sympy.Integer(size) for symbol, size in point.items()})
        if value is sympy.false:
            return {symbol: size for symbol, size in point.items() if size != example_sizes[symbol]}
        if value is not sympy.true:
            return {}
    return None


def _sizes_to_try(symbols: list[Any], example_sizes: dict[Any, int], ranges: Mapping[Any, Any]) -> Iterator[dict[Any, int]]:
    """A single dim moved off the example's size (by one, halved, doubled, ...), or
    several dims scaled together; only sizes in the dims' ranges."""

    def allowed(symbol: Any, size: int) -> bool:
        bounds = ranges.get(symbol)
        if bounds is None:
            return size >= 1
        lower, upper = float(bounds.lower), float(bounds.upper)  # torch's int_oo says it is finite: compare floats
        return size >= max(1.0, lower) and size <= upper

    example = {symbol: example_sizes[symbol] for symbol in symbols}
    if len(symbols) == 1:
        (symbol,) = symbols
        size = example[symbol]
        for moved in (size - 1, size + 1, size // 2, size * 2, size // 4, size * 4, 1):
            if moved != size and allowed(symbol, moved):
                yield {symbol: moved}
        return
    # several dims: inputs relate them (a mask as long as the cache and the new tokens),
    # which moving one alone would break; scaled together, such relations hold
    for numerator, denominator in ((1, 2), (2, 1), (1, 4), (4, 1)):
        scaled = {symbol: size * numerator // denominator for symbol, size in example.items()}
        if all(allowed(symbol, size) for symbol, size in scaled.items()):
            yield scaled


def _input_dims(program: torch.export.ExportedProgram, leaves: Sequence[Any]) -> tuple[dict[Any, str], dict[Any, int]]:
    """torch's symbol of each dynamic input dim -> ``input.shape[i]`` (the first dim it
    stands for), and -> its size in the example."""
    user_inputs = user_input_nodes(program)
    names: dict[Any, str] = {}
    sizes: dict[Any, int] = {}
    for node, leaf in zip(user_inputs, leaves):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for index, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                names.setdefault(size.node.expr, f"{node.name}.shape[{index}]")
                if isinstance(leaf, torch.Tensor) and leaf.dim() == value.dim():
                    sizes.setdefault(size.node.expr, int(leaf.shape[index]))
    return names, sizes
