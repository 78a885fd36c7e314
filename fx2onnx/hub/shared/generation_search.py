"""The search a folder's `generation_config.json` asks for, as each client runs it.

transformers' `generate` runs the whole generation config: beam search (`num_beams`,
`length_penalty`, `early_stopping`), sampling (`do_sample`, `top_k`, `top_p`,
`temperature`) and the logits processors (`repetition_penalty`, `no_repeat_ngram_size`,
`bad_words_ids`, `forced_bos_token_id`, ...). The folder keeps the file as the source has
it (folder_files.py copies it); the clients differ in what they read of it:

- ONNX Runtime GenAI reads its own `search` section of `genai_config.json`:
  `genai_search` writes the generation config's values there (src/config.cpp parses the
  keys; src/search.cpp applies `min_length`, `repetition_penalty` and
  `no_repeat_ngram_size` to greedy and beam search alike). The runtime has no forced
  tokens, bad words or suppressed tokens in its search: `genai_note` names those the
  generation config sets.
- Transformers.js reads `generation_config.json` itself (`_prepare_generation_config`)
  and applies the processors transformers has for greedy search
  (`_get_logits_processor`), but with `num_beams` > 1 it runs greedy search: its sampler
  for beams returns the `num_beams` best tokens of a row and `generate` appends the first
  and stops looking (`break`). `transformers_js_note` says so with the source lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.shared.json_files import read_json_if_present

GENERATION_CONFIG = "generation_config.json"
# the generation config's fields ONNX Runtime GenAI's search section has under the same name
_GENAI_NUMBERS = {
    "num_beams": int, "length_penalty": float, "no_repeat_ngram_size": int, "repetition_penalty": float, "min_length": int,
    "top_k": int, "top_p": float, "temperature": float, "diversity_penalty": float,
}
# what transformers' generate applies that GenAI's search has no key for
_GENAI_LACKS = (
    "forced_bos_token_id", "forced_eos_token_id", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
    "sequence_bias", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
    "min_new_tokens", "typical_p", "min_p", "epsilon_cutoff", "eta_cutoff",
)
# what transformers' generate applies that Transformers.js's _get_logits_processor (line 25808) never reads
_TRANSFORMERS_JS_LACKS = (
    "sequence_bias", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
    "typical_p", "min_p", "epsilon_cutoff", "eta_cutoff",
)
# the lines of the pinned release's dist/transformers.node.mjs the notes cite
_TRANSFORMERS_JS_LINES = (
    "dist/transformers.node.mjs: LogitsSampler.getSampler, line 25131, picks BeamSearchSampler for num_beams > 1; "
    "its sample, lines 25184-25207, returns the num_beams best tokens of the row; generate, lines 26175-26183, "
    "appends the first of them and breaks"
)


def _value(generation: Any, name: str) -> Any:
    """``name`` of a GenerationConfig or of the dict `generation_config.json` holds; None when unset."""
    if generation is None:
        return None
    return generation.get(name) if isinstance(generation, dict) else getattr(generation, name, None)


def _set(generation: Any, name: str) -> bool:
    """Whether the generation config asks for something with ``name`` (not unset, not off;
    a token id, 0 too, is set)."""
    value = _value(generation, name)
    if name.endswith(("_token_id", "_ids", "_tokens")):
        return value not in (None, [])
    off = 1.0 if name.endswith("penalty") or name == "typical_p" else 0
    return value not in (None, False, off)


def genai_search(generation: Any) -> dict[str, Any]:
    """The `search` keys of genai_config.json the generation config sets (None: nothing):
    its sampling, beam search and repetition settings under the runtime's names.
    transformers' `early_stopping="never"` has no runtime equivalent: written as False,
    the runtime's (and transformers') heuristic stop."""
    search: dict[str, Any] = {}
    for name, kind in _GENAI_NUMBERS.items():
        value = _value(generation, name)
        if value is not None:
            search[name] = kind(value)
    for name in ("do_sample", "early_stopping"):
        value = _value(generation, name)
        if value is not None:
            search[name] = value is True
    return search


def genai_note(generation: Any) -> str | None:
    """What ONNX Runtime GenAI's search runs unlike transformers' `generate` with the
    generation config (None: the same): the settings it has no option for, and its beam search."""
    notes = []
    lacking = [f"{name} {_value(generation, name)}" for name in _GENAI_LACKS if _set(generation, name)]
    if lacking:
        notes.append(f"the runtime has no search option for {', '.join(lacking)} (src/config.cpp's search keys): its "
                     "generation does not apply them, transformers' generate does")
    beams = _value(generation, "num_beams")
    if beams is not None and int(beams) > 1:
        notes.append(
            f"its beam search (num_beams {beams}) applies min_length, repetition_penalty and no_repeat_ngram_size to the "
            "logits before normalizing them (src/search.cpp: the Apply* calls of RunStandardDecodingStep, then "
            "BeamSearch_Cpu::SelectTop's LogSoftMax) where transformers normalizes first, and divides a finished beam's "
            "score by the whole sequence's length: its beams may differ from transformers' (greedy search, num_beams 1, "
            "gives transformers' tokens)")
    if not notes:
        return None
    return ("ONNX Runtime GenAI: genai_config.json's search has the generation config's sampling, beam search and "
            "repetition settings, but " + "; ".join(notes) + ".")


def transformers_js_note(generation: Any) -> str | None:
    """What Transformers.js runs unlike transformers' `generate` with this generation config (None: the same)."""
    differences = []
    beams = _value(generation, "num_beams")
    if beams is not None and int(beams) > 1:
        differences.append(
            f"num_beams {beams} runs as greedy search ({_TRANSFORMERS_JS_LINES}); length_penalty and early_stopping are "
            "read nowhere. Its tokens are transformers' generate with num_beams=1 and the config's logits processors "
            "(no_repeat_ngram_size, repetition_penalty, bad_words_ids, forced_bos/eos_token_id, min_length), which it applies")
    if _value(generation, "do_sample") is True and _set(generation, "top_p") and float(_value(generation, "top_p")) < 1.0:
        differences.append(
            f"do_sample samples among the top_k tokens at the temperature without top_p {_value(generation, 'top_p')} "
            "(_get_logits_processor, line 25808, adds no TopPLogitsWarper; MultinomialSampler, line 25157)")
    lacking = [name for name in _TRANSFORMERS_JS_LACKS if _set(generation, name)]
    if lacking:
        differences.append(f"{', '.join(lacking)} read nowhere (_get_logits_processor, line 25808)")
    if not differences:
        return None
    return f"{TRANSFORMERS_JS} with this folder's {GENERATION_CONFIG}: " + "; ".join(differences) + "."


