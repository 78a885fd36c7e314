"""A residual Add and the RMSNormalization of its sum as onnxruntime's
SkipSimplifiedLayerNormalization: the kernel's outputs equal the pair's (normalized value
and sum, the sum also a graph output), and pairs the kernel would compute otherwise
(a broadcast Add, a norm over other axes) stay as they are."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from fx2onnx.onnx_passes.skip_normalization import fuse_skip_normalizations

D = 16
OUTPUTS = ("normed", "residual", "second", "broadcast_normed")


def _model(rng: np.random.Generator, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    info = oh.make_tensor_value_info
    numpy_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [
        oh.make_node("Add", ["x", "attended"], ["residual"]),
        oh.make_node("RMSNormalization", ["residual", "scale"], ["normed"], epsilon=1e-5),
        # the next layer: its residual is the sum above, read by an Add and normalized again
        oh.make_node("Add", ["residual", "normed"], ["residual_2"]),
        oh.make_node("RMSNormalization", ["residual_2", "scale"], ["second"], epsilon=1e-6, axis=2),
        # a broadcast Add (one row for every token): not the kernel's
        oh.make_node("Add", ["x", "row"], ["broadcast"]),
        oh.make_node("RMSNormalization", ["broadcast", "scale"], ["broadcast_normed"]),
    ]
    weights = [onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(D)).astype(numpy_type), "scale")]
    graph = oh.make_graph(
        nodes, "g",
        [info("x", dtype, ["batch", "sequence", D]), info("attended", dtype, ["batch", "sequence", D]),
         info("row", dtype, [1, 1, D])],
        [info(name, dtype, ["batch", "sequence", D] if name != "broadcast_normed" else None) for name in OUTPUTS],
        weights,
    )
    # the intermediate shapes, as the exporter's models carry them
    return onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)]), strict_mode=True)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(list(OUTPUTS), feeds)


@pytest.mark.parametrize("dtype", [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16])
def test_residual_add_and_norm_become_one_kernel(dtype: int) -> None:
    rng = np.random.default_rng(0)
    original = _model(rng, dtype)
    model = ir.serde.deserialize_model(original)
    assert fuse_skip_normalizations(model) == 2
    fused = ir.serde.serialize_model(model)
    onnx.checker.check_model(fused, full_check=True)
    kinds = collections.Counter((node.domain, node.op_type) for node in fused.graph.node)
    assert kinds[("com.microsoft", "SkipSimplifiedLayerNormalization")] == 2
    # the broadcast pair is left: one Add, one RMSNormalization
    assert (kinds[("", "Add")], kinds[("", "RMSNormalization")]) == (1, 1)
    epsilons = sorted(oh.get_attribute_value(a) for n in fused.graph.node for a in n.attribute if a.name == "epsilon")
    assert epsilons == pytest.approx([1e-6, 1e-5])
    numpy_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    for batch, sequence in ((1, 1), (3, 7)):
        feeds = {name: rng.standard_normal(shape).astype(numpy_type) for name, shape in
                 (("x", (batch, sequence, D)), ("attended", (batch, sequence, D)), ("row", (1, 1, D)))}
        # float16: both compute in float32 and round once; the sum is the same Add
        tolerance = 1e-5 if dtype == onnx.TensorProto.FLOAT else 2e-3
        for expected, actual in zip(_run(original, feeds), _run(fused, feeds)):
            np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32),
                                       rtol=tolerance, atol=tolerance)


def test_norm_in_another_precision_or_over_more_axes_stays() -> None:
    info = oh.make_tensor_value_info
    nodes = [
        oh.make_node("Add", ["x", "y"], ["s"]),
        oh.make_node("RMSNormalization", ["s", "scale"], ["a"], stash_type=0),  # not float32
        oh.make_node("Add", ["x", "y"], ["t"]),
        oh.make_node("RMSNormalization", ["t", "scale_2d"], ["b"], axis=1),  # over two axes
    ]
    weights = [onnx.numpy_helper.from_array(np.ones(D, np.float32), "scale"),
               onnx.numpy_helper.from_array(np.ones((4, D), np.float32), "scale_2d")]
    graph = oh.make_graph(nodes, "g", [info(n, onnx.TensorProto.FLOAT, [2, 4, D]) for n in ("x", "y")],
                          [info(n, onnx.TensorProto.FLOAT, [2, 4, D]) for n in ("a", "b")], weights)
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)]))
    assert fuse_skip_normalizations(model) == 0
    assert [node.op_type for node in model.graph] == ["Add", "RMSNormalization", "Add", "RMSNormalization"]


def test_norm_in_a_branch_of_an_outer_sum_stays() -> None:
    """The sum is computed outside the If that normalizes it: the Add stays where it is."""
    info = oh.make_tensor_value_info
    norm = oh.make_node("RMSNormalization", ["s", "scale"], ["n"])
    branch = oh.make_graph([norm], "branch", [], [info("n", onnx.TensorProto.FLOAT, [2, 4, D])])
    nodes = [oh.make_node("Add", ["x", "y"], ["s"]),
             oh.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)]
    graph = oh.make_graph(nodes, "g", [info(n, onnx.TensorProto.FLOAT, [2, 4, D]) for n in ("x", "y")]
                          + [info("c", onnx.TensorProto.BOOL, [])], [info("out", onnx.TensorProto.FLOAT, [2, 4, D])],
                          [onnx.numpy_helper.from_array(np.ones(D, np.float32), "scale")])
    model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)])))
    assert fuse_skip_normalizations(model) == 0
    assert [node.op_type for node in model.graph] == ["Add", "If"]
