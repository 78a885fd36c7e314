"""Vision models through fx2onnx and `torch.onnx.export(..., dynamo=True)` in one run:
torchvision's classification, segmentation, detection, video and optical-flow models and
timm families (random weights, eval mode, batch 1). For each model and exporter: the
stage reached (export, run in onnxruntime, match eager within rtol 1e-3 / atol 1e-4 of
the output's scale), export seconds and onnxruntime latency (median of --runs), and the
first error. Each model runs in a process of its own.

``--dynamic-batch`` checks the other promise: each model exported from its batch-1
example with a dynamic batch (fx2onnx's ``dynamic_shapes=True``; ``Dim.DYNAMIC`` on the
batch for torch.onnx.export), then run at batch 3 against eager at batch 3 (latency at
batch 3). ``--models classifiers`` names every classification model torchvision lists
and the timm families.

Needs torchvision (and timm for its families): run it in the vision environment
(docs/guides/vision.md).

    flock /tmp/fx2onnx-heavy.lock .venv-vision/bin/python bench/vision_models.py \\
        [--models resnet18,timm:convnext_tiny] [--markdown out.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from report_files import write_report  # noqa: E402 - bench modules side by side

TORCHVISION = {
    "classification": ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "mobilenet_v2", "mobilenet_v3_small",
                       "efficientnet_b0", "efficientnet_v2_s", "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0",
                       "squeezenet1_1", "densenet121", "googlenet", "inception_v3", "mnasnet0_5", "vit_b_16", "swin_t",
                       "maxvit_t"],
    "segmentation": ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"],
    "detection": ["fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn",
                  "fcos_resnet50_fpn", "ssd300_vgg16", "ssdlite320_mobilenet_v3_large", "maskrcnn_resnet50_fpn",
                  "keypointrcnn_resnet50_fpn"],
    "video": ["r3d_18", "s3d"],
    "optical_flow": ["raft_small"],
}
TIMM = ["resnet50", "efficientnet_b0", "convnext_tiny", "vit_small_patch16_224", "deit_small_patch16_224",
        "swin_tiny_patch4_window7_224", "mobilenetv3_large_100", "regnety_004", "rexnet_100", "ghostnet_100",
        "dla34", "cspresnet50", "levit_128", "efficientformer_l1"]
EXPORTERS = ("fx2onnx", "torch.onnx.export")


def all_models() -> list[str]:
    return [name for names in TORCHVISION.values() for name in names] + [f"timm:{name}" for name in TIMM]


def classifiers() -> list[str]:
    """Every classification model of torchvision (its own list), then the timm families."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models)) + [f"timm:{name}" for name in TIMM]


def _family(name: str) -> str:
    from torchvision import models

    found = [family for family, names in TORCHVISION.items() if name in names]
    if found:
        return found[0]
    if name in models.list_models(module=models):
        return "classification"
    raise ValueError(f"unknown model {name!r}: a torchvision model name or timm:NAME")


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The model (eval, random weights) and its example inputs."""
    import torch

    torch.manual_seed(0)
    if name.startswith("timm:"):
        import timm

        model = timm.create_model(name.split(":", 1)[1], pretrained=False).eval()
        size = model.default_cfg.get("input_size", (3, 224, 224))
        return model, (torch.randn(1, *size),)
    from torchvision import models

    family = _family(name)
    if family == "classification":
        size = 299 if name == "inception_v3" else 224
        extra = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
        return getattr(models, name)(weights=None, **extra).eval(), (torch.randn(1, 3, size, size),)
    if family == "segmentation":
        return getattr(models.segmentation, name)(weights=None, weights_backbone=None).eval(), (torch.rand(1, 3, 224, 224),)
    if family == "detection":
        threshold = {"box_score_thresh": 0.0} if "rcnn" in name else {"score_thresh": 0.0}
        model = getattr(models.detection, name)(weights=None, weights_backbone=None, **threshold).eval()
        image = torch.rand(3, 224, 224)
        return _vision_tests().distinct_scores(model, image), ([image],)
    if family == "video":  # s3d's stem needs frames of 224 pixels
        size = (16, 224, 224) if name == "s3d" else (8, 112, 112)
        return getattr(models.video, name)(weights=None).eval(), (torch.randn(1, 3, *size),)
    return getattr(models.optical_flow, name)(weights=None).eval(), (torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128))


def _vision_tests() -> Any:
    """The vision tests' module: detectors get its weights (random weights tie their
    scores, and ties cross the top-k and NMS cuts in an arbitrary order)."""
    import importlib.util

    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path[:0] = [str(tests)]  # its conftest helpers
    spec = importlib.util.spec_from_file_location("vision_tests", tests / "e2e" / "test_e2e_vision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _leaves(value: Any) -> list[Any]:
    import torch

    return [leaf for leaf in torch.utils._pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _detections_match(outputs: list[Any], expected: dict[str, Any]) -> None:
    """The vision tests' criterion for a detector (`detections_match`): the best detections
    equal eager's with their masks and keypoints, at most 1 in 20 of all differs."""
    import torch

    actual = {key: torch.from_numpy(value) for key, value in zip(expected, outputs)}
    _vision_tests().detections_match(actual, expected)


def _outputs_match(outputs: list[Any], expected: list[Any]) -> None:
    """Each output within rtol 1e-3 / atol 1e-4 of its scale of eager's."""
    import numpy as np
    import torch

    for got, want in zip(outputs, expected):
        want = want.numpy() if isinstance(want, torch.Tensor) else want
        scale = float(np.abs(want).max()) if want.size else 1.0
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4 * max(scale, 1.0)):
            difference = float(np.abs(got - want).max()) if got.shape == want.shape else float("nan")
            raise AssertionError(f"output differs from eager: shape {got.shape} vs {want.shape}, largest difference {difference:.3g}")


