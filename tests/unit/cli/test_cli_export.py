"""`fx2onnx export` end to end (in-process through main(argv)), and its argument checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import pytest
import torch

import fx2onnx
from conftest import ATOL, RTOL
from fx2onnx.cli.main import main
from sarif_checks import validate_sarif

MODEL_FILE = textwrap.dedent(
    """
    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(16, 8)
            self.fc2 = torch.nn.Linear(8, 4)

        def forward(self, x, scale):
            return self.fc2(torch.relu(self.fc1(x))) * scale


    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent branch
                return x + 1
            return x - 1


    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)  # the same weights in every instance
            self.embedding = torch.nn.Embedding(50, 8)

        def forward(self, ids):
            return self.embedding(ids).mean(dim=1)


    def make_net():
        torch.manual_seed(0)
        return Net()


    def make_with_inputs():
        torch.manual_seed(0)
        return Net(), (torch.randn(3, 16),), {"scale": torch.tensor([2.0])}


    def scaled_tanh(x, y):
        return torch.tanh(x) * y


    instance = Tokens()
    """
)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "nets.py"
    path.parent.mkdir()
    path.write_text(MODEL_FILE)
    return path


def _load_user_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_nets_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_onnx(path: Path, feeds: dict[str, torch.Tensor]) -> list[np.ndarray]:
    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {name: value.numpy() for name, value in feeds.items()})


def test_export_a_model_file_with_verify(tmp_path, model_file, capsys):
    output = tmp_path / "out" / "net.onnx"
    code = main([
        "export", f"{model_file}:make_net", "--input", "x=2x16:float32", "--input", "scale=1:float32",
        "--output", str(output), "--verify",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "verification: PASS" in printed and "max abs difference" in printed
    assert "inputs:  x FLOAT[2, 16], scale FLOAT[1]" in printed
    assert "outputs: " in printed and "FLOAT[2, 4]" in printed and "functions: " in printed
    report = output.with_suffix(".sarif")
    assert f"report: {report}" in printed
    validate_sarif(report)

    # The file on disk matches PyTorch in onnxruntime, independently of --verify.
    model = _load_user_module(model_file).make_net().eval()
    x, scale = torch.randn(3, 16), torch.tensor([0.5])
    (actual,) = _run_onnx(output, {"x": x[:2], "scale": scale})
    torch.testing.assert_close(torch.from_numpy(actual), model(x[:2], scale).detach(), rtol=RTOL, atol=ATOL)


def test_export_with_precision_writes_matmulnbits(tmp_path, model_file, capsys):
    output = tmp_path / "net_q4.onnx"
    code = main(["export", f"{model_file}:make_net", "--input", "x=2x16:float32", "--input", "scale=1:float32",
                 "--output", str(output), "--precision", "int4", "--quiet"])
    assert code == 0
    onnx.checker.check_model(str(output), full_check=True)
    flat = onnx.inliner.inline_local_functions(onnx.load(str(output)))
    assert [n.op_type for n in flat.graph.node].count("MatMulNBits") == 2  # both linear layers, inside their functions
    model = _load_user_module(model_file).make_net().eval()
    x, scale = torch.randn(2, 16), torch.tensor([0.5])
    (actual,) = _run_onnx(output, {"x": x, "scale": scale})
    expected = model(x, scale).detach()
    # int4 in blocks of 32 moves a random linear layer's outputs by a few percent of their magnitude
    assert (torch.from_numpy(actual) - expected).abs().max() < 0.25 * expected.abs().max()


def test_export_a_module_path_with_named_dynamic_dims(tmp_path, model_file, monkeypatch, capsys):
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(MODEL_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    output = tmp_path / "tokens.onnx"
    code = main([
        "export", "userpkg.nets:Tokens", "--input", "ids=2x7:int64:0..50", "--dynamic", "ids=0:batch,1:seq",
        "--output", str(output), "--report", str(tmp_path / "tokens.sarif"), "--verify", "--no-functions",
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # --verify also ran the model at a second size: every dynamic dim one larger.
    assert "inputs [2, 7] and [3, 8]" in printed and "verification: PASS" in printed
    proto = onnx.load(str(output))
    assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]
    assert not proto.functions  # --no-functions
    import userpkg.nets

    model = userpkg.nets.Tokens().eval()
    ids = torch.randint(0, 50, (4, 11))
    (actual,) = _run_onnx(output, {"ids": ids})
    torch.testing.assert_close(torch.from_numpy(actual), model(ids).detach(), rtol=RTOL, atol=ATOL)


def test_export_the_portable_target(tmp_path, model_file, capsys):
    """`--target portable`: one flat graph whose nodes name their module, that matches PyTorch."""
    output = tmp_path / "portable.onnx"
    code = main(["export", f"{model_file}:make_net", "--input", "x=2x16", "--input", "scale=1",
                 "--target", "portable", "--output", str(output), "--verify"])
    assert code == 0, capsys.readouterr().out
    proto = onnx.load(str(output))
    assert not proto.functions
    gemms = [node for node in proto.graph.node if node.op_type == "Gemm"]
    assert [node.name.split("/")[0] for node in gemms] == ["fc1", "fc2"]
    assert [{p.key: p.value for p in node.metadata_props}["pkg.fx2onnx.module"] for node in gemms] == ["fc1", "fc2"]
    model = _load_user_module(model_file).make_net().eval()
    x, scale = torch.randn(2, 16), torch.tensor([0.5])
    (actual,) = _run_onnx(output, {"x": x, "scale": scale})
    torch.testing.assert_close(torch.from_numpy(actual), model(x, scale).detach(), rtol=RTOL, atol=ATOL)


def test_export_a_plain_function_with_every_dim_dynamic(tmp_path, model_file, capsys):
    output = tmp_path / "fn.onnx"
    code = main(["export", f"{model_file}:scaled_tanh", "--input", "x=2x3", "--input", "y=2x3", "--dynamic",
                 "--output", str(output), "--verify"])
    printed = capsys.readouterr().out
    assert code == 0 and "exported scaled_tanh" in printed and "verification: PASS" in printed
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    (actual,) = _run_onnx(output, {"x": x, "y": y})
    torch.testing.assert_close(torch.from_numpy(actual), torch.tanh(x) * y)


def test_export_with_an_inputs_file_and_a_module_instance(tmp_path, model_file, capsys):
    inputs = tmp_path / "inputs.pt"
    ids = torch.randint(0, 50, (2, 5))
    torch.save({"args": (ids,), "kwargs": {}}, inputs)
    output = tmp_path / "inst.onnx"
    code = main(["export", f"{model_file}:instance", "--inputs-file", str(inputs), "--output", str(output), "--quiet", "--verify"])
    assert code == 0
    assert capsys.readouterr().out == ""  # --quiet
    assert onnx.load(str(output)).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_a_factory_may_return_its_example_inputs(tmp_path, model_file, capsys):
    output = tmp_path / "f.onnx"
    assert main(["export", f"{model_file}:make_with_inputs", "--output", str(output), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "with inputs x float32[3, 16], scale float32[1]" in printed and "verification: PASS" in printed
    model, (x,), kwargs = _load_user_module(model_file).make_with_inputs()
    (actual,) = _run_onnx(output, {"x": x, "scale": kwargs["scale"]})
    torch.testing.assert_close(torch.from_numpy(actual), model(x, **kwargs).detach(), rtol=RTOL, atol=ATOL)


def test_a_failing_model_exits_1_with_the_summary_and_the_report(tmp_path, model_file, capsys):
    output, report = tmp_path / "b.onnx", tmp_path / "b.sarif"
    code = main(["export", f"{model_file}:Branchy", "--input", "x=2x3", "--output", str(output), "--report", str(report)])
    errors = capsys.readouterr().err
    assert code == 1
    assert "Failed to export the model to ONNX" in errors and "[FXE0017]" in errors
    assert f"{model_file}:" in errors  # the user's line
    assert "torch.cond" in errors  # control flow is the cause here
    assert str(report.resolve()) in errors
    assert not output.exists()
    log = validate_sarif(report)
    assert any(r["ruleId"] == "FXE0017" for r in log["runs"][0]["results"])


def test_verification_outside_tolerance_exits_1(tmp_path, model_file, monkeypatch, capsys):
    run = fx2onnx.ONNXProgram.__call__

    def off_by_a_little(self, *args, **kwargs):  # onnxruntime's answer, shifted by 0.01
        return run(self, *args, **kwargs) + 0.01

    monkeypatch.setattr(fx2onnx.ONNXProgram, "__call__", off_by_a_little)
    output = tmp_path / "n.onnx"
    argv = ["export", f"{model_file}:Net", "--input", "x=2x16", "--input", "scale=1", "--output", str(output), "--verify"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "verification: FAIL, max abs difference vs PyTorch 0.01" in captured.out
    assert "verification failed" in captured.err
    assert main([*argv, "--atol", "0.02"]) == 0  # within a looser tolerance
    assert "verification: PASS" in capsys.readouterr().out


@pytest.fixture
def no_export(monkeypatch):
    """Fail the test if the export API is reached."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the export ran although the arguments were wrong")

    monkeypatch.setattr(fx2onnx, "dynamo_export", forbidden)


