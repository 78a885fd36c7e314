"""ONNXProgram: the model as proto and onnx_ir, saving (external data, no half-written
files), adapting PyTorch inputs and outputs, diagnostics, failed exports."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from fx2onnx.program import model_writer
from conftest import assert_outputs_close, check_saved_model, export_program
from sarif_checks import validate_sarif


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 16)  # weight over the 256-byte inline threshold

    def forward(self, x: torch.Tensor, z: torch.Tensor):
        return {"y": self.linear(x), "z": z * 2}


@pytest.fixture
def inputs():
    return torch.randn(3, 8), torch.randn(2, 2, dtype=torch.complex64)


@pytest.fixture
def program(tmp_path, inputs) -> fx2onnx.ONNXProgram:
    return export_program(TwoOutputs(), inputs, tmp_path=tmp_path)


def test_model_proto_and_model(program):
    proto = program.model_proto
    assert isinstance(proto, onnx.ModelProto)
    onnx.checker.check_model(proto, full_check=True)
    assert isinstance(program.model, ir.Model)
    assert [i.name for i in proto.graph.input] == ["x", "z"]
    assert "linear.weight" in {t.name for t in proto.graph.initializer}
    assert proto.producer_name == "fx2onnx"


def test_call_returns_model_structure(program, inputs):
    model = TwoOutputs().eval()
    model.load_state_dict({"linear.weight": program.model.graph.initializers["linear.weight"].const_value.raw,
                           "linear.bias": program.model.graph.initializers["linear.bias"].const_value.raw})
    result = program(*inputs)
    assert set(result) == {"y", "z"} and result["z"].dtype == torch.complex64
    assert_outputs_close(result, model(*inputs))


def test_adapt_inputs_and_outputs(program, inputs):
    onnx_inputs = program.adapt_torch_inputs_to_onnx(*inputs)
    assert [tuple(t.shape) for t in onnx_inputs] == [(3, 8), (2, 2, 2)]
    flat_outputs = program.run_flat(onnx_inputs)
    expected = program.adapt_torch_outputs_to_onnx(program(*inputs))
    assert len(flat_outputs) == len(expected) == 2
    for got, want in zip(flat_outputs, expected):
        torch.testing.assert_close(got, want)
    assert tuple(expected[1].shape) == (2, 2, 2)  # complex as real pairs


def test_adapted_inputs_feed_onnxruntime_directly(program, inputs, tmp_path):
    path = check_saved_model(program, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), program.adapt_torch_inputs_to_onnx(*inputs))}
    results = session.run(None, feed)
    for got, want in zip(results, program.adapt_torch_outputs_to_onnx(program(*inputs))):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_save_embeds_weights_by_default(program, tmp_path):
    path = check_saved_model(program, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx.data").exists()
    assert onnx.load(str(path)).graph.initializer[0].HasField("raw_data")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fx2onnx")] == []


def test_save_with_external_data(program, inputs, tmp_path):
    path = check_saved_model(program, tmp_path / "m.onnx", external_data=True)
    data = tmp_path / "m.onnx.data"
    assert data.exists() and data.stat().st_size > 0
    loaded = onnx.load(str(path), load_external_data=False)
    external = {t.name for t in loaded.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert "linear.weight" in external
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), program.adapt_torch_inputs_to_onnx(*inputs))}
    np.testing.assert_allclose(session.run(None, feed)[0], program(*inputs)["y"].numpy(), rtol=1e-5, atol=1e-6)
    # the folder holds exactly the model and its data
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".sarif")) == ["m.onnx", "m.onnx.data"]


def test_weights_over_the_protobuf_limit_go_to_external_data(program, inputs, tmp_path, monkeypatch):
    """The 2 GB rule, with the limit lowered so that this small model crosses it: save()
    writes a data file unasked, and running the program loads it from a file."""
    import fx2onnx.program.onnx_program

    expected = program(*inputs)["y"]
    program.release()
    monkeypatch.setattr(fx2onnx.program.onnx_program, "_PROTOBUF_LIMIT", 64)
    monkeypatch.setattr(type(program), "model_proto", property(lambda self: pytest.fail("serialized whole")))
    program.save(tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size > 0
    torch.testing.assert_close(program(*inputs)["y"], expected)
    onnx.checker.check_model(str(tmp_path / "big.onnx"), full_check=True)


def test_save_into_new_folder_and_overwrite(program, tmp_path):
    path = tmp_path / "nested" / "folder" / "m.onnx"
    program.save(path)
    first = path.read_bytes()
    program.save(path)
    assert path.read_bytes() == first
    onnx.checker.check_model(str(path), full_check=True)


def test_failed_save_leaves_nothing_behind(program, tmp_path):
    target = tmp_path / "out.onnx"
    target.mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(IsADirectoryError, match="directory"):
        program.save(target)
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(target) == []


def test_failed_write_leaves_no_file(program, tmp_path, monkeypatch):
    def broken_write(proto, staged):
        with open(staged, "wb") as handle:
            handle.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(model_writer, "_write_proto", broken_write)
    with pytest.raises(OSError, match="disk full"):
        program.save(tmp_path / "m.onnx", external_data=True)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".sarif")] == []


def test_save_diagnostics_is_valid_sarif(program, tmp_path):
    path = tmp_path / "export.sarif"
    program.save_diagnostics(path)
    log = validate_sarif(path)
    assert log["runs"][0]["tool"]["driver"]["name"] == "fx2onnx"


def test_stage_times_are_recorded(program):
    assert {"capture", "translation"} <= set(program.stage_seconds)


class Unsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.testlib.program_mystery(x)


@torch.library.custom_op("testlib::program_mystery", mutates_args=())
def _program_mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_program_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_failed_export_program_has_no_model(tmp_path):
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        export_program(Unsupported(), (torch.randn(2),), tmp_path=tmp_path)
    program = caught.value.onnx_program
    with pytest.raises(RuntimeError, match="failed export"):
        program.model_proto
    program.save_diagnostics(tmp_path / "failed.sarif")
    validate_sarif(tmp_path / "failed.sarif")
    assert str(tmp_path / "r.sarif") in str(caught.value)


def test_no_report_file_when_path_is_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(Unsupported(), torch.randn(2), export_options=fx2onnx.ExportOptions(failure_report_path=None))
    assert "SARIF report is at" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_small_integer_initializers_stay_in_the_model_file(tmp_path):
    """External data holds the weights; small integer tensors (indices, and shape inputs
    such as a Slice's starts, whose values onnxruntime reads only from the model file) stay."""

    class Picks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 16)
            self.register_buffer("columns", torch.tensor([0, 3, 5]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)[:, self.columns]

    x, model = torch.randn(3, 8), Picks().eval()
    program = export_program(model, (x,), tmp_path=tmp_path)
    path = check_saved_model(program, tmp_path / "m.onnx", external_data=True)
    loaded = onnx.load(str(path), load_external_data=False)
    located = {t.name: t.data_location for t in loaded.graph.initializer}
    assert located["linear.weight"] == onnx.TensorProto.EXTERNAL and located["columns"] == onnx.TensorProto.DEFAULT
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], expected, rtol=1e-5, atol=1e-6)


