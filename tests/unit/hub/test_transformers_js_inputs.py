"""The graph rewrites that make a decoder take what Transformers.js 4.3.2 feeds its model type,
on tiny graphs in onnxruntime: positions counted from the mask (Qwen3.5's text model) and the
indexer keys carried in the key cache (GLM-MoE-DSA). Whole folders in Transformers.js:
tests/e2e/test_transformers_js.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from fx2onnx.hub.decoders.graph_files import rewrite_graph_file
from fx2onnx.hub.decoders.indexer_cache import join_indexer_keys
from fx2onnx.hub.decoders.mask_positions import POSITIONS, counts_positions_from_mask, positions_from_mask
from fx2onnx.hub.shared.verification import positions_of

OPSET = [helper.make_opsetid("", 18)]


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def test_positions_counted_from_the_mask_are_transformers_generation_positions():
    """Left-padded rows, a prompt step and a decode step: the graph's positions are the last
    columns of `positions_of(mask)`, and its `position_ids` input is gone."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [POSITIONS], ["positions"])], "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
         helper.make_tensor_value_info(POSITIONS, TensorProto.INT64, ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch_size", "sequence_length"])])
    model = helper.make_model(graph, opset_imports=OPSET)
    assert positions_from_mask(model.graph)
    assert [value.name for value in model.graph.input] == ["input_ids", "attention_mask"]
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], dtype=np.int64)
    for step in (6, 1):  # the prompt's tokens, then one decode step's
        got = _run(model, {"input_ids": np.zeros((3, step), np.int64), "attention_mask": mask})["positions"]
        np.testing.assert_array_equal(got, positions_of(mask)[:, 6 - step:])
    assert counts_positions_from_mask({"model_type": "qwen3_5_text"}) and not counts_positions_from_mask(
        {"model_type": "qwen3_5_moe_text"})


def _indexer_decoder(heads: int, key_width: int, index_width: int) -> onnx.ModelProto:
    """A layer's cache step: the past keys and indexer keys joined to the step's, and a score
    reading both (the sum of each)."""
    key, index = ["batch", heads, "past", key_width], ["batch", "past", index_width]
    nodes = [
        helper.make_node("Concat", ["past_key_values.0.key", "new_key"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.indexer_keys", "new_index"], ["present.0.indexer_keys"], axis=1),
        helper.make_node("ReduceSum", ["present.0.key"], ["key_sum"], keepdims=0),
        helper.make_node("ReduceSum", ["present.0.indexer_keys"], ["index_sum"], keepdims=0),
        helper.make_node("Mul", ["key_sum", "index_sum"], ["score"]),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "decoder", [
        helper.make_tensor_value_info("new_key", f, ["batch", heads, "step", key_width]),
        helper.make_tensor_value_info("new_index", f, ["batch", "step", index_width]),
        helper.make_tensor_value_info("past_key_values.0.key", f, key),
        helper.make_tensor_value_info("past_key_values.0.value", f, ["batch", heads, "past", 4]),
        helper.make_tensor_value_info("past_key_values.0.indexer_keys", f, index),
    ], [helper.make_tensor_value_info("score", f, []),
        helper.make_tensor_value_info("present.0.key", f, ["batch", heads, "total", key_width]),
        helper.make_tensor_value_info("present.0.indexer_keys", f, ["batch", "total", index_width])])
    return helper.make_model(graph, opset_imports=OPSET)


def test_indexer_keys_ride_in_the_key_cache_as_one_more_head():
    """Narrower and wider indexer keys than the keys: the joined graph's score and caches are
    the original's, its key cache one head more, padded with zeros to the wider width."""
    rng = np.random.default_rng(0)
    for key_width, index_width in ((8, 4), (4, 6)):
        original = _indexer_decoder(2, key_width, index_width)
        joined = _indexer_decoder(2, key_width, index_width)
        assert join_indexer_keys(joined.graph) == [0]
        width = max(key_width, index_width)
        assert [v.name for v in joined.graph.input][-2:] == ["past_key_values.0.key", "past_key_values.0.value"]
        assert [v.name for v in joined.graph.output] == ["score", "present.0.key"]
        past_key = rng.standard_normal((2, 2, 3, key_width)).astype(np.float32)
        past_index = rng.standard_normal((2, 3, index_width)).astype(np.float32)
        step = {"new_key": rng.standard_normal((2, 2, 1, key_width)).astype(np.float32),
                "new_index": rng.standard_normal((2, 1, index_width)).astype(np.float32),
                "past_key_values.0.value": np.zeros((2, 2, 3, 4), np.float32)}
        want = _run(original, {**step, "past_key_values.0.key": past_key, "past_key_values.0.indexer_keys": past_index})
        packed = np.zeros((2, 3, 3, width), np.float32)
        packed[:, :2, :, :key_width], packed[:, 2, :, :index_width] = past_key, past_index
        got = _run(joined, {**step, "past_key_values.0.key": packed})
        np.testing.assert_allclose(got["score"], want["score"], rtol=1e-6)
        present = got["present.0.key"]
        assert present.shape == (2, 3, 4, width)
        np.testing.assert_array_equal(present[:, :2, :, :key_width], want["present.0.key"])
        np.testing.assert_array_equal(present[:, 2, :, :index_width], want["present.0.indexer_keys"])
        assert not present[:, :2, :, key_width:].any() and not present[:, 2, :, index_width:].any()


def _layered_decoder(layers: int) -> onnx.ModelProto:
    """Each layer's cache step: its key, value and states (ZAYA's names) scaled by the layer's
    own number plus one, so that a layer fed another's cache would show."""
    shapes = {"key": ["batch", 2, "past", 4], "value": ["batch", 2, "past", 4], "conv_state": ["batch", 6, 2],
              "shift_state": ["batch", 4]}
    nodes, inputs, outputs = [], [], []
    for layer in range(layers):
        nodes.append(helper.make_node("Constant", [], [f"scale.{layer}"],
                                      value=helper.make_tensor(f"scale.{layer}", TensorProto.FLOAT, [], [layer + 1.0])))
        for kind, shape in shapes.items():
            past, present = f"past_key_values.{layer}.{kind}", f"present.{layer}.{kind}"
            nodes.append(helper.make_node("Mul", [past, f"scale.{layer}"], [present]))
            inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, shape))
    return helper.make_model(helper.make_graph(nodes, "decoder", inputs, outputs), opset_imports=OPSET)


