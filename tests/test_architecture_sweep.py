"""The architecture sweep's bookkeeping (`bench/architecture_sweep.py`): the order of its
pairs, a pair's isolation in its own process, the causes and classes of failures, and the
scoreboard written from its results. No model is built here: the sweep itself does that."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import architecture_sweep as sweep  # noqa: E402

from fx2onnx.errors import OnnxExporterError  # noqa: E402


def test_priority_tasks_come_first_and_in_turn() -> None:
    tasks = ["automatic-speech-recognition", "fill-mask", "text-generation", "text-classification"]
    order = sweep.sweep_order(tasks, per_task=3)
    assert [task for task, _, _ in order] == (
        ["text-generation", "text-classification", "fill-mask"] * 3 + ["automatic-speech-recognition"] * 3
    )
    # each task's pairs in the fixed shuffled order: a stopped sweep has sampled every task
    full = sweep.sweep_order(["fill-mask"])
    assert sorted((t, m, c) for t, m, c in full) == sorted(("fill-mask", m, c) for m, c in sweep.pairs_of("fill-mask"))
    assert full == sweep.sweep_order(["fill-mask"])
    assert [c for _, _, c in full] != sorted(c for _, _, c in full)


def test_an_export_failure_is_its_first_diagnostic() -> None:
    message = ("Failed to export the model to ONNX.\n1 error:\n"
               "- [FXE0011] No ONNX function for aten::frobnicate.default (at /src/model.py:12)\nWhat to do:\n- ...")
    cause = sweep._cause(OnnxExporterError(None, message))
    assert cause == "OnnxExporterError: [FXE0011] No ONNX function for aten::frobnicate.default"
    record = {"status": "failed", "cause": cause, "where": "exporter", "via": "exporter"}
    assert sweep.classify(record) == "unsupported operator"


@pytest.mark.parametrize(
    ("record", "category"),
    [
        ({"status": "exported", "exact": True}, None),
        ({"status": "exported", "exact": False}, "differs"),
        ({"status": "not built", "cause": "ValueError: heads"}, "not built"),
        ({"status": "failed", "cause": "time limit (120 s)"}, "time limit"),
        ({"status": "failed", "cause": "child died (-11)"}, "crash"),
        ({"status": "failed", "cause": "RuntimeError: x", "where": "transformers", "via": "export-hf",
          "eager_cause": "RuntimeError: x"}, "transformers fails"),
        # an input transformers' forward refuses is not the cause of export-hf's own error
        ({"status": "failed", "cause": "AttributeError: no vocab_size", "where": "transformers", "via": "export-hf",
          "eager_cause": "ValueError: input_features needed"}, "export-hf"),
        ({"status": "failed", "cause": "OnnxExporterError: [FXE0017] torch.export could not capture the model: E",
          "where": "exporter", "via": "exporter"}, "capture"),
        # a clear refusal is counted apart from export-hf's failures
        ({"status": "failed", "cause": "UnsupportedTaskError: no", "where": "export-hf", "via": "export-hf"}, "refused"),
        # the model's own forward failing on the decode step its folder runs, naming its line
        ({"status": "failed", "cause": "DecodeStepError: X's own forward fails (raised at m.py:N)", "where": "export-hf",
          "via": "export-hf"}, "refused"),
        ({"status": "failed", "cause": "ValueError: Dim N of input 'input_ids' is static", "where": "export-hf",
          "via": "export-hf"}, "export-hf"),
        ({"status": "failed", "cause": "Fail: [ONNXRuntimeError] bad", "where": "onnxruntime", "via": "export-hf"},
         "onnxruntime"),
    ],
)
def test_each_failure_has_a_class(record: dict, category: str | None) -> None:
    assert sweep.classify(record) == category
    assert category is None or category in sweep.CATEGORIES


def _sleeps(*args, **kwargs):
    time.sleep(60)


def _dies(*args, **kwargs):
    os._exit(3)


@pytest.mark.parametrize(("pair", "cause", "category"), [(_sleeps, "time limit (2 s)", "time limit"),
                                                           (_dies, "child died (3)", "crash")])
def test_a_pair_that_hangs_or_dies_stops_only_itself(monkeypatch, pair, cause: str, category: str) -> None:
    monkeypatch.setattr(sweep, "run_pair", pair)
    started = time.perf_counter()
    record = sweep.run_in_child("fill-mask", "bert", "BertForMaskedLM", compare=False, limit=2)
    assert time.perf_counter() - started < 15
    assert (record["status"], record["cause"], record["category"]) == ("failed", cause, category)
    assert record["limit"] == 2  # kept for the scoreboard's header


def test_the_scoreboard_counts_the_last_record_of_each_pair(tmp_path: Path) -> None:
    records = [
        {"task": "fill-mask", "architecture": "BertForMaskedLM", "status": "failed", "cause": "time limit (120 s)"},
        {"task": "fill-mask", "architecture": "BertForMaskedLM", "status": "exported", "exact": True, "difference": 1e-7,
         "torch_onnx": "exported", "torch_onnx_exact": True, sweep.MEASURED: 1, "limit": 300.0},
        {"task": "fill-mask", "architecture": "EsmForMaskedLM", "status": "failed", "where": "exporter", "via": "exporter",
         "cause": "OnnxExporterError: [FXE0011] No ONNX function for aten::frobnicate.default",
         "torch_onnx": "failed", "torch_onnx_cause": "DispatchError: no"},
        {"task": "fill-mask", "architecture": "SqueezeBertForMaskedLM", "status": "not built", "cause": "ValueError: w"},
        {"task": "fill-mask", "architecture": "XLMWithLMHeadModel", "status": "failed", "where": "export-hf",
         "via": "export-hf", "cause": "UnsupportedTaskError: XLMWithLMHeadModel (xlm) is served by fill-mask"},
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    every = ("BertForMaskedLM", "EsmForMaskedLM", "SqueezeBertForMaskedLM", "XLMWithLMHeadModel")
    assert sweep._done(results, set()) == {("fill-mask", a) for a in every}
    assert sweep._done(results, {"unsupported operator"}) == {("fill-mask", a) for a in every if a != "EsmForMaskedLM"}
    page = tmp_path / "scoreboard.md"
    line = sweep.report(results, page)
    assert line.startswith("4 pairs run, 3 built and tried: export-hf exported 1, exact in onnxruntime 1; "
                           "torch.onnx.export(dynamo=True) exported 1, exact 1 of the 1 whose outputs were compared")
    text = page.read_text()
    # the bar both ways: 1 exact of 3 tried, and of the 2 not refused
    assert (f"| [fill-mask](#fill-mask) | {len(sweep.pairs_of('fill-mask'))} | 4 | 1 | 3 | 1 | 1 | 1 | 33% | 50% | 33% "
            "| 1 | 1 | 1 |") in text
    assert "| fill-mask | XLMWithLMHeadModel | UnsupportedTaskError: XLMWithLMHeadModel (xlm) is served by fill-mask |" in text
    assert "| refused | export-hf refuses the pair" in text
    assert "| unsupported operator | [FXE0011] No ONNX function" not in text  # the cause keeps its class name
    assert ("| unsupported operator | OnnxExporterError: [FXE0011] No ONNX function for aten::frobnicate.default | 1 | "
            "EsmForMaskedLM |") in text
    assert "| BertForMaskedLM | exact | 1e-07 |" in text
    assert "Traceback" not in text
    # the limits the pairs ran under: the one recorded, and the range of the runs before records held it
    assert "time limit (300 s for 1 pair; 120 to 600 s for the 3 pairs run before the results recorded it)" in text


def _sweep_and_client_results(folder: Path, records: list[dict], clients: list[dict]) -> Path:
    """The sweep's results file and the clients' beside it, as the scoreboard reads them."""
    results = folder / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "sweep_clients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in clients))
    return results


def test_the_scoreboard_has_a_column_per_client(tmp_path: Path) -> None:
    """bench/sweep_clients.py's records beside the sweep's give the pair tables a
    Transformers.js column (and ONNX Runtime GenAI's for text generation) and the page a
    count per client."""
    import sweep_clients

    records = [
        {"task": "text-generation", "architecture": "Qwen2ForCausalLM", "status": "exported", "exact": True},
        {"task": "text-generation", "architecture": "FalconForCausalLM", "status": "exported", "exact": True},
        {"task": "text-generation", "architecture": "CTRLLMHeadModel", "status": "exported", "exact": True},
        {"task": "text-generation", "architecture": "Mamba2ForCausalLM", "status": "exported", "exact": True},
        {"task": "text-generation", "architecture": "MBartForCausalLM", "status": "exported", "exact": True},
        {"task": "fill-mask", "architecture": "BertForMaskedLM", "status": "exported", "exact": True},
        {"task": "fill-mask", "architecture": "EsmForMaskedLM", "status": "failed", "cause": "time limit (120 s)"},
    ]
    clients = [
        {"task": "text-generation", "architecture": "Qwen2ForCausalLM", "model_type": "qwen2", "js": "loaded", "js_exact": True,
         "genai": "loaded", "genai_type": "qwen2", "genai_exact": True},
        {"task": "text-generation", "architecture": "FalconForCausalLM", "model_type": "falcon", "js": "failed",
         "js_cause": "Error: Missing the following inputs: past_key_values.0.key", "genai": "loaded", "genai_type": "decoder",
         "genai_exact": True},
        {"task": "text-generation", "architecture": "CTRLLMHeadModel", "model_type": "ctrl", "js": "not supported", "genai": "loaded",
         "genai_type": "decoder", "genai_exact": False},
        {"task": "text-generation", "architecture": "Mamba2ForCausalLM", "model_type": "mamba2", "js": "not supported",
         "genai": "no genai_config.json"},
        # a failure export-hf says is Transformers.js's own (client_support.py): shown as its limit
        {"task": "text-generation", "architecture": "MBartForCausalLM", "model_type": "mbart", "js": "failed",
         "js_cause": "Error: Missing the following inputs: past_key_values.0.key",
         "js_limit": "it feeds a mbart causal LM no cache (its sizes table names an encoder-decoder's layers only): Missing",
         "genai": "loaded", "genai_type": "decoder", "genai_exact": True},
        {"task": "fill-mask", "architecture": "BertForMaskedLM", "model_type": "bert", "js": "loaded", "js_exact": False,
         "js_difference": 0.01},
        {"task": "fill-mask", "architecture": "RobertaForMaskedLM", "model_type": "roberta", "js": "loaded", "js_exact": True,
         "onnxruntime_exact": True},
        {"task": "fill-mask", "architecture": "XmodForMaskedLM", "model_type": "xmod", "rebuilt": "failed",
         "cause": "RuntimeError: no"},
    ]
    results = _sweep_and_client_results(tmp_path, records, clients)
    page = tmp_path / "scoreboard.md"
    sweep.report(results, page)
    text = page.read_text()
    assert "| architecture | export-hf |" in text and " | nodes | torch.onnx | its difference | its nodes | Transformers.js |" in text
    assert "| its nodes | Transformers.js | ONNX Runtime GenAI |" in text
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and "ForCausalLM" in line
            or "LMHead" in line or "MaskedLM |" in line}
    assert rows["Qwen2ForCausalLM"].endswith("| exact | exact (qwen2) |")
    assert rows["FalconForCausalLM"].endswith("| fails: Error: Missing the following inputs: past_key_values.0.key | exact (decoder) |")
    assert rows["CTRLLMHeadModel"].endswith("| no class | differs (decoder) |")
    assert rows["BertForMaskedLM"].endswith("| differs |")
    assert rows["EsmForMaskedLM"].endswith("| - |")  # not run in the clients
    assert rows["MBartForCausalLM"].endswith("| Transformers.js's limit: it feeds a mbart causal LM no cache | exact (decoder) |")
    # GenAI's count: the folders with a genai_config.json, those without told apart
    assert "| text-generation | 5 | 3 | 1 | 1 | 1 | 4 of 4 (1 more without `genai_config.json`) | 3 |" in text
    assert "| fill-mask | 2 | 2 | 2 | 1 | 0 | - | - |" in text
    # the model types each client runs, and a pair the clients ran beyond the sweep's results
    assert ("- text-generation: exact `qwen2`; not: falcon (Error: Missing the following inputs: past_key_values.0.key); "
            "mbart (Transformers.js's limit: it feeds a mbart causal LM no cache)") in text
    assert "- text-generation: exact `falcon`, `mbart`, `qwen2`; not: ctrl (differs)" in text
    assert "| fill-mask | RobertaForMaskedLM (roberta) | exact | exact |  |" in text
    assert "| fill-mask | XmodForMaskedLM (xmod) | fails: RuntimeError: no | not run |  |" in text
    # without client records, the page is as before
    (tmp_path / "sweep_clients.jsonl").unlink()
    sweep.report(results, page)
    assert "Transformers.js" not in page.read_text()


def test_the_scoreboard_names_the_transformers_js_release_each_record_ran_on() -> None:
    """A client record names the Transformers.js release it ran on; the older ones, which do
    not, ran on 4.3.1. The page names one release, or each with its count."""
    import sweep_clients

    older = {"task": "fill-mask", "architecture": "BertForMaskedLM", "js": "loaded"}
    newer = {**older, "architecture": "RobertaForMaskedLM", "transformers_js": "4.3.2"}
    no_class = {"task": "text-generation", "architecture": "Mamba2ForCausalLM", "transformers_js": "4.3.2",
                "js": "not supported"}
    rebuilt_failed = {"task": "fill-mask", "architecture": "XmodForMaskedLM", "rebuilt": "failed"}
    assert sweep_clients._js_releases([older, rebuilt_failed]) == "Transformers.js 4.3.1"
    assert sweep_clients._js_releases([newer, no_class]) == "Transformers.js 4.3.2"
    assert sweep_clients._js_releases([older, newer, no_class]) == "Transformers.js 4.3.2 (2 pairs) and 4.3.1 (1 pair)"


def test_transformers_js_model_tables_are_read_from_its_build(tmp_path: Path) -> None:
    import sweep_clients

    dist = tmp_path / "node_modules" / "@huggingface" / "transformers" / "dist"
    dist.mkdir(parents=True)
    tables = {name: "var {} = /* @__PURE__ */ new Map([\n  [\"bert\", \"BertX\"],\n  [\"xlm-roberta\", \"XlmX\"]\n]);\n".format(name)
              for names in sweep_clients.TRANSFORMERS_JS_TABLES.values() for name in names}
    tables["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"] = 'var MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = /* @__PURE__ */ new Map([["gpt2", "G"]]);\n'
    (dist / "transformers.node.mjs").write_text("".join(tables.values()))
    found = sweep_clients.transformers_js_types(tmp_path)
    assert found["text-generation"] == {"gpt2"}
    assert found["fill-mask"] == {"bert", "xlm-roberta"}
    (dist / "transformers.node.mjs").write_text(tables["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"])
    with pytest.raises(ValueError, match="MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES is not in Transformers.js"):
        sweep_clients.transformers_js_types(tmp_path)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        # rotary dims no larger than the head (GPT-J's 64 of a head of 256)
        ("gptj", {"n_embd": 32, "n_head": 4, "rotary_dim": 2}),
        # a latent attention's head sizes and ranks shrink with the head; its key/value heads stay its heads
        ("deepseek_v2", {"num_key_value_heads": 4, "head_dim": 4, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
                         "v_head_dim": 8, "kv_lora_rank": 32}),
        # the validator's hidden_size * expand == num_heads * head_dim, and groups dividing the heads
        ("mamba2", {"hidden_size": 32, "num_heads": 4, "head_dim": 16, "n_groups": 1}),
        # a width a multiple of the first stage's 3 heads; the image the windows are sized for
        ("swin", {"embed_dim": 33, "image_size": 224}),
        # sizes the config leaves None although its model reads them
        ("dots1", {"n_routed_experts": 4, "n_shared_experts": 1}),
        # LongCat-Flash's own names for its widths and experts, and its rotary dims equal to its head's
        ("longcat_flash", {"ffn_hidden_size": 64, "n_routed_experts": 4, "zero_expert_num": 2, "moe_topk": 2,
                           "head_dim": 6, "qk_rope_head_dim": 6}),
        # a group-limited router's 8 groups of the shrunk 4 experts: 2 groups of 2, one kept
        ("axk1", {"n_routed_experts": 4, "n_group": 2, "topk_group": 1}),
    ],
)
def test_the_derived_level_keeps_the_architectures_constraints(model_type: str, expected: dict) -> None:
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    derived = sweep._derived_values(config, sweep._shrunk_values(config))
    assert {key: derived.get(key, getattr(config, key)) for key in expected} == expected


def test_a_level_over_the_parameter_bound_is_counted_without_being_built() -> None:
    import resource

    # AXK1's widths kept (the depth alone shrunk): 820M parameters, counted on the meta device
    config = sweep.small_config("axk1", "AXK1ForCausalLM", sweep.SHRINK_LEVELS["depth only"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert sweep._meta_parameters("AXK1ForCausalLM", config) > 40 * sweep._MOST_PARAMETERS
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: not 3.3 GB of weights
    _, _, level = sweep.tiny_model("axk1", "AXK1ForCausalLM", lambda c, m: sweep._eager_failure("text-generation", c, m))
    assert level == "derived"


def test_a_shrunk_config_that_breaks_the_forward_is_derived_again() -> None:
    import torch

    config, model, level = sweep.tiny_model(
        "deepseek_v2", "DeepseekV2ForCausalLM", lambda c, m: sweep._eager_failure("text-generation", c, m))
    assert level == "derived"  # the first level's key/value heads break its latent attention
    assert sweep._eager_failure("text-generation", config, model) is None
    with torch.no_grad():
        logits = model(**sweep.task_inputs("text-generation", config, model)[0](0)).logits
    assert logits.shape == (2, 7, sweep.VOCAB) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    ("kinds", "layers", "expected"),
    [
        (["conv", "conv", "full_attention", "conv"], 2, ["conv", "full_attention"]),  # attention after two convolutions
        (["sliding", "sliding", "full"], 2, ["sliding", "full"]),
        (["a", "b", "c"], 2, ["a", "b", "c"]),  # more kinds than layers: a layer of each
        (["full", "full", "full"], 2, ["full", "full"]),
    ],
)
def test_a_tiny_hybrid_keeps_every_kind_of_layer(kinds: list, layers: int, expected: list) -> None:
    assert sweep._every_kind(kinds, layers) == expected


def test_a_shrunk_hybrid_config_keeps_its_attention_layers() -> None:
    import transformers

    config = sweep.small_config("lfm3", "Lfm3ForCausalLM")
    assert config.num_hidden_layers == len(config.layer_types) >= 2
    assert set(config.layer_types) == set(transformers.AutoConfig.for_model("lfm3").layer_types)


def test_a_config_deriving_from_its_layer_kinds_derives_from_the_shrunk_ones() -> None:
    # Zamba2 names its layer kinds layers_block_type and derives the hybrid layers' ids from them
    config = sweep.small_config("zamba2", "Zamba2ForCausalLM")
    assert config.layers_block_type == ["linear_attention", "hybrid"]
    assert config.hybrid_layer_ids == [1]


def test_a_list_of_end_of_text_ids_keeps_within_the_shrunk_vocabulary() -> None:
    config = sweep.small_config("glm", "GlmForCausalLM")  # three end-of-text ids past 150000
    assert config.eos_token_id == [sweep.SMALL["eos_token_id"]] and config.vocab_size == sweep.VOCAB


def test_a_head_padded_to_the_vocabulary_keeps_within_the_shrunk_one() -> None:
    config = sweep.small_config("inkling2_loop_text", "Inkling2LoopForCausalLM")
    assert config.unpadded_vocab_size <= config.vocab_size == sweep.VOCAB


def test_a_repeated_pattern_of_layer_kinds_is_repeated_as_often_as_the_depth_holds() -> None:
    config = sweep.small_config("gpt_neo", "GPTNeoForQuestionAnswering")  # its validator checks the two agree
    assert (config.num_layers, config.attention_layers) == (2, ["global", "local"])


def test_a_pair_run_again_without_torch_onnx_keeps_its_earlier_comparison() -> None:
    earlier = {"shrunk": "small", "status": "failed", "torch_onnx": "exported", "torch_onnx_exact": True}
    assert sweep._torch_onnx_kept(earlier, {"shrunk": "small"}) == {"torch_onnx": "exported", "torch_onnx_exact": True}
    assert sweep._torch_onnx_kept(earlier, {"shrunk": "derived"}) == {}  # another tiny model: not its result
    assert sweep._torch_onnx_kept(None, {"shrunk": "small"}) == {}


def test_the_kept_comparison_is_the_pairs_last_one(tmp_path) -> None:
    results = tmp_path / "results.jsonl"
    pair = {"task": "text-generation", "architecture": "Mamba2ForCausalLM"}
    lines = [{**pair, "torch_onnx": "failed"}, {**pair, "torch_onnx": "exported"}, {**pair, "cause": "time limit (300 s)"}]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sweep._last_torch_onnx_records(results)[("text-generation", "Mamba2ForCausalLM")]["torch_onnx"] == "exported"


_EXPORT_HF = {"task": "fill-mask", "model_type": "bert", "architecture": "BertForMaskedLM", "shrunk": "small",
              "status": "exported", "exact": False, "difference": 0.5, "seconds": 3.0, "category": "differs",
              "commit": "aaaaaaa", "limit": 300.0}


def test_a_torch_onnx_only_run_takes_export_hfs_side_from_the_pairs_record() -> None:
    # the pair's record written when outputs were matched by name: exported, nothing compared
    stale = {**_EXPORT_HF, "torch_onnx": "exported", "torch_onnx_exact": True, "torch_onnx_cause": "run: KeyError: 'logits'"}
    torch_side = {"task": "fill-mask", "architecture": "BertForMaskedLM", "shrunk": "small", "torch_onnx": "exported",
                  "torch_onnx_exact": True, "torch_onnx_difference": 1e-7, sweep.MEASURED: 1, "torch_onnx_commit": "bbbbbbb"}
    merged = sweep.with_torch_onnx(stale, torch_side)
    # export-hf's side and commit unchanged, torch.onnx's all new (the stale cause gone)
    assert {k: merged[k] for k in _EXPORT_HF} == _EXPORT_HF
    assert {k: v for k, v in merged.items() if k.startswith("torch_onnx")} == {
        k: v for k, v in torch_side.items() if k.startswith("torch_onnx")}
    assert sweep._torch_cell(merged) == "exact" and sweep.classify(merged) == "differs"
    # another tiny model than export-hf's: its comparison is not the pair's
    assert "torch_onnx" not in sweep.with_torch_onnx(stale, {**torch_side, "shrunk": "derived"})
    # a record written before the shrink levels was built at the first, "small"
    assert sweep.with_torch_onnx({k: v for k, v in stale.items() if k != "shrunk"}, torch_side)["torch_onnx_exact"]
    assert "torch_onnx" not in sweep.with_torch_onnx(stale, {**torch_side, "shrunk": None})  # not built


@pytest.mark.parametrize(("record", "unmeasured"), [
    (_EXPORT_HF, True),  # run without the comparison
    ({**_EXPORT_HF, "torch_onnx": "exported", "torch_onnx_exact": True}, True),  # outputs matched by name
    ({**_EXPORT_HF, "torch_onnx": "exported", "torch_onnx_exact": True, sweep.MEASURED: 1}, False),
    ({**_EXPORT_HF, "torch_onnx": "exported", "torch_onnx_cause": "run: Fail", sweep.MEASURED: 0}, False),
    ({**_EXPORT_HF, "torch_onnx": "failed", "torch_onnx_cause": "ConversionError: x"}, False),  # a result
    ({**_EXPORT_HF, "status": "not built"}, False),
    ({**_EXPORT_HF, "task": "image-text-to-text", "torch_onnx": "not compared"}, False),
])
def test_the_pairs_whose_torch_onnx_side_is_unmeasured(record: dict, unmeasured: bool) -> None:
    assert sweep.torch_onnx_unmeasured(record) is unmeasured


def test_a_torch_onnx_only_sweep_appends_the_pairs_whole_records(tmp_path: Path, monkeypatch) -> None:
    measured = {**_EXPORT_HF, "architecture": "EsmForMaskedLM", "model_type": "esm", "torch_onnx": "exported",
                "torch_onnx_exact": True, sweep.MEASURED: 1}
    earlier = [_EXPORT_HF, measured]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in earlier))
    ran = []

    def torch_side(task, model_type, class_name, compare, limit, torch_onnx_only):
        assert torch_onnx_only
        ran.append(class_name)
        return {"task": task, "model_type": model_type, "architecture": class_name, "shrunk": "small",
                "torch_onnx": "failed", "torch_onnx_cause": "ConversionError: x", "torch_onnx_limit": limit}

    monkeypatch.setattr(sweep, "run_in_child", torch_side)
    sweep.sweep(["fill-mask"], results, 60.0, True, None, torch_onnx_only=True)
    assert ran == ["BertForMaskedLM"]  # the measured pair and those never run are left alone
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert lines[:2] == earlier  # appended only
    assert len(lines) == 3 and lines[2]["torch_onnx"] == "failed" and lines[2]["seconds"] == 3.0
    # measured now: a second run has nothing to do; the scoreboard reads the combined line
    sweep.sweep(["fill-mask"], results, 60.0, True, None, torch_onnx_only=True)
    assert ran == ["BertForMaskedLM"]
    bert = next(r for r in sweep.read_results(results) if r["architecture"] == "BertForMaskedLM")
    assert (bert["status"], bert["commit"], bert["torch_onnx_limit"]) == ("exported", "aaaaaaa", 60.0)
    # a later run of export-hf alone keeps the comparison
    monkeypatch.setattr(sweep, "run_in_child", lambda *args: {**_EXPORT_HF, "exact": True, "category": None})
    sweep.sweep(["fill-mask"], results, 60.0, False, None, architectures={"BertForMaskedLM"})
    bert = next(r for r in sweep.read_results(results) if r["architecture"] == "BertForMaskedLM")
    assert bert["exact"] and bert["torch_onnx_cause"] == "ConversionError: x"


def _builds_then_sleeps(task, model_type, class_name, on_built=None):
    on_built({"task": task, "model_type": model_type, "architecture": class_name, "shrunk": "derived"})
    time.sleep(60)


def test_a_torch_onnx_only_pair_past_its_time_limit_keeps_its_shrink_level(monkeypatch) -> None:
    monkeypatch.setattr(sweep, "run_torch_onnx_pair", _builds_then_sleeps)
    record = sweep.run_in_child("fill-mask", "bert", "BertForMaskedLM", compare=True, limit=2, torch_onnx_only=True)
    assert (record["shrunk"], record["torch_onnx"], record["torch_onnx_cause"]) == ("derived", "failed", "time limit (2 s)")
    assert record["torch_onnx_limit"] == 2 and "status" not in record  # export-hf's side is the pair's record's


def test_inputs_forward_takes_through_its_kwargs_are_keyed_under_them() -> None:
    import torch

    class Model(torch.nn.Module):
        def forward(self, input_ids, use_cache=None, **kwargs):
            return input_ids

    inputs = {"input_ids": torch.zeros(2, 3), "attention_mask": torch.zeros(2, 3)}
    shapes = sweep.dynamic_shapes(Model(), inputs, {"use_cache": False})
    auto = torch.export.Dim.AUTO
    assert shapes == {"input_ids": {0: auto, 1: auto}, "use_cache": None, "kwargs": {"attention_mask": {0: auto, 1: auto}}}


@pytest.mark.parametrize(("model_type", "class_name", "encoder"), [
    ("bert", "BertForCausalLM", "BertForMaskedLM"), ("bert-generation", "BertGenerationDecoder", "BertGenerationEncoder"),
    ("bert", "BertLMHeadModel", "BertModel"), ("reformer", "ReformerModelWithLMHead", "ReformerForMaskedLM"),
])
def test_an_encoders_causal_lm_head_is_built_as_a_decoder(model_type: str, class_name: str, encoder: str) -> None:
    # as transformers' docs build them for generation; otherwise their attention sees later tokens
    assert sweep.small_config(model_type, class_name).is_decoder
    assert not sweep.small_config(model_type, encoder).is_decoder


def test_a_text_model_of_a_multimodal_type_reads_its_own_config_class() -> None:
    import transformers

    # qwen3_5's type is the image-text model's config; its causal LM reads the text config
    config = sweep.small_config("qwen3_5", "Qwen3_5ForCausalLM")
    assert isinstance(config, transformers.Qwen3_5ForCausalLM.config_class)
    assert config.vocab_size == sweep.VOCAB and config.num_hidden_layers == len(config.layer_types)


def test_values_given_per_layer_shrink_with_the_depth() -> None:
    # Gemma 3n's text config gives a width per layer, and its validator wants one per layer
    config = sweep.small_config("gemma3n", "Gemma3nForConditionalGeneration")
    text = config.text_config
    assert len(text.intermediate_size) == text.num_hidden_layers == 4
    assert max(text.intermediate_size) <= sweep.SMALL["intermediate_size"]


def test_layers_reusing_an_earlier_layers_cache_keep_a_producer_of_each_kind() -> None:
    # Gemma 3n's last layers reuse the cache of the last earlier layer of their kind: each kind
    # once to produce it, then once to reuse it (the validator refuses a kind without a producer)
    text = sweep.small_config("gemma3n", "Gemma3nForConditionalGeneration").text_config
    assert text.layer_types == ["sliding_attention", "full_attention"] * 2 and text.num_kv_shared_layers == 2
    assert text.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    # an assistant reuses another model's cache in every layer: all of its shrunk layers do
    assistant = sweep.small_config("gemma4_assistant", "Gemma4AssistantForCausalLM").text_config
    assert assistant.num_kv_shared_layers == assistant.num_hidden_layers == 2


def test_a_value_stored_under_another_name_shrinks_under_the_known_one() -> None:
    # Kimi-Linear stores num_experts_per_tok as num_experts_per_token: 8 of 4 experts would fail its top-k
    config = sweep.small_config("kimi_linear", "KimiLinearForCausalLM")
    assert config.num_experts_per_tok == sweep.SMALL["num_experts_per_tok"] <= config.num_local_experts


@pytest.mark.parametrize(("model_type", "class_name", "check"), [
    ("zamba", "ZambaForCausalLM", lambda c: c.layers_block_type.count("hybrid") == 2),  # its shared block tied
    ("bamba", "BambaForCausalLM", lambda c: "full_attention" in c.layers_block_type),
    ("granitemoehybrid", "GraniteMoeHybridForCausalLM", lambda c: "full_attention" in c.layer_types),
    ("dory", "DoryForCausalLM", lambda c: c.n_input_layers == c.n_recurrent_layers == c.n_output_layers == 1),
    ("qwen4_exp", "Qwen4ExpForCausalLM", lambda c: c.indexer_budget % c.indexer_compress_ratio == 0),
    ("cohere_compass_text", "CohereCompassForCausalLM", lambda c: "full_attention" in c.rope_parameters),
    ("dbrx", "DbrxForCausalLM", lambda c: c.attn_config.rope_theta > 0 and c.attn_config.clip_qkv),
])
def test_a_tiny_model_is_shaped_as_the_checkpoints_are(model_type: str, class_name: str, check) -> None:
    # values the checkpoints set that the config's defaults or the shrink leave inconsistent
    config = sweep.small_config(model_type, class_name)
    assert check(config)


def test_a_pair_exported_with_text_only_is_marked_on_the_scoreboard() -> None:
    record = {"task": "text-generation", "architecture": "GitForCausalLM", "status": "exported", "exact": True,
              "option": sweep.TEXT_ONLY}
    assert sweep._cell(record) == "exact" + sweep.TEXT_ONLY_MARK
    assert sweep._cell({**record, "option": None}) == "exact"


def test_a_model_type_whose_checkpoints_name_its_layer_kinds_gets_them() -> None:
    # LFM2-MoE's config leaves its layer kinds None; a dense layer first, then an expert layer
    config = sweep.small_config("lfm2_moe", "Lfm2MoeForCausalLM")
    assert config.layer_types == ["conv", "full_attention"] and config.num_dense_layers == 1


def test_a_tiny_jamba_keeps_an_attention_layer_as_its_checkpoints() -> None:
    # its default period (one attention layer in 8, at 4) would leave two Mamba layers only
    config = sweep.small_config("jamba", "JambaForCausalLM")
    assert config.num_hidden_layers == 2 and config.layer_types == ["linear_attention", "full_attention"]


def test_a_model_type_whose_checkpoints_name_its_key_value_heads_gets_them_shrunk() -> None:
    # Nemotron's config leaves its key/value heads None, which its attention divides by
    config = sweep.small_config("nemotron", "NemotronForQuestionAnswering")
    assert config.num_key_value_heads == sweep.SMALL["num_key_value_heads"]
    assert config.num_attention_heads == sweep.SMALL["num_attention_heads"]


def test_an_encoder_decoder_names_its_decoders_first_token() -> None:
    # T5ForQuestionAnswering shifts the input right with it; T5's config defines none
    assert sweep.small_config("t5", "T5ForQuestionAnswering").decoder_start_token_id == sweep.SMALL["pad_token_id"]


@pytest.mark.parametrize(("model_type", "class_name", "processor"), [
    ("speech-encoder-decoder", "SpeechEncoderDecoderModel", "Wav2Vec2FeatureExtractor"),
    ("vision-encoder-decoder", "VisionEncoderDecoderModel", "ViTImageProcessorPil"),
])
def test_a_composite_encoder_decoder_has_its_decoders_token_ids_and_its_encoders_processor(
        tmp_path: Path, model_type: str, class_name: str, processor: str) -> None:
    # its config class sets no token ids of its own (its decoder's are the decoder config's): its
    # checkpoints do, and generation reads them there
    config = sweep.small_config(model_type, class_name, multimodal=True)
    decoder = config.decoder
    assert (config.pad_token_id, config.eos_token_id) == (decoder.pad_token_id, decoder.eos_token_id) == (
        sweep.SMALL["pad_token_id"], sweep.SMALL["eos_token_id"])
    assert config.decoder_start_token_id == sweep.SMALL["bos_token_id"]
    assert sweep.save_processors(model_type, config, tmp_path) == [processor]  # its encoder's model type's
    assert (tmp_path / "preprocessor_config.json").is_file()


def test_a_latent_attentions_key_value_heads_shrink_with_its_heads() -> None:
    # GLM-4-MoE-Lite expands its latent keys to one per head: fewer key/value heads break its cache
    config = sweep.small_config("glm4_moe_lite", "Glm4MoeLiteForCausalLM")
    assert config.num_key_value_heads == config.num_attention_heads == sweep.SMALL["num_attention_heads"]
    # other models keep the shrunk grouped-query ratio
    assert sweep.small_config("llama", "LlamaForCausalLM").num_key_value_heads == sweep.SMALL["num_key_value_heads"]


@pytest.mark.parametrize("model_type, class_name, check", [
    # a backbone's stages handed on (Depth Anything's DINOv2: 9 to 12 of 12): its last ones, as many
    ("depth_anything", "DepthAnythingForDepthEstimation",
     lambda c: c.backbone_config.out_indices == [1, 2, 3, 4] and c.backbone_config.num_hidden_layers == 4),
    # DPT's hidden states past the embeddings, counted from 0
    ("dpt", "DPTForDepthEstimation", lambda c: list(c.backbone_out_indices) == [0, 1, 2, 3] and c.num_hidden_layers == 4),
    # BEiT's segmentation checkpoints hand four layers to its head
    ("beit", "BeitForSemanticSegmentation", lambda c: c.out_indices == [1, 2, 3, 4] and c.num_hidden_layers == 4),
    # a stage within the shrunk depth stays (DepthPro's last stage of 2)
    ("depth_pro", "DepthProForDepthEstimation", lambda c: c.image_model_config.out_indices == [2]),
])
def test_a_backbones_handed_on_layers_are_within_its_shrunk_depth(model_type: str, class_name: str, check) -> None:
    assert check(sweep.small_config(model_type, class_name))


def test_a_width_the_config_derives_from_its_width_shrinks_with_it() -> None:
    # SigLIP's text projection_size is its hidden_size, which its image features are multiplied with
    config = sweep.small_config("siglip", "SiglipModel")
    assert config.text_config.projection_size == config.text_config.hidden_size == sweep.SMALL["hidden_size"]


def test_a_detector_without_a_padding_token_is_built() -> None:
    # DETR is an encoder-decoder without token ids; its ResNet backbone is transformers' own
    config = sweep.small_config("detr", "DetrForSegmentation")
    assert config.decoder_start_token_id is None and config.backbone_config.model_type == "resnet"
    # its mask head reads every stage, and normalises its width plus its heads in groups of 8
    assert config.backbone_config.out_features == ["stage1", "stage2", "stage3", "stage4"]
    assert (config.d_model + config.encoder_attention_heads) % 8 == 0


def test_a_segmenters_queries_join_layers_of_its_shrunk_depth() -> None:
    config = sweep.small_config("eomt", "EomtForUniversalSegmentation")
    assert config.num_blocks <= config.num_hidden_layers


def test_alignments_text_projection_has_its_image_features_width() -> None:
    # ALIGN compares its projected texts with its EfficientNet's unprojected pooled features
    config = sweep.small_config("align", "AlignModel")
    # its last stage's 24 channels by a quarter, rounded up to its divisor of 8
    vision = config.vision_config
    assert (vision.out_channels[-1], vision.width_coefficient, vision.depth_divisor) == (24, 0.25, 8)
    assert config.projection_dim == 8


def test_a_list_of_widths_equal_to_the_width_shrinks_with_it() -> None:
    # RT-DETR's decoder reads its encoder's three levels at the model's width
    config = sweep.small_config("rt_detr", "RTDetrForObjectDetection")
    assert list(config.decoder_in_channels) == [config.d_model] * 3 == [sweep.SMALL["d_model"]] * 3
    assert config.encoder_hidden_dim == config.d_model


def test_torch_onnx_outputs_are_compared_by_position() -> None:
    # torch.onnx.export names them after their nodes (linear_13), not after the output's keys
    import numpy as np
    import torch
    from transformers.modeling_outputs import SemanticSegmenterOutput

    logits = torch.ones(1, 2)
    expected = SemanticSegmenterOutput(logits=logits)
    pairs = sweep.compared_outputs(expected, ("logits", "pred_boxes"), [np.zeros((1, 2))])
    assert len(pairs) == 1 and pairs[0][1] is logits and pairs[0][0].shape == (1, 2)
    with pytest.raises(ValueError, match="2 outputs, transformers gives 1"):
        sweep.compared_outputs(expected, ("logits",), [np.zeros((1, 2)), np.zeros(1)])


def test_a_torch_onnx_record_without_compared_outputs_is_not_counted_exact() -> None:
    # records written when the outputs were matched by name compared none: exported, not measured
    written_unmeasured = {"status": "exported", "exact": True, "torch_onnx": "exported", "torch_onnx_exact": True,
                          "torch_onnx_difference": 0.0}
    measured = {**written_unmeasured, sweep.MEASURED: 1}
    failed_run = {**written_unmeasured, "torch_onnx_exact": False, "torch_onnx_cause": "run: ValueError"}
    counts = sweep.summary([written_unmeasured, measured, failed_run])
    assert (counts["torch_onnx_exported"], counts["torch_onnx_measured"], counts["torch_onnx_exact"]) == (3, 1, 1)
    assert sweep._torch_cell(written_unmeasured) == "exported, not compared"
    assert sweep._torch_cell(measured) == "exact" and sweep._torch_cell(failed_run) == "exported, its run fails"


def test_the_generative_multimodal_tasks_are_enumerated_from_their_auto_mappings() -> None:
    from fx2onnx.hub.loading import TASKS

    vision_language = sweep.pairs_of("image-text-to-text")
    assert ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration") in vision_language
    assert ("vision-encoder-decoder", "VisionEncoderDecoderModel") in vision_language  # image-to-text is filed here
    assert ("whisper", "WhisperForConditionalGeneration") in sweep.pairs_of("speech-seq2seq")
    # the CTC encoders keep their own task; the encoder-decoders are export-hf's speech recognition too
    assert not set(sweep.pairs_of("speech-seq2seq")) & set(sweep.pairs_of("automatic-speech-recognition"))
    assert sweep.EXPORT_TASKS["speech-seq2seq"] in TASKS and "image-text-to-text" in TASKS
    assert set(sweep.UNCOMPARED) == {"image-text-to-text", "speech-seq2seq"}
    # text-to-audio is swept, its torch.onnx export not compared: each run draws its own noise
    assert ("vits", "VitsModel") in sweep.pairs_of("text-to-audio") and "text-to-audio" in TASKS
    assert sweep._torch_onnx(None, "text-to-audio", None, Path("."))["torch_onnx"] == "not compared"


def test_a_tiny_vision_language_model_fits_its_towers_to_the_shrunk_sizes() -> None:
    config = sweep.small_config("qwen3_vl", "Qwen3VLForConditionalGeneration", multimodal=True)
    vision, text = config.vision_config, config.text_config
    assert vision.depth == 2 and list(vision.deepstack_visual_indexes) == [1]  # within the shrunk tower
    assert vision.out_hidden_size == text.hidden_size == sweep.SMALL["hidden_size"]
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    assert all(getattr(config, name) < sweep.VOCAB for name in ("image_token_id", "video_token_id", "vision_start_token_id"))
    assert len({config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id}) == 4
    # without it (the other tasks), the generic shrink alone
    assert list(sweep.small_config("qwen3_vl", "Qwen3VLForConditionalGeneration").vision_config.deepstack_visual_indexes) == [8, 16, 24]


def test_a_tiny_vision_tower_has_sixteen_patches_a_side_and_its_processor_feeds_them(tmp_path: Path) -> None:
    config = sweep.small_config("gemma3", "Gemma3ForConditionalGeneration", multimodal=True)
    vision = config.vision_config
    assert vision.image_size // vision.patch_size == sweep.PATCHES_PER_SIDE
    assert sweep.save_processors("gemma3", config, tmp_path) == ["Gemma3ImageProcessorPil"]
    size = json.loads((tmp_path / "preprocessor_config.json").read_text())["size"]
    assert size == {"height": vision.image_size, "width": vision.image_size}


def test_a_multimodal_pair_is_recorded_with_the_reason_it_is_not_compared(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    record = sweep.run_pair("image-text-to-text", "mistral3", "Mistral3ForConditionalGeneration", compare=False)
    assert record["status"] == "exported" and record["exact"] is True and record["tokens_equal"] is True
    assert record["difference"] <= sweep.ATOL and record["nodes"] > 0 and record["seconds"] > 0 and "peak_mb" in record
    assert record["category"] is None and record["processors"] == ["PixtralImageProcessorPil"]
    assert record["torch_onnx"] == "not compared" and "no single module" in record["torch_onnx_cause"]
    # a vision-language model export-hf writes no folder for: its refusal, counted apart
    refused = sweep.run_pair("image-text-to-text", "llava", "LlavaForConditionalGeneration", compare=False)
    assert refused["cause"].startswith("UnsupportedArchitectureError") and "llava is not one of them" in refused["cause"]
    assert refused["category"] == "refused"


def test_a_tiny_whisper_suppresses_only_tokens_of_its_vocabulary() -> None:
    import transformers

    config = sweep.small_config("whisper", "WhisperForConditionalGeneration", multimodal=True)
    model = transformers.WhisperForConditionalGeneration(config)
    assert any(i >= sweep.VOCAB for i in model.generation_config.begin_suppress_tokens)
    sweep._generation_within_vocabulary(model)
    assert all(i < sweep.VOCAB for i in model.generation_config.begin_suppress_tokens or [])


def test_the_task_pages_get_their_tables_between_their_markers(tmp_path: Path) -> None:
    """--write-docs fills each export-hf task page's marked table from the sweep's and the
    clients' records, and leaves the hand-written text as it is."""
    import task_pages

    records = [
        {"task": "text-generation", "architecture": "Qwen2ForCausalLM", "status": "exported", "exact": True, "difference": 1.5e-7},
        {"task": "text-generation", "architecture": "MambaForCausalLM", "status": "exported", "exact": True, "difference": 2e-7},
        {"task": "text-generation", "architecture": "XLMWithLMHeadModel", "status": "failed", "where": "export-hf",
         "via": "export-hf", "cause": "UnsupportedTaskError: XLMWithLMHeadModel (xlm) is served by fill-mask"},
        {"task": "text-generation", "architecture": "SqueezeBertForCausalLM", "status": "not built", "cause": "ValueError: w"},
        {"task": "fill-mask", "architecture": "BertForMaskedLM", "status": "exported", "exact": False, "difference": 0.5},
    ]
    clients = [
        {"task": "text-generation", "architecture": "Qwen2ForCausalLM", "model_type": "qwen2", "js": "loaded", "js_exact": True,
         "genai": "loaded", "genai_type": "qwen2", "genai_exact": True},
        {"task": "text-generation", "architecture": "MambaForCausalLM", "model_type": "mamba", "js": "not supported",
         "genai": "no genai_config.json"},
    ]
    results = _sweep_and_client_results(tmp_path, records, clients)
    pages = tmp_path / "pages"
    pages.mkdir()
    marked = "\n".join([task_pages.START.format(task="{task}"), "an old table", task_pages.END])
    (pages / "text-generation.md").write_text(f"# Text generation\n\nBy hand.\n\n{marked.format(task='text-generation')}\n\nAfter.\n")
    (pages / "fill-mask.md").write_text(f"# Fill-mask\n\n{marked.format(task='fill-mask')}\n")
    (pages / "other.md").write_text("# Nothing marked\n")

    written = sweep.write_task_tables(results, pages)
    assert [p.name for p in written] == ["fill-mask.md", "text-generation.md"]
    text = (pages / "text-generation.md").read_text()
    assert text.startswith("# Text generation\n\nBy hand.\n\n") and text.endswith(f"{task_pages.END}\n\nAfter.\n")
    assert "an old table" not in text
    assert ("3 architectures tried, 2 exported, 2 exact in onnxruntime. Of the 2 folders run in the clients, "
            "Transformers.js has a class for 1: 1 exact; ONNX Runtime GenAI ran the 1 with a `genai_config.json`: 1 exact.") in text
    assert "| architecture | export-hf | largest difference | Transformers.js | ONNX Runtime GenAI |" in text
    assert "| Qwen2ForCausalLM | exact | 1.5e-07 | exact | exact (qwen2) |" in text
    assert "| MambaForCausalLM | exact | 2e-07 | no class | not written (no genai_config.json) |" in text
    assert "| XLMWithLMHeadModel | fails: refused |  |  |  |" in text
    assert "SqueezeBert" not in text  # not built: counted on the scoreboard, not tried
    fill_mask = (pages / "fill-mask.md").read_text()
    assert "| BertForMaskedLM | differs | 0.5 | - |" in fill_mask and "ONNX Runtime GenAI" not in fill_mask
    assert "Not run in the clients yet." in fill_mask
    # a second run finds its own tables and writes them the same
    assert sweep.write_task_tables(results, pages) == []
    # a marker naming a task the results do not hold is an error, not an empty table
    (pages / "other.md").write_text(marked.format(task="text-to-mime") + "\n")
    with pytest.raises(ValueError, match="other.md asks for the sweep table of 'text-to-mime'"):
        sweep.write_task_tables(results, pages)


def test_the_guides_markers_name_tasks_of_the_sweep() -> None:
    import task_pages

    pages = sorted((sweep.ROOT / "docs" / "guides" / "export-hf").glob("*.md"))
    marked = {m["task"] for page in pages for m in task_pages.MARKED.finditer(page.read_text(encoding="utf-8"))}
    assert marked and marked <= set(sweep.TASK_MAPPINGS), sorted(marked - set(sweep.TASK_MAPPINGS))


def test_a_causal_lm_filed_under_image_text_to_text_alone_is_swept_as_text_generation() -> None:
    # Mistral4ForCausalLM: export-hf's default task for it (no encoder) is text generation
    assert ("mistral4", "Mistral4ForCausalLM") in sweep.pairs_of("text-generation")
    assert ("mistral4", "Mistral4ForCausalLM") in sweep.pairs_of("image-text-to-text")
    names = [name for _, name in sweep.pairs_of("text-generation")]
    assert len(names) == len(set(names))  # a class filed under both (Git's) once


def test_the_clients_read_a_folders_model_type_as_the_class_config_gives_it() -> None:
    """transformers maps llama4 and llama4_text to Llama4ForCausalLM, whose own config class
    writes llama4_text (the type Transformers.js lists): both may be the folder's."""
    import sweep_clients

    assert sweep_clients.candidate_types("llama4", "Llama4ForCausalLM") == {"llama4", "llama4_text"}
    assert sweep_clients.candidate_types("llama", "LlamaForCausalLM") == {"llama"}


def test_a_tiny_depth_pro_takes_images_of_its_processors_proportions() -> None:
    """DepthPro's patches (patch_size, each encoder's image size) shrunk to 32 pixels, so that
    its image is 128 pixels (its processor's 1536 hold 384-pixel patches), and its encoders'
    layers it hands on within their shrunk depth."""
    from fx2onnx.hub.pipeline_tasks import image_size

    config = sweep.small_config("depth_pro", "DepthProForDepthEstimation")
    assert config.patch_size == config.image_model_config.image_size == config.patch_model_config.image_size == 32
    assert max(config.intermediate_hook_ids) < config.patch_model_config.num_hidden_layers
    assert image_size(config) == (128, 128)


def test_a_class_filed_under_several_model_types_is_swept_under_its_own_config_s() -> None:
    """transformers files GPT2LMHeadModel under gpt-sw3 and gpt2, LlamaForCausalLM under
    exaone, llama and others: the sweep builds each from its own config class's model
    type, the one clients know it by."""
    pairs = dict((name, model_type) for model_type, name in sweep.pairs_of("text-generation"))
    assert pairs["GPT2LMHeadModel"] == "gpt2" and pairs["LlamaForCausalLM"] == "llama"
    assert pairs["Llama4ForCausalLM"] == "llama4_text"
    assert sweep.own_model_type("LlamaForCausalLM", ["exaone", "llama"]) == "llama"
    assert sweep.own_model_type("NoSuchClass", ["b", "a"]) == "b"  # no config class: the first
