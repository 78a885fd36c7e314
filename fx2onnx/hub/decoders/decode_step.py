"""Causal LMs: one model for prefill and decode, as ONNX Runtime GenAI runs it.

The decode step is exported with a cache from a prefill run (2 sequences, 5 cached and 3
new tokens: sizes that no other dim shares, so torch.export keeps every length apart). A
past length of 0 is then the prefill. Inputs `input_ids`, `attention_mask`,
`position_ids` (when forward takes it), `past_key_values.{i}.key/.value`; outputs
`logits`, `present.{i}.key/.value`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Any

import torch

import fx2onnx
from fx2onnx.capture import (
    dims_dynamic_but_ones, is_cache_type, is_encoder_decoder_cache_type, tensors_outside_layers,
)
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared.program_files import own_forward_refusal
from fx2onnx.hub.tasks import UnsupportedArchitectureError, UnsupportedTaskError
from fx2onnx.hub.decoders.sliding_window import growing_cache, layers_config

BATCH, NEW_TOKENS, CACHED_TOKENS = 2, 3, 5


# forward's name for a recurrent state it takes and returns as a list of tensors (RWKV's)
STATE_LIST = "state"


def cache_argument(model: torch.nn.Module) -> str:
    """forward's name for the cache: `cache` from transformers 5.24 on, `past_key_values` before;
    `state` for a model that takes its recurrent state as a list of tensors (RWKV)."""
    parameters = inspect.signature(model.forward).parameters
    if "cache" in parameters:
        return "cache"
    return STATE_LIST if STATE_LIST in parameters and "past_key_values" not in parameters else "past_key_values"


def output_cache(outputs: Any) -> Any:
    """A model output's cache: `cache` from transformers 5.24 on (`past_key_values` is kept
    there only as a deprecated alias), `past_key_values` before, RWKV's `state`."""
    for name in ("cache", STATE_LIST):
        if name in outputs:
            return outputs[name]
    return outputs.past_key_values


# an output field that carries a decoder's state from one step to the next
_STATE_FIELDS = ("cache", "past", "state")


def declared_output_fields(model: torch.nn.Module) -> list[str] | None:
    """The fields of the output dataclasses forward declares it returns; None when it
    declares none (or an annotation that cannot be resolved)."""
    try:
        declared = typing.get_type_hints(model.forward).get("return")
    except (NameError, TypeError):  # an annotation that cannot be resolved says nothing
        return None
    outputs = [kind for kind in (typing.get_args(declared) or (declared,)) if dataclasses.is_dataclass(kind)]
    return [field.name for kind in outputs for field in dataclasses.fields(kind)] if outputs else None


def returns_no_cache(model: torch.nn.Module) -> bool:
    """Whether forward's declared output holds no state for the next step (XLM's
    `MaskedLMOutput`: a masked LM filed under causal LMs); False when forward declares none."""
    fields = declared_output_fields(model)
    return fields is not None and not any(
        any(part in name.split("_") for part in _STATE_FIELDS) or "cache" in name for name in fields
    )


def decode_step_inputs(loaded: LoadedModel, cached: int = CACHED_TOKENS) -> dict[str, Any]:
    """Example inputs of a decode step, fake when the model is, over a cache that grows
    with the sequence in every layer (a prefill of ``cached`` tokens)."""
    model, config = loaded.model, loaded.config
    vocab = int(getattr(config, "vocab_size", 100) or 100)
    mode = eager_forwards(loaded)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(3, vocab - 1), vocab, (BATCH, cached + NEW_TOKENS), generator=generator)
    with mode, torch.no_grad():
        ids = ids.clone()  # fake when the model is
        mask = torch.ones(BATCH, cached + NEW_TOKENS, dtype=torch.int64)
        # a sliding layer's cache grows too: the window is in the mask (sliding_window.py)
        cache = growing_cache(config)
        try:
            prefill = model(input_ids=ids[:, :cached], attention_mask=mask[:, :cached], use_cache=True,
                            **({cache_argument(model): cache} if cache is not None else {}))
        except (UnsupportedTaskError, UnsupportedArchitectureError):  # export-hf's own refusal, from its mask patches
            raise
        # the model's own failure, whatever its class, is the cause named (Blt's cache built from a
        # config without layers: an AttributeError in transformers 5.24)
        except Exception as own:  # noqa: BLE001
            raise own_forward_refusal(
                model, config.model_type, f"the prefill its decode step is captured after ({cached} tokens with use_cache=True)", own,
                "Check that the config's sizes are those its cache is built for, or export it with fx2onnx.dynamo_export.",
            ) from own
        inputs: dict[str, Any] = {"input_ids": ids[:, cached:], "attention_mask": mask}
        if "position_ids" in inspect.signature(model.forward).parameters:
            positions = torch.arange(cached, cached + NEW_TOKENS, dtype=torch.int64)
            inputs["position_ids"] = positions.unsqueeze(0).expand(BATCH, -1).contiguous()
        state = output_cache(prefill)
        if not _feedable(state):
            raise UnsupportedTaskError(
                f"{type(model).__name__} ({config.model_type}) keeps its decoding state in a {type(state).__name__}, "
                "which is neither a transformers Cache nor a list of tensors: export-hf cannot make it the inputs and "
                "outputs of a decode step. No folder was written. Export it with fx2onnx.dynamo_export."
            )
        outside = tensors_outside_layers(state) if is_cache_type(type(state)) and not is_encoder_decoder_cache_type(type(state)) else []
        if outside:  # MiniMax's linear-attention states, kept beside the cache's layers
            raise UnsupportedTaskError(
                f"{type(model).__name__} ({config.model_type}) keeps part of its decoding state outside its cache's "
                f"layers ({type(state).__name__}.{', '.join(outside)}): a decode step's inputs and outputs are the "
                "cache's layers, so that state would be frozen into the folder's model as constants. No folder was "
                "written. Tasks of one pass without a cache (text-classification, token-classification, "
                "question-answering) export this model."
            )
        inputs[cache_argument(model)] = state
    return inputs