def test_layers_fed_in_groups_take_their_own_caches_again():
    """Three layers in groups of two (the last alone): the joined graph takes the inputs of
    layers 0 and 2 only, and gives each layer its own cache back, joined the same way."""
    from fx2onnx.hub.decoders.strided_cache import cache_stride, join_strided_layers

    original, joined = _layered_decoder(3), _layered_decoder(3)
    assert join_strided_layers(joined.graph, 3, 2) == [0]
    assert sorted({v.name.split(".")[1] for v in joined.graph.input}) == ["0", "2"]
    rng = np.random.default_rng(0)
    feed = {v.name: rng.standard_normal([2 if isinstance(d, str) else d for d in
                                         [x.dim_param or x.dim_value for x in v.type.tensor_type.shape.dim]]).astype(np.float32)
            for v in original.graph.input}
    want = _run(original, feed)
    kinds = ("key", "value", "conv_state", "shift_state")
    packed = {f"past_key_values.0.{k}": np.concatenate([feed[f"past_key_values.{i}.{k}"] for i in (0, 1)], axis=1)
              for k in kinds} | {f"past_key_values.2.{k}": feed[f"past_key_values.2.{k}"] for k in kinds}
    got = _run(joined, packed)
    for k in kinds:
        np.testing.assert_array_equal(got[f"present.0.{k}"], np.concatenate([want[f"present.{i}.{k}"] for i in (0, 1)], axis=1))
        np.testing.assert_array_equal(got[f"present.2.{k}"], want[f"present.2.{k}"])
    assert cache_stride({"model_type": "zaya", "cca_time1": 2}) == 2 and cache_stride({"model_type": "llama"}) == 1


def test_a_graph_file_is_written_back_only_when_its_rewrite_changed_it(tmp_path) -> None:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    before = path.read_bytes()

    def rename(changed: bool):
        def rewrite(g: onnx.GraphProto) -> bool:
            g.node[0].name = "renamed"
            return changed
        return rewrite

    assert not rewrite_graph_file(path, rename(False)) and path.read_bytes() == before
    assert rewrite_graph_file(path, rename(True))
    assert onnx.load(str(path)).graph.node[0].name == "renamed"
