"""Every task `export-hf` serves against every architecture transformers files under it.

For each task and each class of transformers' auto mapping for it, a tiny model is built
from the architecture's own config class (sizes shrunk: 2 layers, width 32, vocabulary
100, images of 64 pixels; random weights, those a model initialises to zeros
made random too, so that no tie decides a router; nothing downloaded), saved, and

- exported with `export_hf(..., verify=True)`: the folder's model in onnxruntime against
  transformers (`--verify`'s tolerance: rtol 1e-3, atol 1e-4; a decoder's 16 greedy
  tokens equal as well); a multimodal class export-hf refuses for text generation for the
  encoders the folder leaves out is exported with `--text-only` (the record's "option");
- exported with `torch.onnx.export(..., dynamo=True)` on the same module and the same
  example inputs (every dim `Dim.AUTO`), its outputs compared in onnxruntime the same way
  on both input sizes (decoders: the logits of the prompt without a cache).

The generative multimodal tasks (image-text-to-text; speech-seq2seq, export-hf's speech
recognition by an encoder-decoder) are exported with export-hf's recipe and checked by its
`--verify` of the whole folder; their tiny models get their model type's feature extractor
and image processor, and towers fitted to the shrunk sizes (`_fit_towers`); torch.onnx is
not compared on them (several models, no single module: `UNCOMPARED`), nor on text-to-audio,
whose model draws noise on every run (`RANDOM_OUTPUTS`: export-hf verifies its twin without noise).

The pairs of text generation, text and token classification, question answering,
fill-mask, image classification and sequence-to-sequence come first, in turn (each task's
in a fixed shuffled order), then the other tasks'. A config that refuses the smallest
sizes, or whose forward fails on them, has the widths that depend on them follow them, or
is shrunk less (`SHRINK_LEVELS`). Each pair runs in a child process forked from this
one (the libraries already imported) with a time limit, so that a crash or a hang stops
only that pair; it records exported or the error's cause (its class and first line, the
library that raised it, its class of failure: `CATEGORIES`), the largest difference, the
export time, the peak memory the child added and the node count. Results are appended to
a JSON lines file (a pair already there is not run again, unless `--retry` names its class
of failure or `--architectures` its architecture); `--torch-onnx-only` runs torch.onnx.export's
side alone of the recorded pairs whose comparison is not measured, appending each as the pair's
export-hf record with the new comparison. `--report` (after a sweep) or `--write-docs` (alone) writes the scoreboard,
docs/scoreboard.md, from it: dated, with the versions, failures grouped by class and cause; and each export-hf task
page's table of its architectures (docs/guides/export-hf/, bench/task_pages.py).

    OMP_NUM_THREADS=1 flock /tmp/fx2onnx-heavy.lock python bench/architecture_sweep.py \\
        [--tasks text-classification,fill-mask] [--limit 300] [--retry "time limit"] \\
        [--architectures FSMTForConditionalGeneration,MvpForConditionalGeneration] [--torch-onnx-only] [--report]
    python bench/architecture_sweep.py --write-docs
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fx2onnx  # noqa: E402
from fx2onnx.hub import export_hf  # noqa: E402

# task -> the auto mappings whose classes the sweep builds for it
TASK_MAPPINGS = {
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",),
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    "text2text-generation": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",),
    "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",),
    "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",),
    "image-segmentation": (
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES",
        "MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES", "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES",
    ),
    "depth-estimation": ("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",),
    "automatic-speech-recognition": ("MODEL_FOR_CTC_MAPPING_NAMES",),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",),
    "zero-shot-image-classification": ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    "feature-extraction": ("MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",),
    "text-to-audio": ("MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",),
    # the generative multimodal tasks: vision-language models (vision encoder-decoders too: transformers
    # files them here) and speech recognition by an encoder-decoder (Whisper-style)
    "image-text-to-text": ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
    "speech-seq2seq": ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",),
}
# a sweep task that export-hf names otherwise: speech recognition by an encoder-decoder is export-hf's
# automatic-speech-recognition as well, swept apart from the CTC encoders the sweep files under that name
EXPORT_TASKS = {"speech-seq2seq": "automatic-speech-recognition"}
# the tasks whose folder is several models (encoders, embedding, decoder with its cache), checked by
# export-hf's own verification of the folder: torch.onnx.export has no one module to compare, and why
UNCOMPARED = {
    "image-text-to-text": "a folder of several models (vision encoder, token embedding, decoder with its cache), "
                          "verified as a whole by export-hf: no single module to compare",
    "speech-seq2seq": "a folder of several models (audio encoder, decoder with its cache), verified as a whole "
                      "by export-hf: no single module to compare",
}
# the tasks whose model draws noise on every run: two exports' outputs are not comparable, and why
RANDOM_OUTPUTS = {
    "text-to-audio": "the model draws noise (VITS's noise scales): its waveform and length differ from run to run; "
                     "export-hf's --verify compares a twin without noise",
}

VOCAB = 100
SMALL = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=128, n_embd=32, n_layer=2, n_head=4, n_positions=128,
    d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, ffn_dim=64,
    word_embed_proj_dim=32, num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0, n_inner=64, embed_dim=32,
    image_size=64, num_labels=3, projection_dim=16, num_queries=10, num_detection_tokens=5,
    unpadded_vocab_size=VOCAB,  # the rows of a head padded to vocab_size (Inkling2): within it
    # a latent array's width, length and depth (Perceiver); one cross-attention head, as released,
    # since its query/key width is the input's channels (261 for Fourier features), odd
    d_latents=32, num_latents=16, num_self_attends_per_block=2, num_cross_attention_heads=1,
    num_dense_layers=1,  # a mixture of experts' leading dense layers: one, so that a shrunk depth keeps an expert layer
    # LongCat-Flash's names for its widths and experts (its zero experts return their input)
    ffn_hidden_size=64, expert_ffn_hidden_size=32, n_routed_experts=4, moe_topk=2, zero_expert_num=2,
    # an audio language model's placeholder token, within the vocabulary (Voxtral's config sets none)
    audio_token_id=VOCAB - 1, audio_token_index=VOCAB - 1,
)
# a pair's outputs are exact when every element is within |a - b| <= ATOL + RTOL * |b|
RTOL, ATOL = fx2onnx.ExportOptions.verify_rtol, fx2onnx.ExportOptions.verify_atol


def own_model_type(class_name: str, model_types: list[str]) -> str:
    """Of the model types transformers files ``class_name`` under (GPT2LMHeadModel under
    ``gpt2`` and ``gpt-sw3``, LlamaForCausalLM under ``llama``, ``exaone`` and others), the
    one of the class's own config class, which clients know it by; else the first."""
    if len(model_types) > 1:
        import transformers

        config_class = getattr(getattr(transformers, class_name, None), "config_class", None)
        own = getattr(config_class, "model_type", None)
        if own in model_types:
            return own
    return model_types[0]


def pairs_of(task: str) -> list[tuple[str, str]]:
    """(model type, class name) of every class transformers files under ``task``."""
    from transformers.models.auto import modeling_auto

    candidates: dict[str, list[str]] = {}
    for mapping in TASK_MAPPINGS[task]:
        for model_type, classes in getattr(modeling_auto, mapping, {}).items():
            for name in (classes,) if isinstance(classes, str) else classes:
                candidates.setdefault(name, []).append(model_type)
    found = {name: own_model_type(name, types) for name, types in candidates.items()}
    if task == "text-generation":
        # a causal LM transformers files under image-text-to-text alone (Mistral4ForCausalLM), which
        # export-hf's default task makes text generation where its config has no encoder
        for model_type, name in pairs_of("image-text-to-text"):
            if name.endswith("ForCausalLM"):
                found.setdefault(name, model_type)
    return sorted((model_type, name) for name, model_type in found.items())


# what a second and a third try at a tiny model shrink, when a config refuses SMALL whole
# (a width it derives from another, heads that must divide a width): the widths kept, then
# the depth, the vocabulary and the labels alone
_HEADS = {"num_attention_heads", "num_key_value_heads", "head_dim", "num_heads", "n_head", "d_kv",
          "encoder_attention_heads", "decoder_attention_heads", "num_cross_attention_heads"}
_DEPTH = {"num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "vocab_size",
          "unpadded_vocab_size", "num_labels", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
          "num_local_experts", "num_experts", "num_experts_per_tok", "num_dense_layers"}
