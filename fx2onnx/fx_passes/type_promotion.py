"""Explicit type promotion: insert casts so every ONNX op computes in PyTorch's dtypes.

PyTorch promotes mixed inputs implicitly (int tensor + 2.5 is float, bool.cumsum() is
int64, int / int is float) while ONNX operators need inputs of one allowed type. This
pass reads PyTorch's own promotion rules:

- elementwise ops: the `ELEMENTWISE_TYPE_PROMOTION_KIND` and the promoting arguments
  that `torch._refs` attaches to each reference implementation, fed to
  `torch._prims_common.elementwise_dtypes`;
- reductions (`sum`, `prod`, `cumsum`, ...): the output dtype PyTorch computed
  (`node.meta["val"]`), which is int64 for bool/int inputs.

Casts are `aten._to_copy(dtype=...)` nodes with their own FakeTensor `meta["val"]`.
Each inserted cast is one `FX_NODE_INSERT_TYPE_PROMOTION` diagnostic (level NONE, kept
at DEBUG verbosity) at the user's source line.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch._prims_common as prims_common
import torch._prims_common.wrappers as prims_wrappers
import torch._refs
import torch._refs.nn.functional
import torch._refs.special
import torch.fx
from torch._guards import detect_fake_mode

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.fx_passes.node_meta import SOURCE_META

_KIND = prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND
# aten._to_copy rather than prims.convert_element_type: its ONNX function accepts every
# dtype (bool and uint8 included).
_CAST = torch.ops.aten._to_copy.default
_SCALAR_TENSOR = torch.ops.aten.scalar_tensor.default
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

# Reductions whose output dtype PyTorch widens (bool/int -> int64) or sets with `dtype=`;
# ONNX computes in the input type, so the input is cast to the output dtype first.
_WIDENING_REDUCTIONS = frozenset({"sum", "nansum", "prod", "cumsum", "cumprod"})


class _Rule:
    """Promotion rule of one elementwise op: promoting argument positions and kind."""

    def __init__(self, positions: tuple[int, ...], kind: _KIND) -> None:
        self.positions = positions
        self.kind = kind


def _find_promotion_wrapper(fn: Callable, depth: int = 0, seen: set[int] | None = None) -> Any:
    # torch._refs functions are wrapped (out_wrapper, elementwise_type_promotion_wrapper,
    # factory closures); the promotion wrapper object sits in one of the closures.
    seen = set() if seen is None else seen
    if depth > 6 or id(fn) in seen:
        return None
    seen.add(id(fn))
    nested = [fn.__wrapped__] if hasattr(fn, "__wrapped__") else []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        if isinstance(content, prims_wrappers.elementwise_type_promotion_wrapper):
            return content
        if inspect.isfunction(content):
            nested.append(content)
    for inner in nested:
        found = _find_promotion_wrapper(inner, depth + 1, seen)
        if found is not None:
            return found
    return None


# Ops whose reference has no promotion wrapper of its own (it dispatches to others).
_EXTRA_RULES: dict[str, tuple[tuple[int, ...], _KIND]] = {
    "rsub": ((0, 1), _KIND.DEFAULT),
    "clamp_min": ((0, 1), _KIND.DEFAULT),
    "clamp_max": ((0, 1), _KIND.DEFAULT),
}


@functools.cache
def _rule_for(packet_name: str) -> _Rule | None:
    if packet_name in _EXTRA_RULES:
        positions, kind = _EXTRA_RULES[packet_name]
        return _Rule(positions, kind)
    # aten::logit's reference lives in torch._refs.special, aten::gelu's in nn.functional.
    reference = next(
        (
            getattr(namespace, packet_name)
            for namespace in (torch._refs, torch._refs.special, torch._refs.nn.functional)
            if callable(getattr(namespace, packet_name, None))
        ),
        None,
    )
    if not callable(reference):
        return None
    wrapper = _find_promotion_wrapper(reference)
    if wrapper is None or not wrapper.type_promoting_arg_names:
        return None
    try:
        parameters = list(inspect.signature(reference).parameters)
    except (TypeError, ValueError):
        return None
    positions = tuple(parameters.index(name) for name in wrapper.type_promoting_arg_names if name in parameters)
    return _Rule(positions, wrapper.type_promotion_kind)


def _div_rule(node: torch.fx.Node) -> _Rule:
    # div with a rounding mode keeps integers integral; true division makes them float.
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    return _Rule((0, 1), _KIND.INT_TO_FLOAT if mode is None else _KIND.DEFAULT)


# ATen aliases torch._refs has no reference of their own for: promoted as the operator
# they name (torchlib implements some of them directly, so they reach ONNX as they are).
_ALIASES = {
    "divide": "div",
    "multiply": "mul",
    "subtract": "sub",
    "greater": "gt",
    "greater_equal": "ge",
    "less": "lt",
    "less_equal": "le",
    "not_equal": "ne",
    "arctan2": "atan2",
    "clip": "clamp",
    "special_xlogy": "xlogy",
}


def _rule_for_node(node: torch.fx.Node) -> _Rule | None:
    packet = node.target.overloadpacket.__name__
    in_place = packet.endswith("_") and not packet.endswith("__")
    name = packet[:-1] if in_place else packet
    packet = _ALIASES.get(name, name) + ("_" if in_place else "")
    if packet in ("div", "div_"):
        return _div_rule(node)
    return _rule_for(packet)


def _argument(node: torch.fx.Node, position: int) -> tuple[Any, str | int | None]:
    """The node's argument at schema position ``position`` and where it is stored."""
    if position < len(node.args):
        return node.args[position], position
    arguments = node.target._schema.arguments
    if position < len(arguments) and arguments[position].name in node.kwargs:
        name = arguments[position].name
        return node.kwargs[name], name
    return None, None


