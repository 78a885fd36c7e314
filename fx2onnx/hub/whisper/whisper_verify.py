"""`--verify` of ONNX Runtime GenAI's Whisper folder, with the same audio in both.

A test signal (tones and a chirp, 16-bit) is written as a .wav. transformers' side: the
source's `WhisperFeatureExtractor` on its samples, then `model.generate` greedy (`num_beams`
1 on both sides, whatever the config's beam search) with its
generation config (`language="en", task="transcribe"` for a multilingual model, else the
decoder prompt `<|startoftranscript|>` ... `<|notimestamps|>` as the tokenizer has them),
so with the config's suppress lists; the window decoded once, as the runtime does
(`force_unique_generate_call=True`: where the model emits timestamp tokens, `generate`'s
default run decodes the audio again from the last one, and the summary says so). The
folder's side, twice:

- the two ONNX models in onnxruntime on transformers' features: the encoder, then the
  decoder greedy step by step feeding `present_key_self_*` back; its logits compared with
  the model's on the same tokens, suppressed by transformers' own logits processors
  (within the tolerance, and -inf at the same tokens: a folder without the suppress lists
  fails), its tokens with `generate`'s;
- ONNX Runtime GenAI as a user runs it, where it is installed: `og.Audios.open(wav)`, the
  multimodal processor (its own log-mel features, compared with transformers'), the
  generator; its tokens compared with `generate`'s.
"""

from __future__ import annotations

import importlib.util
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, greedy_decode, run_session, verdict_of,
)
from fx2onnx.hub.whisper.whisper_config import AUDIO_FEATURES

_FLOAT_TYPES = {"tensor(float16)": np.float16, "tensor(double)": np.float64}
PROMPT_TOKENS = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
SIGNAL_SECONDS, SILENCE_SECONDS = 3.0, 0.1
SUPPRESSED = -1e30  # a suppressed token's logit in the comparison


@dataclass
class WhisperVerification(Verification):
    """The onnxruntime loop's verdict (logits and tokens), with ONNX Runtime GenAI's run:
    its tokens (None where it is not installed) and the largest difference of its
    log-mel features from transformers'."""

    genai_tokens: list[int] | None = None
    feature_difference: float | None = None
    genai_not_run: str = ""  # why, when it did not run
    redecoded: bool = False  # generate's default run decoded the audio again after timestamp tokens

    @property
    def passed(self) -> bool:
        return super().passed and (self.genai_tokens is None or self.genai_tokens == self.torch_tokens)

    def summary(self) -> str:
        genai = f"ONNX Runtime GenAI not run: {self.genai_not_run}" if self.genai_tokens is None else (
            f"ONNX Runtime GenAI's tokens {'equal' if self.genai_tokens == self.torch_tokens else 'DIFFERENT'}, its "
            f"log-mel features within {self.feature_difference:.3g} of transformers'"
        )
        redecoded = ("; transformers' generate decodes the audio again after the timestamp tokens the model emits, "
                     "the runtime decodes the 30 s window once: compared with generate's first decoding"
                     if self.redecoded else "")
        return f"{super().summary()} (onnxruntime on transformers' features); {genai}{redecoded}"


def speech_signal(rate: int, seconds: float = SIGNAL_SECONDS) -> np.ndarray:
    """A deterministic 16-bit signal: a tone and a rising chirp between 0.1 s of silence
    at each end (where the runtime's STFT pads the edges otherwise than transformers')."""
    t = np.arange(int(rate * seconds)) / rate
    signal = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (200 + 600 * t) * t) * np.exp(-t)
    signal *= (t >= SILENCE_SECONDS) & (t < seconds - SILENCE_SECONDS)
    return np.round(signal * 32767).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(samples.astype("<i2").tobytes())


def decoder_prompt(tokenizer: Any, start: int) -> tuple[str, list[int]]:
    """The prompt's text and ids: the Whisper special tokens the tokenizer has (an
    English-only model has no language and task), else the decoder's start token."""
    if tokenizer is None:
        return "", [start]
    unknown = tokenizer.convert_tokens_to_ids(tokenizer.unk_token) if tokenizer.unk_token is not None else None
    tokens = [t for t in PROMPT_TOKENS if tokenizer.convert_tokens_to_ids(t) not in (None, unknown)]
    if not tokens or tokens[0] != PROMPT_TOKENS[0]:
        return "", [start]
    return "".join(tokens), [int(tokenizer.convert_tokens_to_ids(t)) for t in tokens]


def onnxruntime_greedy(
    encoder_path: Path, decoder_path: Path, features: np.ndarray, prompt: list[int], steps: int
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decoding with the folder's two models: the prompt with an empty self-attention
    cache, then one token per step."""
    with cpu_session(encoder_path) as encoder, cpu_session(decoder_path) as decoder:
        dtype = _FLOAT_TYPES.get(encoder.get_inputs()[0].type, np.float32)  # a bfloat16 folder runs in float32
        encoded = run_session(encoder, {AUDIO_FEATURES: features.astype(dtype)})
        cross = {name.replace("present_", "past_"): value for name, value in encoded.items() if "_cross_" in name}
        cache = empty_cache(decoder, features.shape[0], is_cache=lambda name: "_self_" in name)
        greedy = greedy_decode(
            lambda feed: run_session(decoder, feed), cache, [prompt], steps, feed=lambda step, _mask, _index: {"input_ids": step, **cross}
        )
    return greedy.tokens[0], greedy.logits


def genai_run(folder: Path, wav: Path, prompt: str, max_length: int) -> tuple[list[int], np.ndarray]:
    """ONNX Runtime GenAI's greedy tokens after the prompt, and its processor's features."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    inputs = processor([prompt], audios=og.Audios.open(str(wav)))
    features = inputs[AUDIO_FEATURES].as_numpy()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, num_beams=1, max_length=max_length, batch_size=1)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)], features


