"""`export_hf(..., fake=True)` of a ~1B LLaMA `save_pretrained` folder: peak memory of the
export, and the folder checked against eager PyTorch on a prompt.

Three steps, each in a fresh subprocess so that ru_maxrss is the peak of that step alone:
``write`` builds a real LLaMA (hidden 2048, 16 layers, about 1.1B parameters) and saves it
with save_pretrained and a tokenizer trained here; ``export`` runs
`fx2onnx.hub.export_hf(folder, out, fake=True)` (goal: peak RSS under 1.5 GB, against
about 4.4 GB of float32 weights); ``verify`` loads the real model and runs the folder's
onnx/model.onnx in onnxruntime: prefill and greedy decode steps, logits compared.

``--precision int4`` (or int8) exports weight-only MatMulNBits: each weight is read from
the checkpoint and quantized as it is written, so the peak stays that of the float export;
``verify`` then reports the logit error and greedy-token agreement with the float model.

``--size 7b`` takes LLaMA-2-7B's shapes (6.7B parameters): the folder is written one
random bfloat16 tensor at a time (no model is built: 13 GB of weights), the export's goal
is a peak under 4 GiB, and ``verify`` loads the ONNX file in onnxruntime and runs a prefill
and decode steps (logits finite, the cache growing) instead of comparing with a 7B model
in PyTorch, which this machine cannot hold in float32.

    flock /tmp/fx2onnx-heavy.lock python bench/export_hf_memory.py [--folder /tmp/llama1b] [--precision int4]
    flock /tmp/fx2onnx-heavy.lock python bench/export_hf_memory.py --size 7b --precision int4 --folder /tmp/llama7b
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

GiB = 2**30
SIZES = {
    "1b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=5632, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "7b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
               torch_dtype="bfloat16"),
}
GOALS = {"1b": 1.5 * GiB, "7b": 4 * GiB}
CONFIG = SIZES["1b"]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_write(folder: Path, precision: str | None) -> dict:
    import torch
    import transformers

    if CONFIG is SIZES["7b"]:
        return _write_streamed(folder)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder / "source", max_shard_size="1GB")
    return {"parameters": parameters, "weight_bytes": sum(p.numel() * 4 for p in model.parameters())}


def _write_streamed(folder: Path) -> dict:
    """A save_pretrained-style folder written one random tensor at a time: the model is built
    on the meta device for its names and shapes only."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.LlamaConfig(**CONFIG, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {name: tensor.shape for name, tensor in transformers.LlamaForCausalLM(config).state_dict().items()}
    source = folder / "source"
    source.mkdir(parents=True)
    config.save_pretrained(source)
    generator = torch.Generator().manual_seed(0)
    shard, shard_bytes, index, parameters = {}, 0, {}, 0

    def flush() -> None:
        nonlocal shard, shard_bytes
        name = f"model-{len(set(index.values())) + 1:05d}.safetensors"
        save_file(shard, source / name, metadata={"format": "pt"})
        index.update({tensor_name: name for tensor_name in shard})
        shard, shard_bytes = {}, 0

    for name, shape in shapes.items():
        scale = 1.0 if name.endswith("norm.weight") else 0.02
        shard[name] = (torch.randn(shape, generator=generator) * scale).to(torch.bfloat16)
        if name.endswith("norm.weight"):
            shard[name] = torch.ones(shape, dtype=torch.bfloat16)
        parameters += shard[name].numel()
        shard_bytes += shard[name].numel() * 2
        if shard_bytes > 2 * GiB:
            flush()
    if shard:
        flush()
    total = sum((source / f).stat().st_size for f in set(index.values()))
    (source / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    return {"parameters": parameters, "weight_bytes": parameters * 2}


def _smoke_run(model_path: Path) -> dict:
    """Prefill and two decode steps in onnxruntime: finite logits, a growing cache."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    layers, heads = CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"]
    head_size = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    cache_type = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
    feeds = {f"past_key_values.{i}.{kind}": np.zeros((1, heads, 0, head_size), cache_type)
             for i in range(layers) for kind in ("key", "value")}
    tokens = np.array([[1, 450, 4996, 17354, 1701, 29916]], dtype=np.int64)
    finite, lengths = True, []
    for _ in range(3):
        past = feeds["past_key_values.0.key"].shape[2]
        feeds["input_ids"] = tokens
        feeds["attention_mask"] = np.ones((1, past + tokens.shape[1]), np.int64)
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(past, past + tokens.shape[1], dtype=np.int64)[None]
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs})))
        finite = finite and bool(np.isfinite(outputs["logits"]).all())
        for i in range(layers):
            for kind in ("key", "value"):
                feeds[f"past_key_values.{i}.{kind}"] = outputs[f"present.{i}.{kind}"]
        lengths.append(int(outputs["present.0.key"].shape[2]))
        tokens = outputs["logits"][:, -1:].argmax(-1).astype(np.int64)
    return {"logits_finite": finite, "cache_lengths": lengths}


def step_export(folder: Path, precision: str | None) -> dict:
    from fx2onnx.hub import export_hf
    start = time.perf_counter()
    result = export_hf(folder / "source", folder / "out", fake=True, precision=precision)
    return {"seconds": time.perf_counter() - start, "files": result.files,
            "data_bytes": sum((folder / "out" / f).stat().st_size for f in result.files if f.endswith("_data"))}


def _onnx_model(folder: Path) -> Path:
    """The exported decoder: model.onnx, or model_q4.onnx / model_quantized.onnx for int4 / int8."""
    return next((folder / "out" / "onnx").glob("model*.onnx"))


def step_verify(folder: Path, precision: str | None) -> dict:
    import torch
    import transformers

    from fx2onnx.hub.shared.verification import verify_causal_lm, verify_quantized_causal_lm

    if CONFIG is SIZES["7b"]:
        return _smoke_run(_onnx_model(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "source").eval()
    prompt = torch.randint(3, CONFIG["vocab_size"], (12,), generator=torch.Generator().manual_seed(1)).tolist()
    if precision in ("int4", "int8"):
        quantized = verify_quantized_causal_lm(_onnx_model(folder), model, model.config, prompt, 8)
        return {"summary": quantized.summary()}
    verification = verify_causal_lm(_onnx_model(folder), model, model.config, prompt, 8)
    return {"max_logit_difference": verification.max_logit_difference, "tokens_equal": verification.tokens_equal}


STEPS = {"write": step_write, "export": step_export, "verify": step_verify}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fx2onnx-llama1b"))
    parser.add_argument("--child")
    parser.add_argument("--precision", choices=("int4", "int8", "fp32", "fp16", "bf16"))
    parser.add_argument("--size", choices=tuple(SIZES), default="1b")
    args = parser.parse_args()
    global CONFIG
    CONFIG = SIZES[args.size]
    if args.child:
        result = STEPS[args.child](args.folder, args.precision)
        result["peak_rss"] = _peak_rss()
        print(json.dumps(result))
        return
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    results = {}
    for step in STEPS:
        command = [sys.executable, __file__, "--folder", str(args.folder), "--child", step, "--size", args.size]
        done = subprocess.run(command + (["--precision", args.precision] if args.precision else []),
                              check=True, capture_output=True, text=True)
        results[step] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{step:8s} peak RSS {results[step]['peak_rss'] / GiB:5.2f} GiB  "
              + ", ".join(f"{k}={v}" for k, v in results[step].items() if k != "peak_rss"), flush=True)
    goal = results["export"]["peak_rss"] < GOALS[args.size]
    print(f"export --fake of {results['write']['parameters'] / 1e9:.2f} B parameters "
          f"({results['write']['weight_bytes'] / GiB:.2f} GiB of weights): peak RSS "
          f"{results['export']['peak_rss'] / GiB:.2f} GiB; goal < {GOALS[args.size] / GiB:.1f} GiB: {'met' if goal else 'NOT met'}")
    shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