def decode_step_options(inputs: dict[str, Any], options: fx2onnx.ExportOptions) -> fx2onnx.ExportOptions:
    """``options`` for the capture of the decode step on ``inputs``: with every dim dynamic
    asked, every dim but those of size 1. The step's example has 2 rows, 3 new tokens and 5
    cached ones, so a dim of 1 is the model's own size (Kimi-Linear's and multi-query
    attention's one key/value head), which the capture takes as static at once."""
    if options.dynamic_shapes is not True:
        return options
    return dataclasses.replace(options, dynamic_shapes=dims_dynamic_but_ones(inputs))


def _feedable(state: Any) -> bool:
    """Whether a decode step can take ``state`` as inputs: a transformers Cache, or a list of tensors (RWKV's);
    None (no state at all) is left to the export to say."""
    if state is None:
        return True
    if isinstance(state, (list, tuple)):
        return all(isinstance(part, torch.Tensor) for part in state)
    return is_cache_type(type(state))


def decoder_sizes(config: Any) -> Any:
    """The config that gives the decoder's sizes (vocabulary, width, heads): the model's
    own, or the one the model nests its decoder's in (Fuyu's `text_config`,
    `EncoderDecoderModel`'s `decoder`)."""
    return layers_config(config)


def encoder_output(hidden_states: torch.Tensor, frames_mask: torch.Tensor | None = None) -> Any:
    """An encoder's output as an encoder-decoder's forward takes it (`encoder_outputs=`),
    read by index or by name: transformers' output with every field an encoder returns
    left None (the router logits of a mixture-of-experts encoder, NllbMoe's), but the mask
    of its output frames a speech encoder returns (Moonshine's, Cohere ASR's) where given
    (None: no padding)."""
    output = _encoder_output_class()(last_hidden_state=hidden_states)
    if frames_mask is not None:
        output["attention_mask"] = frames_mask
    return output


@functools.cache
def _encoder_output_class() -> type:
    from transformers.modeling_outputs import MoEModelOutput

    class EncoderOutput(MoEModelOutput):
        """MoEModelOutput whose fields of other encoders' outputs read as None."""

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):
                raise AttributeError(name)
            return None

    return EncoderOutput


def codebooks(config: Any) -> int | None:
    """The number of audio codebooks whose tokens each of the decoder's sequences stacks
    (Musicgen's `num_codebooks`: `input_ids` rows are batch x codebooks, its mask's and
    cache's rows the batch); None for a decoder of one token stream."""
    count = getattr(decoder_sizes(config), "num_codebooks", None)
    return int(count) if isinstance(count, int) and count > 1 else None


def head_size(config: Any) -> int:
    explicit = getattr(config, "head_dim", None)
    return int(explicit) if explicit else int(config.hidden_size) // int(config.num_attention_heads)


def attends_causally(config: Any) -> bool:
    """Whether every layer's attention is causal over all the tokens `attention_mask`
    holds: no sliding window, chunked attention or ALiBi bias in the mask (read from the
    decoder's own config: a multimodal model's text config)."""
    config = decoder_sizes(config)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types) and not getattr(config, "alibi", False)
    window_used = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    chunked = getattr(config, "attention_chunk_size", None) is not None
    return not (window_used or chunked or getattr(config, "alibi", False))
