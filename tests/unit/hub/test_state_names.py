"""A hybrid decoder's states under Transformers.js's names (`fx2onnx.hub.decoders.state_names`):
the renamed graph computes what the exported one does, a state fed in parts included, and the
table against Transformers.js's own cache names where it is installed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from fx2onnx.hub.decoders.state_names import (
    TRANSFORMERS_JS_STATE_NAMES, rename_states, state_names, write_transformers_js_states,
)

onnxruntime = pytest.importorskip("onnxruntime")

FLOAT = onnx.TensorProto.FLOAT
OLMO_HYBRID = {"model_type": "olmo_hybrid", "linear_num_key_heads": 2, "linear_key_head_dim": 2,
               "linear_num_value_heads": 2, "linear_value_head_dim": 3}


def hybrid_graph(channels: int) -> onnx.ModelProto:
    """Layer 0 a convolution state (batch, channels, 3) and a recurrent state, layer 1 keys and
    values; each next value depends on every input, and the logits on every state."""
    inputs = [
        oh.make_tensor_value_info("past_key_values.0.conv_states.0", FLOAT, ["batch_size", channels, 3]),
        oh.make_tensor_value_info("past_key_values.0.recurrent_states.0", FLOAT, ["batch_size", 2, 2]),
        oh.make_tensor_value_info("past_key_values.1.key", FLOAT, ["batch_size", 1, "past_sequence_length", 2]),
        oh.make_tensor_value_info("past_key_values.1.value", FLOAT, ["batch_size", 1, "past_sequence_length", 2]),
    ]
    outputs = [
        oh.make_tensor_value_info("logits", FLOAT, ["batch_size"]),
        oh.make_tensor_value_info("present.0.conv_states.0", FLOAT, ["batch_size", channels, 3]),
        oh.make_tensor_value_info("present.0.recurrent_states.0", FLOAT, ["batch_size", 2, 2]),
        oh.make_tensor_value_info("present.1.key", FLOAT, ["batch_size", 1, "past_sequence_length", 2]),
        oh.make_tensor_value_info("present.1.value", FLOAT, ["batch_size", 1, "past_sequence_length", 2]),
    ]
    weights = oh.make_tensor("weights", FLOAT, [channels, 1], np.arange(1, channels + 1, dtype=np.float32).tolist())
    nodes = [
        oh.make_node("Mul", ["past_key_values.0.conv_states.0", "weights"], ["present.0.conv_states.0"]),
        oh.make_node("Neg", ["past_key_values.0.recurrent_states.0"], ["present.0.recurrent_states.0"]),
        oh.make_node("Identity", ["past_key_values.1.key"], ["present.1.key"]),
        oh.make_node("Identity", ["past_key_values.1.value"], ["present.1.value"]),
        oh.make_node("ReduceSum", ["present.0.conv_states.0", "axes"], ["conv_sum"], keepdims=0),
        oh.make_node("ReduceSum", ["present.0.recurrent_states.0", "axes"], ["recurrent_sum"], keepdims=0),
        oh.make_node("Add", ["conv_sum", "recurrent_sum"], ["logits"]),
    ]
    axes = oh.make_tensor("axes", onnx.TensorProto.INT64, [2], [1, 2])
    graph = oh.make_graph(nodes, "hybrid", inputs, outputs, [weights, axes])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def test_a_mamba_hybrids_states_get_transformers_js_names_and_the_same_values():
    model = hybrid_graph(channels=4)
    rng = np.random.default_rng(0)
    feed = {i.name: rng.standard_normal([2, *[d.dim_value or 1 for d in i.type.tensor_type.shape.dim[1:]]]).astype(np.float32)
            for i in model.graph.input}
    expected = run(model, feed)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    config = {"model_type": "nemotron_h"}
    rename_states(renamed.graph, state_names(config), config)
    onnx.checker.check_model(renamed, full_check=True)
    assert io_names(renamed) == (
        ["past_conv.0", "past_ssm.0", "past_key_values.1.key", "past_key_values.1.value"],
        ["logits", "present_conv.0", "present_ssm.0", "present.1.key", "present.1.value"],
    )
    got = run(renamed, {"past_conv.0": feed["past_key_values.0.conv_states.0"],
                        "past_ssm.0": feed["past_key_values.0.recurrent_states.0"],
                        **{name: feed[name] for name in ("past_key_values.1.key", "past_key_values.1.value")}})
    for theirs, ours in (("present_conv.0", "present.0.conv_states.0"), ("present_ssm.0", "present.0.recurrent_states.0"),
                         ("logits", "logits"), ("present.1.key", "present.1.key")):
        np.testing.assert_array_equal(got[theirs], expected[ours])


def test_a_folders_graph_with_external_weights_is_rewritten_in_place_and_still_loads(tmp_path: Path):
    # the graph file is replaced whole; its weights stay in their own file, which the graph still names
    model = hybrid_graph(channels=4)
    rng = np.random.default_rng(2)
    feed = {i.name: rng.standard_normal([2, *[d.dim_value or 1 for d in i.type.tensor_type.shape.dim[1:]]]).astype(np.float32)
            for i in model.graph.input}
    expected = run(model, feed)
    (tmp_path / "onnx").mkdir()
    # the weights in raw bytes (what onnx moves to an external file), the axes inline (shape inference reads them)
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(model.graph.initializer[0]),
                                                                     "weights"))
    onnx.save(model, str(tmp_path / "onnx" / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
              size_threshold=0)
    weights = (tmp_path / "onnx" / "model.onnx_data").read_bytes()

    assert write_transformers_js_states(tmp_path, "onnx/model.onnx", {"model_type": "nemotron_h"})
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == ["model.onnx", "model.onnx_data"]
    assert (tmp_path / "onnx" / "model.onnx_data").read_bytes() == weights
    graph_only = onnx.load(str(tmp_path / "onnx" / "model.onnx"), load_external_data=False)
    assert {t.name: t.data_location for t in graph_only.graph.initializer} == {
        "weights": onnx.TensorProto.EXTERNAL, "axes": onnx.TensorProto.DEFAULT}
    onnx.checker.check_model(str(tmp_path / "onnx" / "model.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {
        "past_conv.0": feed["past_key_values.0.conv_states.0"], "past_ssm.0": feed["past_key_values.0.recurrent_states.0"],
        **{name: feed[name] for name in ("past_key_values.1.key", "past_key_values.1.value")}})))
    np.testing.assert_array_equal(got["present_conv.0"], expected["present.0.conv_states.0"])
    np.testing.assert_array_equal(got["logits"], expected["logits"])
    # a type without names of its own, or a refused graph: the file is left as it was
    before = (tmp_path / "onnx" / "model.onnx").read_bytes()
    assert not write_transformers_js_states(tmp_path, "onnx/model.onnx", {"model_type": "llama"})
    assert (tmp_path / "onnx" / "model.onnx").read_bytes() == before


def test_olmo_hybrids_convolution_state_is_fed_as_queries_keys_and_values():
    """OLMo-hybrid convolves queries, keys and values concatenated on the channels (2 x 2, 2 x 2
    and 2 x 3 of them): Transformers.js feeds and reads the three apart."""
    model = hybrid_graph(channels=14)
    rng = np.random.default_rng(1)
    conv = rng.standard_normal([2, 14, 3]).astype(np.float32)
    recurrent = rng.standard_normal([2, 2, 2]).astype(np.float32)
    keys = rng.standard_normal([2, 1, 5, 2]).astype(np.float32)
    expected = run(model, {"past_key_values.0.conv_states.0": conv, "past_key_values.0.recurrent_states.0": recurrent,
                           "past_key_values.1.key": keys, "past_key_values.1.value": keys})
    rename_states(model.graph, state_names(OLMO_HYBRID), OLMO_HYBRID)
    onnx.checker.check_model(model, full_check=True)
    parts = ["past_conv.0.query", "past_conv.0.key", "past_conv.0.value"]
    inputs, outputs = io_names(model)
    assert inputs == [*parts, "past_recurrent.0", "past_key_values.1.key", "past_key_values.1.value"]
    assert outputs[1:4] == ["present_conv.0.query", "present_conv.0.key", "present_conv.0.value"]
    shapes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert [shapes[name] for name in parts] == [["batch_size", 4, 3], ["batch_size", 4, 3], ["batch_size", 6, 3]]
    got = run(model, {**dict(zip(parts, np.split(conv, [4, 8], axis=1))), "past_recurrent.0": recurrent,
                      "past_key_values.1.key": keys, "past_key_values.1.value": keys})
    np.testing.assert_array_equal(np.concatenate([got[f"present_conv.0.{part}"] for part in ("query", "key", "value")], 1),
                                  expected["present.0.conv_states.0"])
    np.testing.assert_array_equal(got["logits"], expected["logits"])


def test_a_state_without_its_next_value_is_refused():
    model = hybrid_graph(channels=4)
    del model.graph.output[2]  # present.0.recurrent_states.0
    config = {"model_type": "qwen3_next"}
    with pytest.raises(ValueError, match="no present.0.recurrent_states.0 to give its next value"):
        rename_states(model.graph, state_names(config), config)


def test_the_table_is_transformers_js_cache_names():
    """Each row's names are the ones Transformers.js's getCacheNames adds for its model type."""
    from test_client_support import transformers_js_mapping

    _, source = transformers_js_mapping("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    body = source.split("function getCacheNames(", 1)[1].split("\nfunction ", 1)[0]
    # the function's own branches (indented once), each the model types of its condition and its text
    heads = list(re.finditer(r"^  (?:\} else )?if \((.*)\) \{$", body, re.M))
    branches = [(head.group(1), body[head.end():after.start() if after else None])
                for head, after in zip(heads, [*heads[1:], None])]
    for model_type, names in TRANSFORMERS_JS_STATE_NAMES.items():
        branch = next(text for condition, text in branches if f'"{model_type}"' in condition)
        added = {re.sub(r"\$\{(\w+)\}", lambda m: {"cache_prefix": "past", "pkv_prefix": "past_key_values",
                                                    "i": "{layer}"}[m.group(1)], name)
                 for name in re.findall(r"names\.add\(`([^`]+)`\)", branch)}
        assert {*names.conv, names.recurrent} - {None} <= added, model_type


def test_parts_that_do_not_add_up_to_the_states_channels_are_refused():
    model = hybrid_graph(channels=13)
    with pytest.raises(ValueError, match="has 13 channels, not the 4 \\+ 4 \\+ 6 its config gives"):
        rename_states(model.graph, state_names(OLMO_HYBRID), OLMO_HYBRID)
