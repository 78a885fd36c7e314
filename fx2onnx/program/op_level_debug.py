"""Op-level debugging: which translated FX node makes the ONNX model differ from PyTorch.

With ``ExportOptions(op_level_debug=True)``, after a successful export, the FX graph is
run in PyTorch on the example inputs (``torch.fx.Interpreter``), which gives every
intermediate value. Then the ONNX nodes that each top-level FX node was translated into
(one ATen operator, or one module function call) are cut out as a model of their own and
run in ONNX Runtime on the values PyTorch computed for that FX node's inputs, so that each
node is judged on its own, not on the errors of the nodes before it. Each node's outcome
is recorded under FXE0013 with the user's source line: at level none when its ONNX nodes
ran and match PyTorch, as a warning when its result differs beyond the tolerance of its
dtype (the op, the largest difference and the dtypes) or when its ONNX nodes could not
be run (and why); a final note names the first node, in graph order, that diverges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.translate.module_scope import MODULE_KEY, fx_node_name

# rtol, atol per torch dtype; integers and booleans must match exactly.
_TOLERANCES = {
    torch.float64: (1e-5, 1e-6),
    torch.float32: (1e-3, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


@dataclass
class NodeCheck:
    """The verdict on one FX node."""

    fx_node: str
    target: str
    max_difference: float | None = None
    dtypes: str = ""
    error: str = ""
    mismatch: bool = False
    ran: bool = True  # False: its ONNX nodes could not be run (``error`` says why)

    @property
    def diverges(self) -> bool:
        return bool(self.error) or self.mismatch


@dataclass
class OpLevelReport:
    checked: list[str] = field(default_factory=list)
    diverging: list[NodeCheck] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def first_divergence(self) -> NodeCheck | None:
        return self.diverging[0] if self.diverging else None


def debug_op_level(
    model: ir.Model,
    graph_module: torch.fx.GraphModule,
    fx_values: Mapping[torch.fx.Node, Any],
    onnx_inputs: Sequence[torch.Tensor],
    lifted_tensors: Mapping[str, tuple[str, torch.Tensor]],
    context: DiagnosticContext,
) -> OpLevelReport:
    """Check each top-level FX node's ONNX nodes against PyTorch (see the module doc).

    ``fx_values`` maps each FX node to what the interpreter made of it (ONNX values);
    ``onnx_inputs`` are the flat ONNX inputs of the example; ``lifted_tensors`` the
    weights of placeholders that became initializers.
    """
    report = OpLevelReport()
    try:
        torch_values = _run_in_pytorch(graph_module, model, fx_values, onnx_inputs, lifted_tensors)
    except Exception as error:  # noqa: BLE001 - debugging must never fail the export
        context.record(
            rules.OP_LEVEL_VALIDATION,
            Level.WARNING,
            message=(
                f"Op-level debugging could not run the FX graph in PyTorch on the example inputs "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); no node was checked."
            ),
        ).log_source_exception(error)
        return report
    # id of an ONNX value -> (FX node, position among its ONNX values, how many it has)
    producer_of = {}
    for fx_node, value in fx_values.items():
        leaves = _onnx_leaves(value)
        for position, leaf in enumerate(leaves):
            producer_of[id(leaf)] = (fx_node, position, len(leaves))
    groups = _nodes_by_scope(model)
    for node in graph_module.graph.nodes:
        if node.op not in ("call_function", "call_module"):
            continue
        outputs = _onnx_leaves(fx_values.get(node))
        expected = _torch_leaves(torch_values.get(node))
        if not outputs or len(outputs) != len(expected) or node.name not in groups:
            report.skipped[node.name] = "no ONNX nodes or outputs to compare"
            continue
        produced = {id(out) for onnx_node in groups[node.name] for out in onnx_node.outputs}
        if any(id(v) not in produced for v in outputs):
            # e.g. getitem of a multi-output node: its value is the producer's, checked there
            report.skipped[node.name] = "its ONNX values are produced by another FX node's nodes"
            continue
        if any(getattr(v, "is_complex", False) for v in outputs):
            report.skipped[node.name] = "complex values"
            continue
        check = _check_node(node, groups[node.name], outputs, expected, model, producer_of, torch_values, report, context)
        if check is None:
            continue
        report.checked.append(node.name)
        if check.diverges:
            report.diverging.append(check)
            _record_divergence(context, node, check, first=len(report.diverging) == 1)
        else:
            _record_agreement(context, node, check)
    _record_summary(context, report, graph_module)
    return report


# -- PyTorch side ----------------------------------------------------------------------------


class _RecordingInterpreter(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule, placeholders: Mapping[str, Any]) -> None:
        super().__init__(module)
        self.placeholders = placeholders
        self.values: dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "placeholder":
            value = self.placeholders.get(n.name)
        else:
            value = super().run_node(n)
        self.values[n] = value
        return value


def _run_in_pytorch(
    graph_module: torch.fx.GraphModule,
    model: ir.Model,
    fx_values: Mapping[torch.fx.Node, Any],
    onnx_inputs: Sequence[torch.Tensor],
    lifted_tensors: Mapping[str, tuple[str, torch.Tensor]],
) -> dict[torch.fx.Node, Any]:
    input_index = {id(v): i for i, v in enumerate(model.graph.inputs)}
    placeholders: dict[str, Any] = {}
    for node in graph_module.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name in lifted_tensors:
            placeholders[node.name] = lifted_tensors[node.name][1]
            continue
        value = fx_values.get(node)
        if isinstance(value, ir.Value) and id(value) in input_index:
            placeholders[node.name] = onnx_inputs[input_index[id(value)]]
    interpreter = _RecordingInterpreter(graph_module, placeholders)
    with torch.no_grad():
        interpreter.run(*[None] * sum(1 for n in graph_module.graph.nodes if n.op == "placeholder"))
    return interpreter.values


# -- ONNX side -------------------------------------------------------------------------------


def _onnx_leaves(value: Any) -> list[ir.Value]:
    if isinstance(value, ir.Value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _onnx_leaves(item)]
    return []


def _torch_leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _torch_leaves(item)]
    if isinstance(value, (int, float, bool)) and not isinstance(value, torch.SymInt):
        return [torch.tensor(value)]
    return []


def _nodes_by_scope(model: ir.Model) -> dict[str, list[ir.Node]]:
    """The main graph's nodes grouped by the FX node they were emitted for."""
    groups: dict[str, list[ir.Node]] = {}
    for node in model.graph:
        if node.name:
            groups.setdefault(fx_node_name(node.name, node.metadata_props.get(MODULE_KEY)), []).append(node)
    return groups


