"""The mask of a padded batch of clips (fx2onnx/hub/speech/audio_mask.py): which models
read it, the examples that carry it, the rule from input mask to output frames, and the
optional input whose default attends every frame."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from fx2onnx.hub.speech.audio_input import extractor_gives_mask, reads_mask, speech_examples
from fx2onnx.hub.speech.audio_mask import attended, frames_mask_rule, frames_of, optional_mask

transformers = pytest.importorskip("transformers")


class _Reads(torch.nn.Module):
    """A model that reads ``input_values``, with or without a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.main_input_name = "input_values"
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_values: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return input_values


@pytest.mark.parametrize("returns_mask", [True, False])
def test_the_mask_is_read_where_the_extractor_returns_one(tmp_path, returns_mask):
    transformers.Wav2Vec2FeatureExtractor(return_attention_mask=returns_mask).save_pretrained(tmp_path)
    assert extractor_gives_mask(tmp_path) is returns_mask and reads_mask(tmp_path, _Reads()) is returns_mask
    examples = speech_examples(tmp_path, None, _Reads(), 1, with_mask=True)
    # three clips, the last one 0.7 of the others: padded, and masked where the extractor masks
    assert tuple(examples["input_values"].shape) == (3, 24800)
    if returns_mask:
        assert examples["attention_mask"].dtype == torch.int64
        assert examples["attention_mask"].sum(-1).tolist() == [24800, 24800, 17360]
    else:
        assert "attention_mask" not in examples


def test_a_row_attending_nothing_attends_every_frame():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    assert attended(mask).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    speech_to_text = transformers.Speech2TextForConditionalGeneration(transformers.Speech2TextConfig(
        vocab_size=20, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=16, decoder_ffn_dim=16, conv_channels=8, max_source_positions=64, max_target_positions=16))
    rule = frames_mask_rule(speech_to_text)  # two convolutions of stride 2: 12 frames -> 3
    frames = frames_of(rule, torch.tensor([[1] * 12, [1] * 6 + [0] * 6, [0] * 12]), 3)
    assert frames.tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 1]]


def test_a_model_without_a_known_rule_has_none():
    assert frames_mask_rule(_Reads()) is None


def test_the_optional_mask_pads_its_default_to_the_input(tmp_path):
    """A graph that returns its mask: without it, zeros of the audio's (batch, time); with
    it, the mask as given."""
    audio = helper.make_tensor_value_info("input_values", TensorProto.FLOAT, ["batch", "time"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "time"])
    out = helper.make_tensor_value_info("seen", TensorProto.INT64, ["batch", "time"])
    graph = helper.make_graph([helper.make_node("Identity", ["attention_mask"], ["seen"])], "g", [audio, mask], [out])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)
    optional_mask(path, "attention_mask", "input_values", (0, 1))
    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_values"]
    assert [i.name for i in session.get_overridable_initializers()] == ["attention_mask"]
    values = np.zeros((2, 5), dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"input_values": values})[0], np.zeros((2, 5), dtype=np.int64))
    given = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    np.testing.assert_array_equal(session.run(None, {"input_values": values, "attention_mask": given})[0], given)
    with pytest.raises(ValueError, match="no input 'mask'"):
        optional_mask(path, "mask", "input_values", (0,))
