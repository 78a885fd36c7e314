"""`export-hf` of audio language models (an audio encoder whose features replace the prompt's
audio tokens of a decoder-only language model; transformers files them under
sequence-to-sequence): Transformers.js's audio-text-to-text folder, its audio encoder from
the model's own `get_audio_features` (or an architecture's own features: Qwen2-Audio), the
token embedding and the decoder over `inputs_embeds`. `--verify` runs the three models in
onnxruntime as Transformers.js chains them; here the folders' models also pass ONNX's full
checker, the audio encoder's features equal transformers' on clips of another count than the
capture's, and a refusal names what differs."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.audio_language import qwen2_audio
from fx2onnx.hub.audio_language.audio_parts import EXPORT_BATCH
from fx2onnx.hub.audio_language.audio_verification import end_tokens
from fx2onnx.hub.audio_language.hooks import audio_hooks
from fx2onnx.hub.audio_language.own_features import OWN_FEATURES
from fx2onnx.hub.audio_language.transformers_js_audio import client_note
from fx2onnx.hub.recipe_table import recipe_for
from fx2onnx.hub.recipes import audio_text_to_text

transformers = pytest.importorskip("transformers")

PARTS = ("audio_encoder", "embed_tokens", "decoder_model_merged")
VOCAB, AUDIO_TOKEN = 100, 99
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# a Whisper-like encoder of 16 mel bins over 2 * 40 frames (it takes no other length)
WHISPER_AUDIO = dict(num_mel_bins=16, max_source_positions=40, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                     encoder_ffn_dim=64)


def save_voxtral(folder):
    """A two-layer Voxtral (its projector stacks 4 encoder frames: intermediate_size 4 x 32)."""
    audio = transformers.VoxtralEncoderConfig(num_mel_bins=16, max_source_positions=40, hidden_size=32, intermediate_size=128,
                                              num_hidden_layers=2, num_attention_heads=4)
    config = transformers.VoxtralConfig(audio_config=audio, text_config=transformers.LlamaConfig(**TEXT),
                                        audio_token_id=AUDIO_TOKEN)
    torch.manual_seed(0)
    model = transformers.VoxtralForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


def save_granite_speech(folder):
    """A two-layer Granite Speech (a conformer encoder of 16 mel bins, a one-layer Q-Former
    projector, no LoRA adapter), built without torchaudio (only its feature extractor needs
    it), its weights drawn wide enough for greedy decoding to vary its tokens."""
    encoder = transformers.GraniteSpeechEncoderConfig(input_dim=16, hidden_dim=32, dim_head=8, num_layers=2, num_heads=4,
                                                      output_dim=24)
    projector = transformers.Blip2QFormerConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                intermediate_size=64, encoder_hidden_size=32)
    text = {key: value for key, value in TEXT.items() if key != "head_dim"}
    config = transformers.GraniteSpeechConfig(encoder_config=encoder, projector_config=projector, has_lora_adapter=False,
                                              text_config=transformers.GraniteConfig(**text), audio_token_id=AUDIO_TOKEN)
    model = transformers.GraniteSpeechForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    model.save_pretrained(folder)
    return model


def save_qwen2_audio(folder):
    """A two-layer Qwen2-Audio, whose forward computes the audio features inline."""
    config = transformers.Qwen2AudioConfig(audio_config=transformers.Qwen2AudioEncoderConfig(**WHISPER_AUDIO),
                                           text_config=transformers.Qwen2Config(**TEXT), audio_token_index=AUDIO_TOKEN)
    torch.manual_seed(0)
    model = transformers.Qwen2AudioForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


def encoder_features(path, model, clips: int) -> tuple[np.ndarray, torch.Tensor]:
    """The folder's audio encoder and transformers' features of ``clips`` random clips."""
    from fx2onnx.hub.audio_language.audio_inputs import audio_inputs

    hooks = audio_hooks(model)
    audio = audio_inputs(model, hooks, path.parent.parent, batch=clips, seed=5)
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {name: value.numpy() for name, value in zip(names, audio.values())}
    with torch.no_grad():
        expected = hooks.features(model, audio)
    return session.run(None, feed)[0], expected


@pytest.mark.parametrize(("family", "functions"), [("voxtral", True), ("qwen2_audio", False)])
def test_audio_folder_generates_as_transformers(tmp_path, family, functions):
    """Export with --verify (16 greedy tokens and every step's logits against transformers, the
    features within tolerance), with module functions and without, each model through ONNX's
    full checker; the audio encoder's features equal transformers' for 1 and 2 clips (the
    capture's example has 3)."""
    model = {"voxtral": save_voxtral, "qwen2_audio": save_qwen2_audio}[family](tmp_path / "source")
    out = tmp_path / "out"
    # text2text-generation: the default task of a class transformers files under sequence-to-sequence alone
    verification = export_hf(tmp_path / "source", out, verify=True, tokens=16, module_functions=functions).verification
    assert verification.passed and verification.tokens_equal and len(verification.onnx_tokens) == 16
    assert len(set(verification.torch_tokens)) > 1  # the greedy tokens are not one token repeated
    for name in PARTS:
        onnx.checker.check_model(os.fspath(out / "onnx" / f"{name}.onnx"), full_check=True)
    decoder = onnx.load(os.fspath(out / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)
    assert bool(decoder.functions) is functions
    encoder = onnx.load(os.fspath(out / "onnx" / "audio_encoder.onnx"), load_external_data=False)
    expected_inputs = {"voxtral": ["audio_values"], "qwen2_audio": ["input_features", "feature_attention_mask"]}[family]
    assert [i.name for i in encoder.graph.input] == expected_inputs and encoder.graph.output[0].name == "audio_features"
    assert EXPORT_BATCH not in (1, 2)
    for clips in (1, 2):
        got, expected = encoder_features(out / "onnx" / "audio_encoder.onnx", model, clips)
        assert got.shape == tuple(expected.shape) and got.shape[-1] == TEXT["hidden_size"]
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-3, atol=1e-4)


def test_an_audio_model_whose_hooks_differ_is_refused(tmp_path):
    """A config without its audio token, and a get_audio_features that reads more than the
    audio, are refused before anything is written, saying what differs."""
    model = save_voxtral(tmp_path / "source")
    model.config.audio_token_id = None
    model.config.save_pretrained(tmp_path / "source")
    with pytest.raises(NotImplementedError, match="sets no audio_token_id"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text2text-generation")
    assert not (tmp_path / "out").exists()
    model.config.audio_token_id = AUDIO_TOKEN

    def get_audio_features(input_features, speaker_embedding, **kwargs):
        raise AssertionError("not called")

    model.model.get_audio_features = get_audio_features
    with pytest.raises(NotImplementedError, match="takes `speaker_embedding`, which is no audio input"):
        audio_hooks(model)


def save_voxtral_realtime(folder):
    """A two-layer VoxtralRealtime whose windows the verification's clips pass: the encoder's of 12
    positions (a clip of 21 tokens has 84), the decoder's of 16 tokens (the prompt and 16 new ones
    are 21), a delay of 3 tokens; weights drawn wide enough for greedy decoding to vary its tokens."""
    audio = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_mel_bins=16,
                 head_dim=8, sliding_window=12, initializer_range=0.2)
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, sliding_window=16, initializer_range=0.2, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    config = transformers.VoxtralRealtimeConfig(audio_config=audio, text_config=text, default_num_delay_tokens=3)
    torch.manual_seed(0)
    model = transformers.VoxtralRealtimeForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


# the streaming encoder's inputs and outputs, as Transformers.js's encodeChunk feeds and reads them
REALTIME_ENCODER_INPUTS = ["input_features", "attention_mask", "position_ids", "past_padding_cache",
                           *(f"past_key_values.{layer}.{kind}" for layer in range(2) for kind in ("key", "value"))]
REALTIME_ENCODER_OUTPUTS = ["audio_embeds", "present_padding_cache",
                            *(f"present.{layer}.{kind}" for layer in range(2) for kind in ("key", "value"))]


def test_voxtral_realtime_streaming_folder_generates_as_transformers(tmp_path):
    """VoxtralRealtime's streaming folder with --verify: the encoder run chunk by chunk with its
    padding and key/value caches (two clips, chunked differently), each audio embedding added to
    one token's, the decoder's delay conditioning inside: 16 greedy tokens and every step's logits
    equal transformers' `generate` on the whole clip, past both sliding windows. Each model passes
    the full checker; the encoder's inputs and outputs are those the client feeds and reads, its
    batch and heads static (the client sizes its caches from them). With module functions."""
    save_voxtral_realtime(tmp_path / "source")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, task="text2text-generation", verify=True, tokens=16,
                             module_functions=True).verification
    assert verification.passed and verification.tokens_equal and len(verification.onnx_tokens) == 16
    assert verification.max_logit_difference < 1e-4 and len(set(verification.torch_tokens)) > 4
    for name in PARTS:
        onnx.checker.check_model(os.fspath(out / "onnx" / f"{name}.onnx"), full_check=True)
    encoder = onnx.load(os.fspath(out / "onnx" / "audio_encoder.onnx"), load_external_data=False)
    assert [i.name for i in encoder.graph.input] == REALTIME_ENCODER_INPUTS
    assert [o.name for o in encoder.graph.output] == REALTIME_ENCODER_OUTPUTS
    shapes = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in encoder.graph.input}
    assert shapes["past_padding_cache"] == [1, 16 + 32, 2] and shapes["past_key_values.0.key"][:2] == [1, 4]
    decoder = onnx.load(os.fspath(out / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)
    assert [i.name for i in decoder.graph.input][:3] == ["inputs_embeds", "attention_mask", "past_key_values.0.key"]
    assert decoder.functions and encoder.functions  # with module functions (the Transformers.js test: without)
    assert "Transformers.js 4.3.2 runs this folder" in client_note({"model_type": "voxtral_realtime"})


def test_the_folder_kind_and_its_clients_per_model_type():
    """A decoder-only audio model under text2text-generation gets this folder; Qwen2-Audio's
    features are its own module's; the clients said are Transformers.js's classes."""
    voxtral = transformers.VoxtralConfig(audio_token_id=AUDIO_TOKEN)
    assert recipe_for("text2text-generation", voxtral, "onnxruntime") is audio_text_to_text.RECIPE
    assert recipe_for("text2text-generation", transformers.T5Config(), "onnxruntime") is not audio_text_to_text.RECIPE
    assert OWN_FEATURES["qwen2_audio"].compute is qwen2_audio.audio_features
    assert "AutoModelForAudioTextToText, voxtral" in client_note({"model_type": "voxtral"})
    assert "no audio-text-to-text class for glmasr" in client_note({"model_type": "glmasr"})
    generation = transformers.GenerationConfig(eos_token_id=[2, 7])
    assert end_tokens(type("Model", (), {"generation_config": generation})()) == [2, 7]


def test_qwen3_asr_windows_in_one_graph_equal_transformers_on_padded_clips(tmp_path):
    """Qwen3-ASR's encoder attends within windows whose boundaries transformers finds in Python
    from the mask's values; its audio encoder (qwen3_asr.py: the boundaries as tensors, one masked
    attention) exported alone gives transformers' features for clips padded to several lengths,
    windows of 26 frames cut at each clip's start."""
    import fx2onnx
    from fx2onnx.hub.audio_language import qwen3_asr
    from fx2onnx.hub.audio_language.audio_parts import AudioEncoder

    audio = dict(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                 output_dim=32, n_window=50, n_window_infer=200, downsample_hidden_size=8)
    config = transformers.Qwen3ASRConfig(audio_config=audio, text_config={**TEXT, "num_hidden_layers": 1},
                                         audio_token_id=AUDIO_TOKEN)
    torch.manual_seed(0)
    model = transformers.Qwen3ASRForConditionalGeneration(config).eval()
    hooks = audio_hooks(model)

    def clips(lengths: list[int]) -> dict[str, torch.Tensor]:
        mask = (torch.arange(400)[None, :] < torch.tensor(lengths)[:, None]).to(torch.long)
        return {"input_features": torch.randn(len(lengths), 16, 400, generator=torch.Generator().manual_seed(len(lengths))),
                "input_features_mask": mask}

    example = clips([400, 270, 400])
    assert qwen3_asr.window_boundaries(example["input_features_mask"][:2], 50, 200).tolist() == [0, 26, 52, 78, 87]
    dynamic = {name: {0: torch.export.Dim.AUTO, 2 if name == "input_features" else 1: torch.export.Dim.AUTO}
               for name in example}
    program = fx2onnx.dynamo_export(AudioEncoder(model, hooks).eval(), **example,
                                    export_options=fx2onnx.ExportOptions(dynamic_shapes=dynamic))
    for lengths in ([400, 270], [130], [400, 400, 199]):
        given = clips(lengths)
        with torch.no_grad():
            expected = model.model.get_audio_features(**given).pooler_output
        got = torch.as_tensor(program(**given)["audio_features"])
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
