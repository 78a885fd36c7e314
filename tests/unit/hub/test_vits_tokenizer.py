"""VITS's `tokenizer.json` (fx2onnx/hub/speech/vits_tokenizer.py) and the text-to-audio
recipe's pieces (fx2onnx/hub/recipes/text_to_audio.py), without exporting."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

from fx2onnx.hub.recipes.text_to_audio import NOISE_SCALES, name_frames, quiet_twin, tokenizer_steps_left_out
from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, file_encoder, write_tokenizer
from fx2onnx.hub.speech.vits_tokenizer import skipped_steps

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.mark.parametrize("blank", ["<pad>", "_"])
@pytest.mark.parametrize("normalize", [True, False])
def test_tokenizer_json_encodes_as_vits_tokenizer(tmp_path, blank, normalize):
    """Token 0 of one character or several, with and without normalization (casing, characters
    outside the vocabulary, spaces at the ends): the `tokenizers` library reads the ids
    `VitsTokenizer` gives."""
    characters = [blank, "<unk>", " ", "'", "-", *"abcdefghilmnorstuwxyzé."]
    (tmp_path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(characters)}), encoding="utf-8")
    tokenizer = transformers.VitsTokenizer(str(tmp_path / "vocab.json"), pad_token=blank, normalize=normalize, phonemize=False)
    written = write_tokenizer(tokenizer, tmp_path / "out")
    assert {"tokenizer.json", "vocab.json", "tokenizer_config.json"} <= set(written)
    strings = [*CHECKED_STRINGS, "Hello, the fox's café!", "", "  a  "]
    encode = file_encoder(tmp_path / "out" / "tokenizer.json")
    assert [encode(text) for text in strings] == [tokenizer(text)["input_ids"] for text in strings]


def test_steps_a_tokenizer_json_cannot_take_are_named(tmp_path):
    """Phonemization and romanization, named from the tokenizer and from the source's tokenizer_config.json."""
    (tmp_path / "vocab.json").write_text(json.dumps({"_": 0, "a": 1}), encoding="utf-8")
    tokenizer = transformers.VitsTokenizer(str(tmp_path / "vocab.json"), phonemize=True, is_uroman=True)
    assert [step.split(" ")[0] for step in skipped_steps(tokenizer)] == ["phonemization", "romanization"]
    tokenizer.save_pretrained(tmp_path)
    assert [step.split(" ")[0] for step in tokenizer_steps_left_out(tmp_path)] == ["phonemization", "romanization"]
    transformers.VitsTokenizer(str(tmp_path / "vocab.json"), phonemize=False).save_pretrained(tmp_path)
    assert tokenizer_steps_left_out(tmp_path) == []


def test_quiet_twin_and_frame_names():
    config = transformers.VitsConfig(
        vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, ffn_dim=8, flow_size=8,
        spectrogram_bins=9, upsample_initial_channel=8, upsample_rates=[2], upsample_kernel_sizes=[4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], duration_predictor_filter_channels=8,
        prior_encoder_num_flows=1, prior_encoder_num_wavenet_layers=1, depth_separable_num_layers=1,
        duration_predictor_num_flows=1)
    model = transformers.VitsModel(config)
    twin = quiet_twin(model)
    assert all(getattr(twin, name) == 0 and getattr(twin.config, name) == 0 for name in NOISE_SCALES)
    assert all(getattr(model, name) > 0 for name in NOISE_SCALES)  # the model itself keeps its noise
    frames = ir.Value(name="spectrogram", shape=ir.Shape(["batch", "arange_4_dim_0"]), type=ir.TensorType(ir.DataType.FLOAT))
    waveform = ir.Value(name="waveform", shape=ir.Shape(["batch", "256*arange_4_dim_0"]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.node("Identity", [frames], outputs=[waveform])
    graph = ir.Model(ir.Graph([frames], [waveform], nodes=[node], opset_imports={"": 21}), ir_version=10)
    name_frames(graph)
    assert [d.value for d in frames.shape] == ["batch", "frames"]
    assert [d.value for d in waveform.shape] == ["batch", "waveform_length"]
