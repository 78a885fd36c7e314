"""End-to-end: transformers models from small configs with random weights (nothing is
downloaded), exported with use_cache=False and compared with eager."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

VOCAB = 100


def _ids(batch: int = 2, length: int = 8) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length))


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False
    )
    return transformers.GPT2LMHeadModel(config).eval()


def test_gpt2_lm_head(export_and_compare):
    export_and_compare(gpt2(), kwargs={"input_ids": _ids()})


def test_bert(export_and_compare):
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    export_and_compare(transformers.BertModel(config).eval(), kwargs={"input_ids": ids, "attention_mask": mask})


def test_llama_causal_lm(export_and_compare):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
    )
    export_and_compare(transformers.LlamaForCausalLM(config).eval(), kwargs={"input_ids": _ids()})


def test_t5_encoder_decoder(export_and_compare):
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, use_cache=False,
    )
    ids = _ids()
    export_and_compare(
        transformers.T5ForConditionalGeneration(config).eval(),
        kwargs={"input_ids": ids, "decoder_input_ids": ids[:, :5]},
    )
