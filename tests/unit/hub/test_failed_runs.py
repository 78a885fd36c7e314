"""A folder whose model fails in onnxruntime fails its verification with a sentence that
says where, instead of the runtime's traceback."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fx2onnx.hub.shared.verification import FolderRunError, Tolerance, Verification, cpu_session, run_session


@pytest.fixture()
def gather_of_four_rows(tmp_path):
    """A model that reads row ``index`` of a table of 4: index 4 is out of range."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "index"], ["row"])], "rows",
        [onnx.helper.make_tensor_value_info("index", onnx.TensorProto.INT64, ["n"])],
        [onnx.helper.make_tensor_value_info("row", onnx.TensorProto.FLOAT, ["n"])],
        [onnx.helper.make_tensor("table", onnx.TensorProto.FLOAT, [4], [0.0, 1.0, 2.0, 3.0])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "model.onnx")
    return tmp_path / "model.onnx"


def test_a_failed_run_is_stated_with_the_inputs(gather_of_four_rows):
    with cpu_session(gather_of_four_rows) as session:
        assert run_session(session, {"index": np.array([3, 0]), "unused": np.zeros(1)})["row"].tolist() == [3.0, 0.0]
        with pytest.raises(FolderRunError, match=r"^onnxruntime failed on inputs index \[3\]: .*Gather") as raised:
            run_session(session, {"index": np.array([0, 4, 1])})
    verdict = Verification.failed_run(raised.value, Tolerance(1e-3, 1e-4))
    assert not verdict.passed and verdict.summary() == str(raised.value) and "\n" not in verdict.summary()
    merged = Verification.merged([verdict, Verification(0.0, True, [1], [1])])
    assert not merged.passed and merged.failure == str(raised.value)


def test_a_verdict_merged_from_runs_without_tokens_compares_no_tokens():
    # a float16 folder's verdict and its float32 twins' (one-pass models: no greedy tokens)
    half, twins = Verification(3e-3, None, [], [], Tolerance(1e-2, 1e-2), 0.2), Verification(2e-5, None, [], [], Tolerance(1e-3, 1e-4), 0.1)
    merged = Verification.merged([half, twins])
    assert merged.passed and merged.tokens_equal is None and merged.max_logit_difference == 3e-3
    outside = Verification.merged([half, Verification(0.5, None, [], [], Tolerance(1e-3, 1e-4), 40.0)])
    assert not outside.passed and outside.worst_ratio == 40.0
    assert Verification.merged([Verification(0.0, True, [1], [1]), Verification(0.0, False, [2], [3])]).tokens_equal is False


def test_a_model_the_runtime_refuses_to_load_is_a_failed_run(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    with pytest.raises(FolderRunError, match=r"^onnxruntime failed to load m\.onnx: ") as raised:
        with cpu_session(tmp_path / "m.onnx"):
            pass
    assert "\n" not in str(raised.value) and not Verification.failed_run(raised.value, Tolerance(1e-3, 1e-4)).passed
