"""Gemma 4's embedding and decoder for Transformers.js, in PyTorch: the same numbers as
transformers' model (their ONNX files in Transformers.js: tests/e2e/test_transformers_js.py)."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.hub.decoders.per_layer_inputs import PerLayerDecoder, PerLayerEmbedding, writes_embedded_decoder

transformers = pytest.importorskip("transformers")


def tiny_gemma4(image_token_id: int = 7) -> torch.nn.Module:
    torch.manual_seed(0)
    text = transformers.Gemma4TextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, global_head_dim=16, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=100, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=3.0, pad_token_id=0)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None,
                                       image_token_id=image_token_id)
    return transformers.Gemma4ForConditionalGeneration(config).eval()


def test_gemma4_folders_get_the_layout_and_others_not():
    assert writes_embedded_decoder(transformers.AutoConfig.for_model("gemma4"))
    assert not writes_embedded_decoder(transformers.LlamaConfig())
    assert not writes_embedded_decoder(transformers.AutoConfig.for_model("gemma4_text"))  # no Transformers.js class
    # Gemma 3n's language model, run by the gemma3n class its config.json is given (client_support.py)
    assert writes_embedded_decoder(transformers.AutoConfig.for_model("gemma3n_text"))


def test_ids_past_a_per_layer_table_read_its_first_row():
    """Gemma 3n's per-layer table holds the text vocabulary alone (256 of 400 rows here): the
    embedding gives transformers' per-layer inputs for ids past it too (its row 0)."""
    torch.manual_seed(0)
    text = transformers.Gemma3nTextConfig(
        vocab_size=400, vocab_size_per_layer_input=256, hidden_size=32, hidden_size_per_layer_input=8,
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0, laurel_rank=8,
        activation_sparsity_pattern=[0.0, 0.0])
    model = transformers.Gemma3nForCausalLM(text).eval()
    ids = torch.tensor([[5, 300, 255, 256, 399, 17]])
    with torch.no_grad():
        embedded = PerLayerEmbedding(model)(ids)
        expected = model.model.get_per_layer_inputs(ids)
    torch.testing.assert_close(embedded["per_layer_inputs"], expected, rtol=0, atol=0)
    assert torch.equal(expected[0, 1], expected[0, 3]) and not torch.equal(expected[0, 2], expected[0, 3])


def test_the_embedding_and_decoder_compute_the_models_logits():
    """Each step's ids through the embedding then the decoder give transformers' logits (its
    soft cap included), over a cache; an image token without an image is embedded as padding in
    both, as the multimodal forward does."""
    model = tiny_gemma4()
    embedding, decoder = PerLayerEmbedding(model).eval(), PerLayerDecoder(model).eval()
    ids = torch.tensor([[5, 7, 42, 8, 91, 13], [9, 3, 77, 31, 60, 12]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        embedded = embedding(ids)
        language_model = model.model.language_model
        padded = torch.where(ids == 7, 0, ids)
        torch.testing.assert_close(embedded["inputs_embeds"], language_model.embed_tokens(padded), rtol=0, atol=0)
        torch.testing.assert_close(embedded["per_layer_inputs"], language_model.get_per_layer_inputs(padded), rtol=0, atol=0)
        assert embedded["per_layer_inputs"].shape == (2, 6, 2, 8)
        expected = model(ids, attention_mask=mask, use_cache=True)
        prefill = decoder(embedded["inputs_embeds"][:, :4], mask[:, :4], torch.arange(4).expand(2, -1),
                          transformers.DynamicCache(config=model.config.text_config),
                          per_layer_inputs=embedded["per_layer_inputs"][:, :4])
        step = decoder(embedded["inputs_embeds"][:, 4:], mask, torch.arange(4, 6).expand(2, -1), prefill["present"],
                       per_layer_inputs=embedded["per_layer_inputs"][:, 4:])
    logits = torch.cat([prefill["logits"], step["logits"]], dim=1)
    assert logits.abs().max() <= 3.0  # the soft cap
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)