def _example(value: Any) -> Any:
    """What `elementwise_dtypes` should see for an FX argument."""
    if isinstance(value, torch.fx.Node):
        meta = value.meta.get("val")
        if isinstance(meta, torch.SymBool):
            return True
        if isinstance(meta, torch.SymInt):
            return 1
        if isinstance(meta, torch.SymFloat):
            return 1.0
        return meta
    return value


class _Inserter:
    def __init__(self, graph_module: torch.fx.GraphModule, context: DiagnosticContext | None) -> None:
        self.graph = graph_module.graph
        self.context = context
        self.fake_mode = detect_fake_mode(
            [n.meta.get("val") for n in self.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
        )
        self.inserted = 0

    def _fake(self, compute: Callable[[], Any]) -> Any:
        if self.fake_mode is None:
            return compute()
        with self.fake_mode:
            return compute()

    def cast(self, node: torch.fx.Node, value: torch.fx.Node, dtype: torch.dtype, why: str) -> torch.fx.Node:
        """A cast of ``value`` to ``dtype`` inserted just before ``node``."""
        meta = value.meta.get("val")
        with self.graph.inserting_before(node):
            if isinstance(meta, _SYM_TYPES):
                cast = self.graph.call_function(_SCALAR_TENSOR, (value,), {"dtype": dtype})
                cast.meta["val"] = self._fake(lambda: torch.empty((), dtype=dtype))
            else:
                cast = self.graph.call_function(_CAST, (value,), {"dtype": dtype})
                cast.meta["val"] = self._fake(lambda: _CAST(meta, dtype=dtype))
        self._copy_source_meta(node, cast)
        self._report(node, f"Input '{value.name}' of '{node.name}' ({node.target}) is cast to {dtype}: {why}")
        return cast

    def cast_output(self, node: torch.fx.Node, dtype: torch.dtype, why: str) -> torch.fx.Node:
        """Cast ``node``'s result to ``dtype`` for all its users."""
        meta = node.meta.get("val")
        with self.graph.inserting_after(node):
            cast = self.graph.call_function(_CAST, (node,), {"dtype": dtype})
        node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
        cast.meta["val"] = self._fake(lambda: _CAST(meta, dtype=dtype))
        self._copy_source_meta(node, cast)
        self._report(node, f"Output of '{node.name}' ({node.target}) is cast to {dtype}: {why}")
        return cast

    @staticmethod
    def _copy_source_meta(source: torch.fx.Node, cast: torch.fx.Node) -> None:
        # the cast belongs to the same user line and module as the node it serves
        for key in SOURCE_META:
            if key in source.meta:
                cast.meta[key] = source.meta[key]

    def note_gave_up(self, node: torch.fx.Node, why: str) -> None:
        """No cast is inserted for ``node``: say why (a warning; ONNX may then reject
        the mixed input types, which the translation reports at this line)."""
        if self.context is None:
            return
        self.context.record(
            rules.FX_NODE_INSERT_TYPE_PROMOTION,
            Level.WARNING,
            message=f"No type promotion for '{node.name}' ({node.target}): {why}",
            location=node_location(node),
            stack=node_stack(node),
        )

    def _report(self, node: torch.fx.Node, message: str) -> None:
        self.inserted += 1
        if self.context is None:
            return
        self.context.record(
            rules.FX_NODE_INSERT_TYPE_PROMOTION,
            Level.NONE,
            message=message,
            location=node_location(node),
            stack=node_stack(node),
            properties={"fx_node": node.name, "operator": str(node.target)},
        )


def _replace_argument(node: torch.fx.Node, where: str | int, new: torch.fx.Node) -> None:
    if isinstance(where, int):
        args = list(node.args)
        args[where] = new
        node.args = tuple(args)
    else:
        kwargs = dict(node.kwargs)
        kwargs[where] = new
        node.kwargs = kwargs


def _input_dtype(rule: _Rule, examples: list[Any]) -> torch.dtype | None:
    """The dtype the op's tensor inputs must have so that ONNX computes like PyTorch."""
    kind = rule.kind
    if kind in (_KIND.ALWAYS_BOOL, _KIND.COMPLEX_TO_FLOAT):
        # inputs meet in their common type; the op itself yields bool / real
        kind = _KIND.DEFAULT
    _, result_dtype = prims_common.elementwise_dtypes(*examples, type_promotion_kind=kind)
    # PyTorch's "op math" (float16 computed in float32) is not reproduced: ONNX computes
    # in the result type, as PyTorch's own kernels for these types do on CPU.
    return result_dtype


def _promote_elementwise(inserter: _Inserter, node: torch.fx.Node, rule: _Rule) -> None:
    found = [(pos,) + _argument(node, pos) for pos in rule.positions]
    found = [(pos, value, where) for pos, value, where in found if where is not None and value is not None]
    examples = [_example(value) for _, value, _ in found]
    if not any(isinstance(e, torch.Tensor) for e in examples):
        return
    if any(e is None or not isinstance(e, (torch.Tensor, bool, int, float, complex)) for e in examples):
        return
    try:
        dtype = _input_dtype(rule, examples)
    except (RuntimeError, ValueError, TypeError) as error:
        inserter.note_gave_up(node, f"PyTorch's promotion of {_describe(examples)} failed: {type(error).__name__}: {error}")
        return
    if dtype is None:
        return
    for (_, value, where), example in zip(found, examples):
        if not isinstance(value, torch.fx.Node):
            continue
        meta = value.meta.get("val")
        if isinstance(meta, torch.Tensor) and meta.dtype != dtype:
            why = f"PyTorch computes {node.target} of {_describe(examples)} in {dtype} ({rule.kind.name} promotion)."
            _replace_argument(node, where, inserter.cast(node, value, dtype, why))
        elif isinstance(meta, _SYM_TYPES) and not _natural_match(meta, dtype):
            why = f"a symbolic {type(meta).__name__} meets {dtype} tensors in {node.target}."
            _replace_argument(node, where, inserter.cast(node, value, dtype, why))


def _natural_match(meta: Any, dtype: torch.dtype) -> bool:
    # the interpreter turns SymInt into int64 and SymBool into bool 0-d tensors
    return (isinstance(meta, torch.SymInt) and dtype == torch.int64) or (
        isinstance(meta, torch.SymBool) and dtype == torch.bool
    )


def _describe(examples: list[Any]) -> str:
    parts = []
    for example in examples:
        if isinstance(example, torch.Tensor):
            parts.append(f"{example.dtype} tensor")
        else:
            parts.append(f"Python {type(example).__name__}")
    return ", ".join(parts)


def _promote_reduction(inserter: _Inserter, node: torch.fx.Node) -> None:
    value, where = _argument(node, 0)
    out = node.meta.get("val")
    if not isinstance(value, torch.fx.Node) or not isinstance(out, torch.Tensor):
        return
    meta = value.meta.get("val")
    if isinstance(meta, torch.Tensor) and meta.dtype != out.dtype and not out.dtype.is_complex:
        why = f"PyTorch accumulates {node.target} of a {meta.dtype} tensor in {out.dtype}."
        _replace_argument(node, where, inserter.cast(node, value, out.dtype, why))


_CONCATENATIONS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})


