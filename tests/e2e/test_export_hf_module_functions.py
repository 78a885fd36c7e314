"""`export-hf --module-functions` (each module call an ONNX function) for the folders whose
client-specific graphs are written from the saved one: ONNX Runtime GenAI's windowed
decoder (a sliding layer holds a window-sized cache) and the multi-query folder's two
graphs (one combined key/value cache per layer for Transformers.js, separate ones for
GenAI). Each graph keeps the functions, passes the full checker and generates
transformers' tokens in its client, past the window where there is one."""

from __future__ import annotations

import json
import os

import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.windowed_cache import windowed_decoder_file
from test_sliding_window import WINDOWS, check_in_genai, expected_tokens, model_of, prompts_for
from test_transformers_js import MULTI_QUERY_CONFIGS, NEW_TOKENS, PROMPTS, greedy, left_padded, run_in_transformers_js
from test_transformers_js import tokenizer, transformers_js  # noqa: F401 - the fixtures

transformers = pytest.importorskip("transformers")


def checked_functions(path) -> set[str]:
    """The model-local functions of the graph at ``path``, after the full checker."""
    onnx.checker.check_model(onnx.load(os.fspath(path)), full_check=True)
    return {function.name for function in onnx.load(os.fspath(path), load_external_data=False).functions}


def test_windowed_decoder_with_module_functions_in_genai(tmp_path):
    """Gemma 3 text, window 16: the windowed decoder GenAI reads keeps the attention
    modules' functions and generates transformers' tokens past the window, each prompt
    alone and as GenAI's right-padded batch; --verify passes for both graphs."""
    family = "gemma3_text"
    model = model_of(family, WINDOWS[family])
    model.save_pretrained(tmp_path / "source")
    out = tmp_path / "out"
    result = export_hf(tmp_path / "source", out, module_functions=True, verify=True)
    assert result.verification.passed
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["filename"] == windowed_decoder_file("onnx/model.onnx")
    saved, windowed = checked_functions(out / "onnx" / "model.onnx"), checked_functions(out / decoder["filename"])
    assert saved and saved == windowed
    assert any("self_attn" in name for name in windowed)
    prompts = prompts_for(WINDOWS[family])
    check_in_genai(out, prompts, expected_tokens(model, prompts))


@pytest.mark.parametrize("family", ["falcon-multi-query"])
def test_multi_query_folder_with_module_functions(tmp_path, family, tokenizer, transformers_js):
    """Falcon with multi_query: true and module functions: the combined-cache graph (for
    Transformers.js) and the separate-cache one (for GenAI) both keep the functions, and
    Transformers.js generates transformers' tokens alone and as a left-padded batch."""
    torch.manual_seed(0)
    config = MULTI_QUERY_CONFIGS[family](len(tokenizer))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    out = tmp_path / "out"
    result = export_hf(tmp_path / "source", out, module_functions=True, verify=True)
    assert result.verification.passed
    combined, separate = checked_functions(out / "onnx" / "model.onnx"), checked_functions(
        out / "onnx" / "model_separate_cache.onnx")
    assert combined and combined == separate
    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS]
    ids, mask = left_padded(prompts)
    job = {"folder": str(out), "task": "text-generation", "strings": [], "prompts": prompts, "new_tokens": NEW_TOKENS,
           "batch": {"input_ids": ids, "attention_mask": mask}}
    in_js = run_in_transformers_js(transformers_js, tmp_path, job)
    assert in_js["generated"] == [greedy(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0]
                                  for p in prompts]
    assert in_js["batch_generated"] == greedy(model, torch.tensor(ids), torch.tensor(mask))
