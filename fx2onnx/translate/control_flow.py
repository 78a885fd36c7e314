"""Control flow: torch's higher-order operators as ONNX If, Loop and Scan.

torch.export keeps data-dependent control flow as higher-order operators whose branches
and bodies are GraphModules (reached through `get_attr` nodes); their operands are passed
explicitly. Each body is translated by `FxOnnxInterpreter.translate` into a subgraph
builder of the current graph, so it gets its own diagnostics, reports problems at the
user's lines and shares the model's pool of names:

- ``cond(pred, true_fn, false_fn, operands)`` -> ``If``: the branches' placeholders are
  bound to the operand values, which the branches read by name from the enclosing graph;
  a predicate known at export time translates the chosen branch in place.
- ``while_loop(cond_fn, body_fn, carried, additional)`` -> ``Loop`` without a trip
  count: ``cond_fn`` runs before the loop (the first condition) and at the end of the
  body on the new carried values; the additional inputs are read by name.
- ``scan(combine_fn, init, xs, additional)`` -> ``Scan`` over axis 0 (torch.export has
  already moved ``dim`` to the front and flipped ``xs`` and the stacked outputs for
  ``reverse``): carries are Scan's state variables, ``xs`` its scan inputs, the
  per-step outputs its scan outputs.
- ``map_impl(body_fn, xs, additional)`` (``torch._higher_order_ops.map``) -> ``Scan``
  without state.

Mutation inside a body reaches ONNX in torch.export's functional form: a body returns
the new value of what it changed, the If/Loop/Scan gives it out, and the graph copies it
into the buffer or input, which the exporter turns into a `.mutated` output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import onnx_ir as ir
import torch
import torch.fx

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import argument_value, node_location, node_value, placeholder_nodes
from fx2onnx.translate.fake_metadata import OnnxTypeInfo, SymbolNamer, apply_type, onnx_type_of
from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.translated_body import FAILED, BodyInput, TranslatedBody
from fx2onnx.translate.values import TracedValue



class FxOnnxInterpreter(Protocol):
    """What control flow uses of `fx2onnx.translate.interpreter.FxOnnxInterpreter` (which
    calls this module): named by its shape, so that the two modules import in one direction."""

    builder: GraphBuilder | None
    context: DiagnosticContext
    namer: SymbolNamer

    def onnx_arg(self, arg: Any) -> Any: ...

    def translate(
        self, graph_module: torch.fx.GraphModule, builder: GraphBuilder, *, inputs: Any = None, skip: Any = ()
    ) -> TranslatedBody: ...


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why ``node`` (a higher-order operator call) cannot be translated, or None."""
    name = _name(node.target)
    if name in _TRANSLATORS:
        return None
    return (
        f"the higher-order operator {name} has no ONNX translation (fx2onnx translates "
        f"{', '.join(sorted(_TRANSLATORS))})"
    )