def _promote_concatenation(inserter: _Inserter, node: torch.fx.Node) -> None:
    """``torch.cat`` of tensors of several dtypes gives their promoted dtype (float zeros
    beside int64 lengths: float); ONNX's Concat takes one type, so each other tensor is
    cast to the result's dtype."""
    tensors, where = _argument(node, 0)
    out = node.meta.get("val")
    if not isinstance(tensors, (list, tuple)) or not isinstance(out, torch.Tensor):
        return
    why = f"PyTorch concatenates tensors of several dtypes in {out.dtype}."
    cast = [inserter.cast(node, t, out.dtype, why)
            if isinstance(t, torch.fx.Node) and isinstance(t.meta.get("val"), torch.Tensor) and t.meta["val"].dtype != out.dtype
            else t for t in tensors]
    if any(a is not b for a, b in zip(cast, tensors)):
        _replace_argument(node, where, cast)


# (op, dtype) pairs that PyTorch computes but ONNX (or ONNX Runtime's CPU kernels) has no
# type for: computed in a wider type, the result cast back. Wrapping integer arithmetic
# agrees modulo 2**8, so uint8/int8 results are the same.
_WIDER_COMPUTE: dict[str, dict[torch.dtype, torch.dtype]] = {
    "pow": {torch.uint8: torch.int32, torch.int8: torch.int32, torch.int16: torch.int32},
    "where": {torch.bool: torch.uint8},
}


