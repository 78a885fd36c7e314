"""`genai_config.json`: what ONNX Runtime GenAI needs to run a causal LM's `model.onnx`.

The model type is the config's where the runtime knows it (its own list,
decoders/decoder_types.py), else its generic `decoder`. Sizes come from the config; bos/eos/pad ids from
`generation_config.json` when the folder has one. The past and present buffers are
shared (`past_present_share_buffer: true`) when every layer's cache is updated by
onnxruntime's `GroupQueryAttention`, which then writes the new tokens into the buffer of
the context's length in place, and the model takes `position_ids` (one that does not,
Blenderbot's decoder, counts its positions from the past's length); otherwise the model
returns new cache tensors.

The sections every GenAI configuration holds (each model's session options, the token
ids, the greedy search) are written here once, for every folder kind's configuration
(whisper_config.py's and vision_language/genai_files.py's too). A decoder's search is then
the generation config's where it sets one (sampling, beam search, repetition settings:
generation_search.py), as transformers' `generate` would run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx_ir as ir

from fx2onnx.hub.shared.json_files import read_json_if_present
from fx2onnx.onnx_passes import ONNXRUNTIME_DOMAIN
from fx2onnx.hub.decoders.decode_step import decoder_sizes, head_size
from fx2onnx.hub.decoders.decoder_types import genai_decoder_type
from fx2onnx.hub.decoders.model_lengths import context_length
from fx2onnx.hub.shared.generation_search import genai_search


def _token_id(value: Any) -> Any:
    """A token id, or the list of them (several eos ids); None stays None."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value] if len(value) > 1 else (int(value[0]) if value else None)
    return None if value is None else int(value)


def _maker(value: ir.Value, model: ir.Model) -> ir.Node | None:
    """The node that computes ``value``, looked for inside the model-local functions and
    in the branch an `If` takes when its kernel runs (the exact form of the other branch
    gives the same buffer: `fx2onnx/onnx_passes/cached_attention_guard.py`)."""
    node = value.producer()
    while node is not None and (node.op_identifier() in model.functions or node.op_type == "If"):
        body = node.attributes["then_branch"].as_graph() if node.op_type == "If" else model.functions[node.op_identifier()]
        value = body.outputs[value.index()]
        node = value.producer()
    return node


def _cache_name_part(key_name: str) -> str:
    """What a cache input's name holds between its layer and `key`: "" for
    `past_key_values.0.key`, "decoder." for `past_key_values.0.decoder.key`."""
    return key_name.split(".", 2)[2][: -len("key")]


def updates_cache_in_place(model: ir.Model) -> bool:
    """Whether every `present.*` output is made by onnxruntime's `GroupQueryAttention`,
    which appends to the past in place when the runtime gives both one buffer."""
    presents = [value for value in model.graph.outputs if value.name.startswith("present.")]
    makers = [_maker(value, model) for value in presents]
    return bool(presents) and all(
        node is not None and (node.domain, node.op_type) == (ONNXRUNTIME_DOMAIN, "GroupQueryAttention") for node in makers
    )


def session_options() -> dict[str, Any]:
    """The `session_options` section of each model a GenAI config names: the runtime's log
    id and its default providers."""
    return {"log_id": "onnxruntime-genai", "provider_options": []}


def token_ids(config: Any, generation_config: Any) -> dict[str, Any]:
    """bos, eos and pad token ids: `generation_config.json`'s, else the config's; pad
    defaults to (the first) eos. A model without a bos token (Pegasus, RoCBERT) gets its
    decoder's start token, else pad: ONNX Runtime GenAI refuses a config without a number
    there, and it feeds the prompt's ids as given. A model without an eos token (RoCBERT)
    gets an empty list of them: GenAI refuses null there but takes a list, and an empty one
    ends no sequence early, as transformers' generation without an eos token."""
    ids = {
        key: _token_id(getattr(generation_config, key, None) if generation_config is not None else None)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
    }
    for key, value in ids.items():
        if value is None:
            ids[key] = _token_id(getattr(config, key, None))
    if ids["pad_token_id"] is None:
        ids["pad_token_id"] = ids["eos_token_id"][0] if isinstance(ids["eos_token_id"], list) else ids["eos_token_id"]
    if ids["bos_token_id"] is None:
        start = _token_id(getattr(config, "decoder_start_token_id", None))
        ids["bos_token_id"] = start if start is not None else ids["pad_token_id"]
    if ids["eos_token_id"] is None:
        ids["eos_token_id"] = []
    return ids


def search_options(max_length: int, share_buffer: bool) -> dict[str, Any]:
    """The `search` section: greedy up to ``max_length`` tokens."""
    return {
        "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
        "max_length": max_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
        "num_return_sequences": 1, "past_present_share_buffer": share_buffer, "repetition_penalty": 1.0,
        "temperature": 1.0, "top_k": 50, "top_p": 1.0,
    }


GENAI_CONFIG = "genai_config.json"


def genai_decoder_file(folder: Path) -> str | None:
    """The folder path of the decoder ONNX Runtime GenAI reads in ``folder`` (its
    `genai_config.json`'s), None for a folder without one."""
    settings = read_json_if_present(folder / GENAI_CONFIG)
    return None if settings is None else settings["model"]["decoder"]["filename"]


