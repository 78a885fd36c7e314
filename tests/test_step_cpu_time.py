"""The step benchmark's order-independence machinery (`bench/step_cpu_time.py`): each
contender's session runs in its own worker process, the rounds alternate the contenders'
order, and every contender is compared with its reference. A one-node decoder stands in
for a folder; nothing is timed against a bound."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import step_cpu_time as bench  # noqa: E402


def _tiny_folder(folder: Path) -> Path:
    """A folder a worker loads: genai_config.json naming a decoder whose logits are its ids."""
    folder.mkdir(parents=True)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", ["input_ids"], ["logits"], to=onnx.TensorProto.FLOAT)], "decoder",
        [onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, "sequence"])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, "sequence"])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, folder / "model.onnx")
    decoder = {"filename": "model.onnx", "num_key_value_heads": 1, "head_size": 1, "inputs": {}}
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": decoder}}))
    return folder


def test_rounds_alternate_the_order() -> None:
    assert bench.round_orders(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert bench.round_orders(["a", "b", "c"], 2) == [["a", "b", "c"], ["c", "b", "a"]]


def test_each_contender_has_its_reference() -> None:
    names = ["fx2onnx-fp32", "builder-fp32", "fx2onnx-int4", "builder-int4", "fx2onnx-int4-copy"]
    assert [bench.reference_of(n, names) for n in names] == [
        "builder-fp32", "builder-fp32", "builder-int4", "builder-int4", "fx2onnx-int4"]


@pytest.mark.parametrize("start_reversed", [False, True])
def test_each_contender_runs_in_its_own_process_in_alternation(tmp_path, start_reversed) -> None:
    folder = _tiny_folder(tmp_path / "fx2onnx-fp32")
    folders = {"fx2onnx-fp32": folder, "builder-fp32": folder, "fx2onnx-fp32-copy": folder}
    steps = [("prefill", 3), ("decode", 2)]
    result = bench.measure(folders, steps, rounds=2, repeats=2, warmup=1, start_reversed=start_reversed)
    pids = result["pids"]  # a new process per contender and round
    assert sorted(pids) == sorted(folders) and all(len(rounds) == 2 for rounds in pids.values())
    every = [pid for rounds in pids.values() for pid in rounds]
    assert len(set(every)) == 6 and os.getpid() not in every
    order, backwards = list(folders), list(reversed(folders))
    expected = [(index, phase, length, name) for index, names in enumerate([order, backwards])
                for phase, length in steps for name in names]
    assert result["runs"] == expected
    entry = result["steps"]["decode 2"]
    assert {name: value["reference"] for name, value in entry.items()} == {
        "fx2onnx-fp32": "builder-fp32", "builder-fp32": "builder-fp32", "fx2onnx-fp32-copy": "fx2onnx-fp32"}
    assert all(value["cpu_ms"] >= 0 and value["cpu_ratio"] > 0 for value in entry.values())
    assert entry["builder-fp32"]["cpu_ratio"] == 1.0
    table = bench.markdown({"tiny": result})
    assert "| tiny | decode after 2 | fx2onnx-fp32-copy | fx2onnx-fp32 |" in table


def test_the_same_workers_serve_every_round(tmp_path) -> None:
    folder = _tiny_folder(tmp_path / "fx2onnx-fp32")
    folders = {"fx2onnx-fp32": folder, "builder-fp32": folder}
    result = bench.measure(folders, [("decode", 2)], rounds=3, repeats=1, warmup=1, fresh_workers=False)
    assert all(len(rounds) == 1 for rounds in result["pids"].values())
    assert len({rounds[0] for rounds in result["pids"].values()}) == 2
    assert [name for _, _, _, name in result["runs"]] == ["fx2onnx-fp32", "builder-fp32", "builder-fp32",
                                                          "fx2onnx-fp32", "fx2onnx-fp32", "builder-fp32"]


def test_each_worker_profiles_its_own_session(tmp_path) -> None:
    folder = _tiny_folder(tmp_path / "fx2onnx-fp32")
    folders = {"fx2onnx-fp32": folder, "builder-fp32": folder}
    with pytest.raises(ValueError, match="one phase and one length"):
        bench.measure(folders, [("decode", 2), ("decode", 3)], rounds=1, profile_dir=tmp_path)
    profiles = tmp_path / "not" / "yet"  # made when missing (onnxruntime writes only into a folder that exists)
    result = bench.measure(folders, [("decode", 2)], rounds=2, repeats=2, warmup=1, profile_dir=profiles)
    assert sorted(result["profiles"]) == sorted(folders)
    for name, summary in result["profiles"].items():
        assert summary["ops"]["Cast"][1] == 1  # the one node, once a step
        assert any(path.name.startswith(name) for path in profiles.glob("*.json"))
        assert [(n["op"], "own_us" in n) for n in summary["nodes"]] == [("Cast", False)]
        assert "| Cast |" in next(profiles.glob(f"{name}_*.nodes.md")).read_text()  # the step node by node
    assert "| Cast |" in bench.profile_markdown("tiny", result["profiles"])


def _event(name: str, op: str, ts: int, dur: int) -> dict:
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_step_nodes_give_an_ifs_own_time() -> None:
    """Node by node, medians over the runs after the warm-up; an `If`'s own time is its
    time less its branch's nodes (a nested `If` counted once, with its own nodes)."""
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},  # the warm-up: left out
              _event("warm", "Cast", 1, 50)]
    for start, scale in ((1000, 1), (2000, 3), (3000, 2)):
        events += [{"cat": "Session", "name": "model_run", "ts": start, "dur": 100 * scale},
                   _event("stack", "If", start, 40 * scale),
                   _event("matmul", "MatMulNBits", start + 1, 10 * scale),
                   _event("layer", "If", start + 12 * scale, 20 * scale),
                   _event("attention", "GroupQueryAttention", start + 13 * scale, 15 * scale),
                   _event("head", "MatMulNBits", start + 50 * scale, 5 * scale)]
    nodes = bench.step_nodes(events, warmup_runs=1)
    assert [(n["node"], n["op"], n["us"]) for n in nodes] == [
        ("stack", "If", 80), ("matmul", "MatMulNBits", 20), ("layer", "If", 40),
        ("attention", "GroupQueryAttention", 30), ("head", "MatMulNBits", 10)]
    assert [n.get("own_us") for n in nodes] == [20, None, 10, None, None]  # 40 - 10 - 20; 20 - 15 (x2, the median)
    assert "| stack | If | 80.0 | 20.0 |" in bench.nodes_markdown(nodes)