def _usage_cases(tmp: Path, model: Path) -> dict[str, tuple[list[str], str]]:
    folder = tmp / "a_folder"
    folder.mkdir()
    fifo = tmp / "pipe.onnx"
    os.mkfifo(fifo)
    good = [f"{model}:Net", "--input", "x=2x16", "--input", "scale=1"]
    (tmp / "link.sarif").symlink_to(tmp / "m.onnx")
    return {
        "same-output-and-report": (["export", *good, "--output", str(tmp / "same.onnx.sarif"), "--report", str(tmp / "same.onnx.sarif")], "SARIF report"),
        "same-file-through-a-link": (["export", *good, "--output", str(tmp / "m.onnx"), "--report", str(tmp / "link.sarif")], "are the same file"),
        "report-not-sarif": (["export", *good, "--output", str(tmp / "m.onnx"), "--report", str(tmp / "r.json")], ".sarif"),
        "output-is-a-directory": (["export", *good, "--output", str(folder)], "is a directory"),
        "output-is-a-fifo": (["export", *good, "--output", str(fifo)], "not a regular file"),
        "report-parent-is-a-file": (["export", *good, "--output", str(tmp / "m.onnx"), "--report", str(model / "r.sarif")], "not a folder"),
        "unknown-dtype": (["export", f"{model}:Net", "--input", "x=2x16:float33"], "unknown dtype 'float33'"),
        "bad-shape": (["export", f"{model}:Net", "--input", "x=2by16"], "is not a shape"),
        "bad-range": (["export", f"{model}:Tokens", "--input", "ids=2x3:int64:5..1"], "is empty"),
        "range-on-floats": (["export", f"{model}:Net", "--input", "x=2x3:float32:0..4"], "integer dtypes only"),
        "model-spec-without-name": (["export", str(model)], "path/to/file.py:Name"),
        "missing-file": (["export", f"{tmp / 'nope.py'}:Net", "--input", "x=2"], "no such file"),
        "missing-attribute": (["export", f"{model}:Nope", "--input", "x=2"], "has no 'Nope'"),
        "missing-module": (["export", "no_such_package_xyz.models:Net", "--input", "x=2"], "no module named"),
        "wrong-input-count": (["export", f"{model}:Net", "--input", "x=2x16"], "do not fit forward(x, scale)"),
        "no-inputs": (["export", f"{model}:Net"], "give example inputs"),
        "bad-dynamic-spec": (["export", *good, "--dynamic", "x=first"], "not a dim index"),
        "dynamic-unknown-input": (["export", *good, "--dynamic", "z=0:batch"], "no tensor input 'z'"),
        "dynamic-dim-out-of-range": (["export", *good, "--dynamic", "x=5:batch"], "has 2 dims"),
        "dynamic-both-forms": (["export", *good, "--dynamic", "--dynamic", "x=0:b"], "do not combine"),
        "weights-without-fake": (["export", *good, "--weights", str(model)], "--fake"),
        "precision-with-verify": (["export", *good, "--precision", "int4", "--verify"], "verify an export without --precision"),
        "inputs-twice": (["export", *good, "--inputs-file", str(model)], "not both"),
        "unknown-option": (["export", *good, "--frobnicate"], "unrecognized arguments"),
        "no-command": ([], "give a command"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "same-output-and-report", "same-file-through-a-link", "report-not-sarif", "output-is-a-directory", "output-is-a-fifo",
        "report-parent-is-a-file", "unknown-dtype", "bad-shape", "bad-range", "range-on-floats",
        "model-spec-without-name", "missing-file", "missing-attribute", "missing-module", "wrong-input-count",
        "no-inputs", "bad-dynamic-spec", "dynamic-unknown-input", "dynamic-dim-out-of-range",
        "dynamic-both-forms", "weights-without-fake", "precision-with-verify", "inputs-twice", "unknown-option", "no-command",
    ],
)
def test_argument_errors_exit_2_before_any_export(tmp_path, model_file, monkeypatch, no_export, capsys, case):
    monkeypatch.chdir(tmp_path)
    argv, expected = _usage_cases(tmp_path, model_file)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "fx2onnx: error:" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
    assert (tmp_path / "pipe.onnx").is_fifo()  # a FIFO given as output is left as it was


