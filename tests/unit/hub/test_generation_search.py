"""The released checkpoints' generation configs as each client's search (shared/generation_search.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers import GenerationConfig

from fx2onnx.hub.shared import generation_search
from fx2onnx.hub.shared.genai_config import search_options
from released_generation_configs import RELEASED


def test_genai_search_carries_a_sampling_config_as_released():
    """Gemma 3's and Qwen2-VL's sampling settings under the runtime's keys; the config's ids stay in `model`."""
    gemma = generation_search.genai_search(GenerationConfig(**RELEASED["gemma3"]))
    assert gemma == {"do_sample": True, "top_k": 64, "top_p": 0.95}
    qwen = generation_search.genai_search(GenerationConfig(**RELEASED["qwen2_vl"]))
    assert qwen == {"do_sample": True, "top_k": 1, "top_p": 0.001, "temperature": 0.1, "repetition_penalty": 1.05}
    # a config that sets nothing leaves the greedy defaults as they are
    assert search_options(64, False) | generation_search.genai_search(GenerationConfig()) == search_options(64, False)


def test_genai_search_carries_beam_search_and_says_what_the_runtime_lacks():
    bart = GenerationConfig(**RELEASED["bart"])
    assert generation_search.genai_search(bart) == {
        "num_beams": 4, "length_penalty": 2.0, "no_repeat_ngram_size": 3, "min_length": 56, "early_stopping": True}
    note = generation_search.genai_note(bart)
    assert "forced_bos_token_id 0, forced_eos_token_id 2" in note and "beam search (num_beams 4)" in note
    assert generation_search.genai_note(GenerationConfig(**RELEASED["gemma3"])) is None
    # transformers' "never" is not True: the runtime's heuristic stop
    assert generation_search.genai_search(SimpleNamespace(early_stopping="never"))["early_stopping"] is False


@pytest.mark.parametrize("family", ["bart", "marian", "mbart", "m2m100", "florence2"])
def test_transformers_js_note_names_the_beams_it_runs_greedily(family):
    note = generation_search.transformers_js_note(RELEASED[family])
    assert f"num_beams {RELEASED[family]['num_beams']} runs as greedy search" in note
    assert "line 25131" in note and "lines 26175-26183" in note


def test_transformers_js_note_on_sampling_and_on_greedy_configs():
    assert "without top_p 0.95" in generation_search.transformers_js_note(RELEASED["gemma3"])
    for greedy in ("t5", "voxtral_realtime"):  # ids only: both clients search as generate does
        assert generation_search.transformers_js_note(RELEASED[greedy]) is None
        assert generation_search.genai_note(RELEASED[greedy]) is None
    assert generation_search.transformers_js_note({"do_sample": True, "top_k": 20}) is None  # no top_p: the same
    assert "typical_p" in generation_search.transformers_js_note({"typical_p": 0.9})


def test_notes_read_the_folders_file(tmp_path):
    assert generation_search.generation_notes(tmp_path, True, True) == []  # no generation_config.json
    assert generation_search.verification_note(tmp_path) is None
    (tmp_path / "generation_config.json").write_text(json.dumps(RELEASED["bart"]))
    genai, transformers_js = generation_search.generation_notes(tmp_path, True, True)
    assert genai.startswith("ONNX Runtime GenAI") and "greedy search" in transformers_js
    assert generation_search.generation_notes(tmp_path, False, False) == []
    assert "num_beams 4, no_repeat_ngram_size 3" in generation_search.verification_note(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(RELEASED["t5"]))
    assert generation_search.verification_note(tmp_path) is None
