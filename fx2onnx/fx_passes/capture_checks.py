"""Checks of the captured graph that make bad input a clear error before translation.

* The model must return at least one tensor: an ONNX model without outputs is useless
  (and ONNX Runtime refuses it).
* torch.export propagates FakeTensors through meta kernels, and many of them do not
  check what PyTorch's real kernels check (``nn.Linear(3, 3)`` on int64 inputs captures,
  although eager PyTorch refuses it). The nodes whose tensor inputs mix dtypes are the
  ones where real kernels differ from meta kernels: each such node is run once on CPU on
  small zero tensors of its example shapes and dtypes (nodes with larger inputs are left
  to the final model validation), once per operator and combination of argument dtypes
  (the repeated layers of a model ask the same question). A kernel that rejects the
  dtypes is reported at the user's line with PyTorch's own message.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.utils._pytree as pytree

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import argument_value, node_location, node_stack

# Above this many elements per node the eager check is skipped (it must stay cheap).
_MAX_CHECKED_ELEMENTS = 1 << 20

_ROLE_USER = "user"


def check_captured_graph(graph_module: torch.fx.GraphModule, output_roles: list[tuple[str, Any]], context: DiagnosticContext) -> bool:
    """Both checks below, every problem recorded; False when the export must stop."""
    has_output = check_has_tensor_output(graph_module, output_roles, context)
    computed = check_no_uncomputed_output_read(graph_module, context)
    return check_eager_accepts_dtypes(graph_module, context) and has_output and computed


def check_no_uncomputed_output_read(graph_module: torch.fx.GraphModule, context: DiagnosticContext) -> bool:
    """Record an error for each read of an operator output that fx2onnx's ONNX function
    does not compute (torchvision's ``roi_pool`` argmax); False when there is one."""
    from dispatcher.functions.vision import UNCOMPUTED_OUTPUTS

    valid = True
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = node.target._schema.name
        for user in node.users:
            index = user.args[1] if user.target is operator.getitem and len(user.args) > 1 else None
            what = UNCOMPUTED_OUTPUTS.get((name, index))
            if what is None or not user.users:
                continue
            valid = False
            context.record(
                rules.INVALID_MODEL_IO,
                Level.ERROR,
                location=node_location(user),
                stack=node_stack(user),
                message=(
                    f"The model reads output {index} of {name} ({what}); its ONNX translation does not "
                    f"compute it. Use only the first output (as torchvision's Python function does)."
                ),
            )
    return valid


def check_has_tensor_output(graph_module: torch.fx.GraphModule, output_roles: list[tuple[str, Any]], context: DiagnosticContext) -> bool:
    """Record an error and return False when the model returns no tensor."""
    output = next(n for n in reversed(graph_module.graph.nodes) if n.op == "output")
    leaves = pytree.tree_leaves(output.args[0])
    user_leaves = [
        leaf for index, leaf in enumerate(leaves)
        if index >= len(output_roles) or output_roles[index][0] == _ROLE_USER
    ]
    for leaf in user_leaves:
        if isinstance(leaf, torch.fx.Node):
            value = leaf.meta.get("val")
            if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) or value is None:
                return True
    returned = ", ".join(repr(leaf) for leaf in user_leaves) or "only Python values fixed at export time"
    context.record(
        rules.INVALID_MODEL_IO,
        Level.ERROR,
        message=(
            f"The model returns no tensor (it returns {returned}): an ONNX model needs at least one "
            "tensor output. Return the tensors the model computes (a constant as torch.tensor(...))."
        ),
    )
    return False


def check_eager_accepts_dtypes(graph_module: torch.fx.GraphModule, context: DiagnosticContext) -> bool:
    """Record an error per node whose mixed input dtypes PyTorch's CPU kernel rejects."""
    accepted = True
    accepted_signatures: set[tuple[Any, ...]] = set()
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        signature = _dtype_signature(node)
        if signature in accepted_signatures:
            continue
        arguments = _example_arguments(node)
        if arguments is None:
            continue
        args, kwargs = arguments
        try:
            with torch.no_grad():
                node.target(*args, **kwargs)
        except (RuntimeError, TypeError) as error:
            if "type" not in str(error):
                continue  # shapes of zeros or other limits of this cheap re-run, not dtypes
            accepted = False
            dtypes = ", ".join(str(a.dtype).removeprefix("torch.") for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor))
            context.record(
                rules.INVALID_MODEL_IO,
                Level.ERROR,
                message=(
                    f"PyTorch itself rejects the inputs of {node.target} (FX node '{node.name}', input dtypes "
                    f"{dtypes}): {str(error).splitlines()[0]}. The model cannot run on these example inputs: "
                    "give inputs of the dtypes the model expects (e.g. float for nn.Linear)."
                ),
                location=node_location(node),
                stack=node_stack(node),
                properties={"fx_node": node.name},
            )
        else:
            accepted_signatures.add(signature)
    return accepted


def _dtype_signature(node: torch.fx.Node) -> tuple[Any, ...]:
    """The operator with the dtype of every tensor argument and the type of every other
    argument: what decides whether a CPU kernel accepts the dtypes."""

    def kind(leaf: Any) -> Any:
        value = argument_value(leaf)
        return value.dtype if isinstance(value, torch.Tensor) else type(value)

    return (node.target, *(kind(leaf) for leaf in pytree.tree_leaves((node.args, dict(node.kwargs)))))


def _example_arguments(node: torch.fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """Small real zero tensors for ``node``'s arguments when they mix tensor dtypes."""
    values = [a.meta.get("val") for a in node.all_input_nodes]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if len({t.dtype for t in tensors}) < 2:
        return None
    total = 0
    for tensor in tensors:
        if any(not isinstance(d, int) for d in tensor.shape):
            return None
        total += tensor.numel()
    if total > _MAX_CHECKED_ELEMENTS:
        return None

    def real(arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                return torch.zeros(value.shape, dtype=value.dtype)
            if isinstance(value, (int, float, bool)):
                return value
            raise _Unsupported
        return arg

    try:
        return pytree.tree_map(real, node.args), pytree.tree_map(real, dict(node.kwargs))
    except _Unsupported:
        return None


class _Unsupported(Exception):
    """An argument this cheap re-run cannot materialize (symbolic, opaque...)."""
