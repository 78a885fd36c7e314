"""A one-pass task's model and a sequence-to-sequence model whose capture fails on a Python
branch or size over tensor values in their own code (Longformer's and LED's sliding-window
attention sizes its chunks with `torch.div` of the sequence length, a tensor) are refused
with a ValueBranchError naming the model's line, the task and the capture's report; nothing
is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.value_branch_refusal import ValueBranchError

transformers = pytest.importorskip("transformers")

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _longformer() -> torch.nn.Module:
    config = transformers.LongformerConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        attention_window=4, max_position_embeddings=64, num_labels=3, **IDS)
    return transformers.LongformerForTokenClassification(config).eval()


def _led() -> torch.nn.Module:
    config = transformers.LEDConfig(
        vocab_size=100, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, attention_window=4,
        max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, decoder_start_token_id=2, **IDS)
    return transformers.LEDForConditionalGeneration(config).eval()


@pytest.mark.parametrize(("make", "task", "line"), [
    (_longformer, "token-classification", "transformers/models/longformer/modeling_longformer.py:"),
    (_led, "text2text-generation", "transformers/models/led/modeling_led.py:"),
])
def test_a_branch_on_tensor_values_in_one_pass_or_seq2seq_is_refused_naming_the_line(tmp_path: Path, make, task, line):
    torch.manual_seed(0)
    model = make()
    model.save_pretrained(tmp_path / "source")
    with pytest.raises(ValueBranchError) as refused:
        export_hf(tmp_path / "source", tmp_path / "out", task=task)
    message = str(refused.value)
    name = type(model).__name__
    assert message.startswith(f"{name} ({model.config.model_type}) decides a Python branch or size on values computed "
                              f"from tensors at {line}")
    assert " in _chunk (`hidden_states = hidden_states.view(`)" in message  # the line quoted, in the function named
    assert "GuardOnDataDependentSymNode" in message
    assert f"there is no {task} folder for this model as its code is written. Nothing was written." in message
    report = message.split("SARIF report is at '")[1].split("'")[0]
    assert Path(report).is_file()
    assert not (tmp_path / "out").exists()