def test_a_resize_s_scales_stay_in_the_model_file(tmp_path):
    """A Resize's float scales, which onnxruntime's shape inference reads from the model file
    only, are not written to the data file (a portable folder with them there failed to load:
    "Cannot parse data from external tensors")."""

    class Upsampled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.interpolate(x, scale_factor=2.0, mode="nearest") + 1

    x = torch.randn(1, 2, 3, 4)
    options = fx2onnx.ExportOptions(dynamic_shapes=True, target="portable", opset_version=20)
    program = fx2onnx.dynamo_export(Upsampled().eval(), x, export_options=options)
    resize = next(node for node in program.model.graph if node.op_type == "Resize")
    scales = resize.inputs[2]
    assert scales is not None and scales.is_initializer() and scales.dtype == ir.DataType.FLOAT
    path = tmp_path / "m.onnx"
    program.save(path, external_data=True)
    located = {t.name: t.data_location for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    assert located[scales.name] == onnx.TensorProto.DEFAULT
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0],
                               Upsampled()(x).numpy(), rtol=1e-6, atol=1e-6)


def test_the_portable_target_holds_no_library_functions(tmp_path):
    """torchlib writes `aten.fill` as a call of its function `aten_fill` (VITS's folders held one):
    the portable file, for runtimes that take no functions, has its nodes inlined instead."""

    class Filled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.empty_like(x).fill_(2.5) + torch.ops.aten.fill.Scalar(x, 1.0)

    x = torch.randn(2, 3)
    calls = {}
    for target in ("default", "portable"):
        program = fx2onnx.dynamo_export(Filled().eval(), x, export_options=fx2onnx.ExportOptions(dynamic_shapes=True, target=target))
        proto = program.model_proto
        onnx.checker.check_model(proto, full_check=True)
        calls[target] = [f.name for f in proto.functions]
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], Filled()(x).numpy(), rtol=0, atol=0)
    assert calls == {"default": ["aten_fill"], "portable": []}
