"""The audio input of a speech encoder-decoder's encoder (fx2onnx/hub/speech/audio_input.py):
its name from the model, its layout and time axis from the folder's feature extractor."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.hub.speech.audio_input import AudioLayout, audio_layout, speech_examples

transformers = pytest.importorskip("transformers")


class _Reads(torch.nn.Module):
    """A model that reads ``name`` (what the examples need of one: its input name and dtype)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.main_input_name = name
        self.weight = torch.nn.Parameter(torch.zeros(1))


@pytest.mark.parametrize(("extractor", "name", "shapes", "layout"), [
    # Whisper pads every clip to 3000 frames, mel bins first: no time axis
    (lambda: transformers.WhisperFeatureExtractor(feature_size=80), "input_features",
     [(2, 80, 3000), (3, 80, 3000)], AudioLayout("input_features", None)),
    # frames of 10 ms, then the mel bins
    (lambda: transformers.Speech2TextFeatureExtractor(feature_size=80, num_mel_bins=80), "input_features",
     [(2, 98, 80), (3, 153, 80)], AudioLayout("input_features", 1)),
    # two frames stacked into one of 160
    (lambda: transformers.SeamlessM4TFeatureExtractor(), "input_features", [(2, 49, 160), (3, 77, 160)],
     AudioLayout("input_features", 1)),
    # the waveform as is
    (lambda: transformers.Wav2Vec2FeatureExtractor(do_normalize=False), "input_values", [(2, 16000), (3, 24800)],
     AudioLayout("input_values", 1)),
])
def test_examples_and_layout_follow_the_feature_extractor(tmp_path, extractor, name, shapes, layout):
    extractor().save_pretrained(tmp_path)
    model = _Reads(name)
    examples = [speech_examples(tmp_path, None, model, size) for size in (0, 1)]
    assert [tuple(e[name].shape) for e in examples] == shapes and all(list(e) == [name] for e in examples)
    assert audio_layout(tmp_path, None, model) == layout
    frames = "num_samples" if name == "input_values" else "num_frames"
    # the mask of a padded batch, where the input has a time, follows it
    mask = {} if layout.time_axis is None else {"attention_mask": {0: "batch_size", 1: frames}}
    assert layout.dim_roles() == {name: {0: "batch_size", **({} if layout.time_axis is None else {1: frames})}, **mask}


def test_an_extractor_without_the_models_input_is_an_error(tmp_path):
    transformers.Wav2Vec2FeatureExtractor().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gives input_values but the model reads input_features"):
        speech_examples(tmp_path, None, _Reads("input_features"), 0)
