"""The attention mask of a padded batch of clips, for the models that read one.

A feature extractor pads the clips of a batch to the longest and, where its settings say
(`return_attention_mask`), returns a mask of the samples or frames each clip fills; the
model then masks the padding: a wav2vec2-style encoder its attention and a classifier its
pooling, a speech encoder-decoder its encoder and its decoder's cross-attention. A folder
reads that mask where the extractor returns one and the model takes one
(audio_input.reads_mask), so that each row of a padded batch is transformers' row.

A speech encoder-decoder's decoder is given the mask of the encoder's input, as
Transformers.js gives it (`encoder_attention_mask`: the input's `attention_mask`), and
masks the encoder's output frames as the model does: by the model's own rule from input
lengths to output frames (`frames_mask`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

MASK = "attention_mask"
# the dim names of an audio input's time axis (Optimum's), which its mask shares
FRAMES, SAMPLES = "num_frames", "num_samples"


def takes_mask(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward takes an `attention_mask`."""
    return MASK in inspect.signature(module.forward).parameters


def frames_mask_rule(model: torch.nn.Module) -> Callable[[torch.Tensor, int], torch.Tensor] | None:
    """The model's own rule from its encoder's input mask to the mask of the encoder's
    ``frames`` output frames, as its code computes it for the decoder's cross-attention;
    None for a model with none of the rules known here (its folder then reads no mask)."""
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else model
    if hasattr(encoder, "_get_output_attention_mask"):  # Parakeet's encoder (Cohere ASR, Canary): subsampled lengths
        return lambda mask, frames: encoder._get_output_attention_mask(mask, target_length=frames)
    if hasattr(model, "_compute_sub_sample_lengths_from_attention_mask"):  # SeamlessM4T (v2): its adapter's lengths
        return lambda mask, frames: _first_frames(model._compute_sub_sample_lengths_from_attention_mask(mask), frames)
    # the convolutions' output lengths (Speech2Text, SpeechT5's speech prenet, wav2vec2-style encoders)
    owner = next((m for m in model.modules() if hasattr(m, "_get_feature_vector_attention_mask")), None)
    if owner is not None:
        return lambda mask, frames: owner._get_feature_vector_attention_mask(frames, mask)
    return None


def _first_frames(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """The mask (batch, ``frames``) attending each row's first ``lengths`` frames (SeamlessM4T's
    `_compute_new_attention_mask`: a frame is masked from its index on ``lengths``, a float's floor)."""
    return (torch.arange(frames, device=lengths.device)[None] < lengths[:, None]).long()


def _unattended(mask: torch.Tensor) -> torch.Tensor:
    """The rows of ``mask`` that attend nothing (the optional input's default, `optional_mask`): (batch, 1)."""
    return mask.sum(-1, keepdim=True) == 0


def attended(mask: torch.Tensor) -> torch.Tensor:
    """The encoder's input mask, a row that attends nothing attending every frame."""
    return torch.where(_unattended(mask), torch.ones_like(mask), mask)


def frames_of(rule: Callable[[torch.Tensor, int], torch.Tensor], mask: torch.Tensor, frames: int) -> torch.Tensor:
    """The encoder's output frames' mask of ``mask`` by ``rule``, a row of the input mask
    that attends nothing attending every frame."""
    found = rule(mask, frames)
    return (found.bool() | _unattended(mask).to(found.device)).to(found.dtype)


def _uses_renamed(graph: Any, old: str, new: str) -> None:
    """Every node of ``graph`` and of its subgraphs (an If's branches read the outer graph's
    values by name) reads ``new`` where it read ``old``."""
    from onnx import AttributeProto

    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                _uses_renamed(attribute.g, old, new)
            elif attribute.type == AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _uses_renamed(subgraph, old, new)


def optional_mask(path: Path, name: str, like: str, axes: tuple[int, ...]) -> None:
    """Make the mask input ``name`` of the model at ``path`` optional: a client that gives
    none (Transformers.js's speech encoder-decoders drop the processor's mask) leaves its
    default, one row of one masked frame, which the graph pads with zeros to the sizes of
    input ``like`` along ``axes`` (a mask given is of those sizes: nothing is padded); rows
    that attend nothing attend every frame (`attended`, `frames_of`, in the captured graph).
    The default is an initializer of the input's name, which runtimes list apart from the
    inputs they require (onnxruntime's overridable initializers; not empty: onnxruntime 1.30
    reduces an empty mask to an empty sum). Only the graph is rewritten: the weights stay in
    their data file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if name not in {value.name for value in graph.input} or like not in {value.name for value in graph.input}:
        raise ValueError(f"{path.name} has no input {name!r} or {like!r} to make the mask optional by")
    given = f"{name}_padded"
    _uses_renamed(graph, name, given)
    prefix = f"/{name}_default"
    count = len(axes)
    nodes = [
        helper.make_node("Shape", [like], [f"{prefix}/like_shape"]),
        helper.make_node("Shape", [name], [f"{prefix}/mask_shape"]),
        helper.make_node("Gather", [f"{prefix}/like_shape", f"{prefix}/axes"], [f"{prefix}/like_sizes"], axis=0),
        helper.make_node("Gather", [f"{prefix}/mask_shape", f"{prefix}/axes"], [f"{prefix}/mask_sizes"], axis=0),
        helper.make_node("Sub", [f"{prefix}/like_sizes", f"{prefix}/mask_sizes"], [f"{prefix}/missing"]),
        helper.make_node("Concat", [f"{prefix}/no_start", f"{prefix}/missing"], [f"{prefix}/pads"], axis=0),
        helper.make_node("Pad", [name, f"{prefix}/pads", f"{prefix}/zero", f"{prefix}/axes"], [given], mode="constant"),
    ]
    constants = [
        numpy_helper.from_array(np.array(axes, dtype=np.int64), f"{prefix}/axes"),
        numpy_helper.from_array(np.zeros(count, dtype=np.int64), f"{prefix}/no_start"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), f"{prefix}/zero"),
        numpy_helper.from_array(np.zeros((1, 1), dtype=np.int64), name),
    ]
    mask_type = next(value for value in graph.input if value.name == name).type.tensor_type.elem_type
    if mask_type != TensorProto.INT64:
        raise ValueError(f"{path.name}'s {name} is not int64: its default would not be of its type")
    for node in reversed(nodes):
        graph.node.insert(0, node)
    graph.initializer.extend(constants)
    onnx.save(model, str(path))
