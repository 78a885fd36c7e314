"""A causal LM's decode step must return caches that grow with the sequence: ONNX Runtime
GenAI feeds them back, longer at every step."""

from __future__ import annotations

from typing import Any

import fx2onnx
from fx2onnx.hub.shared.dim_roles import TOTAL, fixed_size_states, present_name


def check_growing_cache(program: fx2onnx.ONNXProgram, config: Any) -> None:
    """A cache captured at a fixed length (a layer that keeps a bounded number of tokens,
    other than the sliding windows sliding_window.py puts in the mask) would be exact at
    one fill only, and ONNX Runtime GenAI feeds back caches that grow with the sequence.
    A hybrid's convolution and recurrent states keep their size at every step, as the model does."""
    states = {present_name(name) for name in fixed_size_states(program.model)}
    # the length is dim 2 of keys and values ([batch, heads, length, head size]), dim 1 of a
    # cache without heads (an indexer's keys, [batch, length, size]): a cache grows when one
    # of its dims is the total length
    fixed_values = [
        value for value in program.model.graph.outputs
        if value.name.startswith("present.") and value.name not in states and value.shape is not None
        and TOTAL not in map(str, value.shape)
    ]
    fixed = [f"{value.name} ({', '.join(map(str, value.shape))})" for value in fixed_values]
    layers = {value.name.split(".")[1] for value in fixed_values}
    if fixed:
        raise NotImplementedError(
            f"{config.model_type}'s cache keeps a fixed number of tokens in {len(layers)} layer(s): its length "
            f"is fixed in the captured graph ({', '.join(fixed[:2])}{', ...' if len(fixed) > 2 else ''}) instead of "
            "growing with the sequence, which export-hf's decoders need. Export the decode step with "
            "fx2onnx.dynamo_export instead; nothing was written."
        )
