"""`export-hf` on architectures whose configs or outputs differ from the usual: a decoder's
sizes in a nested config (EncoderDecoderModel's `decoder`, Fuyu's `text_config`), a
cross-attention cache whose heads only the first step fixes (FSMT), an encoder output read
by name (NllbMoe), a generation config whose processors change the greedy tokens
(Blenderbot's forced end of text); each folder compared with transformers by `--verify`."""

from __future__ import annotations

import json
import os

import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.tasks import UnsupportedTaskError

transformers = pytest.importorskip("transformers")

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
BART_LIKE = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, **IDS)
BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


def encoder_decoder(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "bert2bert":
        config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
            transformers.BertConfig(**BERT), transformers.BertConfig(**BERT, is_decoder=True, add_cross_attention=True),
        )
        config.decoder_start_token_id, config.pad_token_id = 1, 0
        return transformers.EncoderDecoderModel(config).eval()
    if kind == "fsmt":
        config = transformers.FSMTConfig(langs=["en", "de"], src_vocab_size=100, tgt_vocab_size=100, **BART_LIKE)
        return transformers.FSMTForConditionalGeneration(config).eval()
    config = transformers.NllbMoeConfig(vocab_size=100, num_experts=4, **BART_LIKE)
    return transformers.NllbMoeForConditionalGeneration(config).eval()


def _input_dims(path, name: str) -> list:
    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    value = next(v for v in graph.input if v.name == name)
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("kind", ["bert2bert", "fsmt", "nllb-moe"])
def test_encoder_decoders_whose_configs_or_outputs_differ(tmp_path, kind):
    encoder_decoder(kind).save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text2text-generation", verify=True, tokens=4)
    # greedy decoding at two encoder input sizes against the same loop in transformers
    assert result.verification.passed and result.verification.tokens_equal
    merged = tmp_path / "out" / "onnx" / "decoder_model_merged.onnx"
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(tmp_path / "out" / "onnx" / name), full_check=True)
    # the hard case, FSMT: the later steps pass the cross-attention cache on without reading its heads, which the
    # merge then takes from the first step's present (4 heads, the config's), not a free dim
    assert _input_dims(merged, "past_key_values.0.encoder.key")[1] == 4
    assert _input_dims(merged, "past_key_values.0.decoder.key")[1] == 4


def test_a_decoder_with_nested_sizes_and_a_forced_end_of_text(tmp_path):
    # Fuyu keeps its decoder's sizes in text_config; Blenderbot's generation config forces the end of
    # text at the last position, which plain greedy search (the folder's runtime) does not
    torch.manual_seed(0)
    text = transformers.PersimmonConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, max_position_embeddings=128, pad_token_id=0, eos_token_id=2)
    fuyu = transformers.FuyuForCausalLM(transformers.FuyuConfig(text_config=text.to_dict(), image_size=64, patch_size=30))
    blenderbot = transformers.BlenderbotForCausalLM(transformers.BlenderbotConfig(
        vocab_size=100, forced_eos_token_id=2, encoder_no_repeat_ngram_size=3, **BART_LIKE))
    assert blenderbot.generation_config.forced_eos_token_id == 2
    for name, model in (("fuyu", fuyu), ("blenderbot", blenderbot)):
        model.eval().save_pretrained(tmp_path / name)
        result = export_hf(tmp_path / name, tmp_path / f"{name}-out", task="text-generation", verify=True, tokens=8)
        assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
        assert 2 not in result.verification.torch_tokens  # transformers' tokens without the forced end of text
        onnx.checker.check_model(os.fspath(tmp_path / f"{name}-out" / "onnx" / "model.onnx"), full_check=True)


@pytest.mark.parametrize(("task", "config", "words"), [
    ("text-generation", "xlm", "returns no key/value cache"),
    ("image-classification", "pp_lcnet", "returns no `logits`"),  # its class scores come as last_hidden_state
])
def test_models_without_the_folders_parts_are_refused_before_anything_is_written(tmp_path, task, config, words):
    torch.manual_seed(0)
    if config == "pp_lcnet":
        model = transformers.PPLCNetForImageClassification(transformers.PPLCNetConfig(num_labels=3, scale=0.25,
                                                                                       class_expand=32))
        hint = "fx2onnx.dynamo_export"
    else:
        model = transformers.XLMWithLMHeadModel(transformers.XLMConfig(vocab_size=100, emb_dim=32, n_layers=1, n_heads=4))
        hint = "--task fill-mask"
    model.save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=words) as error:
        export_hf(tmp_path / "source", tmp_path / "out", task=task)
    assert hint in str(error.value) and "Nothing was written" in str(error.value)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("kind", ["rembert", "blenderbot"])
