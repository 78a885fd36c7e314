"""Verification before success, on request: the exported model runs in ONNX Runtime.

A model that ONNX's checker accepts can still be one that ONNX Runtime refuses (a kernel's
own checks on shapes and attributes) or that computes something else. With
``ExportOptions(verify=True)`` the finished program runs once in ONNX Runtime on the
example inputs and its outputs are compared with eager PyTorch's; a failure to run or a
mismatch fails the export with an FXE0024 error that names the ONNX node, its op, the FX
node and the user's source line. For a mismatch the node is found by op-level debugging
(each FX node's ONNX nodes run alone on PyTorch's values), which runs only then.

Nothing is verified when the inputs or the weights are fake (no data to run on).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.program.op_level_debug import OpLevelReport
from fx2onnx.onnx_passes.model_graphs import model_nodes
from fx2onnx.onnx_passes.validate_model import fx_node_of

# ONNX Runtime names the failing node: "... running Conv node. Name:'conv3d/Conv_6' ..."
_FAILING_NODE = re.compile(r"running (\S+) node\. Name:'([^']*)'")


def compare_outputs(actual: Any, expected: Any, rtol: float, atol: float) -> tuple[float, bool]:
    """The largest absolute difference between two output trees (non-finite values left
    out), and whether every leaf is within ``rtol``/``atol`` (NaN equal to NaN)."""
    got, want = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(got) != len(want):
        return float("inf"), False
    worst, ok = 0.0, True
    for a, e in zip(got, want):
        if not isinstance(e, torch.Tensor):
            ok = ok and a == e
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape:
            return float("inf"), False
        wide = torch.complex128 if e.is_complex() else torch.float64
        a, e = a.detach().to(wide), e.detach().to(wide)
        if a.numel():
            diff = (a - e).abs()
            finite = torch.isfinite(diff)
            worst = max(worst, diff[finite].max().item() if finite.any() else 0.0)
        ok = ok and torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    return worst, ok


def has_fake_data(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    fake = torch._subclasses.fake_tensor.FakeTensor
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    return any(isinstance(leaf, fake) or (isinstance(leaf, torch.Tensor) and leaf.is_meta) for leaf in leaves)


def _run_eager(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The model's outputs on copies of the inputs; buffers it updates get their values back."""
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    buffers = dict(model.named_buffers()) if isinstance(model, torch.nn.Module) else {}
    saved = {name: buffer.clone() for name, buffer in buffers.items()}
    try:
        with torch.no_grad():
            return model(*copy.deepcopy(tuple(args)), **copy.deepcopy(dict(kwargs)))
    finally:
        with torch.no_grad():
            for name, buffer in buffers.items():
                buffer.copy_(saved[name])


def verify_in_onnxruntime(
    program: Any,
    model: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    graph_module: torch.fx.GraphModule,
    context: DiagnosticContext,
    locate_mismatch: Callable[[], OpLevelReport],
    rtol: float = 1e-3,
    atol: float = 1e-4,
) -> bool:
    """Run ``program`` (an ONNXProgram) and ``model`` on the example inputs; record an
    FXE0024 error and return False when ONNX Runtime fails or the outputs differ."""
    if program.fake_context is not None or has_fake_data(args, kwargs):
        context.record(rules.RUNTIME_VERIFICATION, Level.NOTE, message="Verification skipped: the inputs or weights are fake (no data to run on).")
        return True
    try:
        expected = _run_eager(model, args, kwargs)
    except Exception as error:  # noqa: BLE001 - the model's own failure: nothing to compare with
        context.record(
            rules.RUNTIME_VERIFICATION,
            Level.WARNING,
            message=f"Verification skipped: the model fails in eager PyTorch on the example inputs ({type(error).__name__}: {error}).",
        ).log_source_exception(error)
        return True
    try:
        actual = program(*copy.deepcopy(tuple(args)), **copy.deepcopy(dict(kwargs)))
    except Exception as error:  # noqa: BLE001 - ONNX Runtime's refusal is the verdict
        _record_runtime_failure(str(error), program.model, graph_module, context)
        return False
    difference, close = compare_outputs(actual, expected, rtol, atol)
    if close:
        context.record(
            rules.RUNTIME_VERIFICATION,
            Level.NOTE,
            message=f"Verified in ONNX Runtime on the example inputs: largest difference from PyTorch {difference:.3g} (rtol {rtol:g}, atol {atol:g}).",
        )
        return True
    _record_mismatch(difference, rtol, atol, program.model, graph_module, context, locate_mismatch)
    return False


