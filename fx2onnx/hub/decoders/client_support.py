"""Which clients cannot load a text-generation folder as `export-hf` writes it, and why.

The one place that knows a client's limits per architecture: `export_hf` says the note
when it writes such a folder, and docs/guides/export-hf/clients.md ("Clients per architecture")
lists the same model types. The folder itself is the same for every client (one key and
one value input per layer, as ONNX Runtime GenAI and onnxruntime take it), except for a
config with ``multi_query: true`` (combined_cache.py), a hybrid decoder's convolution and
recurrent states, which take Transformers.js's names (state_names.py), Gemma 4's folder,
which also holds the embedding and decoder Transformers.js loads (per_layer_inputs.py), and the
graphs of Qwen3.5's text model, GLM-MoE-DSA and ZAYA, which take their positions and caches as
Transformers.js feeds them (mask_positions.py, indexer_cache.py, strided_cache.py).

Transformers.js, the release `TRANSFORMERS_JS` names (the one the tests pin, tests/client_versions.py;
read from its `dist/transformers.node.mjs`):

- `AutoModelForCausalLM` finds a class by `config.json`'s `model_type` in its
  causal-LM table (`TRANSFORMERS_JS_CAUSAL_LM_TYPES`); any other type stops with
  ``Unsupported model type: <type>`` (Mixtral, for one).
- it reads a model type's sizes under the names its own table gives: EXAONE's layer count
  as ``num_layers`` (the name of EXAONE's own remote code), which transformers 5 writes as
  ``num_hidden_layers``; without it Transformers.js feeds no cache at all (`Missing the
  following inputs: past_key_values.0.key`). Likewise Qwen2-VL's text sizes at the top of
  `config.json`, where transformers 5 writes them under `text_config`. The folder's
  `config.json` gets the entry under both names, with the same value (`transformers_js_entries`).
- it tells a hybrid's layers apart by transformers' older names (Nemotron-H's and
  Granite-MoE-hybrid's ``mamba`` and ``attention``), which transformers 5 writes as
  ``linear_attention`` and ``full_attention`` and reads back from either: the folder's
  `config.json` lists them by the older names.
- it sizes some model types' caches in ways no folder of transformers' model meets
  (`TRANSFORMERS_JS_CAUSAL_LM_LIMITS`): MBart's and TrOCR's decoder-only cache by no layer count
  at all.
- it runs Gemma 4 through its image-audio-text-to-text class, which loads
  `onnx/embed_tokens.onnx` and `onnx/decoder_model_merged.onnx`: the folder holds them beside
  its model (per_layer_inputs.py). It has no class for Gemma 3n's language model
  (`gemma3n_text`: a `--text-only` folder of Gemma 3n, or a Gemma3nForCausalLM checkpoint's);
  its `gemma3n` causal-LM class runs the same two models when `config.json` names
  Gemma3nForConditionalGeneration, reading the sizes from `text_config`: such a folder holds
  them, and its `config.json` says `gemma3n` and that class, the text config under
  `text_config` too (`TRANSFORMERS_JS_WRAPPED_TYPES`).
- it feeds ZAYA's cache in every ``cca_time1``-th layer only (a field transformers reads as a
  kernel size): the folder's graph takes each group of ``cca_time1`` layers' caches in the
  inputs of its first layer (strided_cache.py).
- it feeds GLM-MoE-DSA a key and a value per layer, not its indexer's keys: the folder's key
  cache carries them as one more head (indexer_cache.py).
- it runs Qwen3.5's text model through its vision-language class, which computes positions of
  its own (from a vision config a text config lacks) when the graph takes `position_ids`: the
  folder's graph counts them from the mask instead (mask_positions.py).
- it has no class for Qwen3.5-MoE's text model (`qwen3_5_moe_text`); its `qwen3_next` class feeds
  what that folder's graph takes, and transformers reads such a config back as Qwen3-Next's with
  every entry kept: the folder's `config.json` says `qwen3_next` (`TRANSFORMERS_JS_MODEL_TYPES`).
- it runs onnxruntime-node 1.30, whose CPU ``MoE`` kernel returns zeros with
  ``normalize_routing_weights=0`` when its input and output are values inside a graph (as in
  every decoder; the same node between a graph's input and output is right): the folder writes
  such experts as the renormalized kernel times the top k's share of the softmax
  (`dispatcher/functions/fused.py`), the same in every onnxruntime version.
- its cache input names read `config.json`'s ``multi_query`` whatever the model type:
  when true it feeds one combined ``past_key_values.<i>.key_value`` per layer, which such a
  folder's `onnx/model.onnx` takes (combined_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any


# the release every message names; the tests run the folders in it (tests/client_versions.py)
TRANSFORMERS_JS = "Transformers.js 4.3.2"

# The model types of Transformers.js's MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
TRANSFORMERS_JS_CAUSAL_LM_TYPES = frozenset({
    "afmoe", "apertus", "arcee", "bloom", "codegen", "cohere", "cohere2", "deepseek_v3", "deepseek_v4", "ernie4_5",
    "exaone", "falcon", "falcon_h1", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma4", "glm",
    "glm_moe_dsa", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_oss", "gptj", "granite", "granitemoehybrid",
    "helium", "hrm_text", "hunyuan_v1_dense", "jais", "lfm2", "lfm2_moe", "lfm3", "llama", "llama4_text", "mbart",
    "ministral", "ministral3", "mistral", "mistral4", "mobilellm", "modernbert-decoder", "mpt", "nanochat",
    "nemotron_h", "olmo", "olmo2", "olmo3", "olmo_hybrid", "openelm", "opt", "phi", "phi3", "phi3_v", "qwen2",
    "qwen2_5_vl", "qwen2_moe", "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_moe",
    "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "smollm3", "solar_open", "stablelm", "starcoder2", "trocr",
    "vaultgemma", "youtu", "zaya",
})

# model type -> {the name Transformers.js reads a config entry by: the name transformers writes it by
# (a dotted name: an entry of a sub-config)}
TRANSFORMERS_JS_ENTRY_NAMES = {
    "exaone": {"num_layers": "num_hidden_layers"},
    "qwen2_vl": {name: f"text_config.{name}" for name in (
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim")},
}

# model type -> {an entry Transformers.js reads in transformers' older vocabulary, which transformers
# also reads back: {transformers 5's value: the older one}}
TRANSFORMERS_JS_ENTRY_VALUES = {
    model_type: {entry: {"linear_attention": "mamba", "full_attention": "attention"}}
    for model_type, entry in (("nemotron_h", "layers_block_type"), ("granitemoehybrid", "layer_types"))
}

# model type Transformers.js has no class for -> the one whose class feeds what the folder's graph takes,
# and that transformers reads the config back as with every entry kept (Qwen3-Next's for Qwen3.5-MoE's text model:
# 2-row positions, the same state names)
TRANSFORMERS_JS_MODEL_TYPES = {"qwen3_5_moe_text": "qwen3_next"}

# text model type Transformers.js has no class for -> (the multimodal type whose causal-LM class runs its
# language model alone, that type's multimodal class): a config.json naming that class gets the class's
# text-only sessions (embed_tokens and decoder_model_merged, per_layer_inputs.py), its sizes read from
# `text_config` (Gemma 3n's language model: gemma3n_text)
TRANSFORMERS_JS_WRAPPED_TYPES = {"gemma3n_text": ("gemma3n", "Gemma3nForConditionalGeneration")}
# the entries of a folder's config.json that are no part of the model's text config
_FOLDER_ENTRIES = ("architectures", "transformers.js_config")

_NO_DECODER_ONLY_CACHE = (
    "it feeds a {model_type} causal LM no cache (src/configs.js: getKeyValueNames counts this model type's cache "
    "layers only under is_encoder_decoder, its sizes table naming an encoder-decoder's decoder_layers alone, and "
    "generate() runs a folder saying is_encoder_decoder as an encoder-decoder, an encoder session first; the one "
    "folder form it runs names another decoder's model type, opt with OPT's size entries, which transformers' "
    "AutoConfig reads back as an OPT config, so the folder keeps {model_type}): Missing the following inputs: "
    "past_key_values.0.key"
)

# model type -> (whether Transformers.js cannot feed the cache of a folder of this config, why)
TRANSFORMERS_JS_CAUSAL_LM_LIMITS: dict[str, tuple[Callable[[Mapping[str, Any]], bool], str]] = {
    "mbart": (lambda config: True, _NO_DECODER_ONLY_CACHE),
    "trocr": (lambda config: True, _NO_DECODER_ONLY_CACHE),
}


def transformers_js_reason(config: Mapping[str, Any]) -> str | None:
    """Why Transformers.js cannot load a text-generation folder whose `config.json` is
    ``config`` (a dict), or None when nothing known stops it."""
    model_type = config.get("model_type")
    if model_type not in TRANSFORMERS_JS_CAUSAL_LM_TYPES:
        return f"it has no text-generation class for model type {model_type} (Unsupported model type: {model_type})"
    applies, reason = TRANSFORMERS_JS_CAUSAL_LM_LIMITS.get(model_type, (lambda config: False, ""))
    return reason.format(model_type=model_type) if applies(config) else None


def transformers_js_entries(config: Mapping[str, Any]) -> dict[str, Any]:
    """The entries to set in a folder's `config.json` (a dict) so that Transformers.js
    finds the sizes it reads under another name than transformers writes: the same values,
    under its names (none already there is replaced); the entries it reads in
    transformers' older vocabulary, in that vocabulary (which transformers reads back); and,
    for a model type it has no class for, the one whose class runs the folder (a text model
    type of `TRANSFORMERS_JS_WRAPPED_TYPES`: the multimodal type and class, the config under
    `text_config` as well, its entries kept at the top)."""
    model_type = config.get("model_type")
    found = {"model_type": TRANSFORMERS_JS_MODEL_TYPES[model_type]} if model_type in TRANSFORMERS_JS_MODEL_TYPES else {}
    if model_type in TRANSFORMERS_JS_WRAPPED_TYPES:
        wrapper, architecture = TRANSFORMERS_JS_WRAPPED_TYPES[model_type]
        text = {key: value for key, value in config.items() if key not in _FOLDER_ENTRIES}
        found.update(model_type=wrapper, architectures=[architecture], text_config=text)
    for entry, older in TRANSFORMERS_JS_ENTRY_VALUES.get(model_type, {}).items():
        if isinstance(config.get(entry), list):
            found[entry] = [older.get(value, value) for value in config[entry]]
    names = TRANSFORMERS_JS_ENTRY_NAMES.get(model_type, {})
    for theirs, ours in names.items():
        section, *path = [config, *ours.split(".")]
        for key in path:
            section = section.get(key) if isinstance(section, Mapping) else None
        if theirs not in config and section is not None:
            found[theirs] = section
    return found


def client_note(config: Mapping[str, Any], genai_config: bool = True) -> str | None:
    """The line `export_hf` says for a text-generation folder that a client cannot load,
    or None when every client loads it; ``genai_config``: the folder has a
    `genai_config.json`, without which ONNX Runtime GenAI cannot load it either."""
    reason = transformers_js_reason(config)
    if reason is None:
        return None
    runtimes = "onnxruntime and ONNX Runtime GenAI" if genai_config else "onnxruntime only"
    return f"{TRANSFORMERS_JS} cannot load this folder: {reason}. It is for {runtimes}."


def transformers_js_unsupported(model_types: Iterable[str]) -> list[str]:
    """The ``model_types`` (a causal-LM mapping's keys) Transformers.js has no
    text-generation class for, sorted."""
    return sorted(set(model_types) - TRANSFORMERS_JS_CAUSAL_LM_TYPES)
