"""The sequence lengths where a causal LM starts computing otherwise, read from its config.

A sliding window (`sliding_window`, its layers in `layer_types`), chunked attention
(`attention_chunk_size`), the chunks a Mamba2-style mixer scans a prompt in (`chunk_size`,
`mamba_chunk_size`: one chunk, then several), the chunks of a gated-delta-rule layer (Qwen3-Next,
Qwen3.5, OLMo-hybrid: the default of its scan function's `chunk_size`, read through the capture
rewrite of that function) and the rotary embeddings that switch at a length (LongRoPE's
short and long factors at `original_max_position_embeddings`, dynamic NTK past
`max_position_embeddings`; YaRN and Llama 3 keep the original context as a reference)
each name such a length. `--verify` reads a prompt longer than all of them
(:func:`verification_lengths`); `genai_config.json` takes the context from
:func:`context_length`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fx2onnx.capture import default_scan_chunks

# rope types whose frequencies are measured against the model's original context, by name
_ORIGINAL_CONTEXT_ROPES = {"longrope": "LongRoPE", "llama3": "Llama 3 rope", "yarn": "YaRN"}
# tokens past the last change point the verification's prompt reaches
PAST_THE_LAST_POINT = 8
# the prompt of a model that changes nowhere (as --verify always read)
SHORT_PROMPT = 6


@dataclass(frozen=True)
class ChangePoint:
    """A length where the model computes otherwise from the next token on."""

    length: int
    what: str


def _rope_parameter_sets(config: Any) -> list[dict[str, Any]]:
    """The config's rope parameters: one set, or one per layer type (Gemma 3)."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(parameters, dict):
        return []
    if all(isinstance(value, dict) for value in parameters.values()):
        return list(parameters.values())
    return [parameters]


def _positions(config: Any) -> int | None:
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    # XLNet's -1: relative positions, no longest sequence
    return int(value) if value and int(value) > 0 else None


def _rope_points(config: Any) -> list[ChangePoint]:
    points = []
    for parameters in _rope_parameter_sets(config):
        rope_type = str(parameters.get("rope_type", parameters.get("type", "default")))
        original = parameters.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
        if rope_type in _ORIGINAL_CONTEXT_ROPES and original:
            points.append(ChangePoint(int(original), f"{_ORIGINAL_CONTEXT_ROPES[rope_type]}'s original context"))
        elif "dynamic" in rope_type and _positions(config):
            points.append(ChangePoint(_positions(config), "dynamic NTK rope's max_position_embeddings"))
    return points


def _attention_points(config: Any) -> list[ChangePoint]:
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    windowed = any("sliding" in str(kind) for kind in layer_types) if layer_types else getattr(config, "use_sliding_window", True)
    points = [ChangePoint(int(window), "sliding window")] if window and windowed else []
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk:
        points.append(ChangePoint(int(chunk), "attention chunk"))
    # DeepSeek-V4's compressors: an entry per window of `rate` tokens, read by the tokens after it
    rates = getattr(config, "compress_rates", None)
    if isinstance(rates, dict):
        points += [ChangePoint(int(rate), "compression window") for rate in sorted(set(rates.values())) if rate]
    return points


def _scan_points(config: Any) -> list[ChangePoint]:
    # Mamba2, Nemotron-H, Zamba2: chunk_size; Bamba, Falcon-H1, Granite-MoE-hybrid: mamba_chunk_size
    chunk = getattr(config, "chunk_size", None) or getattr(config, "mamba_chunk_size", None)
    points = [ChangePoint(int(chunk), "scan chunk")] if isinstance(chunk, int) and chunk > 0 else []
    # the gated-delta-rule layers' chunk is their scan function's default, not in the config
    modeling = type(config).__module__.replace(".configuration_", ".modeling_")
    return points + [ChangePoint(chunk, "linear attention chunk") for chunk in default_scan_chunks(modeling)]


def change_points(config: Any) -> list[ChangePoint]:
    """Every length where the model changes, shortest first, each length once."""
    seen: dict[int, ChangePoint] = {}
    found = _attention_points(config) + _scan_points(config) + _rope_points(config)
    for point in sorted(found, key=lambda p: p.length):
        seen.setdefault(point.length, point)
    return list(seen.values())


def context_length(config: Any) -> int:
    """The longest sequence the model is made for: `max_position_embeddings`, times the
    factor of a dynamic NTK rope (made to stretch past it); 2048 when the config says none."""
    context = _positions(config) or 2048
    factors = [
        float(p.get("factor") or 1.0) for p in _rope_parameter_sets(config) if "dynamic" in str(p.get("rope_type", ""))
    ]
    return int(context * max(factors)) if factors else context


@dataclass(frozen=True)
class VerificationLengths:
    """The lengths `--verify` runs a causal LM at: one prompt, decode steps after it, and a
    left-padded batch of prompts of different lengths."""

    prompt: int
    new_tokens: int
    batch: tuple[int, ...]
    points: tuple[ChangePoint, ...]
    context: int

    def unreached(self) -> list[ChangePoint]:
        """The change points the sequence never passes (beyond the context)."""
        return [p for p in self.points if p.length >= self.prompt + self.new_tokens]

    def describe(self) -> str:
        end = self.prompt + self.new_tokens
        by_prompt = [f"{p.what} {p.length}" for p in self.points if p.length < self.prompt]
        by_decoding = [f"{p.what} {p.length}" for p in self.points if self.prompt <= p.length < end]
        past = f" (past {', '.join(by_prompt)})" if by_prompt else ""
        decoding = f"; the decode steps pass {', '.join(by_decoding)}" if by_decoding else ""
        missed = "".join(f"; {p.what} {p.length} is not reached within the context of {self.context}" for p in self.unreached())
        return (
            f"a prompt of {self.prompt} tokens{past}, {self.new_tokens} decode steps to length {end}, a left-padded "
            f"batch of {', '.join(map(str, self.batch))} tokens{decoding}{missed}"
        )


def verification_lengths(config: Any, new_tokens: int) -> VerificationLengths:
    """A prompt that passes every change point within the context by
    :data:`PAST_THE_LAST_POINT` tokens (:data:`SHORT_PROMPT` tokens when there is none),
    cut so that the decode steps stay in the context; the batch: that prompt, two thirds
    and a quarter of it. A point at or past the context (a window as long as it) cannot
    change anything and asks for no longer prompt."""
    points = tuple(change_points(config))
    context = context_length(config)
    wanted = max([SHORT_PROMPT] + [p.length + PAST_THE_LAST_POINT for p in points if p.length < context])
    prompt = max(1, min(wanted, context - new_tokens))
    batch = tuple(dict.fromkeys((prompt, max(1, prompt - max(1, prompt // 3)), max(1, prompt // 4))))
    return VerificationLengths(prompt, new_tokens, batch, points, context)