def _record_runtime_failure(text: str, model: ir.Model, graph_module: torch.fx.GraphModule, context: DiagnosticContext) -> None:
    match = _FAILING_NODE.search(text)
    runtime_op, runtime_name = (match.group(1), match.group(2)) if match else ("?", "?")
    onnx_node = _node_named_by_runtime(model, runtime_name)
    op_type = runtime_op
    if onnx_node is not None and onnx_node.domain == "" and onnx_node.op_type in runtime_op:
        op_type = onnx_node.op_type  # onnxruntime may have fused it first (Conv + Relu: FusedConv)
    elif onnx_node is not None:
        op_type = f"{runtime_op} in function {onnx_node.op_type}"
    name = onnx_node.name if onnx_node is not None else runtime_name
    _record(context, onnx_node, name, op_type, graph_module, "ONNX Runtime cannot run it: " + " ".join(text.split()))


def _node_named_by_runtime(model: ir.Model, runtime_name: str) -> ir.Node | None:
    """The model's node that onnxruntime calls ``runtime_name``. onnxruntime inlines
    functions first, naming their nodes ``_inlfunc_<function>_<node>``: the inner node
    when the exporter named it (``<fx node>/<op>_<n>``), else the call of the function."""
    nodes = list(model_nodes(model))
    exact = next((node for node in nodes if node.name == runtime_name), None)
    if exact is not None:
        return exact
    inner = [node for node in nodes if "/" in (node.name or "") and runtime_name.endswith("_" + node.name)]
    if inner:
        return max(inner, key=lambda node: len(node.name))
    calls = [node for node in nodes if node.domain and runtime_name.startswith(f"_inlfunc_{node.op_type}_")]
    return calls[0] if calls else None


def _record_mismatch(
    difference: float,
    rtol: float,
    atol: float,
    model: ir.Model,
    graph_module: torch.fx.GraphModule,
    context: DiagnosticContext,
    locate_mismatch: Callable[[], OpLevelReport],
) -> None:
    reason = f"its outputs differ from PyTorch's by up to {difference:.3g} (rtol {rtol:g}, atol {atol:g})"
    first = locate_mismatch().first_divergence
    fx_node = next((n for n in graph_module.graph.nodes if first is not None and n.name == first.fx_node), None)
    if fx_node is None:
        _record(context, None, "?", "?", graph_module, reason + "; no single node was found to differ on its own")
        return
    onnx_node = next((node for node in model_nodes(model) if node.name.split("/", 1)[0] == fx_node.name), None)
    detail = first.error or f"this node alone differs by {first.max_difference:.3g} ({first.dtypes})"
    _record(
        context, onnx_node, onnx_node.name if onnx_node else fx_node.name, onnx_node.op_type if onnx_node else "?",
        graph_module, f"{reason}; the first node that differs on its own: {detail}", fx_node,
    )


def _record(
    context: DiagnosticContext,
    onnx_node: ir.Node | None,
    name: str,
    op_type: str,
    graph_module: torch.fx.GraphModule,
    reason: str,
    fx_node: torch.fx.Node | None = None,
) -> None:
    fx_node = fx_node or (fx_node_of(onnx_node, graph_module) if onnx_node is not None else None)
    if fx_node is not None:
        reason += f" The node comes from FX node '{fx_node.name}' ({fx_node.op} {fx_node.target})."
    context.record(
        rules.RUNTIME_VERIFICATION,
        Level.ERROR,
        node=name,
        op_type=op_type,
        reason=reason,
        location=node_location(fx_node) if fx_node is not None else None,
        stack=node_stack(fx_node) if fx_node is not None else None,
        properties={"onnx_node": name, "op_type": op_type, "fx_node": fx_node.name if fx_node is not None else None},
    )
