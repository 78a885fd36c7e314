"""The text-to-audio recipe of SpeechT5 (`SpeechT5ForTextToSpeech`): the folder Transformers.js's
`SpeechT5ForTextToSpeech.generate_speech` runs (fx2onnx/hub/speech/speecht5_tts.py):
`onnx/encoder_model.onnx`, `onnx/decoder_model_merged.onnx` (the first step and the steps over
the cache, merged as an encoder-decoder's: merged_decoder.py) and `vocoder/` (`config.json`
and `onnx/model.onnx`: the model's postnet, then the `SpeechT5HifiGan` checkpoint given as
``vocoder``, a separate checkpoint in transformers). Verified by running the folder as
Transformers.js does, against transformers' `generate_speech` (speech/speecht5_verify.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.loading import LoadedModel, local_folder
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.dim_roles import BATCH, SEQUENCE
from fx2onnx.hub.shared.merged_decoder import merge_decoders
from fx2onnx.hub.shared.json_files import read_json, write_json_file
from fx2onnx.hub.shared.program_files import exported, onnx_file, save_program, weights_dtype
from fx2onnx.hub.shared.verification import Tolerance, Verification
from fx2onnx.hub.speech.audio_input import FEATURE_EXTRACTOR_FILE, feature_extractor_settings
from fx2onnx.hub.speech.speecht5_tts import (
    DecoderStep, PostnetVocoder, SpeechEncoder, first_spectrum, without_prenet_dropout,
)
from fx2onnx.hub.shared.peak_scale import PEAK_SCALED_RULE
from fx2onnx.hub.speech.speecht5_verify import verify_speecht5
from fx2onnx.hub.tasks import UnsupportedArchitectureError

VOCODER = "vocoder"
# transformers' model type of SpeechT5HifiGan, and the older one Transformers.js maps to it (vocoder/config.json's)
VOCODER_TYPES = ("speecht5_hifigan", TRANSFORMERS_JS_VOCODER_TYPE := "hifigan")
# example sizes no other dim shares: batch, text tokens, the cache's frames, the output sequence's
BATCH_SIZE, TOKENS, CACHED, FRAMES = 2, 7, 3, 5
_ROLES = {"output_sequence": {0: BATCH, 1: SEQUENCE}, "speaker_embeddings": {0: BATCH}}


def vocoder_refusal(source: str, config: Any) -> str | None:
    """Why ``source`` (a folder or a hub id) is not a `SpeechT5HifiGan` for the model of ``config``, or None."""
    settings = read_json(local_folder(source) / "config.json")
    if settings.get("model_type") not in VOCODER_TYPES:
        return (f"--vocoder {source}: a {settings.get('model_type')} checkpoint; give a SpeechT5HifiGan one "
                "(model_type speecht5_hifigan or hifigan: microsoft/speecht5_hifigan). Nothing was written.")
    if settings.get("model_in_dim") != config.num_mel_bins:
        return (f"--vocoder {source} reads {settings.get('model_in_dim')} mel bins where the model writes "
                f"{config.num_mel_bins}: give the vocoder made for this model. Nothing was written.")
    return None


def processor_files(source: Path, staging: Path) -> list[str]:
    """`preprocessor_config.json` (naming SpeechT5Processor) where the source has transformers
    5's `processor_config.json` alone: Transformers.js's `AutoProcessor` reads that file only,
    and its text-to-audio pipeline takes the text-to-spectrogram path (the vocoder, the speaker
    embeddings) only with a processor (set on it: docs/guides/export-hf/text-to-audio.md). Nothing where the
    source has the file (copied as it is) or no feature extractor."""
    settings = feature_extractor_settings(source)
    if settings is None or (source / FEATURE_EXTRACTOR_FILE).is_file():
        return []
    return [write_json_file(staging, FEATURE_EXTRACTOR_FILE, {**settings, "processor_class": "SpeechT5Processor"})]


def load_vocoder(source: str) -> torch.nn.Module:
    """The `SpeechT5HifiGan` of ``source`` (checked by :func:`vocoder_refusal`)."""
    import transformers

    return transformers.SpeechT5HifiGan.from_pretrained(local_folder(source)).eval()


def _texts(config: Any, batch: int, tokens: int, seed: int) -> torch.Tensor:
    """Token ids without the padding id (ids 0-3 are SpeechT5's special tokens)."""
    return torch.randint(4, int(config.vocab_size), (batch, tokens), generator=torch.Generator().manual_seed(seed))


def verification_texts(config: Any) -> list[torch.Tensor]:
    """The two texts `verify` speaks, (1, tokens) each: of 7 and 11 tokens."""
    return [_texts(config, 1, tokens, seed) for seed, tokens in ((1, TOKENS), (2, TOKENS + 4))]


def speaker_embedding(config: Any, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, int(config.speaker_embedding_dim), generator=torch.Generator().manual_seed(11))


def step_inputs(model: torch.nn.Module, with_past: bool) -> dict[str, Any]:
    """A decoding step's example: the first (no cache), or one over a cache of CACHED frames."""
    config, step = model.config, DecoderStep(model)
    ids = _texts(config, BATCH_SIZE, TOKENS, 0)
    speakers = speaker_embedding(config, BATCH_SIZE)
    with torch.no_grad():
        encoded = SpeechEncoder(model)(ids)
        inputs = {"speaker_embeddings": speakers, "encoder_hidden_states": encoded["encoder_outputs"],
                  "encoder_attention_mask": encoded["encoder_attention_mask"]}
        sequence = torch.cat([first_spectrum(int(config.num_mel_bins), BATCH_SIZE),
                              torch.randn(BATCH_SIZE, FRAMES - 1, int(config.num_mel_bins))], dim=1)
        if not with_past:
            return {"output_sequence": sequence[:, :CACHED + 1], **inputs}
        cache = None
        for length in range(1, CACHED + 1):  # the cache as the steps build it, one frame each
            cache = step(sequence[:, :length], **inputs, cache=cache)["present"]
    return {"output_sequence": sequence, **inputs, "cache": cache}


class SpeechT5TextToAudioRecipe(RecipeDefaults):
    takes_vocoder = True

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        if request.vocoder is None:
            return Refusal(ValueError, (
                "SpeechT5ForTextToSpeech writes a spectrogram, which its HiFi-GAN vocoder (a separate checkpoint) turns "
                "into the waveform: give it with --vocoder (microsoft/speecht5_hifigan, or a folder). Its folder's "
                "vocoder/ runs the model's postnet first (Transformers.js does not), so no other vocoder gives "
                "transformers' waveform. Nothing was written."))
        if (refusal := vocoder_refusal(request.vocoder, loaded.config)) is not None:
            return Refusal(ValueError, refusal)
        if loaded.fake_context is not None:
            return Refusal(UnsupportedArchitectureError, (
                "SpeechT5 text-to-audio is exported from the checkpoint's real weights (its vocoder is another "
                "checkpoint): give it without --fake. Nothing was written."))
        if (dtype := weights_dtype(loaded)) != torch.float32:
            return Refusal(NotImplementedError, (
                f"SpeechT5 text-to-audio in {str(dtype).removeprefix('torch.')}: {TRANSFORMERS_JS}'s generate_speech feeds the decoder its first "
                "spectrogram frame and the speaker embeddings as float32 tensors whatever the folder's dtype (lines 31085 "
                "and 33911 of dist/transformers.node.mjs), which a float16 decoder refuses. Nothing was written. "
                "Give --precision fp32 (a float16 checkpoint's weights are then widened)."))
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        model = loaded.model
        vocoder = load_vocoder(str(request.vocoder)).to(weights_dtype(loaded))
        say("text-to-audio: the speech decoder prenet without its dropout (transformers draws its masks at every step "
            "even in eval, so its generate_speech differs from run to run; the folder gives the same speech every run)")
        with without_prenet_dropout(model):
            ids = _texts(model.config, BATCH_SIZE, TOKENS, 0)
            files = save_program(exported(SpeechEncoder(model), {"input_ids": ids}, options), staging,
                                 onnx_file(loaded, folder_layout.ENCODER), loaded)
            steps = staging / ".decoder_steps"
            paths = []
            for name, with_past in (("decoder_model.onnx", False), ("decoder_with_past_model.onnx", True)):
                save_program(exported(DecoderStep(model), step_inputs(model, with_past), options, _ROLES), steps, name, loaded)
                paths.append(steps / name)
        merged = onnx_file(loaded, folder_layout.MERGED_DECODER)
        merge_decoders(*paths, staging / merged, folder_layout.data_file(merged))
        shutil.rmtree(steps)
        files += folder_layout.with_data_file(merged)
        spectrogram = torch.randn(FRAMES + 4, int(model.config.num_mel_bins))
        program = exported(PostnetVocoder(model, vocoder), {"spectrogram": spectrogram}, options,
                           {"spectrogram": {0: "num_frames"}})
        files += [f"{VOCODER}/{name}" for name in save_program(program, staging / VOCODER, onnx_file(loaded, folder_layout.MODEL), loaded)]
        vocoder_config = {**vocoder.config.to_dict(), "model_type": TRANSFORMERS_JS_VOCODER_TYPE}
        write_json_file(staging / VOCODER, "config.json", vocoder_config)
        folder_layout.mark_for_transformers_js(staging / VOCODER / "config.json", weights_dtype(loaded))
        return [*files, f"{VOCODER}/config.json", *processor_files(Path(loaded.folder), staging)]

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        vocoder = load_vocoder(str(request.vocoder)).to(next(model.parameters()).dtype)
        say("verification: the folder run as Transformers.js's generate_speech runs it, against transformers' "
            f"generate_speech without the prenet's dropout, on two texts; spectrograms and waveforms {PEAK_SCALED_RULE}")
        texts = verification_texts(model.config)
        return verify_speecht5(
            folder / onnx_file(loaded, folder_layout.ENCODER), folder / onnx_file(loaded, folder_layout.MERGED_DECODER),
            folder / VOCODER / onnx_file(loaded, folder_layout.MODEL), model, vocoder, texts, speaker_embedding(model.config),
            tolerance)


RECIPE = SpeechT5TextToAudioRecipe()
