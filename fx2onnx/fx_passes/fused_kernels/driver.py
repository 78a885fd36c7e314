"""The table of fused-kernel rules and the pass that applies them.

For each node of a rule's anchor operator, the rules of that operator are tried in the
table's order: the first whose ``match`` finds its pattern has its ``replace`` make the
new calls, and the driver, here alone, hands the replaced nodes' uses to them and erases
what only the replaced nodes read. A refusal is recorded as a note (FXE0010): "kept
unfused" with the reason, or, when a later rule of the same anchor takes the node, which
kernel it became instead. Each rule has the opset its kernel needs; below it the rule is
skipped, with one note for the rules whose anchor is their own operator.
"""

from __future__ import annotations

import collections

import torch

from diagnostics import DiagnosticContext, Level, rules
from fx2onnx.fx_passes.fused_kernels import (
    attention, attention_sinks, gelu, group_query_attention, mixture_of_experts, rms_normalization, rotary_embedding,
)
from fx2onnx.fx_passes.fused_kernels.editing import erase_unused_tree
from fx2onnx.fx_passes.fused_kernels.matching import (
    FUSED_KERNELS_OPSET, PORTABLE_KERNELS, FusionRule, FusionTarget, Match, Refusal,
)

# Rules of one anchor in the order they are tried: attention over a cache becomes
# GroupQueryAttention where it can, the standard Attention otherwise.
RULES: tuple[FusionRule, ...] = (
    group_query_attention.RULE,
    group_query_attention.PACKED_OPERANDS_RULE,
    attention.RULE,
    attention_sinks.RULE,
    rotary_embedding.RULE,
    rotary_embedding.HALVES_RULE,
    rotary_embedding.INTERLEAVED_RULE,
    gelu.RULE,
    rms_normalization.RULE,
    mixture_of_experts.RULE,
)


def _note(context: DiagnosticContext, message: str) -> None:
    context.record(rules.FX_PASS, Level.NOTE, pass_name="fuse_kernels", message=message)


def _apply(rule: FusionRule, found: Match, erased: set[torch.fx.Node]) -> None:
    """``rule``'s replacement of what it ``found``: the new calls take over the replaced
    nodes' uses, and the replaced nodes go with what only they read (the anchor too,
    though torch may call it impure)."""
    for replaced, new in rule.replace(found.anchor.graph, found):
        replaced.replace_all_uses_with(new)
        erase_unused_tree(replaced, erased, replaced=found.anchor)


def fuse_kernels(
    graph_module: torch.fx.GraphModule, opset: int, context: DiagnosticContext, opset_chosen: bool = True,
    target: FusionTarget = FusionTarget(),
) -> int:
    """Apply every rule of :data:`RULES` that ``opset`` has the kernel of to
    ``graph_module``, in place, for ``target``; returns how many nodes became fused
    kernels. When the user chose ``opset`` (``opset_chosen``), a note names the rules it
    is too old for."""
    by_anchor: dict[object, list[FusionRule]] = collections.defaultdict(list)
    for rule in RULES:
        if not target.portable or rule.kernel in PORTABLE_KERNELS:
            by_anchor[rule.anchor].append(rule)
    graph = graph_module.graph
    anchors = [node for node in graph.nodes if node.op == "call_function" and node.target in by_anchor]
    waiting = collections.Counter(
        rule for node in anchors for rule in by_anchor[node.target] if rule.opset > opset and rule.whole_operator and opset_chosen
    )
    for rule, count in waiting.items():
        _note(context, f"{count} {rule.name} node(s) kept unfused: its fused kernel is an ONNX operator of opset {rule.opset}; "
              f"export with ExportOptions(opset_version={FUSED_KERNELS_OPSET}) to use it.")
    fused, erased = 0, set()
    for node in anchors:
        if node in erased:  # a term of a replacement before it
            continue
        refused: list[tuple[FusionRule, Refusal]] = []
        for rule in by_anchor[node.target]:
            found = rule.match(node, target) if rule.opset <= opset else None
            if isinstance(found, Refusal):
                refused.append((rule, found))
            elif found is not None:
                _apply(rule, found, erased)
                fused += 1
                for other, refusal in refused:
                    _note(context, f"`{node.name}` ({rule.name}) fused as {rule.kernel}, not {other.kernel}: {refusal.reason}.")
                break
        else:
            for rule, refusal in refused:
                _note(context, f"`{node.name}` ({rule.name}) kept unfused: {refusal.reason}.")
    if fused:
        graph_module.recompile()
    return fused