SHRINK_LEVELS = {
    "small": frozenset(SMALL), "derived": frozenset(SMALL), "heads kept": frozenset(SMALL) - _HEADS,
    "depth only": frozenset(_DEPTH),
}
# the levels whose other widths follow the shrunk ones (`_derived_values`)
DERIVED_LEVELS = frozenset({"derived"})
# the config's width, its heads, and the widths sized per head (they shrink with the head's size)
_WIDTHS = ("hidden_size", "n_embd", "d_model", "embed_dim")
_HEAD_COUNTS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
_PER_HEAD = re.compile(r"^(head_dim|.*_head_dim|rotary_dim|.*_rank)$")
# sizes a config may leave None although its model reads them as numbers
# (the head's size for head_dim)
_NONE_FILLED = {
    "head_dim": None, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1,
}
# counts that divide the heads (key/value heads, state-space groups): they keep their ratio to them
_HEAD_GROUPS = ("num_key_value_heads", "n_groups")
# the most parameters a tiny model may have when only its depth is shrunk
_MOST_PARAMETERS = 20_000_000
# values every checkpoint of a model type sets and its config class leaves None although
# its model reads them (LFM2-MoE's layer kinds: its checkpoints list convolutions and attention)
# Granite Speech's default config sizes its projector for another encoder width (1408, the encoder's 1024)
_GRANITE_SPEECH = {"encoder_config": {"hidden_dim": 32, "dim_head": 8}, "projector_config": {"encoder_hidden_size": 32}}
# VibeVoice's speech tokenizers (convolutions doubling 32 filters over 6 stages, 3 to 8 blocks each: 0.7B
# parameters the generic shrink does not reach): one block a stage, 4 filters
_VIBEVOICE_TOKENIZER = {"depths": [1] * 7, "num_filters": 4}
_CHECKPOINT_VALUES = {
    "lfm2_moe": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
    # Jamba's checkpoints put an attention layer in every period of Mamba layers (1 in 8, at 4),
    # which two layers would not reach: a period of 2, its attention layer second
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # Nemotron's config leaves its key/value heads None, which its attention divides by (Minitron's: 8)
    "nemotron": {"num_key_value_heads": 8},
    "granite_speech": _GRANITE_SPEECH, "granite_speech_plus": _GRANITE_SPEECH,
    "vibevoice_asr": {"acoustic_tokenizer_encoder_config": _VIBEVOICE_TOKENIZER,
                      "semantic_tokenizer_encoder_config": _VIBEVOICE_TOKENIZER},
    # its projector's output is the language model's width, which the shrink makes 32
    "qwen3_asr": {"audio_config": {"output_dim": SMALL["hidden_size"]}},
    # xLSTMCache sizes its states with the query/key and value widths rounded up to 64, the layers with the
    # width times the factor: equal for the checkpoints (4096 x 0.5), not for a width of 32 unless its factor is 2
    "xlstm": {"qk_dim_factor": 2.0, "v_dim_factor": 2.0},
    # its checkpoints repeat two recurrent blocks and an attention one: two layers keep one of each (with
    # only recurrent ones, transformers' own generation fails on a cache without an attention layer)
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # the state-space heads must divide the state-space width (2 x the width): 8 divide the shrunk 64
    # as 128 divide the released 8192; Bamba's and Granite 4's hybrids have attention among their Mamba
    # layers (the configs' defaults have Mamba layers only)
    "bamba": {"mamba_n_heads": 8, "num_hidden_layers": 2, "attn_layer_indices": [1]},
    "granitemoehybrid": {"mamba_n_heads": 8, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    # DBRX's checkpoints give the rotary base in the attention's sub-config, which its attention reads
    # and clips its queries, keys and values at 8
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8.0}},
    # a Gemma 4 assistant's text model has no per-layer inputs, experts or double-wide MLP (its validator)
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                         "enable_moe_block": False, "use_double_wide_mlp": False}},
    # Blt's local encoder and decoder read the global transformer's width (hidden_size_global), which the
    # shrink makes 32 in the global config alone
    "blt": {"encoder_config": {"hidden_size_global": SMALL["hidden_size"]},
            "decoder_config": {"hidden_size_global": SMALL["hidden_size"]}},
    # DETR's checkpoints' ResNet backbone as transformers builds it (as timm's, which the sweep does not install)
    **{detr: {"use_timm_backbone": False} for detr in ("conditional_detr", "dab-detr", "deformable_detr",
                                                       "table-transformer")},
    # DETR's hands on every stage (its mask head reads them), as timm's backbone does
    "detr": {"use_timm_backbone": False, "backbone_config": {
        "model_type": "resnet", "out_features": ["stage1", "stage2", "stage3", "stage4"]}},
    # ALIGN's EfficientNet (its widths and depths scaled by coefficients, which the shrink leaves): a quarter
    "align": {"vision_config": {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 64}},
    # BEiT's segmentation checkpoints hand four of their layers to the segmentation head
    "beit": {"out_indices": [3, 5, 7, 11]},
    # DepthPro's encoders read patches of patch_size pixels (their image size, which its config sets to it)
    # cut from the image at a quarter, half and whole size: 32-pixel patches of 8-pixel tokens (384 of 16
    # released), so that its image is 128 pixels (1536); its patch encoder hands on its layers 1 and 0
    # ((11, 5) of 24 released, deeper first)
    "depth_pro": {"patch_size": 32, "intermediate_hook_ids": [1, 0], **{
        part: {"model_type": "dinov2", "patch_size": 8} for part in (
            "image_model_config", "patch_model_config", "fov_model_config")}},
    # Cohere Compass's checkpoints give rotary parameters per layer kind, which its rotary embedding reads
    "cohere_compass_text": {"rope_parameters": {kind: {"rope_type": "default", "rope_theta": 50000.0}
                                                for kind in ("full_attention", "sliding_attention")}},
}
# values a tiny model of a type needs that the shrink would undo, given after it: Zamba's attention
# block is one module shared by its hybrid layers (tied to the first one's), so it needs two of them
_TINY_VALUES = {
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["mamba", "hybrid", "hybrid"]},
    # Dory's layers are input, recurrent (looped over) and output layers, 8 + 20 + 8 released: one of
    # each (the shrunk depth alone leaves the input and output at 8 and the recurrent at -14)
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    # ALIGN's image embeddings are its EfficientNet's pooled features, unprojected: the texts' projection
    # has their width (8 for the EfficientNet below, its stages cut to the shrunk depth of 2)
    "align": {"projection_dim": 8},
    # EoMT's queries join the last num_blocks of its layers (4 of 24 released): the last of two
    "eomt": {"num_blocks": 1}, "eomt_dinov3": {"num_blocks": 1},
    # DETR's mask head normalises its width plus its heads in groups of 8 (256 + 8 released)
    "detr": {"encoder_attention_heads": 8, "decoder_attention_heads": 8},
    # Qwen4-Exp's config leaves its token indexer unset, which each of its attention layers builds: a
    # small one (one key head, as required; its head as wide as the shrunk rotary part; 8 tokens kept in
    # blocks of 4, fewer than a prompt and its decode steps)
    # Blt's hashed byte n-gram embeddings: 500002 rows for each of 6 group sizes (96M parameters at width
    # 32) that no shrunk size reaches; 512 rows keep every group's hash spread over its own rows
    "blt": {"encoder_hash_byte_group_vocab": 512},
    "qwen4_exp": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": SMALL["head_dim"],
                  "indexer_budget": 8, "indexer_compress_ratio": 4},
}
# a value of `_shrunk_values` that the constructor is left to derive (not given at all)
_LEFT_OUT = object()


