"""What export-hf reads of an audio language model, found in transformers' own hooks rather
than per architecture: the model's `get_audio_features` (audio inputs -> the projected
embeddings, `pooler_output`), the audio token its forward replaces by them in order
(`config.audio_token_id`), and the language model and LM head the vision-language decoder
wraps (`model.model.language_model`, `model.lm_head`). A model whose hooks differ is refused
with what differs, before anything is written."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fx2onnx.hub.audio_language.own_features import OWN_FEATURES
from fx2onnx.hub.audio_language.tower_lengths import counts_output_lengths, tower_output_lengths
from fx2onnx.hub.audio_language.transformers_js_audio import not_written
from fx2onnx.hub.tasks import UnsupportedArchitectureError

# the tensors a `get_audio_features` may take, as the audio encoder's inputs (the processors' names)
AUDIO_INPUTS = ("input_features", "input_features_mask", "feature_attention_mask", "input_values", "padding_mask")
# the prompt's token ids, which a `get_audio_features` may read to find each clip's run of audio tokens
# (MusicFlamingo's rotary time embedding): the encoder takes as many audio tokens as its tower's output
# lengths (`audio_tower._get_feat_extract_output_lengths`) count
PROMPT = "input_ids"
# arguments the encoder is captured with where the model's default is a training-time choice:
# `sample` adds random noise to the latents (a sigma-VAE's), off for a deterministic encoder
DETERMINISTIC_ARGUMENTS = {"sample": False}


@dataclass(frozen=True)
class AudioHooks:
    """An audio language model's hooks.

    Attributes:
        audio_token_id: the prompt's placeholder token whose rows take the audio features in order.
        inputs: the tensors `get_audio_features` takes (of AUDIO_INPUTS), in its order.
        fixed: the other arguments it is called with (DETERMINISTIC_ARGUMENTS it takes).
        compute: (model, audio inputs) -> the projected embeddings, for an architecture
            whose model has no `get_audio_features` or one torch.export cannot capture
            (own_features.py), else None.
    """

    audio_token_id: int
    inputs: tuple[str, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    compute: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor] | None = None

    def features(self, model: torch.nn.Module, audio: dict[str, torch.Tensor]) -> torch.Tensor:
        """``model``'s audio features of ``audio`` as rows [features, hidden], in the order
        the audio tokens take them."""
        given = {name: audio[name] for name in self.inputs}
        if self.compute is not None:
            embeds = self.compute(model, given)
        else:
            embeds = model.model.get_audio_features(**given, **self.fixed, return_dict=True).pooler_output
        return embeds.reshape(-1, embeds.shape[-1])


def audio_token_ids(model: torch.nn.Module, hooks: AudioHooks, audio: dict[str, torch.Tensor]) -> torch.Tensor:
    """For an encoder that reads the prompt: each clip's run of audio tokens [clips, tokens],
    as many as its tower's output lengths of the frames its mask keeps."""
    mask = next(audio[name] for name in ("input_features_mask", "feature_attention_mask") if name in audio)
    lengths = tower_output_lengths(model.model.audio_tower, mask.sum(-1).to(torch.long))[-1]
    return torch.full((mask.shape[0], int(lengths.max())), hooks.audio_token_id, dtype=torch.long)


def _refusal(model: torch.nn.Module, cause: str) -> UnsupportedArchitectureError:
    config = model.config
    return UnsupportedArchitectureError(
        f"{type(model).__name__} ({config.model_type}) cannot be written as an audio-text-to-text folder: {cause} "
        "export-hf writes this folder from transformers' hooks: `model.model.get_audio_features` giving the "
        "projected audio embeddings as `pooler_output`, `config.audio_token_id` whose tokens take them in order, "
        "and `model.model.language_model` with `model.lm_head`. Nothing was written."
    )


def audio_hooks(model: torch.nn.Module) -> AudioHooks:
    """The hooks of ``model``; an UnsupportedArchitectureError (a NotImplementedError) naming
    what differs for a model that has them otherwise."""
    layout = not_written(getattr(model.config, "model_type", None))
    if layout is not None:  # Transformers.js loads another layout for it
        raise _refusal(model, layout)
    inner = getattr(model, "model", None)
    get_features = getattr(inner, "get_audio_features", None)
    own = OWN_FEATURES.get(getattr(model.config, "model_type", None))
    if get_features is None and own is None:
        raise _refusal(model, "its model has no get_audio_features (its forward computes the audio features inline).")
    config = model.config
    token = getattr(config, "audio_token_id", None)
    if token is None:
        cause = ("its config has no audio token (audio_token_id): its audio embeddings do not replace placeholder tokens "
                 "of the prompt." if not hasattr(config, "audio_token_id") else
                 "its config.json sets no audio_token_id; set the checkpoint's audio token id in it.")
        raise _refusal(model, cause)
    if not hasattr(inner, "language_model") or not hasattr(model, "lm_head"):
        raise _refusal(model, "it has no model.language_model and lm_head.")
    if own is not None:
        return AudioHooks(int(token), own.inputs, compute=own.compute)
    inputs, fixed = [], {}
    for name, parameter in inspect.signature(get_features).parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        if name in AUDIO_INPUTS:
            inputs.append(name)
        elif name in DETERMINISTIC_ARGUMENTS:
            fixed[name] = DETERMINISTIC_ARGUMENTS[name]
        elif name == PROMPT and counts_output_lengths(getattr(inner, "audio_tower", None)):
            inputs.append(name)  # the audio tokens' runs, as many tokens as the tower's output lengths
        elif parameter.default is inspect.Parameter.empty:
            raise _refusal(model, f"its get_audio_features takes `{name}`, which is no audio input "
                                  f"({', '.join(AUDIO_INPUTS)}): its features depend on more than the audio.")
    if not any(name in ("input_features", "input_values") for name in inputs):
        raise _refusal(model, "its get_audio_features takes neither input_features nor input_values.")
    return AudioHooks(int(token), tuple(inputs), fixed)