def _export(exporter: str, model: Any, args: tuple[Any, ...], path: Path, dynamic_batch: bool) -> None:
    import torch

    if exporter == "fx2onnx":
        import fx2onnx

        options = fx2onnx.ExportOptions(failure_report_path=None, dynamic_shapes=dynamic_batch or None)
        fx2onnx.dynamo_export(model, *args, export_options=options).save(path)
    else:
        shapes = tuple({0: torch.export.Dim.DYNAMIC} for _ in args) if dynamic_batch else None
        torch.onnx.export(model, args, str(path), dynamo=True, external_data=False, dynamic_shapes=shapes)


def _at_batch(args: tuple[Any, ...], batch: int) -> tuple[Any, ...]:
    """The example inputs with a batch of ``batch``: new random images of the same size."""
    import torch

    return tuple(torch.rand(batch, *a.shape[1:], dtype=a.dtype) for a in args)


def measure(name: str, exporter: str, runs: int, dynamic_batch: bool = False) -> dict[str, Any]:
    """One model through one exporter: the stage reached, times and the first error.
    With ``dynamic_batch``: exported at batch 1 with a dynamic batch, run at batch 3."""
    import onnxruntime as ort
    import torch

    result: dict[str, Any] = {"model": name, "exporter": exporter, "stage": "build"}
    try:
        model, args = build(name)
        run_args = _at_batch(args, 3) if dynamic_batch else args
        with torch.no_grad():
            eager = model(*run_args)
        expected = _leaves(eager)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "model.onnx"
            result["stage"] = "export"
            start = time.perf_counter()
            _export(exporter, model, args, path, dynamic_batch)
            result["export_seconds"] = time.perf_counter() - start
            result["stage"] = "run"
            options = ort.SessionOptions()
            options.log_severity_level = 3
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            inputs = [leaf.numpy() for leaf in _leaves(run_args)]
            feed = dict(zip([i.name for i in session.get_inputs()], inputs))
            outputs = session.run(None, feed)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - start)
            result["latency_ms"] = statistics.median(times) * 1e3
        result["stage"] = "match"
        if len(outputs) != len(expected):
            raise AssertionError(f"{len(outputs)} outputs, eager has {len(expected)}")
        if name in TORCHVISION["detection"]:  # one image: one dict of boxes, labels, scores (masks, keypoints)
            _detections_match(outputs, eager[0])
        else:
            _outputs_match(outputs, expected)
        result["stage"] = "pass"
    except Exception as error:  # noqa: BLE001 - a benchmark row: the stage and the first error
        result["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
        result["traceback"] = traceback.format_exc(limit=3)
    return result


def _child(name: str, exporter: str, runs: int, timeout: float, dynamic_batch: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, exporter, "--runs", str(runs)] + (["--dynamic-batch"] if dynamic_batch else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "exporter": exporter, "stage": "timeout", "error": f"more than {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"model": name, "exporter": exporter, "stage": "crash", "error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "no output"}
    return json.loads(lines[-1])


def markdown(results: list[dict[str, Any]]) -> str:
    rows = {}
    for result in results:
        rows.setdefault(result["model"], {})[result["exporter"]] = result

    def cell(result: dict[str, Any] | None) -> str:
        if result is None:
            return "-"
        if result["stage"] == "pass":
            return f"pass ({result['export_seconds']:.1f} s, {result['latency_ms']:.1f} ms)"
        return f"fails at {result['stage']}"

    lines = ["| model | fx2onnx | torch.onnx.export | latency fx2onnx / torch | first error (fx2onnx) |", "|---|---|---|---:|---|"]
    for model, by_exporter in rows.items():
        mine, theirs = by_exporter.get("fx2onnx"), by_exporter.get("torch.onnx.export")
        ratio = "-"
        if mine and theirs and mine.get("latency_ms") and theirs.get("latency_ms"):
            ratio = f"{mine['latency_ms'] / theirs['latency_ms']:.2f}x"
        error = (mine or {}).get("error", "").replace("|", "/")[:160]
        lines.append(f"| {model} | {cell(mine)} | {cell(theirs)} | {ratio} | {error} |")
    passed = {e: sum(1 for r in results if r["exporter"] == e and r["stage"] == "pass") for e in EXPORTERS}
    lines.append("")
    lines.append(f"Passing, of {len(rows)}: fx2onnx {passed['fx2onnx']}, torch.onnx.export {passed['torch.onnx.export']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all", help="comma-separated; timm families as timm:NAME; 'all' (the table's models) or 'classifiers'")
    parser.add_argument("--dynamic-batch", action="store_true", help="export at batch 1 with a dynamic batch, run and compare at batch 3")
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--runs", type=int, default=10, help="onnxruntime runs per model (median)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model and exporter")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(measure(*options.child, options.runs, options.dynamic_batch)))
        return
    names = {"all": all_models, "classifiers": classifiers}.get(options.models, lambda: options.models.split(","))()
    results = []
    for name in names:
        for exporter in options.exporters.split(","):
            print(f"... {name} with {exporter}", file=sys.stderr, flush=True)
            results.append(_child(name, exporter, options.runs, options.timeout, options.dynamic_batch))
    write_report(markdown(results), results, options.markdown, options.json)


if __name__ == "__main__":
    main()