def test_decoders_whose_cache_differs_run_in_onnxruntime_genai(tmp_path, kind):
    """ONNX Runtime GenAI generates transformers' greedy tokens (plain greedy search, as
    `genai_config.json` asks) from folders whose cache is not the usual: a BERT-like causal
    LM (RemBERT) keeps an encoder-decoder cache class, whose entries the folder names
    `past_key_values.<i>.decoder.key` (`genai_config.json` gives the runtime those names);
    Blenderbot's decoder takes no position_ids and counts positions from the past's length,
    which a shared past/present buffer (the whole context long) would not give."""
    from fx2onnx.hub.shared.verification import plain_greedy
    from test_export_hf import genai_greedy

    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    torch.manual_seed(0)
    if kind == "rembert":
        config = transformers.RemBertConfig(**BERT, input_embedding_size=16, output_embedding_size=16, is_decoder=True,
                                            pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = transformers.RemBertForCausalLM(config).eval()
    else:
        model = transformers.BlenderbotForCausalLM(transformers.BlenderbotConfig(vocab_size=100, **BART_LIKE)).eval()
    model.save_pretrained(tmp_path / "source")
    export_hf(tmp_path / "source", tmp_path / "out")
    onnx.checker.check_model(os.fspath(tmp_path / "out" / "onnx" / "model.onnx"), full_check=True)
    written = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    part = "decoder." if kind == "rembert" else ""
    assert written["model"]["decoder"]["inputs"]["past_key_names"] == f"past_key_values.%d.{part}key"
    assert written["model"]["decoder"]["outputs"]["present_value_names"] == f"present.%d.{part}value"
    if kind == "blenderbot":
        assert "position_ids" not in written["model"]["decoder"]["inputs"]
        assert written["search"]["past_present_share_buffer"] is False
    genai = og.Model(str(tmp_path / "out"))
    for prompt in ([5, 17, 42, 8], [9, 3, 77, 31, 60, 12, 4, 50, 21]):
        ids = torch.tensor([prompt])
        with torch.no_grad(), plain_greedy(model):
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                                      pad_token_id=0)[0, len(prompt):].tolist()
        assert genai_greedy(genai, prompt, len(expected)) == expected


def test_a_sequence_length_the_models_own_code_fixes_is_refused_naming_that_code(tmp_path):
    # Funnel builds its relative positions from a Python list of the sequence's length, so the
    # export holds one length: the error cites that line of transformers, not fx2onnx
    torch.manual_seed(0)
    config = transformers.FunnelConfig(vocab_size=100, block_sizes=[1], num_decoder_layers=1, d_model=32, n_head=4, d_head=8,
                                      d_inner=64)
    transformers.FunnelForMaskedLM(config).eval().save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"Dim 1 of input 'input_ids' \(sequence_length\) is static") as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="fill-mask")
    message = str(error.value)
    assert "was fixed to 7 by the code at" in message and "modeling_funnel.py:" in message
    assert "Report this" not in message and "Nothing was written" in message
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_model_whose_own_forward_needs_more_than_the_tasks_inputs_is_refused(tmp_path):
    # Bros reads its words' boxes (bbox), which a token-classification folder does not feed
    torch.manual_seed(0)
    config = transformers.BrosConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, num_labels=3)
    transformers.BrosForTokenClassification(config).eval().save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match="transformers' own forward fails on them") as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="token-classification")
    message = str(error.value)
    assert "(input_ids, attention_mask" in message
    # transformers' error, and the line of the model's code that raised it
    assert "You have to specify bbox (raised at transformers/models/bros/modeling_bros.py:" in message
    assert "fx2onnx.dynamo_export" in message
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_hybrid_decoders_convolution_states_keep_their_size(tmp_path):
    # LFM2's cache is a convolution state in its conv layer (the kernel's last inputs, 3, never
    # grows) beside the keys and values of its attention layer: the folder's decoder takes the
    # state at its own size, started as zeros, and the keys growing with the sequence
    torch.manual_seed(0)
    config = transformers.Lfm2Config(vocab_size=100, hidden_size=32, intermediate_size=64, block_ff_dim=64,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
                                     layer_types=["conv", "full_attention"], max_position_embeddings=64, **IDS)
    transformers.Lfm2ForCausalLM(config).eval().save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=6)
    # a prompt and a left-padded batch, decoded past the kernel width
    assert result.verification.passed and result.verification.tokens_equal
    model = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(os.fspath(model), full_check=True)
    assert _input_dims(model, "past_conv.0") == ["batch_size", 32, 3]  # named as Transformers.js feeds it
    assert _input_dims(model, "past_key_values.1.key") == ["batch_size", 2, "past_sequence_length", 8]
    assert not (tmp_path / "out" / "genai_config.json").exists()  # GenAI feeds such states only to its own builder's models


