"""`export-hf` folders in the browser: Transformers.js's web build in headless Chromium on
the WebGPU device.

Chromium runs headless with a software WebGPU adapter (SwiftShader, so no GPU is needed),
driven by `playwright-core` from npm; `browser_runner.mjs` serves the page, the library,
onnxruntime-web's files and the folders on 127.0.0.1. A `--runtime standard` LLaMA folder
generates transformers' greedy tokens and a BERT feature-extraction folder gives its
outputs within 1e-4; onnxruntime-web's verbose log says where each node runs, and it
leaves no node computing on floats on the CPU (its CPU share is shape and index
arithmetic, which onnxruntime keeps there on purpose).

Skipped, saying why, where Chromium is missing (set FX2ONNX_CHROMIUM to its executable
elsewhere than /usr/bin/chromium), where Node or npm is missing, or where the npm registry
cannot be reached; `playwright-core` is installed once into a cache folder beside
Transformers.js's (FX2ONNX_TEST_CACHE, default ~/.cache/fx2onnx-tests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from test_export_hf import save_causal_lm, save_encoder
from test_transformers_js import PROMPTS, greedy, left_padded, npm_installed, trained_tokenizer, transformers_js  # noqa: F401 (a fixture)

transformers = pytest.importorskip("transformers")

PLAYWRIGHT_VERSION = "1.65.1"
RUNNER = Path(__file__).with_name("browser_runner.mjs")
NEW_TOKENS = 16
PLACED = re.compile(r"Node\(s\) placed on \[(\w+)\]")
NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\w+) \((.*)\)$")
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's executable, or the test skipped with the reason (before anything is installed)."""
    given = os.environ.get("FX2ONNX_CHROMIUM")
    if given:
        if not Path(given).is_file():
            pytest.skip(f"browser tests need Chromium: FX2ONNX_CHROMIUM names no file ({given})")
        return given
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("browser tests need Chromium: no `chromium` on PATH (Debian: `apt-get install chromium`; "
                    "elsewhere set FX2ONNX_CHROMIUM to its executable)")
    return path


@pytest.fixture(scope="session")
def playwright(chromium, transformers_js) -> Path:
    """The npm prefix holding playwright-core (which drives a Chromium it does not download)."""
    return npm_installed("playwright-core", PLAYWRIGHT_VERSION, f"playwright-core-{PLAYWRIGHT_VERSION}", minutes=5)


def placements(log: list[str]) -> dict[str, list[tuple[str, str]]]:
    """onnxruntime's node placements, as its verbose log lists them: for each execution
    provider, the (operator, node name) pairs it runs."""
    placed: dict[str, list[tuple[str, str]]] = {}
    provider = None
    for line in log:
        if match := PLACED.search(line):
            provider = match.group(1)
            placed.setdefault(provider, [])
        elif provider and (match := NODE.search(line)):
            placed[provider].append((match.group(1), match.group(2)))
        else:
            provider = None
    return placed


def nodes_on_floats(path: Path, names: list[str]) -> list[tuple[str, str]]:
    """The nodes of ``names`` in the file at ``path`` that read a float tensor (onnxruntime's
    own nodes, such as copies and fused kernels, are not in the file)."""
    model = onnx.shape_inference.infer_shapes(onnx.load(os.fspath(path), load_external_data=False))
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    nodes = {node.name: node for node in graph.node}
    return sorted((nodes[name].op_type, name) for name in names
                  if name in nodes and any(types.get(i) in FLOATS for i in nodes[name].input))


def test_folders_run_on_webgpu_in_chromium(tmp_path, chromium, transformers_js, playwright):  # noqa: F811 (the fixture)
    tokenizer = trained_tokenizer()
    models = tmp_path / "models"
    llama = save_causal_lm(tmp_path / "llama-source", "llama", tokenizer)
    export_hf(tmp_path / "llama-source", models / "llama", runtime="standard")
    save_encoder(tmp_path / "bert-source", "bert", tokenizer)
    export_hf(tmp_path / "bert-source", models / "bert")  # attention as one MultiHeadAttention node
    export_hf(tmp_path / "bert-source", models / "bert-standard", runtime="standard")  # attention decomposed
    for folder in ("llama", "bert", "bert-standard"):
        onnx.checker.check_model(os.fspath(models / folder / "onnx" / "model.onnx"), full_check=True)

    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS[:2]]
    ids, mask = left_padded(prompts)
    batch = tokenizer(list(PROMPTS), padding=True, return_tensors="pt")  # padded: the mask matters
    encoder_run = {"inputs": {name: batch[name].tolist() for name in ("input_ids", "attention_mask")},
                   "outputs": ["last_hidden_state"]}
    job = {"models_root": str(models), "runs": [
        {"folder": "llama", "prompts": prompts, "new_tokens": NEW_TOKENS, "batch": {"input_ids": ids, "attention_mask": mask}},
        {"folder": "bert", **encoder_run},
        {"folder": "bert-standard", **encoder_run},
    ]}
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    done = subprocess.run(["node", str(RUNNER), str(playwright), str(transformers_js), chromium, str(tmp_path / "job.json"),
                           str(tmp_path / "result.json")], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"the browser run failed:\n{done.stderr[-3000:]}"
    result = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert result["adapter"] == {"architecture": "swiftshader", "vendor": "google"}
    causal, encoder, encoder_standard = result["runs"]

    expected = [greedy(llama, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0] for p in prompts]
    assert causal["generated"] == expected  # 16 greedy tokens each, over the cache
    assert causal["batch_generated"] == greedy(llama, torch.tensor(ids), torch.tensor(mask))
    with torch.no_grad():
        bert = transformers.BertModel.from_pretrained(tmp_path / "bert-source").eval()
        hidden = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    for run in (encoder, encoder_standard):
        got = run["outputs"]["last_hidden_state"]
        assert got["dims"] == list(hidden.shape)
        np.testing.assert_allclose(np.reshape(got["data"], got["dims"]), hidden.numpy(), rtol=0, atol=1e-4)

    # Where each node ran: every node computing on floats on WebGPU (the CPU's share is
    # shape and index arithmetic, which onnxruntime keeps there on purpose). The decomposed
    # attention has no IsNaN (WebGPU has no kernel for it); the default encoder's attention
    # is onnxruntime's MultiHeadAttention (WebGPU has no kernel for opset 23's Attention).
    for run, folder in zip((causal, encoder, encoder_standard), ("llama", "bert", "bert-standard")):
        placed = placements(run["log"])
        assert set(placed) == {"WebGpuExecutionProvider", "CPUExecutionProvider"}, placed.keys()
        on_cpu = nodes_on_floats(models / folder / "onnx" / "model.onnx", [name for _, name in placed["CPUExecutionProvider"]])
        assert on_cpu == [], on_cpu
        on_webgpu = {op for op, _ in placed["WebGpuExecutionProvider"]}
        assert {"MatMul", "Add", "LayerNormalization" if folder != "llama" else "Mul"} <= on_webgpu
        if folder == "bert":
            assert "MultiHeadAttention" in on_webgpu
        else:  # the decomposed attention's products, softmax and masks
            assert {"Softmax", "Where"} <= on_webgpu