def _compute_wider(inserter: _Inserter, node: torch.fx.Node, rule: _Rule) -> None:
    out = node.meta.get("val")
    widen = _WIDER_COMPUTE.get(node.target.overloadpacket.__name__, {})
    if not isinstance(out, torch.Tensor) or out.dtype not in widen:
        return
    wide = widen[out.dtype]
    why = f"ONNX has no {node.target} for {out.dtype}; it is computed in {wide}."
    for position in rule.positions:
        value, where = _argument(node, position)
        if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor):
            _replace_argument(node, where, inserter.cast(node, value, wide, why))
    node.meta["val"] = inserter._fake(lambda: _CAST(out, dtype=wide))
    inserter.cast_output(node, out.dtype, f"PyTorch's result is {out.dtype}.")


@functools.cache
def _tensor_overload(target: torch._ops.OpOverload, positions: tuple[int, ...]) -> torch._ops.OpOverload | None:
    """The overload of ``target``'s operator that takes tensors where ``target`` takes
    Scalars at ``positions``, all else alike (``remainder.Scalar`` -> ``remainder.Tensor``)."""
    arguments, returns = target._schema.arguments, [str(r.type) for r in target._schema.returns]
    for name in target.overloadpacket.overloads():
        candidate = getattr(target.overloadpacket, name)
        other = candidate._schema.arguments
        if len(other) != len(arguments) or [str(r.type) for r in candidate._schema.returns] != returns:
            continue
        wanted = ["Tensor" if i in positions else str(a.type) for i, a in enumerate(arguments)]
        if [str(o.type) for o in other] == wanted and [o.name for o in other] == [a.name for a in arguments]:
            return candidate
    return None


def _symbolic_scalars_as_tensors(inserter: _Inserter, node: torch.fx.Node) -> None:
    """A size computed at run time given to a Scalar argument (``x % w`` with ``w`` a
    SymInt): ONNX functions of Scalar overloads may take the scalar as an attribute,
    which must be known at export. The node moves to the operator's Tensor overload,
    with the size as a 0-d tensor of the dtype PyTorch gives a Python number of its kind
    (int64, the default float dtype, bool), so the result's dtype is unchanged."""
    arguments = node.target._schema.arguments
    positions = [i for i, a in enumerate(arguments[: len(node.args)])
                 if isinstance(a.type, torch.NumberType) and isinstance(node.args[i], torch.fx.Node)
                 and isinstance(node.args[i].meta.get("val"), _SYM_TYPES)]
    overload = _tensor_overload(node.target, tuple(positions)) if positions else None
    if overload is None:
        return
    for i in positions:
        value = node.args[i]
        kind = type(value.meta["val"])
        dtype = torch.int64 if kind is torch.SymInt else torch.bool if kind is torch.SymBool else torch.get_default_dtype()
        _replace_argument(node, i, inserter.cast(node, value, dtype, f"a size known at run time, given to {node.target}'s Scalar argument, is a tensor of {overload}"))
    node.target = overload


def insert_type_promotion(graph_module: torch.fx.GraphModule, context: DiagnosticContext | None = None) -> int:
    """Insert explicit casts before ops whose inputs PyTorch promotes implicitly.

    Returns the number of casts inserted. ``node.meta["val"]`` of every inserted node is
    set; the graph's outputs keep PyTorch's dtypes.
    """
    inserter = _Inserter(graph_module, context)
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        _symbolic_scalars_as_tensors(inserter, node)
        packet = node.target.overloadpacket.__name__
        if packet in _WIDENING_REDUCTIONS:
            _promote_reduction(inserter, node)
            continue
        if packet in _CONCATENATIONS:
            _promote_concatenation(inserter, node)
            continue
        rule = _rule_for_node(node)
        if rule is not None:
            _promote_elementwise(inserter, node, rule)
            _compute_wider(inserter, node, rule)
    if inserter.inserted:
        graph_module.recompile()
    return inserter.inserted