def folder_generation_config(folder: Path) -> dict[str, Any] | None:
    """The folder's `generation_config.json`, None without one."""
    return read_json_if_present(folder / GENERATION_CONFIG)


def generation_notes(folder: Path, genai: bool, transformers_js: bool) -> list[str]:
    """What the clients of ``folder`` run unlike transformers' `generate` with its
    generation config: ONNX Runtime GenAI's (``genai``: the folder has its config) and
    Transformers.js's (``transformers_js``: a folder it loads)."""
    generation = folder_generation_config(folder)
    notes = [genai_note(generation) if genai else None, transformers_js_note(generation) if transformers_js else None]
    return [note for note in notes if note is not None]


def verification_note(folder: Path) -> str | None:
    """What `--verify` compares of a folder whose generation config asks for more than greedy
    search: the graphs' logits and greedy tokens, not the search, which is each client's."""
    generation = folder_generation_config(folder)
    asked = [f"{name} {_value(generation, name)}" for name in ("num_beams", "do_sample", "no_repeat_ngram_size",
                                                                "repetition_penalty", "forced_bos_token_id",
                                                                "forced_eos_token_id", "bad_words_ids")
             if _set(generation, name) and not (name == "num_beams" and int(_value(generation, name)) == 1)]
    if not asked:
        return None
    return (f"verification decoded greedily without the search of {GENERATION_CONFIG} ({', '.join(asked)}): it checks "
            "the graphs' logits and tokens; the search is the client's, as the notes above say")