def _check_node(
    fx_node: torch.fx.Node,
    nodes: list[ir.Node],
    outputs: list[ir.Value],
    expected: list[torch.Tensor],
    model: ir.Model,
    producer_of: Mapping[int, tuple[torch.fx.Node, int, int]],
    torch_values: Mapping[torch.fx.Node, Any],
    report: OpLevelReport,
    context: DiagnosticContext,
) -> NodeCheck | None:
    check = NodeCheck(fx_node.name, str(fx_node.target))
    try:
        feeds, extra_nodes = _feeds(nodes, model, producer_of, torch_values)
    except _CannotFeed as reason:
        report.skipped[fx_node.name] = str(reason)
        if not reason.expected:
            _record_not_run(context, fx_node, str(reason))
        return None
    try:
        actual = _run_cut(model, extra_nodes + nodes, feeds, outputs)
    except Exception as error:  # noqa: BLE001 - a node that fails to run is a finding
        check.error = f"ONNX Runtime failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        check.ran = False
        return check
    worst = 0.0
    dtype_notes = []
    diverges = False
    for got, want in zip(actual, expected):
        want = want.detach()
        got_tensor = torch.from_numpy(np.asarray(got))
        dtype_notes.append(f"onnx {str(got_tensor.dtype).removeprefix('torch.')} vs torch {str(want.dtype).removeprefix('torch.')}")
        if tuple(got_tensor.shape) != tuple(want.shape):
            check.error = f"shape {tuple(got_tensor.shape)} in ONNX, {tuple(want.shape)} in PyTorch"
            break
        difference, close = _compare(got_tensor, want)
        worst = max(worst, difference)
        diverges = diverges or not close
    check.max_difference = worst
    check.dtypes = "; ".join(dtype_notes)
    check.mismatch = diverges
    return check


class _CannotFeed(Exception):
    """An input of the cut-out nodes has no PyTorch value to feed; ``expected`` when
    op-level debugging does not check such nodes by design (complex values)."""

    def __init__(self, reason: str, *, expected: bool = False) -> None:
        super().__init__(reason)
        self.expected = expected


def _feeds(
    nodes: list[ir.Node],
    model: ir.Model,
    producer_of: Mapping[int, tuple[torch.fx.Node, int, int]],
    torch_values: Mapping[torch.fx.Node, Any],
) -> tuple[dict[str, np.ndarray], list[ir.Node]]:
    inside = {id(out) for node in nodes for out in node.outputs}
    feeds: dict[str, np.ndarray] = {}
    extra: list[ir.Node] = []
    for node in nodes:
        for value in node.inputs:
            if value is None or id(value) in inside or value.name in feeds:
                continue
            if value.const_value is not None and value.is_initializer():
                feeds[value.name] = np.asarray(value.const_value.numpy())
                continue
            producer = value.producer()
            if producer is not None and producer.op_type == "Constant" and not producer.inputs:
                extra.append(producer)
                inside.add(id(value))
                continue
            if value.type is not None and not isinstance(value.type, ir.TensorType):
                raise _CannotFeed(f"input '{value.name}' is a {value.type}, not a tensor")
            if id(value) not in producer_of:
                raise _CannotFeed(f"input '{value.name}' comes from no FX node")
            fx_node, position, count = producer_of[id(value)]
            leaves = _torch_leaves(torch_values.get(fx_node))
            if count != len(leaves):
                # e.g. a list of tensors that ONNX holds as one sequence value
                raise _CannotFeed(f"'{value.name}' does not correspond to one PyTorch tensor")
            tensor = leaves[position].detach()
            if tensor.is_complex():
                raise _CannotFeed("complex input", expected=True)
            feeds[value.name] = tensor.contiguous().numpy() if tensor.dtype != torch.bfloat16 else tensor.float().numpy()
    return feeds, extra


