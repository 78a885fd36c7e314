"""A kernel's float query, key and value projections joined into one MatMul: the outputs are
the three layers' (onnxruntime, with and without biases), the joined weight is one
initializer of the file computed from the three when written, and projections that
cannot be joined (a tied weight, biases on some only) stay apart."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from fx2onnx.onnx_passes.derived_weights import DerivedTensor, source_weight_names
from fx2onnx.onnx_passes.packed_float_projections import pack_float_projections

K = 32
SIZES = {"q": 32, "k": 16, "v": 16}


def _model(rng: np.random.Generator, biases: tuple[str, ...], tie_value: bool = False) -> onnx.ModelProto:
    info, tensor = oh.make_tensor_value_info, onnx.numpy_helper.from_array
    nodes, weights = [], []
    for name, n in SIZES.items():
        weight = "w_k" if tie_value and name == "v" else f"w_{name}"
        if name in biases:
            nodes += [oh.make_node("MatMul", ["x", weight], [f"{name}_product"]),
                      oh.make_node("Add", [f"{name}_product", f"b_{name}"], [name])]
            weights.append(tensor(rng.standard_normal(n).astype(np.float32), f"b_{name}"))
        else:
            nodes.append(oh.make_node("MatMul", ["x", weight], [name]))
        if weight == f"w_{name}":
            weights.append(tensor(rng.standard_normal((K, n)).astype(np.float32), weight))
    # the kernel is only what the pass looks for: the tests run the projections
    nodes.append(oh.make_node("GroupQueryAttention", ["q", "k", "v"], ["attention"], domain="com.microsoft",
                              num_heads=2, kv_num_heads=1))
    graph = oh.make_graph(nodes, "g", [info("x", onnx.TensorProto.FLOAT, ["b", "s", K])],
                          [info(name, onnx.TensorProto.FLOAT, ["b", "s", n]) for name, n in SIZES.items()], weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])


def _projections(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    """The query, key and value onnxruntime computes (the kernel left out)."""
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    kept = [n for n in proto.graph.node if n.op_type != "GroupQueryAttention"]
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(list(SIZES), {"x": x})


@pytest.mark.parametrize("biases", [(), ("q", "k", "v")])
def test_query_key_value_joined_into_one_matmul(biases: tuple[str, ...]) -> None:
    rng = np.random.default_rng(0)
    model = ir.serde.deserialize_model(_model(rng, biases))
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    expected = _projections(model, x)
    assert pack_float_projections(model) == 1
    kinds = collections.Counter(node.op_type for node in model.graph)
    assert (kinds["MatMul"], kinds["Split"], kinds["Add"]) == (1, 1, 1 if biases else 0)
    # one initializer for the three weights (and one for the biases), written from them
    joined = {name: value.const_value for name, value in model.graph.initializers.items() if "qkv_packed" in name}
    assert sorted(joined) == sorted(["w_q_qkv_packed", *(["b_q_qkv_packed"] if biases else [])])
    assert all(isinstance(tensor, DerivedTensor) for tensor in joined.values())
    assert joined["w_q_qkv_packed"].shape.dims == (K, sum(SIZES.values()))
    assert not {"w_q", "w_k", "w_v"} & set(model.graph.initializers)  # the three left the file
    assert source_weight_names(model) >= {"w_q", "w_k", "w_v", *(f"b_{n}" for n in biases)}
    # the kernel reads the Split's outputs under the projections' names
    kernel = next(node for node in model.graph if node.op_type == "GroupQueryAttention")
    assert [value.name for value in kernel.inputs] == list(SIZES)
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    for actual, wanted in zip(_projections(model, x), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("biases", "tie_value"), [(("q",), False), ((), True)])
def test_projections_that_cannot_be_joined_stay_apart(biases: tuple[str, ...], tie_value: bool) -> None:
    model = ir.serde.deserialize_model(_model(np.random.default_rng(0), biases, tie_value))
    assert pack_float_projections(model) == 0
    assert collections.Counter(node.op_type for node in model.graph)["MatMul"] == 3
