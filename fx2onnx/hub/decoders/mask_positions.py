"""A decoder graph that counts its tokens' positions from `attention_mask` itself, for a
model type whose Transformers.js class feeds other positions than transformers' generation.

Transformers.js runs Qwen3.5's text model (`qwen3_5_text`) through its Qwen-VL class,
whose `prepare_inputs_for_generation` (`Qwen2VLForConditionalGeneration`'s, in
`models/qwen2_vl/modeling_qwen2_vl.js`) computes `position_ids` only when the session takes
them: then it reads `config.vision_config.spatial_merge_size` (a text config has no vision
config: it stops), and its text-only rope deltas (`_get_text_only_rope_index`: the mask's
largest position + 1 + the prompt's length) put each decode step's position past
transformers'. A session without `position_ids` is fed none (the method returns first).

The folder's graph therefore takes no `position_ids`: it computes them as transformers'
generation gives them (`positions_of` in verification.py), each token's position the count
of real tokens before it in the mask, a padding token's 0, for the step's last
`sequence_length` columns. onnxruntime users and the export's verification feed only the
inputs the graph takes. The graph file is rewritten without loading the weights; the computed
value keeps the input's name, so the nodes that read it are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from fx2onnx.hub.decoders.graph_files import int64_constant, rewrite_graph_file

# model types whose Transformers.js class feeds positions other than transformers' generation
# when the graph takes them, and none when it does not
POSITIONS_FROM_MASK_TYPES = frozenset({"qwen3_5_text"})

POSITIONS = "position_ids"
_INT64_MAX = 2**63 - 1


def counts_positions_from_mask(config: Mapping[str, Any]) -> bool:
    """Whether the folder of ``config`` (a dict) computes its positions from the mask."""
    return config.get("model_type") in POSITIONS_FROM_MASK_TYPES


def positions_from_mask(graph: onnx.GraphProto, mask: str = "attention_mask", ids: str = "input_ids") -> bool:
    """Replace ``graph``'s `position_ids` input ([batch, tokens]) by nodes computing it from
    ``mask`` ([batch, every token so far]) and the step's ``ids``; False (unchanged) when the
    graph takes no `position_ids` or not both of the others."""
    names = [value.name for value in graph.input]
    if POSITIONS not in names or mask not in names or ids not in names:
        return False
    if len(next(v for v in graph.input if v.name == POSITIONS).type.tensor_type.shape.dim) != 2:
        return False  # mRoPE's [axes, batch, tokens]: not this form
    graph.input.remove(next(v for v in graph.input if v.name == POSITIONS))

    def name(part: str) -> str:
        return f"{POSITIONS}_from_mask/{part}"

    def constant(part: str, value: int, shape: tuple[int, ...] = ()) -> onnx.NodeProto:
        return int64_constant(name(part), [value] * max(1, len(shape)), shape)

    nodes = [
        constant("zero", 0), constant("one", 1), constant("axis", 1), constant("last", _INT64_MAX, (1,)),
        constant("axes", 1, (1,)),
        helper.make_node("Cast", [mask], [name("mask")], name=name("Cast"), to=TensorProto.INT64),
        helper.make_node("CumSum", [name("mask"), name("axis")], [name("counted")], name=name("CumSum")),
        helper.make_node("Sub", [name("counted"), name("one")], [name("before")], name=name("Sub")),
        helper.make_node("Equal", [name("mask"), name("one")], [name("real")], name=name("Equal")),
        # a padding token's position is 0, as transformers' generation gives it
        helper.make_node("Where", [name("real"), name("before"), name("zero")], [name("every")], name=name("Where")),
        helper.make_node("Shape", [ids], [name("tokens")], name=name("Shape"), start=1, end=2),
        helper.make_node("Neg", [name("tokens")], [name("start")], name=name("Neg")),
        # the step's tokens are the mask's last columns
        helper.make_node("Slice", [name("every"), name("start"), name("last"), name("axes")], [POSITIONS],
                         name=name("Slice")),
    ]
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *kept])
    return True


def write_positions_from_mask(folder: Path, relative: str, config: Mapping[str, Any]) -> bool:
    """Rewrite the graph at ``relative`` in ``folder`` to compute its positions from the mask
    when the model type of ``config`` (a dict) is one of `POSITIONS_FROM_MASK_TYPES`; False
    (nothing written) otherwise."""
    if not counts_positions_from_mask(config):
        return False
    return rewrite_graph_file(folder / relative, positions_from_mask)
