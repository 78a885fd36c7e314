"""Capture failures of transformers models say which config flag or input to change."""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from conftest import make_options
from fx2onnx.capture.libraries.transformers_hints import transformers_hint, transformers_version
from fx2onnx.capture.library_adapters import library_hint

transformers = pytest.importorskip("transformers")


class ToyCache:
    """A cache class of a model's own that no pytree registration knows."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state


def _gpt2_config() -> object:
    return transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=32)


class ReturnsOwnCache(transformers.GPT2LMHeadModel):
    def forward(self, input_ids: torch.Tensor) -> tuple:
        logits = super().forward(input_ids=input_ids, use_cache=False).logits
        return logits, ToyCache(logits * 2)


class BranchesOnTokenValues(transformers.GPT2LMHeadModel):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if (input_ids == 0).any():  # a value-dependent branch in transformers-style code
            input_ids = input_ids + 1
        return super().forward(input_ids=input_ids).logits


class BranchesOnItsBuffer(transformers.GPT2LMHeadModel):
    """EoMT's kind of branch: on a value the model holds, not on an input."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.register_buffer("mask_probs", torch.ones(1))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = super().forward(input_ids=input_ids).logits
        if self.mask_probs[0] > 0:  # a branch on a buffer's value
            logits = logits * 2
        return logits


def _failure_message(tmp_path, kind: type) -> str:
    """The message of the failed export of a GPT-2 of class ``kind`` on token ids."""
    model = kind(_gpt2_config()).eval()
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        fx2onnx.dynamo_export(model, torch.randint(0, 100, (2, 5)), export_options=make_options(tmp_path))
    return str(raised.value)


def test_unknown_cache_class_hint_names_use_cache_flag(tmp_path) -> None:
    message = _failure_message(tmp_path, ReturnsOwnCache)
    assert "use_cache=False" in message and "ToyCache" in message
    assert "torch.cond" not in message.split("What to do")[0]


def test_value_dependent_branch_hint_names_inputs_and_flag(tmp_path) -> None:
    summary = _failure_message(tmp_path, BranchesOnTokenValues).split("What to do")[0]
    assert "attention_mask" in summary and "use_cache=False" in summary


def test_a_branch_on_a_buffers_value_names_the_buffer_not_the_inputs(tmp_path) -> None:
    summary = _failure_message(tmp_path, BranchesOnItsBuffer).split("What to do")[0]
    assert "by the value of its buffer 'mask_probs' at " in summary and "(`if self.mask_probs[0] > 0:" in summary
    assert "attention_mask" not in summary and "use_cache=False" not in summary


def test_longformers_capture_failure_quotes_its_line(tmp_path) -> None:
    config = transformers.LongformerConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, attention_window=[4], max_position_embeddings=64)
    model = transformers.LongformerModel(config).eval()
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        fx2onnx.dynamo_export(model, torch.randint(3, 100, (2, 8)), export_options=make_options(tmp_path))
    hint = str(raised.value).split("Hint: ", 1)[1]
    # the example's static sizes pass the chunking: the branch on global attention is the line
    assert hint.startswith("Longformer's sliding-window attention cannot be captured at transformers/models/longformer/"
                           "modeling_longformer.py:") and " in forward (`if is_global_attn:`)" in hint
    assert "attention_mask" not in hint


def test_no_transformers_hint_for_other_models() -> None:
    assert transformers_hint(torch.nn.Linear(2, 2), RuntimeError("which is not a known type")) is None


def test_library_hint_asks_each_library_and_names_the_version() -> None:
    error = RuntimeError("Node type ToyCache which is not a known type: register a pytree")
    model = ReturnsOwnCache(_gpt2_config())
    assert library_hint(model, error) == transformers_hint(model, error) and "use_cache=False" in library_hint(model, error)
    assert library_hint(torch.nn.Linear(2, 2), error) is None
    assert transformers_version(model) == transformers.__version__
    assert transformers_version(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize("file", ["longformer/modeling_longformer.py", "led/modeling_led.py"])
def test_a_longformer_chunk_failure_names_its_sliding_window_attention(file: str) -> None:
    # the innermost transformers frame is the attention's chunking, where torch.div made a size a tensor
    namespace: dict = {}
    source = "def _chunk():\n    raise RuntimeError('Could not guard on data-dependent expression Eq(u1, 1)')\n"
    exec(compile(source, f"/site-packages/transformers/models/{file}", "exec"), namespace)  # noqa: S102
    with pytest.raises(RuntimeError) as raised:
        namespace["_chunk"]()
    hint = transformers_hint(transformers.GPT2LMHeadModel(_gpt2_config()), raised.value)
    assert hint.startswith("Longformer's sliding-window attention cannot be captured") and file.split("/")[1] in hint
    assert "attention_mask" not in hint  # not the advice for a branch on token values