def test_fake_mode_export_takes_weights_from_a_checkpoint(tmp_path, model_file, capsys):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    real = _load_user_module(model_file).Net().eval()
    checkpoint = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in real.state_dict().items()}, str(checkpoint))
    output = tmp_path / "fake.onnx"
    code = main(["export", f"{model_file}:Net", "--input", "x=2x16", "--input", "scale=1", "--fake",
                 "--weights", str(checkpoint), "--output", str(output)])
    assert code == 0, capsys.readouterr().err
    x, scale = torch.randn(2, 16), torch.tensor([2.0])
    (actual,) = _run_onnx(output, {"x": x, "scale": scale})
    torch.testing.assert_close(torch.from_numpy(actual), real(x, scale).detach(), rtol=RTOL, atol=ATOL)

    # Without --weights the graph is saved without weight data, and the summary says so.
    bare = tmp_path / "bare.onnx"
    assert main(["export", f"{model_file}:Net", "--input", "x=2x16", "--input", "scale=1", "--fake", "--output", str(bare)]) == 0
    assert "holds no weights" in capsys.readouterr().out
    assert bare.stat().st_size < output.stat().st_size


def test_version_in_process_and_as_python_dash_m(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"fx2onnx {fx2onnx.__version__} (torch ")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "fx2onnx", "--version"], capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"fx2onnx {fx2onnx.__version__}")
    usage = subprocess.run([sys.executable, "-m", "fx2onnx", "export", "x.py:M", "--input", "x=2:nope"],
                           capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert usage.returncode == 2 and "unknown dtype 'nope'" in usage.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["demo", "--report", "r.json"], ".sarif"),
        (["demo", "--output", "same.sarif", "--report", "same.sarif"], "SARIF report"),
        (["demo", "--output", "same.onnx", "--report", "./same.onnx"], ".sarif"),
    ],
    ids=["report-not-sarif", "same-sarif-path", "same-path"],
)
def test_demo_refuses_bad_paths_before_exporting(tmp_path, monkeypatch, no_export, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert expected in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
