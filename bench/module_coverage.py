"""PyTorch's torch.nn modules through both exporters: fx2onnx and torch.onnx.export(dynamo=True).

The module counterpart of `bench/opinfo_coverage.py`: PyTorch's own ModuleInfo database
(`torch.testing._internal.common_modules.module_db`: every torch.nn module with its
constructor and forward sample inputs) in eval mode. Each sample's module is built from
its constructor arguments, cast to the dtype, exported by each exporter, run in
onnxruntime and compared with eager (the OpInfo harness's tolerances). A module passes
for an exporter when each of its samples does; a module counts as capturable when
torch.export captures each of its samples (non-strict), the same for both exporters.

    flock /tmp/fx2onnx-heavy.lock python bench/module_coverage.py --json modules.json --markdown modules.md
    python bench/module_coverage.py --only nn.Conv3d,nn.LSTM --dtype float64
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opinfo_harness import EXPORTERS, SampleResult, first_line, quiet, run_module  # noqa: E402

SAMPLES_PER_MODULE = 2
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ForwardSample(torch.nn.Module):
    """Calls the module with the tensor leaves of one forward sample taken from forward();
    the other leaves (ints, None, flags) are closed over."""

    def __init__(self, module: torch.nn.Module, leaves: list[Any], spec: Any, positions: list[int]) -> None:
        super().__init__()
        self.module = module
        self.leaves = leaves
        self.spec = spec
        self.positions = positions

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.positions, tensors):
            leaves[position] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.module(*args, **kwargs)


def module_name(info: Any) -> str:
    return info.name


def module_samples(info: Any, dtype: torch.dtype, limit: int) -> list[tuple[ForwardSample, list[torch.Tensor]]]:
    """(wrapped module, tensor inputs) for the first `limit` eval-mode samples."""
    torch.manual_seed(0)
    samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False, training=False)
    result = []
    for sample in samples[:limit]:
        if sample.forward_input is None:
            continue
        torch.manual_seed(0)
        constructor = sample.constructor_input
        module = info.module_cls(*constructor.args, **constructor.kwargs).to(dtype).eval()
        leaves, spec = pytree.tree_flatten((tuple(sample.forward_input.args), dict(sample.forward_input.kwargs)))
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        inputs = [leaves[i].detach() for i in positions]
        closed = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        result.append((ForwardSample(module, closed, spec, positions), inputs))
    return result


def capturable(module: torch.nn.Module, inputs: list[torch.Tensor]) -> str:
    """"" when torch.export captures the sample (non-strict), else the first line of why not."""
    try:
        torch.export.export(module, tuple(inputs), strict=False)
    except Exception as error:  # noqa: BLE001 - a column of the table
        return f"{type(error).__name__}: {first_line(error)}"
    return ""


def run(info: Any, dtype: torch.dtype, limit: int, seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {"module": module_name(info), "skipped": "", "capture": "", "results": {}}
    if dtype not in info.supported_dtypes("cpu"):
        row["skipped"] = f"no {dtype} support"
        return row
    try:
        samples = module_samples(info, dtype, limit)
    except Exception as error:  # noqa: BLE001 - the database's own failure
        row["skipped"] = f"samples: {type(error).__name__}: {first_line(error)}"
        return row
    if not samples:
        row["skipped"] = "no samples"
        return row
    row["capture"] = next((why for why in (capturable(m, x) for m, x in samples) if why), "")
    for exporter in EXPORTERS:
        row["results"][exporter] = [asdict(run_module(exporter, m, x, dtype, seconds)) for m, x in samples]
    return row


def passed(row: dict[str, Any], exporter: str) -> bool:
    results = [r for r in row["results"].get(exporter, []) if r["status"] != "eager"]
    return bool(results) and all(r["status"] == "pass" for r in results)


def first_failure(row: dict[str, Any], exporter: str) -> str:
    for result in row["results"].get(exporter, []):
        if result["status"] not in ("pass", "eager"):
            return f"{result['status']}: {result['reason']}"[:200]
    return ""


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tested = [r for r in rows if r["results"] and any(x["status"] != "eager" for x in r["results"].get("fx2onnx", []))]
    capturable_rows = [r for r in tested if not r["capture"]]
    counts = {exporter: sum(passed(r, exporter) for r in tested) for exporter in EXPORTERS}
    return {
        "modules": len(rows),
        "tested": len(tested),
        "capturable": len(capturable_rows),
        "passing": counts,
        "passing_capturable": {e: sum(passed(r, e) for r in capturable_rows) for e in EXPORTERS},
        "torch_only": [r["module"] for r in tested if passed(r, "torch") and not passed(r, "fx2onnx")],
        "fx2onnx_only": [r["module"] for r in tested if passed(r, "fx2onnx") and not passed(r, "torch")],
        "failure_kinds": dict(Counter(first_failure(r, "fx2onnx").split(":")[0] for r in tested if not passed(r, "fx2onnx"))),
    }


def markdown(rows: list[dict[str, Any]], totals: dict[str, Any], dtype: str) -> str:
    lines = [
        f"torch {torch.__version__}, {dtype}; {totals['tested']} modules tested of {totals['modules']}, "
        f"{totals['capturable']} capturable by torch.export",
        "",
        f"- fx2onnx passes {totals['passing']['fx2onnx']}, torch.onnx.export {totals['passing']['torch']}; "
        f"of the capturable: {totals['passing_capturable']['fx2onnx']} / {totals['passing_capturable']['torch']}",
        f"- passing only with torch.onnx.export: {', '.join(totals['torch_only']) or 'none'}",
        f"- passing only with fx2onnx: {', '.join(totals['fx2onnx_only']) or 'none'}",
        "",
        "| module | fx2onnx | torch.onnx.export | first fx2onnx failure (or why torch.export cannot capture) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        if row["skipped"]:
            continue
        mark = {True: "pass", False: "fail"}
        why = first_failure(row, "fx2onnx") or (f"capture: {row['capture']}" if row["capture"] else "")
        lines.append(f"| {row['module']} | {mark[passed(row, 'fx2onnx')]} | {mark[passed(row, 'torch')]} | {why.replace('|', '/')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--only", default="", help="comma-separated module names (nn.Conv3d, ...)")
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_MODULE, help="samples per module")
    parser.add_argument("--seconds", type=float, default=120, help="time limit per sample and exporter")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    options = parser.parse_args()
    quiet()
    from torch.testing._internal.common_modules import module_db

    wanted = {name for name in options.only.split(",") if name}
    infos = [info for info in module_db if not wanted or module_name(info) in wanted]
    rows = []
    start = time.perf_counter()
    for info in infos:
        row = run(info, DTYPES[options.dtype], options.samples, options.seconds)
        rows.append(row)
        verdict = row["skipped"] or " ".join(f"{e}={'pass' if passed(row, e) else 'fail'}" for e in EXPORTERS)
        print(f"{row['module']:40} {verdict}  {first_failure(row, 'fx2onnx')[:120]}", flush=True)
    totals = summary(rows)
    table = markdown(rows, totals, options.dtype)
    print(f"\n{table}\n\n{time.perf_counter() - start:.0f} s")
    if options.json:
        Path(options.json).write_text(json.dumps({"summary": totals, "rows": rows}, indent=1), encoding="utf-8")
    if options.markdown:
        Path(options.markdown).write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
