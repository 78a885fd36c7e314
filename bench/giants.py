"""Giant models: fake-mode export of a 7B LLaMA, weights written apart, memory of saving.

Cases (each in a fresh subprocess, so that ru_maxrss is the peak of that case alone):

- ``llama7b-fake``: a LLaMA-style transformers config of about 7B parameters (hidden 4096,
  32 layers, intermediate 11008, vocab 32000) built under `fx2onnx.enable_fake_mode()`,
  exported and saved without weights (graph only). Goal: peak RSS under 4 GB.
- ``llama7b-fake-torch``: the same model built under a plain `FakeTensorMode` and given to
  `torch.onnx.export(..., dynamo=True)`, then saved without initializers. torch.onnx has no
  fake-mode API of its own (no `enable_fake_mode`, no `model_state` at save time; weights
  come back through `apply_weights`), but it accepts a model built under a fake mode.
- ``llama100m``: a ~100M-parameter LLaMA: a real checkpoint is written (safetensors), the
  model is built in fake mode, exported, saved with ``model_state=<checkpoint>``, run in
  onnxruntime and compared with PyTorch eager.
- ``real1g`` / ``real1g-torch``: a real-weights LLaMA of ~1 GB of float32 weights exported
  and saved with external data by fx2onnx / torch.onnx. Goal (fx2onnx): peak RSS under 2x
  the weights' size. ``real1g-embedded``: the same, saved with the weights inside the
  protobuf (the default below 2 GB), also streamed.

    flock /tmp/fx2onnx-heavy.lock python bench/giants.py [--cases llama7b-fake,real1g,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

GiB = 2**30

CONFIGS = {
    "7b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "100m": dict(hidden_size=768, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=12,
                 num_key_value_heads=12, vocab_size=32000),
    "1g": dict(hidden_size=1024, num_hidden_layers=16, intermediate_size=2816, num_attention_heads=16,
               num_key_value_heads=16, vocab_size=32000),
}
SEQUENCE = 128


def _peak_rss() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _llama(size: str):  # noqa: ANN202 - transformers model
    import transformers

    config = transformers.LlamaConfig(**CONFIGS[size], max_position_embeddings=2048, use_cache=False,
                                      tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


def _weights(model) -> tuple[int, int]:  # noqa: ANN001
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() for t in model.parameters()), sum(t.numel() * t.element_size() for t in tensors)


def case_llama7b_fake(folder: Path) -> dict:
    import torch

    import fx2onnx

    start = time.perf_counter()
    with fx2onnx.enable_fake_mode() as fake_context:
        model = _llama("7b")
        ids = torch.randint(0, 32000, (1, SEQUENCE))
    built = time.perf_counter() - start
    parameters, weight_bytes = _weights(model)
    options = fx2onnx.ExportOptions(fake_context=fake_context, failure_report_path=None)
    program = fx2onnx.dynamo_export(model, ids, export_options=options)
    exported = time.perf_counter() - start
    program.save(folder / "llama7b.onnx", include_initializers=False)
    graph = program.model.graph
    return {
        "parameters": parameters, "weight_bytes": weight_bytes, "build_s": built, "export_s": exported - built,
        "save_s": time.perf_counter() - start - exported, "nodes": len(graph), "functions": len(program.model.functions),
        "initializers": len(graph.initializers), "file_bytes": (folder / "llama7b.onnx").stat().st_size,
    }


def case_llama7b_fake_torch(folder: Path) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _llama("7b")
        ids = torch.randint(0, 32000, (1, SEQUENCE))
    built = time.perf_counter() - start
    parameters, weight_bytes = _weights(model)
    program = torch.onnx.export(model, (ids,), dynamo=True, verbose=False, optimize=False)
    exported = time.perf_counter() - start
    program.save(folder / "llama7b.onnx", include_initializers=False)
    return {
        "parameters": parameters, "weight_bytes": weight_bytes, "build_s": built, "export_s": exported - built,
        "save_s": time.perf_counter() - start - exported, "nodes": len(program.model.graph),
        "file_bytes": (folder / "llama7b.onnx").stat().st_size,
    }


def case_llama100m(folder: Path) -> dict:
    import numpy as np
    import onnxruntime as ort
    import safetensors.torch
    import torch

    import fx2onnx

    torch.manual_seed(0)
    real = _llama("100m")
    parameters, weight_bytes = _weights(real)
    checkpoint = folder / "llama100m.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in {**real.state_dict(), **dict(real.named_buffers())}.items()}, checkpoint)
    ids = torch.randint(0, 32000, (1, SEQUENCE))
    with torch.no_grad():
        expected = real(ids).logits.numpy()
    del real
    start = time.perf_counter()
    with fx2onnx.enable_fake_mode() as fake_context:
        model = _llama("100m")
        fake_ids = torch.randint(0, 32000, (1, SEQUENCE))
    program = fx2onnx.dynamo_export(model, fake_ids, export_options=fx2onnx.ExportOptions(fake_context=fake_context, failure_report_path=None))
    exported = time.perf_counter() - start
    path = folder / "llama100m.onnx"
    program.save(path, model_state=checkpoint, external_data=True)
    saved = time.perf_counter() - start - exported
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    return {
        "parameters": parameters, "weight_bytes": weight_bytes, "export_s": exported, "save_s": saved,
        "max_abs_diff": float(np.abs(logits - expected).max()),
        "allclose_1e-4": bool(np.allclose(logits, expected, rtol=1e-4, atol=1e-4)),
    }


def _real1g(folder: Path, exporter: str, external_data: bool = True) -> dict:
    import torch

    torch.manual_seed(0)
    model = _llama("1g")
    parameters, weight_bytes = _weights(model)
    ids = torch.randint(0, 32000, (1, SEQUENCE))
    baseline = _peak_rss()  # imports and the model itself
    start = time.perf_counter()
    path = folder / "real1g.onnx"
    if exporter == "fx2onnx":
        import fx2onnx

        program = fx2onnx.dynamo_export(model, ids, export_options=fx2onnx.ExportOptions(failure_report_path=None))
        exported = time.perf_counter() - start
        program.save(path, external_data=external_data)
    else:
        program = torch.onnx.export(model, (ids,), dynamo=True, verbose=False, optimize=False)
        exported = time.perf_counter() - start
        program.save(path, external_data=True)
    return {
        "parameters": parameters, "weight_bytes": weight_bytes, "export_s": exported,
        "save_s": time.perf_counter() - start - exported, "rss_before_export": baseline,
        "data_bytes": sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("real1g")),
    }


CASES = {
    "llama7b-fake": case_llama7b_fake,
    "llama7b-fake-torch": case_llama7b_fake_torch,
    "llama100m": case_llama100m,
    "real1g": lambda folder: _real1g(folder, "fx2onnx"),
    "real1g-torch": lambda folder: _real1g(folder, "torch"),
    "real1g-embedded": lambda folder: _real1g(folder, "fx2onnx", external_data=False),
}


def run_child(case: str) -> None:
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="fx2onnx-giants-") as folder:
        start = time.perf_counter()
        result = CASES[case](Path(folder))
        result.update(case=case, total_s=time.perf_counter() - start, peak_rss=_peak_rss())
    print(json.dumps(result))


def run_case(case: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", case]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        tail = completed.stderr.strip().splitlines()[-3:]
        return {"case": case, "error": " | ".join(tail)}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def report(result: dict) -> str:
    if "error" in result:
        return f"{result['case']:<20} FAILED: {result['error']}"
    line = f"{result['case']:<20} peak RSS {result['peak_rss'] / GiB:6.2f} GiB, total {result['total_s']:7.1f} s"
    if "parameters" in result:
        line += f", {result['parameters'] / 1e9:.2f} B params ({result['weight_bytes'] / GiB:.2f} GiB of weights)"
    if "export_s" in result:
        line += f", export {result['export_s']:.1f} s, save {result['save_s']:.1f} s"
    if result["case"].startswith("llama7b"):
        line += f"; goal < 4 GiB: {'met' if result['peak_rss'] < 4 * GiB else 'NOT met'}"
    if result["case"].startswith("real1g"):
        ratio = result["peak_rss"] / result["weight_bytes"]
        line += f"; peak RSS / weights = {ratio:.2f} (before export {result['rss_before_export'] / GiB:.2f} GiB)"
    if "max_abs_diff" in result:
        line += f"; onnxruntime vs PyTorch max |diff| {result['max_abs_diff']:.2e} (allclose 1e-4: {result['allclose_1e-4']})"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child")
    parser.add_argument("--json", help="also write the raw results to this file")
    arguments = parser.parse_args()
    if arguments.child:
        run_child(arguments.child)
        return
    results = []
    for case in arguments.cases.split(","):
        result = run_case(case)
        results.append(result)
        print(report(result), flush=True)
    by_case = {r["case"]: r for r in results if "error" not in r}
    for ours, theirs in (("llama7b-fake", "llama7b-fake-torch"), ("real1g", "real1g-torch")):
        if ours in by_case and theirs in by_case:
            print(
                f"ratio fx2onnx / torch.onnx ({ours}): peak RSS {by_case[ours]['peak_rss'] / by_case[theirs]['peak_rss']:.2f}, "
                f"time {by_case[ours]['total_s'] / by_case[theirs]['total_s']:.2f}"
            )
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
