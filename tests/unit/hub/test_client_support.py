"""The clients that cannot load a text-generation folder (`fx2onnx.hub.decoders.client_support`):
the reason per config, the line export-hf says, the table read against Transformers.js's
own sources where they are installed, and the docs' list against the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from client_versions import PINNED_TRANSFORMERS_JS, TRANSFORMERS_JS_VERSION, transformers_js_folder

from fx2onnx.hub.decoders.combined_cache import reads_combined_cache
from fx2onnx.hub.decoders.client_support import (
    TRANSFORMERS_JS, TRANSFORMERS_JS_CAUSAL_LM_TYPES, client_note, transformers_js_reason,
    transformers_js_unsupported,
)

transformers = pytest.importorskip("transformers")

DOCS = Path(__file__).parents[3] / "docs" / "guides" / "export-hf" / "clients.md"
PACKAGE = Path(__file__).parents[3] / "fx2onnx"
TRANSFORMERS_JS_DIST = transformers_js_folder() / "node_modules" / "@huggingface" / "transformers" / "dist" / "transformers.node.mjs"


def test_the_messages_name_the_release_the_tests_pin():
    # a bump of the pin that forgets the constant (or the reverse) makes every note name a release no test ran
    assert TRANSFORMERS_JS == f"Transformers.js {PINNED_TRANSFORMERS_JS}"


def test_no_module_writes_a_transformers_js_release_of_its_own():
    # every message reads client_support.TRANSFORMERS_JS, so that one line names the release
    written = [f"{path.relative_to(PACKAGE)}:{number}"
               for path in sorted(PACKAGE.rglob("*.py"))
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if re.search(r"Transformers\.js \d+\.\d+", line) and not line.startswith("TRANSFORMERS_JS = ")]
    assert not written, f"use client_support.TRANSFORMERS_JS instead of the release written out: {written}"


def test_mixtral_has_no_transformers_js_class():
    config = transformers.MixtralConfig(num_hidden_layers=1).to_dict()
    assert transformers_js_reason(config) == (
        "it has no text-generation class for model type mixtral (Unsupported model type: mixtral)"
    )
    assert client_note(config) == (
        "Transformers.js 4.3.2 cannot load this folder: it has no text-generation class for model type mixtral "
        "(Unsupported model type: mixtral). It is for onnxruntime and ONNX Runtime GenAI."
    )


def test_a_folder_without_genai_config_is_for_onnxruntime_only():
    # Mamba's convolution and recurrent states: no genai_config.json, and no Transformers.js class
    config = transformers.MambaConfig(num_hidden_layers=1).to_dict()
    assert client_note(config, genai_config=False) == (
        "Transformers.js 4.3.2 cannot load this folder: it has no text-generation class for model type mamba "
        "(Unsupported model type: mamba). It is for onnxruntime only."
    )


@pytest.mark.parametrize(("config", "multi_query"), [
    (transformers.FalconConfig(num_hidden_layers=1), True),  # Falcon's default
    (transformers.FalconConfig(num_hidden_layers=1, multi_query=False), False),
    (transformers.GPTBigCodeConfig(n_layer=1), True),  # GPT-BigCode's default
])
def test_a_multi_query_config_gets_the_combined_cache_and_no_note(config, multi_query):
    """Transformers.js reads multi_query as one combined cache input per layer, which the
    folder's model.onnx then takes (combined_cache.py): nothing stops it."""
    assert reads_combined_cache(config.to_dict()) is multi_query
    assert transformers_js_reason(config.to_dict()) is None
    assert client_note(config.to_dict()) is None


@pytest.mark.parametrize("config", [
    transformers.LlamaConfig(num_hidden_layers=1),
    transformers.Qwen2Config(num_hidden_layers=1),
    transformers.Phi3Config(num_hidden_layers=1),
    transformers.GPT2Config(n_layer=1),
    transformers.AutoConfig.for_model("gemma4"),  # its folder holds the embedding and decoder Transformers.js loads
])
def test_types_transformers_js_runs_get_no_note(config):
    assert transformers_js_reason(config.to_dict()) is None
    assert client_note(config.to_dict()) is None


def transformers_js_mapping(name: str) -> tuple[set[str], str]:
    """The model types of Transformers.js's mapping ``name``, read from its dist, and the dist's
    text; the test skipped where Transformers.js is not installed."""
    if not TRANSFORMERS_JS_DIST.is_file():
        pytest.skip(f"Transformers.js {TRANSFORMERS_JS_VERSION} is not installed at {TRANSFORMERS_JS_DIST} (tests/e2e/test_transformers_js.py installs it)")
    source = TRANSFORMERS_JS_DIST.read_text(encoding="utf-8")
    table = re.search(rf"var {name} = [^\n]*\n(.*?)\n\]\);", source, re.S)
    assert table is not None, f"Transformers.js's dist no longer defines {name} as expected"
    return set(re.findall(r'^\s*\["([^"]+)"', table.group(1), re.M)), source