def _shrunk_values(config: Any, keys: frozenset[str] = frozenset(SMALL)) -> dict[str, Any]:
    """The config's values of ``keys`` to give its constructor again, shrunk (sub-configs as dicts)."""
    values: dict[str, Any] = {}
    aliases = {stored: name for name, stored in getattr(type(config), "attribute_map", {}).items()
               if name in keys and stored not in keys}
    for key, current in vars(config).items():
        if hasattr(current, "to_dict") and hasattr(current, "model_type"):
            merged = {**current.to_dict(), **_shrunk_values(current, keys)}
            layers = merged.get("num_hidden_layers")
            # its to_dict also holds what it derives per layer (Gemma 4's overrides), not in vars
            values[key] = {k: v for k, v in merged.items() if v is not _LEFT_OUT
                           and not (isinstance(layers, int) and _beyond_layers(v, layers))}
            continue
        # a value stored under another name than the one the shrink knows (Kimi-Linear stores
        # num_experts_per_tok as num_experts_per_token): given under the known name
        key = key if key in keys else aliases.get(key, key)
        if key not in keys or isinstance(getattr(type(config), key, None), property):
            continue
        value = SMALL[key]
        # lists stay (hierarchical widths); numbers only ever shrink; token ids within the vocabulary
        if (key.endswith("_id") or key == "vocab_size") and (current is None or isinstance(current, int)):
            values[key] = value
        elif key.endswith("_id") and isinstance(current, list):  # several end-of-text ids (GLM, CWM): one, within
            values[key] = [value]
        elif isinstance(current, (int, float)) and not isinstance(current, bool) and current > value:
            values[key] = value
    if "kv_lora_rank" in vars(config) and vars(config).get("num_key_value_heads") == vars(config).get("num_attention_heads"):
        # a latent attention's key/value heads are its heads (its checkpoints say so; the
        # expansion of its latent keys gives one per head): they shrink together
        values["num_key_value_heads"] = values.get("num_attention_heads", vars(config).get("num_attention_heads"))
    values.update(_expert_groups(config, values))
    layers = values.get("num_hidden_layers", getattr(config, "num_hidden_layers", None))
    old_layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and isinstance(old_layers, int) and layers < old_layers:
        values.update(_per_layer_values(config, old_layers, layers, keys))
    kinds = getattr(config, "layer_types", None)
    # under the config's own name for them: a config that derives from its layer kinds
    # (Zamba2's hybrid layer ids) reads that field, not the alias set after it
    name = getattr(type(config), "attribute_map", {}).get("layer_types", "layer_types")
    read_only = isinstance(getattr(type(config), name, None), property)
    if isinstance(kinds, list) and isinstance(layers, int) and not read_only:
        values[name] = _every_kind(kinds, layers)
        shared = vars(config).get("num_kv_shared_layers")
        if isinstance(shared, int) and shared >= len(kinds):  # every layer reuses another model's (an assistant's)
            values["num_kv_shared_layers"] = len(values[name])
        elif isinstance(shared, int) and shared > 0:
            # the last layers reuse the cache of the last earlier layer of their kind (Gemma 3n):
            # each kind once to produce it, then each kind once to reuse it, as in the checkpoints
            values[name] = values[name] + values[name]
            values["num_kv_shared_layers"] = len(values[name]) // 2
        if len(values[name]) > layers:
            values["num_hidden_layers"] = len(values[name])
            values.update(_per_layer_values(config, len(kinds), len(values[name]), keys))
    # a pattern of layer kinds repeated a number of times ([[["global", "local"], 12]]) repeated
    # as often as the shrunk depth holds it, and the depth a whole number of patterns
    depth = values.get("num_layers", getattr(config, "num_layers", None))
    runs = vars(config).get("attention_types")
    if isinstance(depth, int) and isinstance(runs, list) and len(runs) == 1 and isinstance(runs[0][0], list):
        kinds = runs[0][0]
        values["attention_types"] = [[kinds, max(1, depth // len(kinds))]]
        values["num_layers"] = len(kinds) * max(1, depth // len(kinds))
    values.update(_width_followers(config, values))
    values.update(_backbone_outputs(config, values))
    return values


def _expert_groups(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """A group-limited router's groups (``n_group``, of which it keeps ``topk_group``) for
    the shrunk experts: the router views the experts as that many groups and scores each by
    its best two, so the groups must divide the experts, two or more each (AXK1's 8 groups
    of 4 experts fail its forward at every level). The most groups that do, and half of
    them kept (one of two), so that the groups still mask experts."""
    experts = values.get("n_routed_experts")
    groups, kept = vars(config).get("n_group"), vars(config).get("topk_group")
    if not isinstance(experts, int) or not isinstance(groups, int) or groups <= 1:
        return {}
    if experts % groups == 0 and experts // groups >= 2:
        return {}
    fitting = max([g for g in range(1, experts // 2 + 1) if experts % g == 0 and g <= groups] or [1])
    return {"n_group": fitting, "topk_group": max(1, min(kept if isinstance(kept, int) else 1, fitting // 2))}


# the names of a width a config derives from its own width when left unset (SigLIP's text
# projection_size is its hidden_size), or that its checkpoints set to it (RT-DETR's decoder reads
# its encoder's levels, decoder_in_channels, at its width): equal to the width, they shrink with it
_WIDTH_FOLLOWER = re.compile(r"^.*_(size|dim|channels)$")


def _width_followers(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The config's widths equal to its width (``_WIDTH_FOLLOWER``; a list of them, each),
    shrunk with it."""
    found = _first_int(config, _WIDTHS)
    if found is None or not isinstance(found[1], int) or not isinstance(values.get(found[0]), int):
        return {}
    (key, old), new = found, values[found[0]]
    followers: dict[str, Any] = {}
    for name, current in vars(config).items():
        if name in values or name == key or not _WIDTH_FOLLOWER.match(name) or isinstance(current, bool) \
                or isinstance(getattr(type(config), name, None), property):
            continue
        if current == old:
            followers[name] = new
        elif isinstance(current, (list, tuple)) and current and all(v == old and not isinstance(v, bool) for v in current):
            followers[name] = [new] * len(current)
    return followers


# the layers a backbone, or a head reading a backbone's layers, hands on (DPT's, BEiT's
# segmentation head's: four layers of 12 or 24), under its constructor's names, with the index
# of the first layer (a stage's, from 1; DPT's hidden states past the embeddings', from 0)
_OUT_INDICES = {"_out_indices": ("out_indices", 1), "out_indices": ("out_indices", 1),
                "backbone_out_indices": ("backbone_out_indices", 0)}


def _backbone_outputs(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The layers a backbone hands on, when its shrunk depth no longer holds them: as many,
    its last ones (the depth kept at least that many), the stage names left for its
    constructor to derive from the depth."""
    depth = values.get("num_hidden_layers")
    if not isinstance(depth, int):
        return {}
    given = {(name, first): list(v) for key, (name, first) in _OUT_INDICES.items()
             if isinstance(v := vars(config).get(key), (list, tuple)) and v and all(isinstance(i, int) for i in v)}
    if not any(max(indices) > depth - 1 + first for (_, first), indices in given.items()):
        return {}
    depth = max([depth, *map(len, given.values())])
    shrunk: dict[str, Any] = {name: list(range(depth - len(indices) + first, depth + first))
                              for (name, first), indices in given.items()}
    return {**shrunk, "num_hidden_layers": depth, "out_features": _LEFT_OUT, "stage_names": _LEFT_OUT}


def _per_layer_values(config: Any, old_layers: int, layers: int, keys: frozenset[str]) -> dict[str, Any]:
    """The config's values given per layer, for a depth shrunk from ``old_layers`` to ``layers``:
    a list with one entry per layer (Gemma 3n's widths) keeps its first ``layers`` entries,
    shrunk like the value they stand for; a dict keyed by layer index (Gemma 4's overrides of
    its global layers) is left out, for the constructor to derive again from the layer kinds."""
    values: dict[str, Any] = {}
    for key, current in vars(config).items():
        if key == "layer_types" or isinstance(getattr(type(config), key, None), property):
            continue
        if isinstance(current, list) and len(current) == old_layers:
            small = SMALL.get(key) if key in keys else None
            values[key] = [min(v, small) if isinstance(v, int) and isinstance(small, int) else v
                           for v in current[:layers]]
        elif _beyond_layers(current, layers):
            values[key] = _LEFT_OUT
    return values


def _beyond_layers(value: Any, layers: int) -> bool:
    """Whether ``value`` is a dict keyed by layer index naming a layer past ``layers``."""
    return isinstance(value, dict) and bool(value) and all(
        isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in value) and max(map(int, value)) >= layers


def _every_kind(kinds: list[Any], layers: int) -> list[Any]:
    """The first ``layers`` of a config's layer kinds, or, when they leave a kind out (a
    hybrid whose attention comes after its first convolutions), the first layer of each
    kind in their order: a tiny model keeps every kind of layer its cache and masks serve."""
    if set(map(str, kinds[:layers])) == set(map(str, kinds)):
        return kinds[:layers]
    firsts = sorted({str(kind): index for index, kind in reversed(list(enumerate(kinds)))}.values())
    chosen = [kinds[index] for index in firsts]
    return chosen + kinds[: max(layers - len(chosen), 0)]


def _first_int(config: Any, names: tuple[str, ...]) -> tuple[str, Any] | None:
    for name in names:
        value = vars(config).get(name)
        if isinstance(value, int) and not isinstance(value, bool) or (
                isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value)):
            return name, value
    return None


def _derived_values(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (shrunk) with the widths that depend on them following: the width a multiple
    of the first stage's heads, the key/value heads in their ratio to the heads (equal when
    equal: latent attentions and validators require it), every width sized per head (head,
    rotary, latent ranks) scaled by the ratio of the head's size, and the sizes the config
    leaves None filled; sub-configs likewise."""
    # the architecture's own image size: its patches, windows and stages are sized for it
    derived = {k: v for k, v in values.items() if k != "image_size"}
    for key, value in values.items():
        current = vars(config).get(key)
        if isinstance(value, dict) and hasattr(current, "to_dict"):
            derived[key] = {**value, **_derived_values(current, {k: v for k, v in value.items() if k in SMALL})}
    width, heads = _first_int(config, _WIDTHS), _first_int(config, _HEAD_COUNTS)
    if width is None or heads is None or isinstance(width[1], (list, tuple)):
        return derived
    (width_key, old_width), (heads_key, old_heads) = width, heads
    first_heads = old_heads[0] if isinstance(old_heads, (list, tuple)) else derived.get(heads_key, old_heads)
    for key in _WIDTHS:  # every width a multiple of the heads (hierarchical models name two)
        if isinstance(derived.get(key), int):
            derived[key] = -(-derived[key] // first_heads) * first_heads
    new_width = derived.get(width_key, old_width)
    new_heads = derived.get(heads_key, old_heads)
    for key in _HEAD_GROUPS:
        groups = vars(config).get(key)
        if isinstance(new_heads, int) and isinstance(old_heads, int) and isinstance(groups, int) and groups > 0:
            derived[key] = max(1, new_heads * groups // old_heads)
    old_head_size = old_width / (old_heads[0] if isinstance(old_heads, (list, tuple)) else old_heads)
    new_head_size = new_width / first_heads
    for key, current in vars(config).items():
        if _PER_HEAD.match(key) and isinstance(current, int) and not isinstance(current, bool) and current > 0:
            derived[key] = max(2, 2 * round(current * new_head_size / old_head_size / 2))
        elif key in _NONE_FILLED and current is None and not isinstance(getattr(type(config), key, None), property):
            derived[key] = _NONE_FILLED[key] or max(2, int(new_head_size))
    return derived


def _forward_defaults(config: Any) -> None:
    """Choices a model's forward needs and the config leaves unset: the default among the
    languages the config lists (the model refuses input in no language)."""
    languages = getattr(config, "languages", None)
    if getattr(config, "default_language", "") is None and languages:
        config.default_language = list(languages)[0]


def small_config(model_type: str, class_name: str, keys: frozenset[str] = frozenset(SMALL), derive: bool = False,
                 multimodal: bool = False) -> Any:
    """The architecture's config class, built again with shrunk sizes (so that what its
    constructor derives from them, backbone stages or layer types, follows); with ``derive``,
    the widths that depend on the shrunk ones follow them as well (`_derived_values`)."""
    import transformers

    # the class's own config class where the model type's is another (a text model of a
    # multimodal type: Qwen3.5's causal LM reads a text config)
    config_class = getattr(getattr(transformers, class_name, None), "config_class", None)
    if config_class is not None and getattr(config_class, "model_type", None) == model_type:
        make = config_class  # its default may fail its own validator (Gemma 4's assistant): not built
    else:
        default = transformers.AutoConfig.for_model(model_type)
        make = config_class if config_class is not None and not isinstance(default, config_class) else type(default)
    config = make(**_CHECKPOINT_VALUES.get(model_type, {}))
    values = _shrunk_values(config, keys)
    values = {k: v for k, v in values.items() if v is not _LEFT_OUT}
    config = make(**{**_CHECKPOINT_VALUES.get(model_type, {}), **(_derived_values(config, values) if derive else values),
                     **_TINY_VALUES.get(model_type, {})})
    _forward_defaults(config)
    if multimodal:
        _fit_towers(config)
    config.architectures = [class_name]
    _composite_token_ids(config)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # an encoder-decoder's checkpoints name the decoder's first token (T5's is the padding token);
        # its heads that shift the labels right (T5ForQuestionAnswering) read it from the config
        config.decoder_start_token_id = getattr(config, "pad_token_id", None)  # None for a detector (DETR)
    if (class_name.endswith(("ForCausalLM", "Decoder")) or _wants_a_decoder(class_name)) and getattr(
            config, "is_decoder", None) is False:
        # an encoder's causal-LM head (BERT-like, BertGenerationDecoder, Reformer's) is a decoder only when told
        config.is_decoder = True
    return config


def _composite_token_ids(config: Any) -> None:
    """A composite encoder-decoder's token ids on its own config, in place, as its released checkpoints
    set them (SpeechEncoderDecoderModel's, VisionEncoderDecoderModel's: the decoder's padding, end of
    text, and its start of text as the decoder's first token): its config class sets none, and
    generation and the export read them there."""
    decoder = vars(config).get("decoder")
    if not (hasattr(decoder, "to_dict") and hasattr(vars(config).get("encoder"), "to_dict")):
        return
    start = decoder.bos_token_id if getattr(decoder, "bos_token_id", None) is not None else decoder.pad_token_id
    for name, value in (("pad_token_id", decoder.pad_token_id), ("eos_token_id", getattr(decoder, "eos_token_id", None)),
                        ("decoder_start_token_id", start)):
        if getattr(config, name, None) is None:
            setattr(config, name, value)


# a tiny vision tower's patches per side of its (shrunk) image: 16, the 256 image tokens a runtime's
# processor may put per image (Gemma 3's), pooled to fewer where the projector pools
PATCHES_PER_SIDE = 16


def _sub_configs(config: Any) -> list[Any]:
    return [config] + [value for value in vars(config).values() if hasattr(value, "to_dict") and hasattr(value, "model_type")]


def _fit_towers(config: Any) -> None:
    """A generative multimodal model's parts made to fit the shrunk sizes, in place: its
    placeholder tokens within the vocabulary, its towers 2 layers deep and projecting to the
    text model's width, each vision tower's patch a sixteenth of its shrunk image
    (`PATCHES_PER_SIDE`), and a
    multimodal rotary embedding's sections (time, height, width) within the shrunk head
    (half its size, the first section the largest, as in the checkpoints)."""
    # the placeholder tokens (image, video, their start and end) within the shrunk vocabulary, each its
    # own id from its top down (the shrink keeps the padding, start and end of text at 0 to 2)
    names = sorted({name for part in _sub_configs(config) for name, value in vars(part).items()
                    if re.search(r"_token_(id|index)$", name) and isinstance(value, int) and value >= VOCAB})
    for part in _sub_configs(config):
        for name in names:
            if isinstance(vars(part).get(name), int) and vars(part)[name] >= VOCAB:
                setattr(part, name, VOCAB - 1 - names.index(name))
    text_width = getattr(getattr(config, "text_config", None), "hidden_size", None)
    for part in _sub_configs(config):
        if isinstance(vars(part).get("out_hidden_size"), int) and isinstance(text_width, int):
            part.out_hidden_size = text_width  # a tower that projects its features to the text model's width (Qwen's)
        depth = vars(part).get("depth")
        if isinstance(depth, int) and depth > 2:  # a tower's depth under its own name (Qwen's): 2 as the text's
            part.depth = depth = 2
        layers = depth if isinstance(depth, int) else vars(part).get("num_hidden_layers")
        for name, value in list(vars(part).items()):  # its layers named by index (DeepStack's, full attention's)
            if (isinstance(layers, int) and name.endswith(("_indexes", "_indices")) and isinstance(value, (list, tuple))
                    and any(isinstance(i, int) and i >= layers for i in value)):
                setattr(part, name, [layers - 1])  # the last, as the checkpoints' last group ends with one
        image, patch = getattr(part, "image_size", None), getattr(part, "patch_size", None)
        if isinstance(image, int) and isinstance(patch, int) and image // patch < PATCHES_PER_SIDE:
            part.patch_size = max(1, image // PATCHES_PER_SIDE)
        rope = getattr(part, "rope_parameters", None)
        heads = getattr(part, "num_attention_heads", None)
        head = getattr(part, "head_dim", None) or (part.hidden_size // heads if isinstance(heads, int) and heads else None)
        if isinstance(rope, dict) and "rope_type" in rope and isinstance(head, int) and head >= 8:  # one rotary, not one per layer kind
            sections = rope.get("mrope_section") or [16, 24, 24]
            half = head // 2
            rope["mrope_section"] = [half - len(sections) + 1] + [1] * (len(sections) - 1)


def _wants_a_decoder(class_name: str) -> bool:
    """Whether the class's constructor warns or asserts unless its config says ``is_decoder``
    (BertLMHeadModel, ReformerModelWithLMHead: an encoder's language-model head)."""
    import transformers

    try:
        source = inspect.getsource(getattr(transformers, class_name).__init__)
    except (AttributeError, OSError, TypeError):
        return False
    return re.search(r"(if not|assert) (self\.)?config\.is_decoder\b", source) is not None


def tiny_model(model_type: str, class_name: str, check: Any = None, multimodal: bool = False) -> tuple[Any, torch.nn.Module, str]:
    """The config, the model (random weights, in eval mode) and the shrink level of the first
    of ``SHRINK_LEVELS`` that builds and passes ``check(config, model)`` (None when its
    forward runs; widths shrunk apart can disagree: a latent attention's head sizes); the
    first level that builds when none passes; the first level's error when none builds."""
    import transformers

    first: Exception | None = None
    built: tuple[Any, torch.nn.Module, str] | None = None
    for level, keys in SHRINK_LEVELS.items():
        try:
            config = small_config(model_type, class_name, keys, derive=level in DERIVED_LEVELS, multimodal=multimodal)
            if level != "small" and _meta_parameters(class_name, config) > _MOST_PARAMETERS:
                continue
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(config).eval()
            _random_where_zero(model)
            if model_type in _QUERY_SELECTION_TYPES:
                _weights_that_separate_positions(model)
        except Exception as error:  # noqa: BLE001 - the next level is tried; the first error is the cause
            first = first or error
            continue
        if sum(p.numel() for p in model.parameters()) > _MOST_PARAMETERS and level != "small":
            continue
        built = built or (config, model, level)
        if check is None or check(config, model) is None:
            return config, model, level
    if built is not None:
        return built
    assert first is not None
    raise first


def _meta_parameters(class_name: str, config: Any) -> int:
    """The parameters of ``class_name`` built from ``config`` on the meta device (no memory:
    a level that keeps the widths, 820M parameters for AXK1, is skipped without being built);
    0 when the class does not build there (it is then built and counted)."""
    import transformers

    try:
        with torch.device("meta"):
            return sum(p.numel() for p in getattr(transformers, class_name)(config).parameters())
    except Exception:  # noqa: BLE001 - counted again once built for real
        return 0


def _random_where_zero(model: torch.nn.Module) -> None:
    """Give the weights a model initialises to zeros (a router's gate, a bias) small random
    values: a zero router scores every expert alike, and each runtime breaks that tie its
    own way, which no trained checkpoint asks of it."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.numel() > 1 and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


# model types whose initial weights (matrices of standard deviation initializer_range, 0.01, and
# batch-norm scales drawn as small) shrink every feature map to rounding noise before their encoder
# scores the positions: their query selection (a top-k over the positions, RT-DETR's) then picks
# among ties, which torch and onnxruntime each break their own way
_QUERY_SELECTION_TYPES = ("rt_detr", "rt_detr_v2", "d_fine", "deimv2")


def _weights_that_separate_positions(model: torch.nn.Module) -> None:
    """Weights that keep the positions of a feature map apart, as a trained checkpoint's do:
    batch-norm scales drawn near zero set to one, and weight matrices (a Linear's, a
    convolution's) drawn with standard deviation 1 / sqrt(fan-in) (seeded by their size)."""
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and weight is not None \
                    and weight.numel() and float(weight.abs().mean()) < 0.1:
                weight.fill_(1.0)
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.dim() > 1:
                parameter.normal_(0, parameter[0].numel() ** -0.5, generator=torch.Generator().manual_seed(parameter.numel()))


def _node_count(folder: Path) -> int:
    import onnx

    total = 0
    for path in sorted((folder / "onnx").glob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        total += len(model.graph.node) + sum(len(f.node) for f in model.functions)
    return total


def _first_line(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [part.strip() for part in text.splitlines() if part.strip()]
    # an export's failure: its first diagnostic (`- [FXE0011] No ONNX function ...`), not the heading
    line = next((part[2:] for part in lines if part.startswith("- [")), lines[0] if lines else "")
    line = re.sub(r"\(at [^)]*\)", "", line)
    line = re.sub(r"/tmp/\S+", "<path>", line)
    return re.sub(r"\b\d+\b", "N", line).strip()


def _cause(error: BaseException) -> str:
    """``Class: first line`` of an error (of the error it was raised from, when that says more),
    without the colours, numbers, paths and source lines that vary by pair."""
    while error.__cause__ is not None and type(error).__name__ in ("TorchExportError", "CaptureError"):
        error = error.__cause__
    return f"{type(error).__name__}: {_first_line(str(error))[:200]}"


def _places(error: BaseException) -> tuple[str, str]:
    """Where ``error`` was raised: the library of its innermost frame among those named, and
    the part of fx2onnx that called into it ("export-hf" for fx2onnx/hub, "exporter", or "")."""
    import traceback as tb

    while error.__cause__ is not None and type(error).__name__ in ("TorchExportError", "CaptureError"):
        error = error.__cause__
    where, via = "other", ""
    for frame in tb.extract_tb(error.__traceback__):
        path = frame.filename.replace(os.sep, "/")
        for marker, name in (("/fx2onnx/hub/", "export-hf"), ("/fx2onnx/", "exporter"), ("/dispatcher/", "exporter"),
                             ("/transformers/", "transformers"), ("/onnxruntime/", "onnxruntime"),
                             ("/onnxscript/", "onnxscript"), ("/torch/", "torch"), ("/onnx/", "onnx")):
            if marker in path:
                where = name
                via = name if name in ("export-hf", "exporter") else via
                break
    return where, via


def _failure(error: BaseException) -> dict[str, str]:
    where, via = _places(error)
    return {"cause": _cause(error), "where": where, "via": via}


# the classes of failure the scoreboard counts, in the order it lists them
CATEGORIES = {
    "not built": "the tiny model cannot be built (transformers refuses the shrunk config or needs a library)",
    "transformers fails": "transformers' own forward fails on the tiny model and its example inputs",
    "refused": "export-hf refuses the pair before writing anything, with an error naming what serves it or the model's line that stops it",
    "export-hf": "export-hf (fx2onnx/hub) fails before or after the export",
    "capture": "torch.export cannot capture the model",
    "unsupported operator": "an operator without an ONNX function",
    "translation": "the translation or an ONNX pass fails",
    "onnxruntime": "onnxruntime cannot load or run the model",
    "differs": "exported, but onnxruntime's outputs differ from transformers' beyond the tolerance",
    "time limit": "the pair reached the sweep's time limit",
    "crash": "the pair's process died",
    "other": "any other error",
}


# a text-generation pair exported with --text-only, export-hf having refused it without (the
# record's "option"; its "via" names the part of fx2onnx a failure came from): the scoreboard marks its cell
TEXT_ONLY = "--text-only"

# the errors export-hf refuses a pair with (a task, an architecture or parts it does not serve, a
# Python branch on tensor values in the model's code, the model's own forward failing on the decode
# step its folder runs), each naming what does or the line that stops it: the one place that says
# what a refusal is
REFUSALS = ("UnsupportedTaskError", "UnsupportedArchitectureError", "PartsLeftOutError", "ValueBranchError",
            "DecodeStepError")


def classify(record: dict[str, Any]) -> str | None:
    """The class of a pair's failure (None for a pair exported and exact)."""
    status, cause = record["status"], record.get("cause", "")
    where, via = record.get("where", ""), record.get("via", "")
    if status == "not built":
        return "not built"
    if status == "exported":
        return None if record.get("exact") else "differs"
    if cause.startswith("time limit"):
        return "time limit"
    if cause.startswith("child died"):
        return "crash"
    if cause.split(":")[0] in REFUSALS:
        return "refused"
    eager = record.get("eager_cause", "")
    # transformers' forward fails on the example inputs, and the export where it runs that forward
    if eager and (eager.split(":")[0] == cause.split(":")[0] or via == "exporter"):
        return "transformers fails"
    if any(rule in cause for rule in ("FXE0011", "FXE0012", "FXE0016", "No ONNX function")):
        return "unsupported operator"
    if where == "onnxruntime" or "FolderRunError" in cause:
        return "onnxruntime"
    if "FXE0017" in cause or cause.startswith("CaptureError") or (via == "exporter" and where in ("torch", "transformers")):
        return "capture"
    if "FXE00" in cause or via == "exporter":
        return "translation"
    if via == "export-hf":
        return "export-hf"
    return "other"


def task_inputs(task: str, config: Any, model: torch.nn.Module) -> tuple[Any, tuple[str, ...]] | None:
    """The example inputs of ``task`` (a function of the size, 0 or 1) that forward takes,
    and the outputs compared; None for a task without them."""
    from fx2onnx.hub.pipeline_tasks import PIPELINE_TASKS, example_inputs, text_inputs

    if task == "text-generation":
        make = lambda size: text_inputs(config, model, size)  # noqa: E731
        names: tuple[str, ...] = ("logits",)
    elif task == "text2text-generation":  # the whole model in one pass: the encoder and the decoder's prompt
        def make(size: int) -> dict[str, torch.Tensor]:
            inputs = text_inputs(config, model, size)
            return {**inputs, "decoder_input_ids": inputs["input_ids"][:, :4]}
        names = ("logits",)
    elif task in PIPELINE_TASKS:
        make = lambda size: example_inputs(task, config, model, size)  # noqa: E731
        names = PIPELINE_TASKS[task].outputs
    elif task == "image-classification":
        make = lambda size: example_inputs("object-detection", config, model, size)  # noqa: E731 (pixel_values)
        names = ("logits",)
    elif task == "feature-extraction":
        make = lambda size: text_inputs(config, model, size)  # noqa: E731
        names = ("last_hidden_state",)
    else:
        return None
    parameters = inspect.signature(model.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return (lambda size: {k: v for k, v in make(size).items() if takes_any or k in parameters}), names


def _without_cache(model: torch.nn.Module) -> dict[str, bool]:
    # as export-hf exports the tasks of one pass
    return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}


def _torch_onnx(model: torch.nn.Module, task: str, config: Any, folder: Path) -> dict[str, Any]:
    """torch.onnx.export(..., dynamo=True) of the same module on the same example inputs."""
    import onnxruntime as ort

    if task in UNCOMPARED or task in RANDOM_OUTPUTS:
        return {"torch_onnx": "not compared", "torch_onnx_cause": {**UNCOMPARED, **RANDOM_OUTPUTS}[task]}
    found = task_inputs(task, config, model)
    if found is None:
        return {"torch_onnx": "not compared"}
    make, names = found
    inputs = make(0)
    extra = _without_cache(model)
    dynamic = dynamic_shapes(model, inputs, extra)
    started = time.perf_counter()
    try:
        program = torch.onnx.export(model, (), kwargs={**inputs, **extra}, dynamo=True, dynamic_shapes=dynamic, verbose=False)
        program.save(str(folder / "torch_onnx.onnx"))
    except Exception as error:  # noqa: BLE001 - the benchmark records every cause
        return {"torch_onnx": "failed", "torch_onnx_cause": _cause(error)}
    seconds = time.perf_counter() - started
    session = ort.InferenceSession(str(folder / "torch_onnx.onnx"), providers=["CPUExecutionProvider"])
    worst, ratio, count = 0.0, 0.0, 0
    try:
        for size in (0, 1):
            inputs = make(size)
            feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs() if i.name in inputs}
            got = session.run(None, feed)
            with torch.no_grad():
                expected = model(**inputs, **extra)
            compared = compared_outputs(expected, names, got)
            count = max(count, len(compared))
            if not compared:
                raise ValueError(f"none of the outputs {', '.join(names)} among the {len(got)} given")
            for value, want in compared:
                value, want = value.astype(np.float64), want.double().numpy()
                worst = max(worst, float(np.abs(value - want).max()))
                ratio = max(ratio, float((np.abs(value - want) / (ATOL + RTOL * np.abs(want))).max()))
    except Exception as error:  # noqa: BLE001
        return {"torch_onnx": "exported", "torch_onnx_seconds": seconds, "torch_onnx_exact": False,
                "torch_onnx_cause": "run: " + _cause(error), MEASURED: 0}
    return {"torch_onnx": "exported", "torch_onnx_seconds": seconds, "torch_onnx_exact": ratio <= 1.0,
            "torch_onnx_difference": worst, "torch_onnx_nodes": _torch_onnx_nodes(folder / "torch_onnx.onnx"),
            MEASURED: count}


def dynamic_shapes(model: torch.nn.Module, inputs: dict[str, torch.Tensor], extra: dict[str, Any]) -> dict[str, Any]:
    """Every dim of ``inputs`` ``Dim.AUTO`` (``extra``'s flags static), keyed as torch.export binds
    them to forward's signature: an input forward takes through its ``**kwargs`` (FNet's
    attention mask, a speech model's decoder ids) under that parameter's name."""
    auto = torch.export.Dim.AUTO
    parameters = inspect.signature(model.forward).parameters
    var_keyword = next((p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    shapes: dict[str, Any] = {**{k: {i: auto for i in range(v.dim())} for k, v in inputs.items()}, **{k: None for k in extra}}
    named = {k: v for k, v in shapes.items() if k in parameters and parameters[k].kind is not inspect.Parameter.VAR_KEYWORD}
    rest = {k: v for k, v in shapes.items() if k not in named}
    if rest and var_keyword is None:
        raise ValueError(f"forward takes no {', '.join(rest)}")
    return {**named, **({var_keyword: rest} if rest else {})}


# the field of a record whose torch.onnx outputs were compared (by position, how many; 0 when
# onnxruntime could not run its model): records written before it matched the outputs by name,
# which torch.onnx does not give, and compared none
MEASURED = "torch_onnx_outputs_compared"


def torch_onnx_measured(record: dict[str, Any]) -> bool:
    """Whether the record's torch.onnx exactness was measured (an exported pair whose outputs
    were compared) rather than written with nothing compared or its run failed."""
    return record.get("torch_onnx") == "exported" and bool(record.get(MEASURED))


def torch_onnx_unmeasured(record: dict[str, Any]) -> bool:
    """Whether a pair's torch.onnx.export side is still to be measured: a built pair of a task
    it is compared on, never given to it (a run without the comparison) or exported when
    the outputs were matched by name (no count of compared outputs). A failed export is a
    result: it stands."""
    if record["status"] == "not built" or record["task"] in UNCOMPARED or record["task"] in RANDOM_OUTPUTS:
        return False
    return "torch_onnx" not in record or (record["torch_onnx"] == "exported" and MEASURED not in record)


def compared_outputs(expected: Any, names: tuple[str, ...], got: list[np.ndarray]) -> list[tuple[np.ndarray, torch.Tensor]]:
    """(onnxruntime's, transformers') of each of ``names`` the model gives (a segmenter gives
    one of two sets), by position: torch.onnx.export names its outputs after the nodes that
    compute them (``linear_13``), in the order of the output's flattened tensors."""
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(expected) if isinstance(leaf, torch.Tensor)]
    if len(leaves) != len(got):
        raise ValueError(f"{len(got)} outputs, transformers gives {len(leaves)}")
    pairs = []
    for name in names:
        want = expected.get(name) if isinstance(expected, dict) else getattr(expected, name, None)
        index = next((i for i, leaf in enumerate(leaves) if leaf is want), None)
        if index is not None:
            pairs.append((got[index], want))
    return pairs


def _torch_onnx_nodes(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return len(model.graph.node) + sum(len(f.node) for f in model.functions)


def run_pair(
    task: str, model_type: str, class_name: str, compare: bool, on_export: Any = None
) -> dict[str, Any]:
    """One pair, in the current process: the record the scoreboard reads (``on_export``
    is given export-hf's part of it as soon as it is known)."""
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    record: dict[str, Any] = {"task": task, "model_type": model_type, "architecture": class_name}
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory(prefix="fx2onnx-sweep-") as scratch:
        scratch = Path(scratch)
        try:
            config, model, record["shrunk"] = tiny_model(
                model_type, class_name, lambda config, model: _eager_failure(task, config, model),
                multimodal=task in UNCOMPARED)
            if task in UNCOMPARED:
                _generation_within_vocabulary(model)
            model.save_pretrained(scratch / "source")
            if task in UNCOMPARED:
                record["processors"] = save_processors(model_type, config, scratch / "source")
        except Exception as error:  # noqa: BLE001
            record.update(status="not built", **_failure(error))
            record["category"] = classify(record)
            return record
        eager_cause = _eager_failure(task, config, model)
        started = time.perf_counter()
        try:
            result = _export_for_task(scratch, task, record)
        except Exception as error:  # noqa: BLE001
            record.update(status="failed", **_failure(error), seconds=time.perf_counter() - started)
            if eager_cause:  # transformers' forward fails as well: its cause is the pair's
                record["eager_cause"] = eager_cause
        else:
            verification = result.verification
            record.update(
                status="exported", seconds=time.perf_counter() - started, exact=verification.passed,
                difference=verification.max_logit_difference, tokens_equal=verification.tokens_equal,
                nodes=_node_count(scratch / "out"),
            )
            if task in UNCOMPARED and verification.failure:  # a run of the folder failed: what failed
                record["cause"] = f"FolderRunError: {_first_line(verification.failure)[:200]}"
        record["peak_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss) / 1024
        record["category"] = classify(record)
        if on_export is not None:  # export-hf's result, kept should torch.onnx.export reach the time limit
            on_export(dict(record))
        if compare or task in UNCOMPARED:  # the reason it is not compared, recorded either way
            try:
                record.update(_torch_onnx(model, task, config, scratch))
            except Exception as error:  # noqa: BLE001
                record.update(torch_onnx="failed", torch_onnx_cause=_cause(error))
    return record


def run_torch_onnx_pair(task: str, model_type: str, class_name: str, on_built: Any = None) -> dict[str, Any]:
    """torch.onnx.export's side of one pair alone, in the current process: the tiny model
    built as `run_pair` builds it (its shrink level, to be matched with export-hf's record,
    given to ``on_built`` once known), exported and compared; export-hf is not run."""
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    record: dict[str, Any] = {"task": task, "model_type": model_type, "architecture": class_name}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-sweep-") as scratch:
        try:
            config, model, record["shrunk"] = tiny_model(
                model_type, class_name, lambda config, model: _eager_failure(task, config, model))
        except Exception as error:  # noqa: BLE001 - its record says so; export-hf's record stands
            return {**record, "shrunk": None, "torch_onnx": "not compared", "torch_onnx_cause": f"not built: {_cause(error)}"}
        if on_built is not None:  # the shrink level, kept should the export reach the time limit
            on_built(dict(record))
        try:
            record.update(_torch_onnx(model, task, config, Path(scratch)))
        except Exception as error:  # noqa: BLE001
            record.update(torch_onnx="failed", torch_onnx_cause=_cause(error))
    return record


def _mel_bins(config: Any) -> int | None:
    """The mel bins of a speech model's features, from its config or its encoder's."""
    for part in (config, *(getattr(config, name, None) for name in ("encoder_config", "audio_config", "encoder"))):
        bins = getattr(part, "num_mel_bins", None)
        if isinstance(bins, int):
            return bins
    return None


def _generation_within_vocabulary(model: torch.nn.Module) -> None:
    """The token ids the generation config suppresses kept within the shrunk vocabulary (a
    checkpoint's are within its own; Whisper's defaults name ids of its 51865 tokens)."""
    generation = getattr(model, "generation_config", None)
    for name in ("suppress_tokens", "begin_suppress_tokens"):
        ids = getattr(generation, name, None)
        if isinstance(ids, list):
            setattr(generation, name, [i for i in ids if isinstance(i, int) and i < VOCAB])


def _processor_sizes(processor: Any, config: Any) -> dict[str, Any]:
    """An image processor's sizes for the tiny vision tower: its patch, its images the tower's
    shrunk size, or (a processor that sizes images by their pixels, Qwen's) from 2 x 2 to
    8 x 8 of its merged patches."""
    vision = next((p for p in _sub_configs(config) if isinstance(getattr(p, "patch_size", None), int)), None)
    if vision is None:
        return {}
    default = vars(processor())  # its settings (its constructor may take them as keywords only)
    patch, image = vision.patch_size, getattr(vision, "image_size", None)
    values: dict[str, Any] = {"patch_size": patch} if isinstance(default.get("patch_size"), int) else {}
    if isinstance(default.get("patch_size"), dict):
        values["patch_size"] = {k: patch for k in default["patch_size"]}
    if "min_pixels" in default or "max_pixels" in default:
        unit = patch * getattr(vision, "spatial_merge_size", 1)
        values.update(min_pixels=(2 * unit) ** 2, max_pixels=(8 * unit) ** 2)
        if isinstance(default.get("size"), dict) and "shortest_edge" in default["size"]:  # the pixels' other spelling
            values["size"] = {"shortest_edge": (2 * unit) ** 2, "longest_edge": (8 * unit) ** 2}
    elif isinstance(image, int) and default.get("size") is not None:
        size = default["size"]  # a dict, or transformers' SizeDict (its unset sizes None)
        size = {k: v for k, v in (size.items() if isinstance(size, dict) else vars(size).items()) if v is not None}
        keys = [k for k in ("height", "width", "longest_edge", "shortest_edge") if k in size]
        values["size"] = {k: image for k in keys} if keys else {"height": image, "width": image}
    return values


def save_processors(model_type: str, config: Any, folder: Path) -> list[str]:
    """Save beside the tiny model the feature extractor and image processor its model type's
    checkpoints ship (transformers' defaults; the mel bins the config's), which export-hf
    reads for a multimodal folder (a Whisper folder's log-mel parameters); the class names saved
    (and those left out, a library they need missing)."""
    import transformers
    from transformers.models.auto import feature_extraction_auto, image_processing_auto

    saved = []
    encoder = vars(config).get("encoder")
    if model_type not in feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES and \
            model_type not in image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES and hasattr(encoder, "model_type"):
        model_type = encoder.model_type  # a composite encoder-decoder's checkpoints ship its encoder's processor
    extractor = getattr(transformers, feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type) or "", None)
    if extractor is not None:
        bins = _mel_bins(config)
        takes_size = "feature_size" in inspect.signature(extractor.__init__).parameters
        try:
            extractor(**({"feature_size": bins} if bins and takes_size else {})).save_pretrained(folder)
            saved.append(extractor.__name__)
        except ImportError:  # it needs a library not installed (torchaudio, librosa): left out, and the record says so
            saved.append(f"{extractor.__name__} not saved: a library is missing")
    names = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
    names = {"pil": names} if isinstance(names, str) else names
    for name in (names.get("pil"), names.get("torchvision")):
        try:
            processor = getattr(transformers, name or "", None)
            if processor is not None:
                processor(**_processor_sizes(processor, config)).save_pretrained(folder)
                return [*saved, processor.__name__]
        except ImportError:  # a processor of a library not installed (torchvision): the next, or none (said)
            saved.append(f"{name} not saved: a library is missing")
    return saved


def _export_for_task(scratch: Path, task: str, record: dict[str, Any]) -> Any:
    """export-hf's folder for ``task``: for text generation, a multimodal class export-hf
    refuses for the parts the folder leaves out (PartsLeftOutError) is exported again with
    ``--text-only``, whose folder is the one a text-generation pipeline runs; the record
    says so (``option``)."""
    from fx2onnx.hub.decoders.text_only import PartsLeftOutError

    try:
        return export_hf(scratch / "source", scratch / "out", task=EXPORT_TASKS.get(task, task), verify=True, tokens=16)
    except PartsLeftOutError:
        if task != "text-generation":
            raise
    record["option"] = TEXT_ONLY
    return export_hf(scratch / "source", scratch / "out", task=task, verify=True, tokens=16, text_only=True)


def _eager_failure(task: str, config: Any, model: torch.nn.Module) -> str | None:
    """The cause when transformers' own forward fails on the example inputs (None when it runs)."""
    found = task_inputs(task, config, model)
    if found is None:
        return None
    try:
        with torch.no_grad():
            model(**found[0](0), **_without_cache(model))
    except Exception as error:  # noqa: BLE001 - recorded as the pair's cause
        return _cause(error)
    return None


def _child(queue: Any, task: str, model_type: str, class_name: str, compare: bool, torch_onnx_only: bool) -> None:
    try:
        if torch_onnx_only:
            queue.put(run_torch_onnx_pair(task, model_type, class_name, queue.put))
            return
        queue.put(run_pair(task, model_type, class_name, compare, queue.put))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        record = {"task": task, "model_type": model_type, "architecture": class_name, "status": "failed",
                  **_failure(error)}
        queue.put({**record, "category": classify(record)})


def _next_record(queue: Any, child: Any, deadline: float) -> tuple[dict[str, Any] | None, str]:
    """The child's next record, or None and why: it died, or the deadline passed."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=max(min(1.0, deadline - time.perf_counter()), 0.01)), ""
        except queues.Empty:
            if not child.is_alive():
                try:  # a record put just before the child ended
                    return queue.get(timeout=0.5), ""
                except queues.Empty:
                    return None, f"child died ({child.exitcode})"
            if time.perf_counter() >= deadline:
                return None, "time limit"


def run_in_child(
    task: str, model_type: str, class_name: str, compare: bool, limit: float, torch_onnx_only: bool = False
) -> dict[str, Any]:
    """One pair in a forked child, killed after ``limit`` seconds; a crash or a hang ends
    only the pair. With ``torch_onnx_only``, torch.onnx.export's side alone (`run_torch_onnx_pair`)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue, task, model_type, class_name, compare, torch_onnx_only))
    deadline = time.perf_counter() + limit
    child.start()
    record, why = _next_record(queue, child, deadline)  # export-hf's part, then the whole record
    if torch_onnx_only:  # the tiny model's shrink level, then the whole record
        if record is not None and "torch_onnx" not in record:
            whole, why = _next_record(queue, child, deadline)
            record = whole or {**record, "torch_onnx": "failed",
                               "torch_onnx_cause": why.replace("time limit", f"time limit ({limit:.0f} s)")}
        _end(child, why)
        if record is None:  # ended before its model was built: no shrink level, so it stands for no record
            record = {"task": task, "model_type": model_type, "architecture": class_name, "shrunk": None,
                      "torch_onnx": "failed", "torch_onnx_cause": why.replace("time limit", f"time limit ({limit:.0f} s)")}
        return {**record, "torch_onnx_limit": limit}
    if record is not None and record.get("status") != "not built" and "peak_mb" in record:
        whole, why = _next_record(queue, child, deadline)
        if whole is None:  # export-hf's result stands; torch.onnx.export's part did not end
            record.update(torch_onnx="failed", torch_onnx_cause=why.replace("time limit", f"time limit ({limit:.0f} s)"))
        record = whole or record
    _end(child, why)
    if record is None:
        cause = why.replace("time limit", f"time limit ({limit:.0f} s)")
        record = {"task": task, "model_type": model_type, "architecture": class_name, "status": "failed", "cause": cause}
    record["category"] = classify(record)
    record["limit"] = limit  # the scoreboard states the limits its pairs ran under
    return record


def _end(child: Any, why: str) -> None:
    child.join(0 if why else 5)  # a child past its time limit (or dead) is killed at once
    if child.is_alive():
        child.kill()
        child.join()


def read_results(results: Path) -> list[dict[str, Any]]:
    """The results' records, the last one of each pair (a pair run again replaces its record)."""
    if not results.is_file():
        return []
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for line in results.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            latest[(record["task"], record["architecture"])] = record
    return list(latest.values())


def _done(results: Path, retry: set[str]) -> set[tuple[str, str]]:
    """The pairs a rerun skips: every pair recorded, but those whose failure class is in ``retry``."""
    return {(r["task"], r["architecture"]) for r in read_results(results) if classify(r) not in retry}


# the tasks whose pairs come first, taken in turn (the bar of 90% exported and exact is theirs)
PRIORITY_TASKS = (
    "text-generation", "text-classification", "token-classification", "question-answering", "fill-mask",
    "image-classification", "text2text-generation",
)


def _spread(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs in a fixed shuffled order, so that a sweep stopped early has sampled each
    task evenly rather than its first letters."""
    import random

    shuffled = list(pairs)
    random.Random(0).shuffle(shuffled)
    return shuffled


def sweep_order(task_names: list[str], per_task: int | None = None) -> list[tuple[str, str, str]]:
    """(task, model type, class) in the order the sweep runs them: the priority tasks' pairs
    in turn, one of each task after another, then the other tasks' pairs in turn."""
    def in_turn(tasks: list[str]) -> list[tuple[str, str, str]]:
        queues = [[(task, *pair) for pair in _spread(pairs_of(task))[:per_task]] for task in tasks]
        return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]

    first = [task for task in PRIORITY_TASKS if task in task_names]
    return in_turn(first) + in_turn([task for task in task_names if task not in first])


def sweep(
    task_names: list[str], results: Path, limit: float, compare: bool, budget: float | None, per_task: int | None = None,
    retry: set[str] = frozenset(), architectures: set[str] | None = None, torch_onnx_only: bool = False,
) -> None:
    """Run every pair of ``task_names`` not yet in ``results`` (or whose failure class is in
    ``retry``), appending each pair's record as soon as it is known; with ``architectures``,
    only the pairs of those classes, run again whether recorded or not. With ``torch_onnx_only``,
    torch.onnx.export's side alone of the recorded pairs whose side is unmeasured
    (`torch_onnx_unmeasured`; with ``architectures``, of those classes' recorded pairs), each
    appended as the pair's export-hf record with the new comparison (`with_torch_onnx`)."""
    latest = {(r["task"], r["architecture"]): r for r in read_results(results)}
    if torch_onnx_only:
        todo = {pair for pair, r in latest.items() if (torch_onnx_unmeasured(r) if architectures is None else
                                                          r["status"] != "not built" and r["task"] not in UNCOMPARED)}
    else:
        todo = None
    done = _done(results, set(retry)) if architectures is None and not torch_onnx_only else set()
    earlier = _last_torch_onnx_records(results)
    started = time.perf_counter()
    commit = _commit()
    for task, model_type, class_name in sweep_order(task_names, per_task):
        if (task, class_name) in done or (architectures is not None and class_name not in architectures):
            continue
        if todo is not None and (task, class_name) not in todo:
            continue
        if budget is not None and time.perf_counter() - started > budget:
            print(f"budget of {budget:.0f} s spent: stopping (rerun to continue)", flush=True)
            return
        record = run_in_child(task, model_type, class_name, compare, limit, torch_onnx_only)
        if torch_onnx_only:
            torch_side = {**record, "torch_onnx_commit": commit}
            record = with_torch_onnx(latest[(task, class_name)], torch_side)
            if "torch_onnx" not in record:  # nothing new to append: export-hf's record is of another tiny model
                print(f"{task:32} {class_name:48} torch.onnx on a tiny model built at the {torch_side.get('shrunk')} "
                      f"level, export-hf's record at the {record.get('shrunk')}: run the pair again whole "
                      f"(--architectures {class_name}) [{torch_side.get('torch_onnx_cause', '')[:80]}]", flush=True)
                continue
        else:
            record["commit"] = commit
            if not compare and "torch_onnx" not in record:
                record = with_torch_onnx(record, earlier.get((task, class_name)))
        with results.open("a") as file:
            file.write(json.dumps(record) + "\n")
        print(f"{task:32} {class_name:48} {record['status']:10} {record.get('exact', '')!s:6} "
              f"{record.get('torch_onnx', '')} {record.get('torch_onnx_exact', '')!s:6} "
              f"{record.get('cause', record.get('torch_onnx_cause', ''))[:90]}", flush=True)


def _last_torch_onnx_records(results: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Each pair's last record that holds a torch.onnx.export comparison (a later run
    without one, or stopped by the time limit, does not replace it here)."""
    if not results.is_file():
        return {}
    records = (json.loads(line) for line in results.read_text().splitlines() if line.strip())
    return {(r["task"], r["architecture"]): r for r in records if "torch_onnx" in r}


def _torch_onnx_kept(earlier: dict[str, Any] | None, record: dict[str, Any]) -> dict[str, Any]:
    """A pair run again without torch.onnx.export's comparison keeps its earlier one: that
    result depends on torch and the tiny model, not on fx2onnx, so it stands while the tiny
    model is built at the same shrink level."""
    if earlier is None or _shrink_level(earlier) != _shrink_level(record):
        return {}
    return {key: value for key, value in earlier.items() if key.startswith("torch_onnx")}


def _shrink_level(record: dict[str, Any]) -> str | None:
    if "shrunk" in record:
        return record["shrunk"]
    # export-hf's records written before the sweep had shrink levels (1e27e32) were built from SMALL whole
    return "small" if record.get("status") in ("exported", "failed") else None


def with_torch_onnx(record: dict[str, Any], torch_record: dict[str, Any] | None) -> dict[str, Any]:
    """A pair's record: export-hf's side from ``record``, torch.onnx.export's from ``torch_record``
    (another run's, of the same pair) where it stands (`_torch_onnx_kept`: the same tiny model),
    else none; the one place two runs' sides are combined, so that the pair's last line, which
    the scoreboard reads, holds both."""
    export_side = {key: value for key, value in record.items() if not key.startswith("torch_onnx")}
    return {**export_side, **_torch_onnx_kept(torch_record, record)}


# ---- the scoreboard ----------------------------------------------------------------------------------------------


def _versions() -> str:
    import onnxruntime
    import transformers

    return (f"fx2onnx {fx2onnx.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"onnxruntime {onnxruntime.__version__}")


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def summary(records: list[dict[str, Any]]) -> dict[str, int]:
    """Pairs tried, exported, exact, and torch.onnx.export's exported and exact, on them."""
    built = [r for r in records if r["status"] != "not built"]
    return {
        "tried": len(built),
        "exported": sum(r["status"] == "exported" for r in built),
        "exact": sum(r["status"] == "exported" and bool(r.get("exact")) for r in built),
        "torch_onnx_exported": sum(r.get("torch_onnx") == "exported" for r in built),
        "torch_onnx_exact": sum(torch_onnx_measured(r) and bool(r.get("torch_onnx_exact")) for r in built),
        "torch_onnx_compared": sum(r.get("torch_onnx") in ("exported", "failed") for r in built),
        "torch_onnx_measured": sum(torch_onnx_measured(r) for r in built),
        "not_built": len(records) - len(built),
        "transformers_fails": sum(classify(r) == "transformers fails" for r in built),
        "refused": sum(classify(r) == "refused" for r in built),
    }


def _cell(record: dict[str, Any]) -> str:
    mark = TEXT_ONLY_MARK if record.get("option") == TEXT_ONLY else ""
    if record["status"] != "exported":
        return f"fails: {classify(record)}{mark}"
    return ("exact" if record.get("exact") else "differs") + mark


# what the scoreboard says of the generative multimodal tasks' pairs
MULTIMODAL_NOTE = (
    "**image-text-to-text** (vision-language models, and the vision encoder-decoders transformers files there) and "
    "**speech-seq2seq** (speech recognition by an encoder-decoder, export-hf's `automatic-speech-recognition` for "
    "Whisper-style models; the CTC encoders are the `automatic-speech-recognition` row) are exported with export-hf's "
    "recipe for the task and checked by its own `--verify` of the folder (its encoders, token embedding and "
    "decoder run as the runtime runs them, greedy tokens against transformers'). Their tiny models also get the "
    "model type's feature extractor and image processor (transformers' defaults at the tiny tower's sizes), their "
    "placeholder tokens within the vocabulary, vision towers of 16 patches a side and 2 layers projecting to the "
    "text width. torch.onnx is not compared on them: the folder is several models, with no single module to compare.")

# the mark of a pair exported with --text-only, and the legend's line for it
TEXT_ONLY_MARK = " (text only)"
TEXT_ONLY_LEGEND = (
    "*(text only)*: a multimodal class that export-hf refuses for text generation without `--text-only` "
    "(its other encoders left out of the folder, PartsLeftOutError), exported with `--text-only`, whose "
    "folder is the one a text-generation pipeline runs.")


def _torch_cell(record: dict[str, Any]) -> str:
    state = record.get("torch_onnx", "")
    if state != "exported":
        return {"failed": "fails", "not compared": "-"}.get(state, "-")
    if "torch_onnx_cause" in record:
        return "exported, its run fails"
    if not torch_onnx_measured(record):
        return "exported, not compared"
    return "exact" if record.get("torch_onnx_exact") else "differs"


def _escaped(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("<", "&lt;")


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _task_rows(by_task: dict[str, list[dict[str, Any]]]) -> list[str]:
    rows = [
        "| task | pairs in transformers | pairs run | not built | tried | export-hf exported | export-hf exact | "
        "export-hf refused | exact of tried | exact of tried, refusals aside | "
        "exact of tried, transformers' own failures aside | torch.onnx exported | torch.onnx outputs compared | "
        "torch.onnx exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in [t for t in TASK_MAPPINGS if t in by_task]:
        s = summary(by_task[task])
        rows.append(
            f"| [{task}](#{task}) | {len(pairs_of(task))} | {len(by_task[task])} | {s['not_built']} | {s['tried']} | "
            f"{s['exported']} | {s['exact']} | {s['refused']} | {_percent(s['exact'], s['tried'])} | "
            f"{_percent(s['exact'], s['tried'] - s['refused'])} | "
            f"{_percent(s['exact'], s['tried'] - s['transformers_fails'])} | {s['torch_onnx_exported']} | {s['torch_onnx_measured']} | {s['torch_onnx_exact']} |"
        )
    return rows


def _category_rows(records: list[dict[str, Any]]) -> list[str]:
    counts = Counter(classify(r) for r in records)
    rows = ["| class | what it means | pairs |", "|---|---|---|"]
    return rows + [f"| {name} | {_escaped(text)} | {counts[name]} |" for name, text in CATEGORIES.items() if counts[name]]


def _cause_rows(records: list[dict[str, Any]]) -> list[str]:
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for record in records:
        category = classify(record)
        if category not in (None, "differs"):
            causes[(category, record.get("cause", "?"))].append(record["architecture"])
    rows = ["| class | cause | pairs | examples |", "|---|---|---|---|"]
    for (category, cause), names in sorted(causes.items(), key=lambda item: (-len(item[1]), item[0])):
        more = ", ..." if len(names) > 4 else ""
        rows.append(f"| {category} | {_escaped(cause)} | {len(names)} | {', '.join(names[:4])}{more} |")
    return rows


def _refusal_rows(records: list[dict[str, Any]]) -> list[str]:
    refused = sorted((r["task"], r["architecture"], r.get("cause", "")) for r in records if classify(r) == "refused")
    rows = ["| task | architecture | error |", "|---|---|---|"]
    if not refused:
        return ["None."]
    return rows + [f"| {task} | {name} | {_escaped(cause)} |" for task, name, cause in refused]


def _pair_rows(task_records: list[dict[str, Any]]) -> list[str]:
    rows = ["| architecture | export-hf | largest difference | seconds | peak MB | nodes | torch.onnx | its difference | its nodes |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(task_records, key=lambda r: r["architecture"]):
        if r["status"] == "not built":
            rows.append(f"| {r['architecture']} | not built | | | | | | | |")
            continue
        difference = f"{r['difference']:.2g}" if r.get("difference") is not None else ""
        measured = r.get("torch_onnx_difference") is not None and torch_onnx_measured(r)
        theirs = f"{r['torch_onnx_difference']:.2g}" if measured else ""
        rows.append(
            f"| {r['architecture']} | {_cell(r)} | {difference} | {r.get('seconds', 0):.1f} | {r.get('peak_mb', 0):.0f} | "
            f"{r.get('nodes', '')} | {_torch_cell(r)} | {theirs} | {r.get('torch_onnx_nodes', '')} |"
        )
    return rows


def report(results: Path, page: Path) -> str:
    """Write the scoreboard page from ``results``; returns its summary line."""
    records = read_results(results)
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    total = summary(records)
    priority = summary([r for r in records if r["task"] in PRIORITY_TASKS])
    line = (f"{len(records)} pairs run, {total['tried']} built and tried: export-hf exported {total['exported']}, "
            f"exact in onnxruntime {total['exact']}; torch.onnx.export(dynamo=True) exported {total['torch_onnx_exported']}, "
            f"exact {total['torch_onnx_exact']} of the {total['torch_onnx_measured']} whose outputs were compared "
            f"({total['torch_onnx_compared']} pairs given to it)")
    priority_line = (f"{priority['exact']} of {priority['tried']} tried ({_percent(priority['exact'], priority['tried'])}) "
                     f"exported and exact; {priority['refused']} refused by export-hf with a clear error, and "
                     f"{priority['exact']} of the {priority['tried'] - priority['refused']} not refused "
                     f"({_percent(priority['exact'], priority['tried'] - priority['refused'])}) exact; "
                     f"{priority['transformers_fails']} fail in transformers' own forward")
    # export-hf's commits, and those torch.onnx's side was run alone at (--torch-onnx-only)
    commits = sorted({r.get("commit", "unknown") for r in records} | {r["torch_onnx_commit"] for r in records if "torch_onnx_commit" in r})
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    out = [
        "# Scoreboard: every task and architecture", "",
        "<!-- generated by bench/architecture_sweep.py --write-docs: do not edit by hand -->", "",
        f"Generated on {today} from `bench/architecture_sweep.jsonl` (pairs run at commit "
        f"{', '.join(f'`{c}`' for c in commits)}) with {_versions()}, one CPU thread (`OMP_NUM_THREADS=1`). "
        f"Each pair ran in a process of its own with a time limit ({_limits(records)}). Run the sweep (it continues "
        "where its results stop) and regenerate this page with", "",
        "```text",
        "OMP_NUM_THREADS=1 nice -n 10 python bench/architecture_sweep.py --limit 300 --report",
        "python bench/architecture_sweep.py --write-docs",
        "```", "",
        "Each pair is a task of `fx2onnx export-hf` and a class that transformers' auto mappings file under it, "
        "built from the architecture's own config class with its sizes shrunk (2 layers, width 32, vocabulary 100, "
        "images of 64 pixels; random weights, zero-initialised ones made random too; nothing downloaded). **export-hf** is `export_hf(..., verify=True)`: "
        "the folder's model in onnxruntime against transformers on two input sizes (the second with a padded row), "
        f"every element within `|onnx - torch| <= {ATOL:g} + {RTOL:g} * |torch|` (a decoder's 16 greedy tokens "
        "equal as well). **torch.onnx** is `torch.onnx.export(..., dynamo=True)` on the same module and example "
        "inputs (every dim `Dim.AUTO`; decoders without their cache; sequence-to-sequence models in one pass with "
        "four decoder tokens), compared the same way, its outputs taken by position (it names them after their "
        "nodes); *exported, its run fails*: onnxruntime could not run its model on the example inputs; "
        "*exported, not compared*: a record written when the sweep matched its outputs by name and so "
        "compared none (`--torch-onnx-only` measures it). *exact*: within the tolerance; *differs*: exported but "
        "outside it; *fails*: no model, with the class of its cause (below). A pair whose tiny model transformers "
        "cannot build from the shrunk config is counted apart (not built); a pair whose export fails where "
        "transformers' own forward fails on the same example inputs is counted as tried, and shown apart in "
        "the column that sets it aside. A pair export-hf refuses before writing anything, with an error naming "
        "what serves it (a task or parts it does not serve) or the line of the model's code that stops it (a "
        "Python branch on tensor values, a step its own forward fails on), is counted as tried in the class *refused*, and "
        f"set aside in a second percentage. {TEXT_ONLY_LEGEND} A config whose smallest sizes break its own constraints (a rotary "
        "or latent head size, a validator) is built again with the widths that depend on them following the "
        "shrunk ones (the *derived* level). The sweep runs the pairs of text generation, text and token "
        "classification, question answering, fill-mask, image classification and sequence-to-sequence first, "
        "in turn, each task's in a fixed shuffled order, so that a sweep stopped early has sampled each of them "
        "evenly. Time is export-hf's whole command (export, save, verification); memory is the peak resident "
        "memory the pair's process added.", "",
        f"{MULTIMODAL_NOTE}", "",
        f"**Summary:** {line}.", "",
        f"**Text generation, classification, token classification, question answering, fill-mask, image "
        f"classification and sequence-to-sequence:** {priority_line}.", "",
    ] + _task_rows(by_task) + [
        "", "## Failures by class", "",
        "Each failure is recorded with the class and first line of its error and the library whose code "
        "raised it; the class is read from them.", "",
    ] + _category_rows(records) + ["", "## Failures by cause", ""] + _cause_rows(records) + [
        "", "## Refused by export-hf", "",
        "The pairs export-hf refuses before writing anything, each with the error it gives (counted as tried and "
        "not exact, and shown apart in the column that sets refusals aside).", "",
    ] + _refusal_rows(records)
    torch_causes = Counter(r.get("torch_onnx_cause", "") for r in records if r.get("torch_onnx") == "failed")
    if torch_causes:
        out += ["", "torch.onnx.export's failures by cause (the 15 most common):", "", "| cause | pairs |", "|---|---|"]
        out += [f"| {_escaped(cause)} | {count} |" for cause, count in torch_causes.most_common(15)]
    clients = _client_records(results)
    out += ["", *_client_section(clients, {(r["task"], r["architecture"]) for r in records})] if clients else []
    for task in [t for t in TASK_MAPPINGS if t in by_task]:
        out += ["", f"## {task}", ""] + _client_columns(_pair_rows(by_task[task]), by_task[task], clients)
    page.write_text("\n".join(out) + "\n", encoding="utf-8")
    return line


def _limits(records: list[dict[str, Any]]) -> str:
    """The time limits the pairs ran under: those their records hold, then the range the
    sweeps used before records held theirs."""
    held = Counter(r["limit"] for r in records if "limit" in r)
    parts = [f"{limit:.0f} s for {count} pair{'s' * (count != 1)}" for limit, count in sorted(held.items())]
    earlier = len(records) - sum(held.values())
    if earlier:
        parts.append(f"120 to 600 s for the {earlier} pairs run before the results recorded it")
    return "; ".join(parts)


def _client_records(results: Path) -> dict[tuple[str, str], dict[str, Any]]:
    # the client columns (Transformers.js, ONNX Runtime GenAI): bench/sweep_clients.py's, beside the results
    import sweep_clients

    return sweep_clients.read_clients(results.with_name(sweep_clients.RESULTS.name))


def _client_section(clients: dict[tuple[str, str], dict[str, Any]], swept: set[tuple[str, str]]) -> list[str]:
    import sweep_clients

    return sweep_clients.client_summary(clients, swept)


def _client_columns(rows: list[str], records: list[dict[str, Any]], clients: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    import sweep_clients

    return sweep_clients.with_client_columns(rows, records, clients) if clients else rows


def write_task_tables(results: Path, folder: Path) -> list[Path]:
    """Each export-hf task page's table of the sweep's architectures (bench/task_pages.py)."""
    import sweep_clients
    import task_pages

    return task_pages.write_tables(folder, read_results(results), _client_records(results), _cell,
                                   sweep_clients.client_columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASK_MAPPINGS), help="comma-separated tasks (default: all)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "architecture_sweep.jsonl")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per pair (default 120)")
    parser.add_argument("--budget", type=float, default=None, help="stop starting pairs after these many seconds")
    parser.add_argument("--per-task", type=int, default=None, help="at most this many architectures per task, spread evenly")
    parser.add_argument("--no-torch-onnx", action="store_true", help="skip torch.onnx.export's comparison (a pair run again keeps its earlier one)")
    parser.add_argument("--torch-onnx-only", action="store_true",
                        help="run torch.onnx.export's comparison alone on the recorded pairs whose comparison is not "
                             "measured (with --architectures, on those classes' pairs), keeping their export-hf results")
    parser.add_argument("--retry", action="append", default=[], choices=list(CATEGORIES),
                        help="run again the pairs whose failure is of this class (repeatable)")
    parser.add_argument("--architectures", default=None,
                        help="comma-separated classes: run only their pairs (of --tasks), again if recorded")
    parser.add_argument("--report", action="store_true", help="write docs/scoreboard.md from the results")
    parser.add_argument("--write-docs", "--report-only", dest="write_docs", action="store_true",
                        help="write the scoreboard from the results without running pairs")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASK_MAPPINGS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}: one of {', '.join(TASK_MAPPINGS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if not args.write_docs:
        architectures = None if args.architectures is None else {a for a in args.architectures.split(",") if a}
        if args.torch_onnx_only and (args.no_torch_onnx or args.retry):
            parser.error("--torch-onnx-only runs torch.onnx.export's side alone: not with --no-torch-onnx or --retry")
        sweep(tasks, args.results, args.limit, not args.no_torch_onnx, args.budget, args.per_task, set(args.retry),
              architectures, args.torch_onnx_only)
    if args.report or args.write_docs:
        print(report(args.results, ROOT / "docs" / "scoreboard.md"))
        write_task_tables(args.results, ROOT / "docs" / "guides" / "export-hf")


if __name__ == "__main__":
    main()
