"""The float32 twin of a float16 file (fx2onnx/hub/precision/float32_twin.py): every float16
value, initializer, constant and cast target widened, in the main graph, a function body
and a sub-graph; the twin computes in onnxruntime what the float16 weights give in
float32; other weights are refused with what to do."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from fx2onnx.hub.precision.float32_twin import refusal, widen_to_float32, write_float32_twins

_HALF = TensorProto.FLOAT16


def _float16_model() -> onnx.ModelProto:
    """y = If(flag, then: Cast(x, f16) * w + c, else: f(x)) with f a function of
    Cast(x, f16) + Constant(f16); x float32 in, y float16 out."""
    weight = numpy_helper.from_array(np.array([0.5, -1.25, 3.0], np.float16), "w")
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(0.125, np.float16)))
    then = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xh"], to=_HALF), helper.make_node("Mul", ["xh", "w"], ["m"]), constant,
         helper.make_node("Add", ["m", "c"], ["t"])],
        "then", [], [helper.make_tensor_value_info("t", _HALF, [3])])
    body = [helper.make_node("Cast", ["a"], ["ah"], to=_HALF),
            helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float16))),
            helper.make_node("Add", ["ah", "one"], ["b"])]
    function = helper.make_function("local", "plus_one", ["a"], ["b"], body, [helper.make_opsetid("", 20)])
    otherwise = helper.make_graph([helper.make_node("plus_one", ["x"], ["e"], domain="local")], "else", [],
                                  [helper.make_tensor_value_info("e", _HALF, [3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=otherwise)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", _HALF, [3])], [weight])
    return helper.make_model(graph, functions=[function],
                             opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local", 1)])


def _run(model: onnx.ModelProto, flag: bool) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.array([1.0, 2.0, 3.0], np.float32), "flag": np.array(flag)})[0]


def test_every_float16_tensor_is_widened_and_the_twin_computes_in_float32():
    source = _float16_model()
    onnx.checker.check_model(source, full_check=True)
    model = ir.serde.deserialize_model(source)
    widen_to_float32(model)
    twin = ir.serde.serialize_model(model)
    onnx.checker.check_model(twin, full_check=True)
    text = str(twin)
    assert "data_type: 10" not in text and "elem_type: 10" not in text and "i: 10" not in text  # no FLOAT16 left
    for flag, expected in ((True, np.array([1.0, 2.0, 3.0]) * [0.5, -1.25, 3.0] + 0.125), (False, np.array([2.0, 3.0, 4.0]))):
        got = _run(twin, flag)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected.astype(np.float32))
        np.testing.assert_array_equal(_run(source, flag).astype(np.float32), got)  # exact here in float16 too


def test_twins_are_written_beside_the_float16_files(tmp_path):
    (tmp_path / "onnx").mkdir()
    onnx.save(_float16_model(), tmp_path / "onnx" / "model_fp16.onnx", save_as_external_data=True,
              location="model_fp16.onnx_data", size_threshold=0)
    written = write_float32_twins(tmp_path, ["onnx/model_fp16.onnx", "onnx/model_fp16.onnx_data", "config.json"])
    assert written == ["onnx/model.onnx", "onnx/model.onnx_data"]
    twin = onnx.load(tmp_path / "onnx" / "model.onnx")
    onnx.checker.check_model(twin, full_check=True)
    assert _run(twin, True).dtype == np.float32


@pytest.mark.parametrize(("dtype", "quantized", "named"), [(torch.float32, False, "torch.float32"), (torch.float16, True, "quantized")])
def test_other_weights_are_refused_saying_what_to_do(dtype, quantized, named):
    assert refusal(torch.float16, False) is None
    message = refusal(dtype, quantized)
    assert named in message and "--precision fp16" in message
