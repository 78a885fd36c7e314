"""A model exported in training mode is told so: its dropout and batch statistics.

The exporter takes the model as it is, and a module in training mode exports its
training behaviour: dropout drops random elements on every run, batch norm normalizes
with each batch's statistics (and updates its running statistics). Users almost always
mean inference (`model.eval()`), so the captured graph's nodes that run in training mode
are named in one note (SARIF and a Python warning) that says how to export for inference.
The exported behaviour stays what the model does.
"""

from __future__ import annotations

import warnings

import torch

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.fx_passes.modularize import module_stack
from fx2onnx.private_ops import training_batch_norm_ops
from fx2onnx.user_warnings import ExportWarning, user_stacklevel

_aten = torch.ops.aten
# operator -> position of its `train` argument
_DROPOUT_TRAIN_ARGUMENT = {
    _aten.dropout.default: 2,
    _aten.feature_dropout.default: 2,
    _aten.alpha_dropout.default: 2,
    _aten.feature_alpha_dropout.default: 2,
    _aten.native_dropout.default: 2,
}
_BATCH_NORM_RUNNING_MEAN = 3  # batch norm without running statistics uses batch statistics in eval mode too


def training_mode_nodes(graph: torch.fx.Graph) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The dropout nodes that drop and the batch-norm nodes that use batch statistics
    although the module keeps running statistics (a module in training mode)."""
    batch_norm = {_aten.batch_norm.default: 5, **training_batch_norm_ops()}
    dropouts, norms = [], []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _DROPOUT_TRAIN_ARGUMENT and _flag(node, _DROPOUT_TRAIN_ARGUMENT[node.target], "train"):
            dropouts.append(node)
        elif node.target in batch_norm and _flag(node, batch_norm[node.target], "training"):
            if len(node.args) > _BATCH_NORM_RUNNING_MEAN and node.args[_BATCH_NORM_RUNNING_MEAN] is not None:
                norms.append(node)
    return dropouts, norms


def report_training_mode(graph: torch.fx.Graph, model_label: str, context: DiagnosticContext) -> None:
    """One note (SARIF and a Python warning) when the graph runs dropout or batch norm
    in training mode, naming what and where, and how to export for inference."""
    dropouts, norms = training_mode_nodes(graph)
    if not dropouts and not norms:
        return
    parts = []
    if dropouts:
        parts.append(f"{_subject(dropouts, 'dropout', 'drops', 'drop')} random elements on every run")
    if norms:
        parts.append(
            f"{_subject(norms, 'batch norm', 'normalizes', 'normalize')} with each batch's statistics instead of the "
            "running ones, and updates the running statistics"
        )
    first = (dropouts or norms)[0]
    message = rules.TRAINING_MODE.format_message(model=model_label, what="; ".join(parts))
    context.record(rules.TRAINING_MODE, Level.NOTE, message=message, location=node_location(first), stack=node_stack(first))
    warnings.warn(message, ExportWarning, stacklevel=user_stacklevel())


def _flag(node: torch.fx.Node, position: int, name: str) -> bool:
    value = node.args[position] if len(node.args) > position else node.kwargs.get(name)
    return value is True


def _subject(nodes: list[torch.fx.Node], what: str, verb: str, plural_verb: str) -> str:
    if len(nodes) == 1:
        return f"the {what} {_where(nodes)} {verb}"
    return f"{len(nodes)} {what}s ({_where(nodes)}) {plural_verb}"


def _where(nodes: list[torch.fx.Node], shown: int = 3) -> str:
    """Each node's module (attribute path and class) or FX name, and the model's line."""
    places = []
    for node in nodes[:shown]:
        calls = module_stack(node)
        name = f"`{calls[-1].path}` ({calls[-1].short_class_name})" if calls else f"`{node.name}`"
        location = node_location(node)
        places.append(f"{name} at {location}" if location is not None else name)
    more = f", and {len(nodes) - shown} more" if len(nodes) > shown else ""
    return ", ".join(places) + more


__all__ = ["report_training_mode", "training_mode_nodes"]