def translate_higher_order(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    """The values ``node`` produces, from an If, Loop or Scan node in the current graph."""
    translator = _TRANSLATORS.get(_name(node.target))
    if translator is None:
        raise NotImplementedError(unsupported_reason(node))
    return translator(interpreter, node)


# -- cond -> If -----------------------------------------------------------------------------------
def _translate_cond(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    pred_arg, true_arg, false_arg, operand_args = node.args[:4]
    predicate = interpreter.onnx_arg(pred_arg)
    operands = list(interpreter.onnx_arg(list(operand_args)))
    branches = (_graph_module_of(interpreter, true_arg), _graph_module_of(interpreter, false_arg))
    metas = _output_metas(node)
    builder = interpreter.builder
    if isinstance(predicate, (bool, int)) and not isinstance(predicate, ir.Value):
        # Known at export time (a specialized size): the chosen branch, in place.
        chosen = branches[0] if predicate else branches[1]
        body = _translate_body(interpreter, node, chosen, builder, _bind(chosen, operands), "taken branch")
        if body.failed:
            return FAILED
        return tuple(body.outputs)

    bodies = []
    for label, branch in zip(("then", "else"), branches):
        sub = builder.subgraph(f"{node.name}_{label}")
        body = _translate_body(interpreter, node, branch, sub, _bind(branch, operands), f"{label} branch")
        if body.failed:
            return FAILED
        bodies.append(_finish_subgraph(sub, body.outputs, body.output_metas, interpreter))
    then_outputs, else_outputs = bodies
    if not then_outputs or len(then_outputs) != len(else_outputs):
        raise NotImplementedError(f"the branches of torch.cond '{node.name}' return no tensors or different numbers of them")
    outputs = builder.add_node(
        "",
        "If",
        [_as_bool_scalar(builder, predicate)],
        [ir.AttrGraph("then_branch", then_outputs[0].graph), ir.AttrGraph("else_branch", else_outputs[0].graph)],
        num_outputs=len(then_outputs),
    )
    for index, (value, then_value, else_value) in enumerate(zip(outputs, then_outputs, else_outputs)):
        meta = metas[index] if index < len(metas) else None
        _type_merged(value, (then_value, else_value), meta, interpreter)
        value.name = builder.unique_name(f"{node.name}_{index}")
    return tuple(outputs)


# -- while_loop -> Loop -------------------------------------------------------------------------
def _translate_while_loop(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    cond_arg, body_arg, carried_args = node.args[:3]
    additional_args = node.args[3] if len(node.args) > 3 else ()
    cond_fn, body_fn = _graph_module_of(interpreter, cond_arg), _graph_module_of(interpreter, body_arg)
    builder = interpreter.builder
    carried_metas = [argument_value(arg) for arg in carried_args]
    carried = [
        _as_value(builder, value, meta, interpreter)
        for value, meta in zip(interpreter.onnx_arg(list(carried_args)), carried_metas)
    ]
    additional = list(interpreter.onnx_arg(list(additional_args)))

    # The condition before the first iteration, in the enclosing graph.
    first = _translate_body(interpreter, node, cond_fn, builder, _bind(cond_fn, [*carried, *additional]), "condition")
    if first.failed:
        return FAILED
    first_condition = _as_bool_scalar(builder, _as_value(builder, first.outputs[0], first.output_metas[0], interpreter))

    sub = builder.subgraph(f"{node.name}_body")
    # Loop's own first two body inputs; torch's body sees neither.
    sub.add_input(f"{node.name}_iteration", ir.DataType.INT64, ir.Shape([]))
    sub.add_input(f"{node.name}_condition", ir.DataType.BOOL, ir.Shape([]))
    placeholders = placeholder_nodes(body_fn)
    bindings: dict[str, Any] = {}
    for index, placeholder in enumerate(placeholders):
        if index < len(carried):
            bindings[placeholder.name] = BodyInput(f"{node.name}_{placeholder.name}", _type_of(carried[index], placeholder, interpreter))
        else:
            bindings[placeholder.name] = additional[index - len(carried)]
    body = _translate_body(interpreter, node, body_fn, sub, bindings, "body")
    if body.failed:
        return FAILED
    new_carried = [
        _as_value(sub, value, meta, interpreter) for value, meta in zip(body.outputs, body.output_metas)
    ]
    # The condition for the next iteration, at the end of the body.
    again = _translate_body(interpreter, node, cond_fn, sub, _bind(cond_fn, [*new_carried, *additional]), "condition")
    if again.failed:
        return FAILED
    condition_out = _as_bool_scalar(sub, _as_value(sub, again.outputs[0], again.output_metas[0], interpreter))
    sub_outputs = sub.set_outputs([condition_out, *new_carried])
    for value, carried_input in zip(sub_outputs[1:], sub.graph.inputs[2:]):
        _relax_to(value, carried_input)

    outputs = builder.add_node(
        "", "Loop", [None, first_condition, *carried], [ir.AttrGraph("body", sub.graph)], num_outputs=len(carried)
    )
    metas = _output_metas(node)
    for index, value in enumerate(outputs):
        meta = metas[index] if index < len(metas) else None
        _type_merged(value, (sub.graph.inputs[2 + index], sub_outputs[1 + index]), meta, interpreter)
        value.name = builder.unique_name(f"{node.name}_{index}")
    return tuple(outputs)


# -- scan and map -> Scan -------------------------------------------------------------------------
def _translate_scan(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    combine_arg, init_args, xs_args = node.args[:3]
    additional_args = node.args[3] if len(node.args) > 3 else ()
    return _scan(interpreter, node, combine_arg, list(init_args), list(xs_args), list(additional_args))


def _translate_map(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    body_arg, xs_args = node.args[:2]
    additional_args = node.args[2] if len(node.args) > 2 else ()
    return _scan(interpreter, node, body_arg, [], list(xs_args), list(additional_args))


def _scan(
    interpreter: "FxOnnxInterpreter",
    node: torch.fx.Node,
    body_arg: Any,
    init_args: list[Any],
    xs_args: list[Any],
    additional_args: list[Any],
) -> Any:
    body_fn = _graph_module_of(interpreter, body_arg)
    builder = interpreter.builder
    init = [
        _as_value(builder, value, node_value(arg), interpreter)
        for value, arg in zip(interpreter.onnx_arg(init_args), init_args)
    ]
    xs = list(interpreter.onnx_arg(xs_args))
    additional = list(interpreter.onnx_arg(additional_args))
    if not xs:
        raise NotImplementedError(f"'{node.name}' scans no tensors: nothing to iterate over")

    sub = builder.subgraph(f"{node.name}_body")
    bindings: dict[str, Any] = {}
    placeholders = placeholder_nodes(body_fn)
    for index, placeholder in enumerate(placeholders):
        if index < len(init):
            bindings[placeholder.name] = BodyInput(f"{node.name}_{placeholder.name}", _type_of(init[index], placeholder, interpreter))
        elif index < len(init) + len(xs):
            bindings[placeholder.name] = BodyInput(f"{node.name}_{placeholder.name}")
        else:
            bindings[placeholder.name] = additional[index - len(init) - len(xs)]
    body = _translate_body(interpreter, node, body_fn, sub, bindings, "body")
    if body.failed:
        return FAILED
    step_outputs = [
        _as_value(sub, value, meta, interpreter) for value, meta in zip(body.outputs, body.output_metas)
    ]
    sub_outputs = sub.set_outputs(step_outputs)
    for value, state_input in zip(sub_outputs, sub.graph.inputs[: len(init)]):
        _relax_to(value, state_input)

    outputs = builder.add_node(
        "",
        "Scan",
        [*init, *xs],
        [ir.AttrGraph("body", sub.graph), ir.AttrInt64("num_scan_inputs", len(xs))],
        num_outputs=len(sub_outputs),
    )
    metas = _output_metas(node)
    for index, value in enumerate(outputs):
        meta = metas[index] if index < len(metas) else None
        inner = sub_outputs[index]
        if index < len(init):
            _type_merged(value, (sub.graph.inputs[index], inner), meta, interpreter)
        else:
            info = onnx_type_of(meta, interpreter.namer)
            if info is not None:
                apply_type(value, info)
            else:  # stacked: one more leading dim than the step's output
                value.dtype = inner.dtype
                value.shape = None if inner.shape is None else ir.Shape([None, *inner.shape])
        value.name = builder.unique_name(f"{node.name}_{index}")
    return tuple(outputs)


_TRANSLATORS: dict[str, Callable[["FxOnnxInterpreter", torch.fx.Node], Any]] = {
    "cond": _translate_cond,
    "while_loop": _translate_while_loop,
    "scan": _translate_scan,
    "map_impl": _translate_map,
}


# -- helpers --------------------------------------------------------------------------------------
def _name(target: Any) -> str:
    name = getattr(target, "name", None)
    return name() if callable(name) else str(target)


def _graph_module_of(interpreter: "FxOnnxInterpreter", arg: Any) -> torch.fx.GraphModule:
    module = interpreter.onnx_arg(arg)
    if not isinstance(module, torch.fx.GraphModule):
        raise TypeError(f"expected a branch or body GraphModule, got {type(module).__name__}")
    return module


def _bind(graph_module: torch.fx.GraphModule, values: Sequence[Any]) -> dict[str, Any]:
    """Placeholders bound, in order, to values of the enclosing graph (read by name)."""
    placeholders = placeholder_nodes(graph_module)
    if len(placeholders) != len(values):
        raise ValueError(
            f"the subgraph takes {len(placeholders)} inputs but {len(values)} operands were given"
        )
    return {placeholder.name: value for placeholder, value in zip(placeholders, values)}


def _translate_body(
    interpreter: "FxOnnxInterpreter",
    node: torch.fx.Node,
    graph_module: torch.fx.GraphModule,
    builder: GraphBuilder,
    bindings: dict[str, Any],
    role: str,
) -> TranslatedBody:
    """One branch or body, as a diagnostic scope of its own (its nodes report at the
    user's lines inside it)."""
    with interpreter.context.scope(
        rules.FX_GRAPH_TO_ONNX,
        Level.NONE,
        location=node_location(node),
        graph_name=f"{role} of {_name(node.target)} '{node.name}'",
    ) as diagnostic:
        diagnostic.log_code(lambda: graph_module.print_readable(print_output=False), "python")
        return interpreter.translate(graph_module, builder, inputs=bindings)


def _output_metas(node: torch.fx.Node) -> list[Any]:
    meta = node.meta.get("val")
    return list(meta) if isinstance(meta, (tuple, list)) else [meta]


def _type_of(value: Any, placeholder: torch.fx.Node, interpreter: "FxOnnxInterpreter") -> OnnxTypeInfo | None:
    """A loop-carried input's type: the body's metadata, or the initial value's."""
    info = onnx_type_of(placeholder.meta.get("val"), interpreter.namer)
    if info is None and isinstance(value, ir.Value) and value.dtype is not None:
        info = OnnxTypeInfo(value.dtype, value.shape, getattr(value, "is_complex", False))
    return info


def _as_value(builder: GraphBuilder, value: Any, meta: Any, interpreter: "FxOnnxInterpreter") -> ir.Value:
    """A graph value for ``value`` (a Python number becomes a constant of its meta's type)."""
    if isinstance(value, ir.Value):
        return value
    if isinstance(value, (bool, int, float)):
        info = onnx_type_of(meta if meta is not None else value, interpreter.namer)
        return builder.constant(value, info.dtype if info is not None else ir.DataType.INT64)
    raise TypeError(f"a control-flow operand or result is {type(value).__name__}, not a tensor")


def _as_bool_scalar(builder: GraphBuilder, value: Any) -> ir.Value:
    """ONNX If and Loop take a one-element bool tensor as their condition."""
    if isinstance(value, bool):
        return builder.constant(value, ir.DataType.BOOL)
    if value.dtype is not None and value.dtype != ir.DataType.BOOL:
        (value,) = builder.add_node("", "Cast", [value], [ir.AttrInt64("to", ir.DataType.BOOL.value)])
        value.dtype = ir.DataType.BOOL
    if value.shape is not None and len(value.shape) > 0:
        (value,) = builder.add_node("", "Reshape", [value, builder.constant([], ir.DataType.INT64)])
        value.dtype, value.shape = ir.DataType.BOOL, ir.Shape([])
    return value


def _finish_subgraph(
    sub: GraphBuilder, outputs: list[Any], metas: list[Any], interpreter: "FxOnnxInterpreter"
) -> list[TracedValue]:
    values = [_as_value(sub, value, meta, interpreter) for value, meta in zip(outputs, metas)]
    return sub.set_outputs(values)


def _merged_shape(shapes: Sequence[ir.Shape | None]) -> ir.Shape | None:
    """The shape every one of ``shapes`` has: dims they disagree on become unknown."""
    if any(shape is None for shape in shapes) or len({len(shape) for shape in shapes}) != 1:  # type: ignore[arg-type]
        return None
    dims = []
    for column in zip(*shapes):  # type: ignore[misc]
        first = column[0]
        same = all(_dim_key(dim) == _dim_key(first) for dim in column)
        dims.append(first if same and _dim_key(first) is not None else None)
    return ir.Shape(dims)


def _dim_key(dim: Any) -> Any:
    if isinstance(dim, int):
        return dim
    value = getattr(dim, "value", dim)
    return value if isinstance(value, (int, str)) else None


def _type_merged(value: ir.Value, sources: Sequence[ir.Value], meta: Any, interpreter: "FxOnnxInterpreter") -> None:
    """An If/Loop/Scan output: PyTorch's dtype, and a shape that every source agrees with
    (branches of different shapes give an output of relaxed shape, as ONNX infers)."""
    info = onnx_type_of(meta, interpreter.namer)
    shapes = [source.shape for source in sources]
    if info is not None:
        shapes.append(info.shape)
        value.dtype = info.dtype
    else:
        value.dtype = sources[0].dtype
    value.shape = _merged_shape(shapes)
    if isinstance(value, TracedValue):
        value.is_complex = info.is_complex if info is not None else getattr(sources[0], "is_complex", False)


def _relax_to(output: ir.Value, carried_input: ir.Value) -> None:
    """A loop-carried value's declared shape is what the input and the output share
    (a size that grows with the iterations is unknown)."""
    merged = _merged_shape([output.shape, carried_input.shape])
    carried_input.shape = merged
    if output.producer() is not None and output.producer().op_type == "Identity":
        output.shape = merged