def _cached_folder(folder: Path, share: bool) -> Path:
    """A folder with one layer's cache: each present is its past plus one, the logits the mask."""
    folder.mkdir(parents=True)
    helper, FLOAT = onnx.helper, onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Cast", ["attention_mask"], ["logits"], to=FLOAT),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", FLOAT, [], [1.0]))]
    inputs = [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, "new"]),
              helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, [1, "total"]),
              helper.make_tensor_value_info("position_ids", onnx.TensorProto.INT64, [1, "new"])]
    outputs = [helper.make_tensor_value_info("logits", FLOAT, [1, "total"])]
    for kind in ("key", "value"):
        nodes.append(helper.make_node("Add", [f"past_key_values.0.{kind}", "one"], [f"present.0.{kind}"]))
        inputs.append(helper.make_tensor_value_info(f"past_key_values.0.{kind}", FLOAT, [1, 1, "past", 1]))
        outputs.append(helper.make_tensor_value_info(f"present.0.{kind}", FLOAT, [1, 1, "past", 1]))
    model = helper.make_model(helper.make_graph(nodes, "decoder", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, folder / "model.onnx")
    decoder = {"filename": "model.onnx", "num_key_value_heads": 1, "head_size": 1, "inputs": {}}
    search = {"past_present_share_buffer": share, "max_length": 16}
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": decoder}, "search": search}))
    return folder


def test_a_shared_cache_is_one_buffer_of_max_length_written_in_place(tmp_path) -> None:
    """As ONNX Runtime GenAI runs a folder whose config shares past and present: each past
    is a buffer of max_length positions bound as its present too, the mask as long as the
    positions held; apart, the past has its own length and the present is a new tensor."""
    import onnxruntime

    folder = _cached_folder(tmp_path / "shared", share=True)
    path, decoder = bench._decoder(folder)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = bench._Step(session, decoder, past=5, new=1, cache="shared", max_length=16)
    before = step.bound["past_key_values.0.key"].numpy().copy()
    assert before.shape == (1, 1, 16, 1)
    step.run()
    step.run()
    assert (step.bound["past_key_values.0.key"].numpy() == before + 2).all()  # the present written into the past's buffer
    assert step.bound["attention_mask"].shape == (1, 6)  # as long as the positions held
    assert step.bound["position_ids"].tolist() == [[5]]
    assert bench._present_name("past_key_values.0.value", decoder) == "present.0.value"
    apart = bench._Step(session, decoder, past=5, new=1, cache="apart", max_length=16)
    logits, present_key, _ = apart.run()
    assert logits.shape == (1, 6) and present_key.shape == (1, 1, 5, 1)
    with pytest.raises(ValueError, match="does not fit the shared buffer of max_length 16"):
        bench._Step(session, decoder, past=16, new=1, cache="shared", max_length=16)


def test_a_cache_is_shared_only_where_the_config_shares_it() -> None:
    assert bench.cache_given("shared", {"past_present_share_buffer": True, "max_length": 16}) == "shared"
    assert bench.cache_given("shared", {"past_present_share_buffer": False}) == "apart"
    assert bench.cache_given("shared", {}) == "apart"
    assert bench.cache_given("apart", {"past_present_share_buffer": True}) == "apart"
