"""A step a folder is captured on that the model's own code cannot run: ProphetNet's decoder
asserts one token per step over its cache, so its sequence-to-sequence folder is refused naming
that line; and Longformer's question answering finds the question by its three separators,
which the task's example inputs hold as a pair tokenizer writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.pipeline_tasks import example_inputs
from fx2onnx.hub.recipes import seq2seq
from fx2onnx.hub.tasks import UnsupportedTaskError

transformers = pytest.importorskip("transformers")


def test_a_decoding_step_the_models_own_code_refuses_is_refused_naming_its_line() -> None:
    config = transformers.ProphetNetConfig(vocab_size=100, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                           num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2,
                                           num_decoder_attention_heads=2, ngram=2, num_buckets=8, relative_max_distance=16)
    torch.manual_seed(0)
    model = transformers.ProphetNetForConditionalGeneration(config).eval()
    loaded = LoadedModel(model, config, Path("."), "text2text-generation", None)
    _, decoder = seq2seq.halves(loaded)
    assert seq2seq._step_refusal(loaded, decoder, with_past=False) is None  # the first step runs
    refusal = seq2seq._step_refusal(loaded, decoder, with_past=True)
    assert isinstance(refusal, UnsupportedTaskError)
    assert str(refusal).startswith(f"ProphetNetForConditionalGeneration (prophetnet) does not run a decoding step of "
                                   f"{seq2seq.NEW_TOKENS} new tokens over its cache of {seq2seq.DECODED}")
    assert re.search(r"AssertionError: At the moment `use_cache` is only supported for `decoder_input_ids` of length 1 "
                     r"\(raised at transformers/models/prophetnet/modeling_prophetnet\.py:\d+ in forward "
                     r"\(`assert hidden_states\.size\(1\) == 1, \(`\)\)\. No folder was written\.", str(refusal))


def test_question_answering_inputs_hold_a_question_and_its_context() -> None:
    config = transformers.LongformerConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, attention_window=[4], max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LongformerForQuestionAnswering(config).eval()
    for size in (0, 1):
        inputs = example_inputs("question-answering", config, model, size)
        # `q </s></s> c </s>`: three separators in each row, as Longformer's forward counts them
        assert ((inputs["input_ids"] == config.sep_token_id).sum(-1) == 3).all()
        with torch.no_grad():
            start = model(**inputs).start_logits
        assert start.shape == inputs["input_ids"].shape
    # a separator that does not end a text (BERT's [SEP]): `q [SEP] c [SEP]`; none named: inputs as for other tasks
    bert = transformers.BertConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, sep_token_id=5)
    ids = example_inputs("question-answering", bert, transformers.BertForQuestionAnswering(bert), 0)["input_ids"]
    assert ((ids == 5).sum(-1) == 2).all() and (ids[:, 2] == 5).all() and (ids[:, -1] == 5).all()
    bert.sep_token_id = None
    plain = example_inputs("question-answering", bert, transformers.BertForQuestionAnswering(bert), 0)["input_ids"]
    assert torch.equal(plain, example_inputs("text-classification", bert, transformers.BertForQuestionAnswering(bert), 0)["input_ids"])


def test_layers_whose_masks_export_hf_does_not_build_are_an_architecture_it_refuses() -> None:
    # Dots3-Note's indexed attention beside its sliding-window layers
    from types import SimpleNamespace

    from fx2onnx.hub.decoders.sliding_window import masks_for
    from fx2onnx.hub.tasks import UnsupportedArchitectureError

    config = SimpleNamespace(model_type="dots3_note_text", _attn_implementation="sdpa", sliding_window=4,
                             layer_types=["sliding_attention", "indexed_attention"])
    with pytest.raises(UnsupportedArchitectureError, match=r"layers of kind indexed_attention .*Nothing was written"):
        masks_for(config, torch.ones(2, 6, dtype=torch.int64), 3, torch.float32)
    config.layer_types = ["sliding_attention", "full_attention"]
    masks = masks_for(config, torch.ones(2, 6, dtype=torch.int64), 3, torch.float32)
    # the last token (position 5) sees positions 2 to 5 through its window of 4, and all six without
    assert masks["sliding_attention"].shape == (2, 1, 3, 6)
    assert masks["sliding_attention"][0, 0, 2].tolist() == [False, False, True, True, True, True]
    assert masks["full_attention"][0, 0, 2].all()
