"""RMS normalization as the standard ``RMSNormalization`` (opset 23).

As models write it and as ``F.rms_norm`` decomposes, ``scale * (x * rsqrt(mean(x ** 2,
dims) + eps))`` over trailing dims (the product possibly cast back from float32 first,
the scale over those dims); the kernel computes in float32 and casts back as transformers'
norms do (``F.rms_norm`` and ``nn.RMSNorm`` decompose to the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import (
    FLOATS_ORT_RUNS, FUSED_KERNELS_OPSET, SUMS, FusionRule, FusionTarget, Match, Refusal, Replacements, arguments,
    node_value, only_user, operand_orders, other_factor,
)
from fx2onnx.fx_passes.remove_identity_views import same_size

_aten = torch.ops.aten


def _trailing_dims(dims: Any, rank: int) -> int | None:
    """k when ``dims`` are the last k of ``rank`` dims (in any spelling), else None."""
    wanted = sorted(d % rank for d in dims or ())
    return len(wanted) if wanted and wanted == list(range(rank - len(wanted), rank)) else None


def _mean_of_squares(node: Any) -> tuple[torch.fx.Node, float, int] | None:
    """``(x, eps, k)`` when ``node`` is ``mean(x ** 2, last k dims, keepdim) + eps``."""
    mean, eps = next(((a, b) for a, b in operand_orders(node, SUMS) if isinstance(b, float)), (None, None))
    if not isinstance(mean, torch.fx.Node) or mean.target != _aten.mean.dim:
        return None
    averaged = arguments(mean)
    squared = averaged["self"]
    if not isinstance(squared, torch.fx.Node) or squared.target != _aten.pow.Tensor_Scalar or squared.args[1] != 2:
        return None
    x, x_value = squared.args[0], node_value(squared.args[0])
    if x_value is None or x_value.dim() == 0 or not averaged["keepdim"] or averaged["dtype"] is not None:
        return None
    trailing = _trailing_dims(averaged["dim"], x_value.dim())
    return (x, eps, trailing) if trailing is not None else None


def _is_cast(node: torch.fx.Node) -> bool:
    return node.target == _aten.type_as.default or (node.target == _aten._to_copy.default and set(node.kwargs) == {"dtype"})


def _is_float32_upcast(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.target == _aten._to_copy.default and set(node.kwargs) == {"dtype"}
            and node.kwargs["dtype"] == torch.float32)


@dataclass(frozen=True)
class RMSNormMatch(Match):
    result: torch.fx.Node  # the scaled normalization the kernel replaces
    x: torch.fx.Node
    scale: torch.fx.Node
    eps: float
    trailing_dims: int


def match(node: torch.fx.Node, target: FusionTarget) -> RMSNormMatch | Refusal | None:
    """Anchored at the ``rsqrt`` of a mean of squares plus eps, read once, by ``x * rsqrt``,
    whose result (cast back, maybe) is scaled by a tensor over the normalized dims."""
    found = _mean_of_squares(node.args[0])
    normalized = only_user(node)
    if found is None or normalized is None or other_factor(normalized, found[0]) is not node:
        return None
    x, eps, trailing = found
    scaled, result = normalized, only_user(normalized)
    if result is not None and _is_cast(result):
        scaled, result = result, only_user(result)  # cast back to the input's dtype before the scale
    scale = other_factor(result, scaled) if result is not None else None
    scale_shape = list(node_value(scale).shape) if isinstance(scale, torch.fx.Node) and node_value(scale) is not None else None
    if scale_shape is None or len(scale_shape) != trailing or not all(map(same_size, scale_shape, node_value(x).shape[-trailing:])):
        return Refusal("no scale over the normalized dims follows the normalization")
    source = x.args[0] if _is_float32_upcast(x) else x  # the kernel computes in float32 itself
    cast_back = only_user(result)
    if _is_float32_upcast(scale) and cast_back is not None and _is_cast(cast_back) and node_value(cast_back).dtype == node_value(source).dtype:
        # torch's decomposition scales in float32 and casts after: the kernel casts before
        # (one rounding of the input's type more, within its precision)
        scale, result = scale.args[0], cast_back
    dtypes = {node_value(source).dtype, node_value(scale).dtype, node_value(result).dtype}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS_ORT_RUNS):
        return Refusal(f"{node_value(source).dtype} input, {node_value(scale).dtype} scale (onnxruntime's RMSNormalization "
                       "runs float32 and float16, input, scale and result alike)")
    return RMSNormMatch(node, result, source, scale, eps, trailing)


def replace(graph: torch.fx.Graph, found: RMSNormMatch) -> Replacements:
    with graph.inserting_before(found.result):
        fused = new_call(graph, torch.ops.fx2onnx.rms_norm.default, (found.x, found.scale, found.eps, found.trailing_dims),
                         found.result, like=node_value(found.result))
    return [(found.result, fused)]


RULE = FusionRule("rms_norm", "RMSNormalization", _aten.rsqrt.default, FUSED_KERNELS_OPSET, False, match, replace)
