"""A multimodal checkpoint's language model alone, as a text-generation folder (`--text-only`).

A model with vision or audio encoders exported as text-generation leaves them out: the
folder then answers text prompts only. That happens only when asked (`text_only`), and
the export says which parts were left out. The language model is the checkpoint's own:

- a model transformers loads as a causal LM itself (Phi-4-multimodal, whose encoders only
  feed its embeddings) is loaded so;
- a model with a `text_config` (LLaVA, Mistral 3, Idefics3, SmolVLM, Qwen2-VL, Gemma 3,
  ...) gives its decoder and head to the causal LM class of its text config, the
  weights staying the ones of the loaded model. Qwen2-VL's text config has no causal LM
  class; its decoder takes 2-D positions as Qwen2's does (the three mRoPE axes equal), so
  it runs under Qwen2's. PaliGemma's language model attends both ways over the prompt:
  it has no text-only folder.

Git's language model widens its 2-D mask by the image tokens it expects at the start of
a non-empty cache (`cached_image_tokens`); a text-only folder's cache holds none, so its
decoder is captured widening by none (`no_cached_image_tokens`), and `--verify` compares
a padded batch with transformers' rows alone (`BATCH_ROWS_UNPADDED`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fx2onnx.hub.tasks import CAUSAL_LM_MAPPING, has_class_for

# config attributes of the parts a text-generation folder leaves out -> what they are
NON_TEXT_PARTS = {"vision_config": "vision encoder", "audio_config": "audio encoder", "speech_config": "speech encoder"}
_ARTICLES = {"vision encoder": "a", "audio encoder": "an", "speech encoder": "a"}
# text configs without a causal LM class -> the model type whose causal LM runs their decoder
_CAUSAL_LM_TWINS = {"qwen2_vl_text": "qwen2"}
TEXT_ONLY_HINT = "--text-only"


class PartsLeftOutError(ValueError):
    """A text-generation export of a model with encoders that the folder would leave out, not asked for."""


def left_out_parts(config: Any) -> list[str]:
    """The encoders of ``config`` that a text-generation folder does not hold."""
    return [what for attribute, what in NON_TEXT_PARTS.items() if getattr(config, attribute, None) is not None]


def _causal_lm_type(text_config: Any) -> str | None:
    model_type = getattr(text_config, "model_type", None)
    model_type = _CAUSAL_LM_TWINS.get(model_type, model_type)
    return model_type if has_class_for(model_type, CAUSAL_LM_MAPPING) else None


def can_export_text_only(config: Any) -> bool:
    """Whether `--text-only` finds a causal LM for ``config``'s language model."""
    text_config = getattr(config, "text_config", None)
    if text_config is not None:
        return _causal_lm_type(text_config) is not None and not _prefix_lm(text_config)
    return has_class_for(getattr(config, "model_type", None), CAUSAL_LM_MAPPING)


def _prefix_lm(text_config: Any) -> bool:
    """A language model whose prompt attends both ways (PaliGemma's, which also counts
    positions from 1): not a causal LM's answer alone."""
    return bool(getattr(text_config, "use_bidirectional_attention", False))


def command_hint(config: Any) -> str:
    """The sentence of a refusal that names what works for ``config``."""
    text_config = getattr(config, "text_config", None)
    if text_config is not None and _prefix_lm(text_config):
        return (
            "Its language model attends both ways over the prompt, which no text-generation folder reproduces, so "
            "export-hf has no folder for it: export its modules with fx2onnx.dynamo_export."
        )
    if can_export_text_only(config):
        return (
            f"Give {TEXT_ONLY_HINT} to export its language model alone (a text-generation folder for ONNX Runtime GenAI "
            "that takes text only)."
        )
    return "Its language model has no causal LM class in transformers either: export its modules with fx2onnx.dynamo_export."


def check_parts_kept(config: Any, architecture: str) -> None:
    """A `PartsLeftOutError` when a text-generation folder of ``config`` would leave encoders out."""
    parts = left_out_parts(config)
    if parts:
        raise PartsLeftOutError(
            f"{architecture} ({config.model_type}) has {' and '.join(f'{_ARTICLES[p]} {p}' for p in parts)}, which a "
            f"text-generation folder leaves out. Nothing was written. {command_hint(config)}"
        )


def text_config_of(config: Any) -> Any:
    """The config a text-only folder is written for: the text config where the model has one."""
    text_config = getattr(config, "text_config", None)
    if text_config is None:
        return config
    twin = _CAUSAL_LM_TWINS.get(text_config.model_type)
    if twin is None:
        return text_config
    from transformers import AutoConfig

    fields = {k: v for k, v in text_config.to_dict().items() if k not in ("model_type", "architectures")}
    if isinstance(fields.get("rope_parameters"), dict):  # the mRoPE sections: one axis when the three are equal
        fields["rope_parameters"] = {k: v for k, v in fields["rope_parameters"].items() if k != "mrope_section"}
    return AutoConfig.for_model(twin, **fields)


def language_model(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """The causal LM of ``config``'s text config (`text_config_of`) made of ``model``'s own
    decoder and head: its weights are ``model``'s tensors."""
    from transformers import AutoModelForCausalLM

    text_config = text_config_of(config)
    with torch.device("meta"):  # the shell's own layers are replaced below
        causal = AutoModelForCausalLM.from_config(text_config)
    causal.model = model.get_decoder()
    causal.lm_head = model.get_output_embeddings()
    causal.generation_config = model.generation_config
    causal.config.architectures = [type(causal).__name__]
    left = [name for name, tensor in [*causal.named_parameters(), *causal.named_buffers()] if tensor.is_meta]
    if left:
        raise NotImplementedError(
            f"{type(causal).__name__} has parts other than its decoder and head ({', '.join(left[:3])}): "
            f"{type(model).__name__}'s language model cannot be exported alone; export it with fx2onnx.dynamo_export."
        )
    return causal.eval()


# the attribute with which a language model widens a 2-D mask over the image tokens it
# expects at the start of a non-empty cache (Git's attention: its image's patches and class token)
_CACHED_IMAGE_TOKENS = "image_patch_tokens"
BATCH_ROWS_UNPADDED = (
    "the batch's rows are compared with transformers' generation of each row alone, unpadded: {name}'s decode step "
    "widens a 2-D attention mask by the {tokens} image tokens it expects at the start of its cache, which holds none "
    "without an image, so transformers shifts a left-padded row's padding onto its real tokens (a padded row then "
    "differs from the same row alone); the folder's decoder, captured with no image tokens, sees each row's own tokens"
)


def cached_image_tokens(model: torch.nn.Module) -> int:
    """How many image tokens ``model`` widens a 2-D mask by once its cache is not empty
    (0 for a language model that does not)."""
    return max((int(getattr(m, _CACHED_IMAGE_TOKENS)) for m in model.modules() if hasattr(m, _CACHED_IMAGE_TOKENS)),
               default=0)


@contextlib.contextmanager
def no_cached_image_tokens(model: torch.nn.Module) -> Iterator[None]:
    """Within this context, ``model``'s decode step widens its mask by no image tokens:
    a text-only folder's cache holds the text's tokens only."""
    modules = [m for m in model.modules() if hasattr(m, _CACHED_IMAGE_TOKENS)]
    kept = [getattr(m, _CACHED_IMAGE_TOKENS) for m in modules]
    for module in modules:
        setattr(module, _CACHED_IMAGE_TOKENS, 0)
    try:
        yield
    finally:
        for module, value in zip(modules, kept):
            setattr(module, _CACHED_IMAGE_TOKENS, value)
