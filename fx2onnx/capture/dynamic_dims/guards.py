"""Reading a captured program's ShapeEnv: the guards the capture took on the inputs'
sizes, and the places in the source where it took them (`SourcePlace`); whether a
size-oblivious capture can be trusted."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SourcePlace:
    """A line of source code where the capture took a guard (None where torch kept none)."""

    file: str | None
    line: int | None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def known(self) -> bool:
        return self.file is not None and self.line is not None


def sound_size_oblivious_capture(program: torch.export.ExportedProgram, size_one_symbols: set[Any]) -> bool:
    """Whether a size-oblivious capture can be trusted. Model code that compared a size-1
    example dim with other sizes leaves a dim bounded above (`VR[1, 2]`) with sizes baked
    into the graph; and torch's size-oblivious simplification can divide other sizes by
    such a dim (`seq // batch`), which holds for the example only. Either makes the
    capture valid for the example alone: the plain mode is used instead."""
    for value_range in program.range_constraints.values():
        if not math.isinf(float(value_range.upper)):
            return False
    if not size_one_symbols:
        return True
    for node in program.graph_module.graph.nodes:
        for expr in _size_expressions(node.meta.get("val")):
            if _divides_by(expr, size_one_symbols):
                return False
    return True


def model_lines_comparing(program: torch.export.ExportedProgram, symbols: set[Any]) -> list[SourcePlace]:
    """The places of the guards the capture took on ``symbols`` outside torch's own code
    (unknown where torch kept no place): where the model's code compared those dims."""
    places = _guard_places(_shape_env(program), symbols)
    return [place for place in places if place.file is None or not is_torch_file(place.file)]


def user_input_nodes(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The program's placeholders of the user's inputs, in their order (not parameters,
    buffers or constants)."""
    names = set(program.graph_signature.user_inputs)
    return [node for node in program.graph_module.graph.nodes if node.op == "placeholder" and node.name in names]


def size_one_symbols(program: torch.export.ExportedProgram, leaves: Sequence[Any]) -> set[Any]:
    """The symbols of the program's input dims whose example size is 0 or 1."""
    symbols: set[Any] = set()
    user_inputs = user_input_nodes(program)
    for node, leaf in zip(user_inputs, leaves):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(leaf, torch.Tensor):
            continue
        for size, example in zip(value.shape, leaf.shape):
            if isinstance(size, torch.SymInt) and example in (0, 1):
                symbols |= size.node.expr.free_symbols
    return symbols


def _size_expressions(value: Any) -> list[Any]:
    sizes = list(value.shape) if isinstance(value, torch.Tensor) else [value]
    return [size.node.expr for size in sizes if isinstance(size, (torch.SymInt, torch.SymFloat))]


def _divides_by(expr: Any, symbols: set[Any]) -> bool:
    import sympy

    for term in sympy.preorder_traversal(expr):
        if type(term).__name__ in ("FloorDiv", "CleanDiv", "CeilDiv", "Mod", "PythonMod") and len(term.args) == 2:
            if term.args[1].free_symbols & symbols:
                return True
    return False


def _shape_env(program: torch.export.ExportedProgram) -> Any:
    for node in program.graph_module.graph.nodes:
        value = node.meta.get("val")
        mode = getattr(value, "fake_mode", None)
        if mode is not None and mode.shape_env is not None:
            return mode.shape_env
    return None


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else str(name)


def is_torch_file(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def fixing_location(program: torch.export.ExportedProgram, path: str, dim: int) -> tuple[SourcePlace | None, bool]:
    """Where the capture fixed `path`'s dim `dim`: the first guard on its symbol, and
    whether that guard comes from the model's code (not torch's own shape rules)."""
    shape_env = _shape_env(program)
    if shape_env is None:
        return None, True
    wanted = f"L['{path.split('[')[0]}']{path[len(path.split('[')[0]):]}.size()[{dim}]"
    symbols = [
        symbol for symbol, sources in shape_env.var_to_sources.items()
        if any(_source_name(source) == wanted for source in sources)
    ]
    pinned = _pinning_place(shape_env, _equal_symbols(shape_env, set(symbols)))
    if pinned is not None:
        return pinned, True
    for place in _guard_places(shape_env, set(symbols)):
        if place.file is not None:
            return place, not is_torch_file(place.file)
    return None, True


def _equal_symbols(shape_env: Any, symbols: set[Any]) -> set[Any]:
    """``symbols`` and every symbol a guard made equal to one of them (an attention mask's
    length to the tokens'), through any chain of such guards."""
    import sympy

    pairs = [
        (guard.condition.lhs, guard.condition.rhs) for guard in _guards(shape_env)
        if isinstance(guard.condition, sympy.Eq) and guard.condition.lhs.is_Symbol and guard.condition.rhs.is_Symbol
    ]
    found, grown = set(symbols), True
    while grown:
        grown = False
        for left, right in pairs:
            if (left in found) != (right in found):
                found |= {left, right}
                grown = True
    return found


def _pinning_place(shape_env: Any, symbols: set[Any]) -> SourcePlace | None:
    """The first place in the model's code (not torch's) where a guard set one of
    ``symbols`` to a number (``Eq(s0, 7)``): where the model fixed that size, even when
    torch's shape rules took earlier guards on it."""
    import sympy

    for guard in _guards(shape_env):
        condition = guard.condition
        if not isinstance(condition, sympy.Eq) or guard.place.file is None or is_torch_file(guard.place.file):
            continue
        sides = (condition.lhs, condition.rhs)
        if any(side.is_Integer for side in sides) and any(side in symbols for side in sides):
            return guard.place
    return None


@dataclass(frozen=True)
class Guard:
    """A condition the capture assumed of the inputs' sizes, and where it did."""

    condition: Any  # a sympy expression
    place: SourcePlace


def guards_with_places(program: torch.export.ExportedProgram) -> list[Guard]:
    """Every guard the capture took on the inputs' sizes, in order."""
    return _guards(_shape_env(program))


def _guards(shape_env: Any) -> list[Guard]:
    if shape_env is None:
        return []
    found = []
    for guard in shape_env.guards:
        frame = guard.sloc.framework_loc
        found.append(Guard(guard.expr, SourcePlace(getattr(frame, "filename", None), getattr(frame, "lineno", None))))
    return found


def _guard_places(shape_env: Any, symbols: set[Any]) -> list[SourcePlace]:
    """The place of each guard the capture took on any of ``symbols``, in order."""
    return [guard.place for guard in _guards(shape_env) if guard.condition.free_symbols & symbols]