def _why_genai_cannot_run(prompt: str, dtype: torch.dtype) -> str:
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return "onnxruntime-genai is not installed"
    if not prompt:
        return f"the tokenizer has no {PROMPT_TOKENS[0]} to prompt the decoder with"
    if dtype == torch.bfloat16:
        return "onnxruntime has no bfloat16 CPU kernels"
    return ""


def _generate_prompt(model: torch.nn.Module, prompt: list[int]) -> dict[str, Any]:
    """generate's arguments for the decoder prompt: language "en" and task "transcribe" (as a
    user asks for them) when the generation config knows them, else the prompt's ids."""
    generation = model.generation_config
    if getattr(generation, "is_multilingual", False) and "<|en|>" in (getattr(generation, "lang_to_id", None) or {}):
        return {"language": "en", "task": "transcribe"}
    return {"decoder_input_ids": torch.tensor([prompt])}


def transformers_generate(model: torch.nn.Module, features: torch.Tensor, prompt: list[int], tokens: int) -> tuple[list[int], bool]:
    """`generate`'s greedy tokens for the 30 s window decoded once, and whether its default run
    gives others: where the model emits two timestamp tokens in a row before the window's end,
    transformers decodes the audio again from the last timestamp (long-form segmentation);
    a runtime decodes the window once, as `generate(force_unique_generate_call=True)`."""
    arguments = {"do_sample": False, "num_beams": 1, "max_new_tokens": tokens, **_generate_prompt(model, prompt)}
    with torch.no_grad():
        once = [int(t) for t in model.generate(features, force_unique_generate_call=True, **arguments)[0]]
        default = [int(t) for t in model.generate(features, **arguments)[0]]
    # the single decoding comes with its prompt: a prompt other than the folder's stays, and the tokens differ
    once = once[len(prompt):] if once[:len(prompt)] == prompt else once
    return once, default != once


def suppressed_as_generate(model: torch.nn.Module, read: torch.Tensor, logits: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The logits (1, rows, vocab) of the rows from the prompt's last on, as transformers'
    Whisper `generate` suppresses them: its own SuppressTokens and SuppressTokensAtBegin
    logits processors, each row given the ids it follows."""
    from transformers.generation.logits_process import SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor

    generation = model.generation_config
    processors = []
    if generation.suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(generation.suppress_tokens))
    if generation.begin_suppress_tokens:
        processors.append(SuppressTokensAtBeginLogitsProcessor(generation.begin_suppress_tokens, prompt_length))
    rows = []
    for index in range(prompt_length - 1, read.shape[1]):
        row = logits[:, index]
        for processor in processors:
            row = processor(read[:, :index + 1], row)
        rows.append(row)
    return torch.cat(rows)


def _finite(logits: np.ndarray) -> np.ndarray:
    """-inf (a suppressed token) as a finite value far below any logit, so that the two sides
    compare equal where both suppress a token and far apart where one does not."""
    return np.where(np.isneginf(logits), SUPPRESSED, logits.astype(np.float64))


def verify_whisper_genai(
    folder: Path, encoder_path: Path, decoder_path: Path, model: torch.nn.Module, source: Path, tokens: int,
    tolerance: Tolerance,
) -> WhisperVerification:
    """The folder against transformers on one test signal (see the module docstring)."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source) if (source / "tokenizer_config.json").is_file() else None
    prompt_text, prompt = decoder_prompt(tokenizer, int(model.config.decoder_start_token_id))
    samples = speech_signal(extractor.sampling_rate)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    features = extractor(samples.astype(np.float32) / 32768, sampling_rate=extractor.sampling_rate, return_tensors="pt")
    features = features.input_features.to(dtype)
    torch_tokens, redecoded = transformers_generate(model, features, prompt, tokens)
    onnx_tokens, onnx_logits = onnxruntime_greedy(encoder_path, decoder_path, features.float().numpy(), prompt, len(torch_tokens))
    with torch.no_grad():  # the model's logits on the tokens the folder read, suppressed as generate suppresses them
        read = torch.tensor([prompt + onnx_tokens[:-1]])
        logits = suppressed_as_generate(model, read, model(input_features=features, decoder_input_ids=read).logits, len(prompt))
    pairs = [(_finite(np.concatenate(onnx_logits)), torch.from_numpy(_finite(logits.double().numpy())))]
    verdict = verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
    result = WhisperVerification(**vars(verdict), genai_not_run=_why_genai_cannot_run(prompt_text, dtype),
                                 redecoded=redecoded)
    if not result.genai_not_run:
        with tempfile.TemporaryDirectory(prefix="fx2onnx-verify-") as scratch:
            wav = Path(scratch) / "signal.wav"
            write_wav(wav, samples, extractor.sampling_rate)
            sequence, genai_features = genai_run(folder, wav, prompt_text, len(prompt) + len(torch_tokens))
        result.genai_tokens = sequence[len(prompt):] if sequence[:len(prompt)] == prompt else sequence
        result.feature_difference = float(np.abs(genai_features.astype(np.float64) - features.double().numpy()).max())
    return result
