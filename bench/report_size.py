"""Size of the SARIF report of a successful GPT-2 export, per verbosity level.

GPT-2 "small" (12 layers, width 768, 12 heads; random weights, nothing downloaded)
is exported once per verbosity; the report is written, validated-size, and its results
are counted by level and rule.

    python bench/report_size.py [--layers 12] [--width 768] [--heads 12]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import tempfile
import time
import warnings
from pathlib import Path

import torch

import fx2onnx

VERBOSITIES = {"INFO (default)": logging.INFO, "DEBUG": logging.DEBUG}


def gpt2(layers: int, width: int, heads: int) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, use_cache=False)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore")
    model = gpt2(arguments.layers, arguments.width, arguments.heads)
    input_ids = torch.randint(0, model.config.vocab_size, (1, 16))
    print(f"GPT-2, {arguments.layers} layers, width {arguments.width}: SARIF report of a successful export")
    print(f"{'verbosity':<16}{'bytes':>10}{'results':>9}  {'by level and rule'}")
    with tempfile.TemporaryDirectory() as folder:
        for label, level in VERBOSITIES.items():
            options = fx2onnx.ExportOptions(
                diagnostic_options=fx2onnx.DiagnosticOptions(verbosity_level=level), failure_report_path=None
            )
            start = time.perf_counter()
            program = fx2onnx.dynamo_export(model, input_ids, export_options=options)
            seconds = time.perf_counter() - start
            path = Path(folder) / "report.sarif"
            program.save_diagnostics(path)
            results = json.loads(path.read_text())["runs"][0]["results"]
            counts = collections.Counter(f"{r['level']} {r['ruleId']}" for r in results)
            summary = ", ".join(f"{key}: {count}" for key, count in sorted(counts.items()))
            print(f"{label:<16}{path.stat().st_size:>10}{len(results):>9}  {summary}  (export {seconds:.1f} s)")


if __name__ == "__main__":
    main()
