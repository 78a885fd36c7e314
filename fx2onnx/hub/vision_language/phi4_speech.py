"""Phi-4-multimodal's speech model as ONNX Runtime GenAI's `phi4mm` type runs it, cut from
the model's own audio embedding: `audio_embeds` [audios, frames, mel bins],
`audio_attention_mask` [audios, frames], `audio_sizes` [audios] (each clip's number of
audio tokens) and `audio_projection_mode` [1] (the runtime's 0 text, 1 images, 2 audio,
3 both) -> `audio_features` [audio tokens, hidden]: the conformer encoder, then the
speech projection, or the vision-speech one when the prompt also has images (as
transformers picks it), each clip cut to its own tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.export import Dim

from fx2onnx.hub.shared.json_files import read_json
import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.vision_language import parts
from fx2onnx.hub.vision_language.parts import Holder

# audio_projection_mode values of the runtime's processor that have images: the vision-speech projection
MODES_WITH_IMAGES = (1, 3)
# the encoder's span of subsampled frames: the model cuts longer audio into chunks of this
# many in a Python branch, which the exported graph does not follow
MAX_ENCODER_FRAMES = 500


def streaming_mask(frames: torch.Tensor | int, batch: int, chunk: int, left_chunks: int) -> torch.Tensor:
    """The encoder's streaming mask [batch, frames, frames] made of tensor operations (the
    model builds it with numpy from the length, which an export with a dynamic length
    cannot follow): a frame sees its own chunk and the `left_chunks` before it; a chunk
    size below 1 (Phi-4-multimodal's -1) makes the whole clip one chunk."""
    position = torch.arange(frames)
    chunk_of = position // chunk if chunk > 0 else torch.zeros_like(position)
    query, key = chunk_of[:, None], chunk_of[None, :]
    allowed = (key <= query) & (key >= query - left_chunks)
    return allowed.unsqueeze(0).expand(batch, -1, -1)


@contextlib.contextmanager
def tensor_streaming_mask(encoder: nn.Module) -> Iterator[None]:
    """``encoder``'s `_streaming_mask` computed by ``streaming_mask`` while the context lasts."""
    encoder._streaming_mask = lambda seq_len, batch_size, chunk_size, left_chunk: streaming_mask(
        seq_len, batch_size, chunk_size, left_chunk)
    try:
        yield
    finally:
        del encoder._streaming_mask


def _too_long_fails(hidden: torch.Tensor) -> torch.Tensor:
    """Zero, read from a one-element tensor at index 1 when ``hidden`` has more than
    `MAX_ENCODER_FRAMES` frames, so that the runtime stops with an out-of-bounds Gather
    instead of giving features the model would not (the graph follows the model's
    unchunked side only). The length is counted by a reduction: a comparison of sizes
    would be decided at export time."""
    frames = torch.ones_like(hidden[0, :, 0], dtype=torch.int64).sum()
    return hidden.new_zeros(1)[(frames > MAX_ENCODER_FRAMES).to(torch.int64).reshape(1)]


class Phi4Speech(nn.Module):
    """The audio embedding's encoder and projections for every clip of a call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = Holder(embed_tokens_extend=Holder(audio_embed=model.model.embed_tokens_extend.audio_embed))

    def forward(self, audio_embeds: torch.Tensor, audio_attention_mask: torch.Tensor, audio_sizes: torch.Tensor,
                audio_projection_mode: torch.Tensor) -> dict[str, torch.Tensor]:
        embed = self.model.embed_tokens_extend.audio_embed
        hidden = embed.encoder(audio_embeds.to(embed.up_proj_for_speech.weight.dtype), audio_attention_mask.to(torch.bool))
        hidden = hidden + _too_long_fails(hidden)
        speech = embed.down_proj_for_speech(nn.functional.gelu(embed.up_proj_for_speech(hidden)))
        vision = embed.down_proj_for_vision_speech(nn.functional.gelu(embed.up_proj_for_vision_speech(hidden)))
        mode = audio_projection_mode.reshape(-1)[:1]
        with_images = (mode == MODES_WITH_IMAGES[0]) | (mode == MODES_WITH_IMAGES[1])
        projected = torch.where(with_images.reshape(1, 1, 1), vision, speech)
        keep = torch.arange(projected.shape[1], device=projected.device)[None] < audio_sizes.reshape(-1, 1)
        return {"audio_features": projected[keep]}


def example_audio(mel_bins: int) -> dict[str, torch.Tensor]:
    """Two clips' processed inputs: one of 40 frames (5 tokens), one of 24 padded to 40 (3 tokens)."""
    features = torch.randn(2, 40, mel_bins, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 24:] = False
    features[1, 24:] = 0
    return {"audio_embeds": features, "audio_attention_mask": mask, "audio_sizes": torch.tensor([5, 3]),
            "audio_projection_mode": torch.tensor([2])}


def export_speech(loaded: LoadedModel, options: fx2onnx.ExportOptions) -> fx2onnx.ONNXProgram:
    """The speech model for any number of clips of any length up to the encoder's
    `MAX_ENCODER_FRAMES` after its subsampling."""
    audio_config = loaded.config.audio_config
    inputs = parts.as_loaded(example_audio(int(audio_config.input_size)), loaded)
    dynamic = {"audio_embeds": {0: Dim.AUTO, 1: Dim.AUTO}, "audio_attention_mask": {0: Dim.AUTO, 1: Dim.AUTO},
               "audio_sizes": {0: Dim.AUTO}, "audio_projection_mode": None}
    speech_options = dataclasses.replace(parts.without_causal_mask(options), dynamic_shapes=dynamic)
    module = Phi4Speech(loaded.model)
    with tensor_streaming_mask(module.model.embed_tokens_extend.audio_embed.encoder):
        return fx2onnx.dynamo_export(module, **inputs, export_options=speech_options)


SPEECH = "speech_encoder"  # the speech model's file name (onnx/speech_encoder.onnx)
SPEECH_PROCESSOR_CONFIG = "speech_processor.json"
# what the runtime's Phi4AudioEmbed computes at 16 kHz (and its 8 kHz variant): the
# settings of transformers' Phi4MultimodalFeatureExtractor it was written after
_EXTRACTOR_DEFAULTS = {"feature_size": 80, "sampling_rate": 16000, "hop_length": 160, "n_fft": 512, "win_length": 400,
                       "audio_compression_rate": 8, "audio_downsample_rate": 1, "audio_feat_stride": 1}


def feature_extractor_settings(folder: Path) -> dict[str, Any]:
    """The source's audio feature extractor settings over the extractor's defaults: those
    of its part of processor_config.json, or of preprocessor_config.json (which the image
    processor's settings share)."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = folder / name
        if path.is_file():
            settings = read_json(path)
            part = settings.get("audio_processor") or settings.get("feature_extractor") or settings
            return {key: part.get(key, default) for key, default in _EXTRACTOR_DEFAULTS.items()}
    return dict(_EXTRACTOR_DEFAULTS)


def check(config: Any, settings: dict[str, Any]) -> list[str]:
    """What of the audio configuration and the feature extractor's ``settings`` the
    runtime's Phi4AudioEmbed cannot reproduce (empty when it can)."""
    audio = config.audio_config
    needed = {**_EXTRACTOR_DEFAULTS, "audio_compression_rate": int(audio.time_reduction)}
    wrong = [f"the feature extractor's {name} is {settings[name]} (the runtime's processor needs {value})"
             for name, value in needed.items() if int(settings[name]) != value]
    if int(audio.input_size) != needed["feature_size"]:
        wrong.append(f"audio_config.input_size is {audio.input_size} (the runtime's processor makes {needed['feature_size']} mel bins)")
    if int(audio.downsample_rate) != 1:
        wrong.append(f"audio_config.downsample_rate is {audio.downsample_rate} (the runtime counts one audio token per "
                     f"{needed['audio_compression_rate']} frames)")
    return wrong


def speech_processor_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The runtime's audio steps for ``settings`` (checked by ``check``): the clip decoded at
    16 kHz (8 kHz audio kept at 8 kHz, as transformers' extractor treats it), its log-mel
    features, its attention mask and its number of audio tokens."""
    def stft_and_logmel(prefix: str, rate: int) -> dict[str, Any]:
        scale = rate // 8000  # 8 kHz: half the window and hop; the mel filters stay those of a 512-point FFT
        return {
            f"stft_normal{prefix}/n_fft": 256 * scale, f"stft_normal{prefix}/frame_length": 200 * scale,
            f"stft_normal{prefix}/hop_length": 80 * scale, f"stft_normal{prefix}/win_fn": "hamming",
            f"logmel{prefix}/chunk_size": 30, f"logmel{prefix}/hop_length": 80 * scale, f"logmel{prefix}/n_fft": 512,
            f"logmel{prefix}/n_mel": int(settings["feature_size"]), f"logmel{prefix}/feature_first": 0,
            f"logmel{prefix}/no_padding": 1,
        }

    attrs = {"audio_compression_rate": int(settings["audio_compression_rate"]),
             "qformer_compression_rate": int(settings["audio_downsample_rate"]),
             **stft_and_logmel("", 16000), **stft_and_logmel("_8k", 8000)}
    return {"feature_extraction": {"sequence": [
        {"operation": {"name": "audio_decoder", "type": "AudioDecoderEx", "attrs": {"target_sample_rates": [8000, 16000]}}},
        {"operation": {"name": "phi4_audio_embed", "type": "Phi4AudioEmbed", "attrs": attrs}},
    ], "output_aligner": "phi4-audio-aligner"}}


def genai_speech_section(filename: str, session_options: dict[str, Any]) -> dict[str, Any]:
    """genai_config.json's `speech` section for the speech model in ``filename``."""
    return {
        "filename": filename, "config_filename": SPEECH_PROCESSOR_CONFIG, "session_options": session_options,
        "inputs": {"audio_embeds": "audio_embeds", "attention_mask": "audio_attention_mask", "audio_sizes": "audio_sizes",
                   "audio_projection_mode": "audio_projection_mode"},
        "outputs": {"audio_features": "audio_features"},
    }