def test_the_table_is_transformers_js_causal_lm_mapping():
    types, source = transformers_js_mapping("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    assert types == TRANSFORMERS_JS_CAUSAL_LM_TYPES
    # and its cache names read multi_query for every model type: one key_value input per layer
    assert re.search(r"normalized_config\.multi_query\) \{\s*for .*?\n\s*names\.add\(`\$\{prefix\}\.\$\{i\}\.key_value`\)", source)


def test_the_docs_list_the_causal_lm_types_transformers_js_cannot_load():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    listed = re.split(r"files under causal\s+LMs, ", DOCS.read_text(encoding="utf-8"), maxsplit=1)[1].split(".\n", 1)[0]
    expected = transformers_js_unsupported(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert "mixtral" in expected
    assert re.findall(r"`([^`]+)`", listed) == expected


def test_exaone_gets_its_layer_count_under_the_name_transformers_js_reads():
    from fx2onnx.hub.decoders.client_support import transformers_js_entries

    config = transformers.AutoConfig.for_model("exaone", num_hidden_layers=3).to_dict()
    assert transformers_js_entries(config) == {"num_layers": 3}
    assert transformers_js_entries({**config, "num_layers": 3}) == {}  # never replaced
    assert transformers_js_entries(transformers.LlamaConfig(num_hidden_layers=3).to_dict()) == {}


def test_qwen2_vl_gets_its_text_sizes_at_the_top_where_transformers_js_reads_them():
    from fx2onnx.hub.decoders.client_support import transformers_js_entries

    config = transformers.Qwen2VLConfig(text_config=dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                                         num_key_value_heads=2)).to_dict()
    entries = transformers_js_entries(config)
    assert {key: entries[key] for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")} == {
        "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert transformers.Qwen2VLConfig.from_dict({**config, **entries}).text_config.num_hidden_layers == 3  # read back alike


def test_the_image_text_to_text_rows_are_transformers_js_image_text_to_text_types():
    from fx2onnx.hub.vision_language.transformers_js import TRANSFORMERS_JS_ARCHITECTURES

    assert set(TRANSFORMERS_JS_ARCHITECTURES) <= transformers_js_mapping("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")[0]


def test_nemotron_h_lists_its_layer_kinds_by_the_names_transformers_js_reads():
    """Transformers.js tells Nemotron-H's layers apart by `mamba` and `attention`; transformers
    writes `linear_attention` and `full_attention` and reads the older names back alike."""
    from fx2onnx.hub.decoders.client_support import transformers_js_entries

    config = transformers.NemotronHConfig(layers_block_type=["linear_attention", "moe", "full_attention", "mlp"])
    entries = transformers_js_entries(config.to_dict())
    assert entries == {"layers_block_type": ["mamba", "moe", "attention", "mlp"]}
    assert transformers.NemotronHConfig.from_dict({**config.to_dict(), **entries}).layers_block_type == config.layers_block_type


@pytest.mark.parametrize(("config", "error"), [
    (transformers.MBartConfig(decoder_layers=1, is_encoder_decoder=False), "feeds a mbart causal LM no cache"),
    (transformers.TrOCRConfig(decoder_layers=1), "feeds a trocr causal LM no cache"),
])
def test_causal_lms_whose_cache_transformers_js_cannot_feed_get_the_note(config, error):
    assert error in client_note(config.to_dict())


def test_zaya_gets_no_note_whatever_its_stride():
    """Its graph takes each group of cca_time1 layers' caches in the inputs Transformers.js feeds
    (strided_cache.py)."""
    for stride in (1, 2, 3):
        assert client_note(transformers.ZayaConfig(num_hidden_layers=4, cca_time1=stride).to_dict()) is None


def test_qwen3_5_text_and_glm_moe_dsa_folders_are_for_transformers_js_too():
    """Their graphs take what Transformers.js feeds (positions counted from the mask, the indexer
    keys carried in the key cache): no note."""
    for model_type in ("qwen3_5_text", "glm_moe_dsa"):
        assert client_note(transformers.AutoConfig.for_model(model_type, num_hidden_layers=2).to_dict()) is None


def test_qwen3_5_moe_text_is_written_as_the_model_type_whose_transformers_js_class_runs_it():
    """Transformers.js has no class for qwen3_5_moe_text; its qwen3_next class feeds what the graph
    takes, and transformers reads the config back with every entry kept."""
    from fx2onnx.hub.decoders.client_support import transformers_js_entries

    config = transformers.AutoConfig.for_model("qwen3_5_moe_text", num_hidden_layers=2).to_dict()
    written = {**config, **transformers_js_entries(config)}
    assert written["model_type"] == "qwen3_next" and client_note(written) is None
    read_back = transformers.AutoConfig.for_model(**written).to_dict()
    assert {key: read_back[key] for key in config if key != "model_type"} == {
        key: value for key, value in config.items() if key != "model_type"}


def test_gemma3n_text_is_written_as_the_multimodal_class_whose_text_only_sessions_run_it():
    """Transformers.js has no class for gemma3n_text; its gemma3n causal-LM class loads the
    embedding and decoder a config naming Gemma3nForConditionalGeneration has, with the sizes of
    `text_config`; transformers reads the text config back whole from there."""
    from fx2onnx.hub.decoders.client_support import transformers_js_entries

    config = transformers.Gemma3nTextConfig(num_hidden_layers=2, num_kv_shared_layers=0).to_dict()
    config["architectures"] = ["Gemma3nForCausalLM"]
    written = {**config, **transformers_js_entries(config)}
    assert written["model_type"] == "gemma3n" and written["architectures"] == ["Gemma3nForConditionalGeneration"]
    assert client_note(written) is None and client_note(config) is not None
    assert written["text_config"]["model_type"] == "gemma3n_text" and "architectures" not in written["text_config"]
    assert written["hidden_size"] == config["hidden_size"]  # the top-level entries kept
    read_back = transformers.Gemma3nTextConfig(**written["text_config"]).to_dict()
    assert {key: read_back[key] for key in config if key != "architectures"} == {
        key: value for key, value in config.items() if key != "architectures"}
    assert transformers_js_entries(written) == {}  # marking the folder again changes nothing