def _run_cut(model: ir.Model, nodes: list[ir.Node], feeds: Mapping[str, np.ndarray], outputs: list[ir.Value]) -> list[Any]:
    import onnxruntime as ort

    node_protos = [ir.serde.serialize_node(node) for node in nodes]
    inputs = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), None)
        for name, array in feeds.items()
    ]
    output_infos = [
        onnx.helper.make_tensor_value_info(v.name, v.dtype.value if v.dtype is not None else 0, None) for v in outputs
    ]
    graph = onnx.helper.make_graph(node_protos, "op_level_debug", inputs, output_infos)
    proto = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()],
        ir_version=model.ir_version,
        functions=[ir.serde.serialize_function(f) for f in model.functions.values()],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([v.name for v in outputs], dict(feeds))


def _compare(got: torch.Tensor, want: torch.Tensor) -> tuple[float, bool]:
    if want.dtype == torch.bfloat16:
        want = want.float()
    if got.dtype != want.dtype:
        got = got.to(want.dtype)
    if not (want.is_floating_point()):
        difference = (got.to(torch.float64) - want.to(torch.float64)).abs()
        return (float(difference.max()) if difference.numel() else 0.0), bool(torch.equal(got, want))
    rtol, atol = _TOLERANCES.get(want.dtype, (1e-3, 1e-4))
    both_nan = torch.isnan(got) & torch.isnan(want)
    difference = torch.where(both_nan, torch.zeros_like(want), (got - want).abs())
    difference = torch.nan_to_num(difference, nan=float("inf"))
    worst = float(difference.max()) if difference.numel() else 0.0
    return worst, bool(torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))


# -- diagnostics -----------------------------------------------------------------------------


def _record_outcome(context: DiagnosticContext, node: torch.fx.Node, level: Level, message: str, **properties: Any) -> None:
    """One node's op-level outcome under FXE0013, at its source line."""
    context.record(
        rules.OP_LEVEL_VALIDATION,
        level,
        message=message,
        location=node_location(node),
        stack=node_stack(node) if level is not Level.NONE else None,
        properties={"fx_node": node.name, "target": str(node.target), **properties},
    )


def _record_agreement(context: DiagnosticContext, node: torch.fx.Node, check: NodeCheck) -> None:
    """The level-none outcome of a node whose ONNX nodes ran and match PyTorch."""
    _record_outcome(
        context, node, Level.NONE,
        f"FX node '{node.name}' and its ONNX function {node.target} agree in op-level validation: "
        f"its ONNX nodes ran in ONNX Runtime, max difference {check.max_difference:.6g} ({check.dtypes}).",
        outcome="matched", max_difference=check.max_difference, dtypes=check.dtypes,
    )


def _record_not_run(context: DiagnosticContext, node: torch.fx.Node, why: str) -> None:
    """A node whose ONNX nodes could not be run, so op-level debugging says nothing of it."""
    _record_outcome(
        context, node, Level.WARNING,
        f"Op-level debugging could not run FX node '{node.name}' ({node.target}) in ONNX Runtime: {why}. "
        "It is not checked; compare the whole model's outputs with PyTorch (ExportOptions(verify=True)).",
        outcome="not_run", reason=why,
    )


def _record_divergence(context: DiagnosticContext, node: torch.fx.Node, check: NodeCheck, first: bool) -> None:
    if not check.ran:
        _record_not_run(context, node, check.error)
        return
    if check.error:
        reason = check.error
    else:
        reason = f"max difference {check.max_difference:.6g} ({check.dtypes})"
    if first:
        reason += "; this is the first node that diverges"
    context.record(
        rules.OP_LEVEL_VALIDATION,
        Level.WARNING,
        node=f"'{node.name}'",
        function=str(node.target),
        reason=reason,
        location=node_location(node),
        stack=node_stack(node),
        properties={
            "fx_node": node.name,
            "target": str(node.target),
            "max_difference": check.max_difference,
            "dtypes": check.dtypes,
            "first_divergence": first,
            "outcome": "diverged",
        },
    )


def _record_summary(context: DiagnosticContext, report: OpLevelReport, graph_module: torch.fx.GraphModule) -> None:
    first = report.first_divergence
    verdict = f"first diverging node: '{first.fx_node}' ({first.target})" if first else "no node diverges"
    context.record(
        rules.OP_LEVEL_VALIDATION,
        Level.NOTE,
        message=(
            f"Op-level debugging checked {len(report.checked)} FX node(s) against PyTorch, "
            f"{len(report.diverging)} diverge; {verdict}; {len(report.skipped)} not checked."
        ),
        properties={"checked": len(report.checked), "diverging": [c.fx_node for c in report.diverging], "skipped": report.skipped},
    )
