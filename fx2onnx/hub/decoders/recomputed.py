"""Causal LMs whose forward returns no cache (OpenAI GPT, RecurrentGemma whose states stay
inside its layers): a decoder that reads the whole sequence at every step.

The folder's `onnx/model.onnx` takes `input_ids` and `attention_mask` of the sequence so far
and returns `logits` for every position; a loader recomputes the whole sequence to pick each
next token, as transformers does for such a model. The folder's `config.json` and
`generation_config.json` say ``use_cache: false``. The graph takes `position_ids` where forward
takes them, counted over the mask's tokens as transformers' generation gives them.

Which clients run it:

- onnxruntime, and Optimum-style loaders told ``use_cache=False`` (Optimum's
  `ORTModelForCausalLM(..., use_cache=False)` runs a decoder without `past_key_values` inputs
  on the whole sequence; Optimum is not installed here, so that is read, not run);
- not ONNX Runtime GenAI 0.18: its decoders feed a key/value cache and one new token per step,
  so the folder has no `genai_config.json`;
- not Transformers.js: its generation feeds only the last token after the first step
  (`_update_model_kwargs_for_generation`, whatever ``use_cache`` says), and its causal-LM table
  lists none of these model types.

A model whose generation feeds forward other inputs than the sequence (XLM appends a mask
token, XLNet a dummy token with a permutation mask: their `prepare_inputs_for_generation`)
has no such folder: a loader that feeds the sequence would not reproduce its tokens. Nor has
one whose generation drops the mask its forward takes (Reformer's: a padded row's tokens would
differ from a folder's that is given the mask).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.decoders.decode_step import BATCH, CACHED_TOKENS, NEW_TOKENS
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.program_files import exported, fake_inputs, onnx_file, save_program
from fx2onnx.onnx_passes import WeightQuantization

# the inputs a recomputing loader feeds
FED = ("input_ids", "attention_mask")
NOTE = (
    "{name} returns no key/value cache: onnx/model.onnx reads the whole sequence at every step (use_cache: false in "
    "config.json and generation_config.json), as onnxruntime and Optimum's ORTModelForCausalLM(use_cache=False) run "
    "it. No genai_config.json: ONNX Runtime GenAI feeds a decoder a key/value cache and one token per step. "
    f"{TRANSFORMERS_JS} feeds only the last token after the first step, so it cannot run such a folder."
)


def generation_inputs_refusal(model: torch.nn.Module) -> str | None:
    """Why a loader that feeds the sequence (and its mask) cannot reproduce ``model``'s
    generation: the inputs its `prepare_inputs_for_generation` gives forward, when they are
    more than the sequence (a token appended, tensors of their own), or when it drops the mask
    forward takes (Reformer's: its padded rows then differ from a masked folder's); None when
    they are not."""
    ids = torch.full((1, 4), 3, dtype=torch.int64)
    prepared = model.prepare_inputs_for_generation(ids, attention_mask=torch.ones_like(ids), use_cache=False)
    given = prepared.get("input_ids")
    reasons = []
    if isinstance(given, torch.Tensor) and given.shape != ids.shape:
        reasons.append(f"the sequence with {given.shape[-1] - ids.shape[-1]} token(s) appended")
    extra = sorted(name for name, value in prepared.items()
                   if isinstance(value, torch.Tensor) and name not in (*FED, "input_ids", "position_ids"))
    if extra:
        reasons.append(f"input(s) of its own ({', '.join(extra)})")
    if "attention_mask" in inspect.signature(model.forward).parameters and prepared.get("attention_mask") is None:
        reasons.append("no attention mask (it drops the one it is given)")
    return " and ".join(reasons) or None


def recomputing_inputs(loaded: LoadedModel) -> dict[str, Any]:
    """Example inputs of the whole sequence (fake when the model is: `fake_inputs`), of
    lengths no other dim shares."""
    vocab = int(getattr(loaded.config, "vocab_size", 100) or 100)
    ids = torch.randint(min(3, vocab - 1), vocab, (BATCH, CACHED_TOKENS + NEW_TOKENS), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if "position_ids" in inspect.signature(loaded.model.forward).parameters:
        inputs["position_ids"] = torch.arange(ids.shape[1]).expand(ids.shape).contiguous()
    return fake_inputs(inputs, loaded)


@contextlib.contextmanager
def without_cache(model: torch.nn.Module) -> Iterator[None]:
    """``model`` with its config's ``use_cache`` false while inside: forward then builds no
    cache (RecurrentGemma's in its layers), as for a loader that recomputes the sequence."""
    kept = getattr(model.config, "use_cache", None)
    model.config.use_cache = False
    try:
        yield
    finally:
        model.config.use_cache = kept


def write_without_cache_configs(staging: Path, loaded: LoadedModel) -> list[str]:
    """The folder's `config.json` and `generation_config.json`, saying ``use_cache: false``."""
    config = json.loads(loaded.model.config.to_json_string())
    config["use_cache"] = False
    files = [write_json_file(staging, "config.json", config)]
    generation = getattr(loaded.model, "generation_config", None)
    if generation is not None:
        files.append(write_json_file(staging, "generation_config.json", {**generation.to_diff_dict(), "use_cache": False}))
    return files


def export_recomputed(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, quantization: WeightQuantization | None,
    say: Callable[[str], None],
) -> list[str]:
    """The decoder of a model without a cache: the whole sequence in, every position's logits
    out, and no genai_config.json (ONNX Runtime GenAI needs a cache); the folder's files."""
    with without_cache(loaded.model):
        program = exported(loaded.model, recomputing_inputs(loaded), options)
    name = onnx_file(loaded, folder_layout.MODEL, quantization)
    files = save_program(program, staging, name, loaded)
    say(NOTE.format(name=type(loaded.model).__name__))
    return [*files, *write_without_cache_configs(staging, loaded)]