def genai_config(config: Any, generation_config: Any, filename: str, model: ir.Model) -> dict[str, Any]:
    """The config of the decoder ``model`` (saved as ``filename``): its inputs, its layers,
    heads and head size as its cache inputs have them (batch, heads, past, head size),
    and buffer sharing where it updates the cache in place."""
    input_names = [value.name for value in model.graph.inputs]
    config = decoder_sizes(config)
    keys = [value for value in model.graph.inputs if value.name.startswith("past_key_values.") and value.name.endswith(".key")]
    kv_heads, cache_head_size = (int(keys[0].shape[1]), int(keys[0].shape[3])) if keys else (None, head_size(config))
    context = context_length(config)
    ids = token_ids(config, generation_config)
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if "position_ids" in input_names:
        inputs["position_ids"] = "position_ids"
    # a decoder with an encoder-decoder cache class (BERT-like causal LMs) names its
    # entries `past_key_values.<i>.decoder.key`: the runtime is given the names the graph has
    part = _cache_name_part(keys[0].name) if keys else ""
    inputs |= {"past_key_names": f"past_key_values.%d.{part}key", "past_value_names": f"past_key_values.%d.{part}value"}
    heads = int(config.num_attention_heads)
    return {
        "model": {
            **ids,
            "context_length": context,
            "decoder": {
                "session_options": session_options(),
                "filename": filename,
                "head_size": cache_head_size,
                "hidden_size": int(config.hidden_size),
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": f"present.%d.{part}key",
                            "present_value_names": f"present.%d.{part}value"},
                "num_attention_heads": heads,
                "num_hidden_layers": len(keys),
                "num_key_value_heads": kv_heads or int(getattr(config, "num_key_value_heads", None) or heads),
            },
            "type": genai_decoder_type(config),
            "vocab_size": int(config.vocab_size),
        },
        # a model without position_ids reads its positions from the past's length, which a
        # shared buffer (the whole context long) does not give
        "search": search_options(context, updates_cache_in_place(model) and "position_ids" in input_names)
        | genai_search(generation_config),
    }


def genai_state_note(config: Any, states: list[str]) -> str:
    """Why a decoder with states of fixed size (a hybrid's convolution and recurrent states,
    ``states``) gets no `genai_config.json`: ONNX Runtime GenAI feeds such states only to
    the models its own builder writes (their state groups, for its paged attention)."""
    return (
        f"no genai_config.json: {config.model_type}'s decoder carries {len(states)} state(s) of fixed size beside its "
        f"cache ({states[0]}, ...), which ONNX Runtime GenAI feeds only to the models its own builder writes; the "
        "folder's model runs in onnxruntime (fed zeros as the first states) and in Transformers.js where it has the class"
    )


def unequal_head_sizes_note(config: Any, model: ir.Model) -> str | None:
    """Why a decoder whose cached keys and values have different head sizes (a latent
    attention's, as Youtu's) gets no `genai_config.json`: ONNX Runtime GenAI 0.18 allocates
    every key and value buffer with the one `head_size` its config gives. None when they match."""
    inputs = {value.name: value for value in model.graph.inputs}
    for name, key in inputs.items():
        if not (name.startswith("past_key_values.") and name.endswith(".key")):
            continue
        value = inputs.get(name[: -len("key")] + "value")
        if value is None or key.shape is None or value.shape is None or len(key.shape) != 4 or len(value.shape) != 4:
            continue
        if key.shape[3] != value.shape[3]:
            return (
                f"no genai_config.json: {config.model_type}'s cached keys and values have different head sizes "
                f"({name} {key.shape[3]}, its value {value.shape[3]}), and ONNX Runtime GenAI gives every cache buffer "
                "one head size; the folder's model runs in onnxruntime and in Transformers.js where it has the class"
            )
    return None


def _read_by_nodes(value: ir.Value, model: ir.Model) -> bool:
    """Whether a node reads ``value``, or the value standing for it in the model-local
    function or in either branch of the `If` that makes it (a decoder whose layers run in
    a kernel branch and a guarded one: `fx2onnx/onnx_passes/cached_attention_guard.py`)."""
    if value.uses():
        return True
    node = value.producer()
    if node is None:
        return False
    if node.op_type == "If":
        return any(_read_by_nodes(node.attributes[branch].as_graph().outputs[value.index()], model)
                   for branch in ("then_branch", "else_branch"))
    if node.op_identifier() in model.functions:
        return _read_by_nodes(model.functions[node.op_identifier()].outputs[value.index()], model)
    return False


def shared_cache_note(config: Any, model: ir.Model) -> str | None:
    """Why a decoder whose later layers attend to an earlier layer's updated keys and values
    (Gemma 4's KV-shared layers, `num_kv_shared_layers`) gets a `genai_config.json` with
    past and present apart (`past_present_share_buffer: false`). None when no layer reads
    another's `present.*` (a layer's own attention reading its `present.*`, as standard
    operators' attention does, is not sharing: the config says which layers share)."""
    shared = getattr(decoder_sizes(config), "num_kv_shared_layers", None)
    if not isinstance(shared, int) or shared <= 0:
        return None
    read = sorted(value.name for value in model.graph.outputs
                  if value.name.startswith("present.") and _read_by_nodes(value, model))
    if not read:
        return None
    return (
        f"genai_config.json with past and present apart (past_present_share_buffer false): {config.model_type}'s last "
        f"{shared} layers attend to the keys and values of earlier layers ({', '.join(read)}), which the graph reads "
        "from those layers' present outputs; ONNX Runtime GenAI's shared buffer holds the whole context (max_length, "
        "kv_cache.cpp: the buffer's sequence dim set to max_length when past_present_share_buffer is on), longer than "
        "the attention_mask those layers are masked by (onnxruntime stops: invalid expand shape). Past and present apart, "
        "each present is the past and the step's tokens, as the graph's layers read it"
    )
