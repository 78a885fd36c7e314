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

    flock /tmp/fx2onnx-heavy.lock python bench/export_hf_memory.py [--folder /tmp/llama1b] [--precision int4]
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
CONFIG = dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=5632, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_write(folder: Path, precision: str | None) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder / "source", max_shard_size="1GB")
    return {"parameters": parameters, "weight_bytes": sum(p.numel() * 4 for p in model.parameters())}


def step_export(folder: Path, precision: str | None) -> dict:
    from fx2onnx.hub import export_hf

    start = time.perf_counter()
    result = export_hf(folder / "source", folder / "out", fake=True, precision=precision)
    return {"seconds": time.perf_counter() - start, "files": result.files,
            "data_bytes": (folder / "out" / "onnx" / "model.onnx_data").stat().st_size}


def step_verify(folder: Path, precision: str | None) -> dict:
    import torch
    import transformers

    from fx2onnx.hub.verify import verify_causal_lm, verify_quantized_causal_lm

    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "source").eval()
    prompt = torch.randint(3, CONFIG["vocab_size"], (12,), generator=torch.Generator().manual_seed(1)).tolist()
    if precision in ("int4", "int8"):
        quantized = verify_quantized_causal_lm(folder / "out" / "onnx" / "model.onnx", model, model.config, prompt, 8)
        return {"summary": quantized.summary()}
    verification = verify_causal_lm(folder / "out" / "onnx" / "model.onnx", model, model.config, prompt, 8)
    return {"max_logit_difference": verification.max_logit_difference, "tokens_equal": verification.tokens_equal}


STEPS = {"write": step_write, "export": step_export, "verify": step_verify}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fx2onnx-llama1b"))
    parser.add_argument("--child")
    parser.add_argument("--precision", choices=("int4", "int8", "fp32", "fp16", "bf16"))
    args = parser.parse_args()
    if args.child:
        result = STEPS[args.child](args.folder, args.precision)
        result["peak_rss"] = _peak_rss()
        print(json.dumps(result))
        return
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    results = {}
    for step in STEPS:
        command = [sys.executable, __file__, "--folder", str(args.folder), "--child", step]
        done = subprocess.run(command + (["--precision", args.precision] if args.precision else []),
                              check=True, capture_output=True, text=True)
        results[step] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{step:8s} peak RSS {results[step]['peak_rss'] / GiB:5.2f} GiB  "
              + ", ".join(f"{k}={v}" for k, v in results[step].items() if k != "peak_rss"), flush=True)
    goal = results["export"]["peak_rss"] < 1.5 * GiB
    print(f"export --fake of {results['write']['parameters'] / 1e9:.2f} B parameters "
          f"({results['write']['weight_bytes'] / GiB:.2f} GiB of weights): peak RSS "
          f"{results['export']['peak_rss'] / GiB:.2f} GiB; goal < 1.5 GiB: {'met' if goal else 'NOT met'}")
    shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
