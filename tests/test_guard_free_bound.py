"""The guard-free bound's rewrite (`bench/guard_free_bound.py`): every top-level `If` becomes
its then branch, and the condition's nodes, which nothing reads any more, are dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import guard_free_bound  # noqa: E402


def _guarded() -> onnx.ModelProto:
    """y = x + w where every x is positive (the guard), x - w elsewhere; z = x * 2 where
    it holds (an outer value through an Identity), -2x elsewhere."""
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["sum"]), helper.make_node("Identity", ["doubled"], ["kept"])],
                             "then", [], [helper.make_tensor_value_info("sum", TensorProto.FLOAT, [3]),
                                          helper.make_tensor_value_info("kept", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["difference"]),
                               helper.make_node("Neg", ["doubled"], ["negated"])], "else", [],
                              [helper.make_tensor_value_info("difference", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("negated", TensorProto.FLOAT, [3])])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]),
         helper.make_node("Greater", ["x", "zero"], ["positive"]),
         helper.make_node("Cast", ["positive"], ["flags"], to=TensorProto.INT32),
         helper.make_node("ReduceMin", ["flags"], ["least"], keepdims=0),
         helper.make_node("Cast", ["least"], ["held"], to=TensorProto.BOOL),
         helper.make_node("If", ["held"], ["y", "z"], then_branch=then, else_branch=other)],
        "guarded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_the_ifs_become_their_then_branch_and_the_condition_goes(tmp_path) -> None:
    model = _guarded()
    x = np.array([-1.0, 0.5, 2.0], np.float32)  # the guard does not hold: the model takes else
    assert np.allclose(_run(model, x)[0], x - [1, 2, 3])
    assert guard_free_bound.inline_then_branches(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Mul", "Add", "Identity"]
    y, z = _run(model, x)  # the kernel's branch whatever the guard says: the bound, not exact
    np.testing.assert_array_equal(y, x + [1, 2, 3])
    np.testing.assert_array_equal(z, x * 2)


def test_a_folder_is_copied_with_its_decoder_rewritten(tmp_path) -> None:
    folder = tmp_path / "fx2onnx-fp32"
    (folder / "onnx").mkdir(parents=True)
    onnx.save(_guarded(), str(folder / "onnx" / "model.onnx"))
    (folder / "genai_config.json").write_text("{}")
    out = tmp_path / "fx2onnx-fp32-unguarded"
    out.mkdir()
    (out / "stale").write_text("replaced")
    assert guard_free_bound.write_unguarded(folder, out) == 1
    assert sorted(p.name for p in out.iterdir()) == ["genai_config.json", "onnx"]
    assert "If" not in {n.op_type for n in onnx.load(str(out / "onnx" / "model.onnx")).graph.node}
    assert "If" in {n.op_type for n in onnx.load(str(folder / "onnx" / "model.onnx")).graph.node}  # the source kept