def _siglip2_patches(patches: int, grids: list[list[int]], seed: int) -> dict[str, torch.Tensor]:
    # a batch as Siglip2's image processor cuts it: each image's patches of 4 x 4 pixels, flattened, then padding
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(grids), patches, dtype=torch.long)
    for row, (height, width) in enumerate(grids):
        mask[row, :height * width] = 1
    return dict(pixel_values=torch.randn(len(grids), patches, 3 * 4 * 4, generator=generator),
                pixel_attention_mask=mask, spatial_shapes=torch.tensor(grids))


def test_a_patch_input_image_classifier_is_refused_naming_the_inputs_that_export_it(tmp_path):
    """Siglip2's classifier takes patches, their mask and grid shapes, not the images an
    image-classification folder's clients feed: export-hf refuses it before writing
    anything, and the export its refusal names runs in onnxruntime on other grids too."""
    import onnxruntime

    import fx2onnx

    torch.manual_seed(0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, patch_size=4,
                  num_patches=16)
    config = transformers.Siglip2Config(text_config=dict(BERT, num_hidden_layers=1), vision_config=vision, num_labels=3)
    model = transformers.Siglip2ForImageClassification(config).eval()
    model.save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match="takes its image as patches") as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="image-classification")
    assert "pixel_attention_mask" in str(error.value) and "spatial_shapes" in str(error.value)
    assert "Nothing was written" in str(error.value) and not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]

    options = fx2onnx.ExportOptions(dynamic_shapes=True)
    program = fx2onnx.dynamo_export(model, **_siglip2_patches(16, [[4, 4], [3, 4]], 0), export_options=options)
    program.save(tmp_path / "siglip2.onnx")
    onnx.checker.check_model(os.fspath(tmp_path / "siglip2.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(os.fspath(tmp_path / "siglip2.onnx"), providers=["CPUExecutionProvider"])
    for inputs in (_siglip2_patches(16, [[2, 8], [4, 2]], 1), _siglip2_patches(12, [[3, 4], [2, 5], [1, 6]], 2)):
        with torch.no_grad():
            expected = model(**inputs).logits.numpy()
        got = session.run(["logits"], {name: value.numpy() for name, value in inputs.items()})[0]
        torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(expected), rtol=1e-3, atol=1e-4)


def test_an_indexers_cache_of_keys_without_heads_grows_with_the_sequence(tmp_path):
    # AXK2's sparse attention keeps, beside its latent keys and values, its indexer's keys
    # ([batch, length, size]: no heads, so the length is dim 1): the folder's decoder takes
    # them growing, an empty one first
    torch.manual_seed(0)
    config = transformers.AXK2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=48, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8,
        index_head_dim=16, index_n_heads=4, max_position_embeddings=64, **IDS)
    transformers.AXK2ForCausalLM(config).eval().save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=4)
    assert result.verification.passed and result.verification.tokens_equal
    model = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(os.fspath(model), full_check=True)
    assert _input_dims(model, "past_key_values.0.indexer_keys") == ["batch_size", "past_sequence_length", 16]


def test_a_falcon_mamba_flat_folder_scans_its_prompt_at_any_length(tmp_path):
    # Falcon-Mamba's selective scan loops in Python over the prompt's tokens; captured as a scan
    # from the cache's state, the flat folder (module functions off) equals transformers at
    # --verify's lengths and its left-padded batch, and the scan is an ONNX Scan
    torch.manual_seed(0)
    config = transformers.FalconMambaConfig(vocab_size=100, hidden_size=32, state_size=4, num_hidden_layers=1, expand=2,
                                            conv_kernel=3, time_step_rank=4, **IDS)
    transformers.FalconMambaForCausalLM(config).eval().save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=4,
                       module_functions=False)
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4, result.verification.summary()
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    assert not model.functions and "Scan" in {node.op_type for node in model.graph.node}
    assert not (tmp_path / "out" / "genai_config.json").exists()


def test_a_text_model_of_a_multimodal_type_loads_as_its_own_class(tmp_path):
    # Emu3's text model has a config class of its own (Emu3TextConfig), which
    # AutoModelForCausalLM does not map: the folder is exported from the checkpoint's class
    from transformers.models.emu3.configuration_emu3 import Emu3TextConfig

    torch.manual_seed(0)
    config = Emu3TextConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    assert Emu3TextConfig not in transformers.AutoModelForCausalLM._model_mapping  # the case: no auto class for it
    transformers.Emu3ForCausalLM(config).eval().save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.task == "text-generation" and result.verification.passed, result.verification.summary()
    onnx.checker.check_model(str(tmp_path / "out" / "onnx" / "model.onnx"), full_check=True)
