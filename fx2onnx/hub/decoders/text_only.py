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
"""

from __future__ import annotations

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
