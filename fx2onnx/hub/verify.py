"""`export_hf(..., verify=True)`: run the folder the way its runtime will and compare with
transformers. For a causal LM: a prefill with an empty cache, then decode steps feeding
`present.*` back, greedy, against `model.generate(do_sample=False)`; for the others: the
model's outputs on two input sizes."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.causal_lm import cache_argument
from fx2onnx.program.onnx_program import session_on_cpu


@dataclass
class Verification:
    max_logit_difference: float
    tokens_equal: bool | None
    onnx_tokens: list[int]
    torch_tokens: list[int]

    def summary(self) -> str:
        tokens = "" if self.tokens_equal is None else f", greedy tokens {'equal' if self.tokens_equal else 'DIFFERENT'}"
        return f"largest logit difference {self.max_logit_difference:.3g}{tokens}"


@contextlib.contextmanager
def _session(path: Path) -> Iterator[Any]:
    """An onnxruntime CPU session on a saved model of the folder (a bfloat16 one computed
    in float32, its copy in a temporary folder: the folder itself is left as written)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="fx2onnx-verify-") as scratch:
        yield session_on_cpu(path, options, Path(scratch))


def _run(session: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The session's outputs by name, fed with the entries of ``feed`` it takes."""
    names = {i.name for i in session.get_inputs()}
    results = session.run(None, {k: v for k, v in feed.items() if k in names})
    return dict(zip([o.name for o in session.get_outputs()], results))


def _largest_difference(pairs: Any) -> float:
    """The largest absolute difference over pairs of (numpy result, torch result)."""
    return max(float(np.abs(a.astype(np.float64) - b.double().numpy()).max()) for a, b in pairs)


def greedy_in_onnxruntime(path: Path, prompt: list[int], new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy generation with the exported decoder: prefill, then one token per step."""
    with _session(path) as session:
        inputs = {i.name: i for i in session.get_inputs()}
        past_names = [n for n in inputs if n.startswith("past_key_values.")]
        cache_type = inputs[past_names[0]].type if past_names else "tensor(float)"
        dtype = {"tensor(float16)": np.float16, "tensor(double)": np.float64}.get(cache_type, np.float32)
        # an empty cache of the model's own heads and head size (batch, heads, 0, head size)
        cache = {n: np.zeros((1, inputs[n].shape[1], 0, inputs[n].shape[3]), dtype=dtype) for n in past_names}
        tokens, logits_seen = list(prompt), []
        step = np.array([prompt], dtype=np.int64)
        for _ in range(new_tokens):
            total = len(tokens)
            positions = np.arange(total - step.shape[1], total, dtype=np.int64)[None, :]
            feed = {"input_ids": step, "attention_mask": np.ones((1, total), dtype=np.int64), "position_ids": positions, **cache}
            outputs = _run(session, feed)
            logits_seen.append(outputs["logits"][:, -1, :])
            tokens.append(int(logits_seen[-1].argmax(-1)[0]))
            cache = {n: outputs[n.replace("past_key_values.", "present.")] for n in past_names}
            step = np.array([[tokens[-1]]], dtype=np.int64)
    return tokens[len(prompt):], logits_seen


def verify_causal_lm(path: Path, model: torch.nn.Module, config: Any, prompt: list[int], new_tokens: int) -> Verification:
    onnx_tokens, onnx_logits = greedy_in_onnxruntime(path, prompt, new_tokens)
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    torch_tokens = generated.sequences[0, len(prompt):].tolist()
    difference = _largest_difference(zip(onnx_logits, generated.logits))
    return Verification(difference, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)


def verify_outputs(path: Path, model: torch.nn.Module, make_inputs: Any, output_name: str) -> Verification:
    """The ONNX model's ``output_name`` against the model's, on two input sizes."""
    pairs = []
    with _session(path) as session:
        for size in (0, 1):
            inputs = make_inputs(size)
            actual = _run(session, {k: v.numpy() for k, v in inputs.items()})[output_name]
            with torch.no_grad():
                pairs.append((actual, getattr(model(**inputs), output_name)))
    return Verification(_largest_difference(pairs), None, [], [])


def verify_seq2seq(folder: Path, model: torch.nn.Module, encoder_inputs: dict[str, torch.Tensor], start: int, steps: int) -> Verification:
    """Greedy decoding of the first example with the three files (encoder, first step,
    next steps) against the same loop in PyTorch."""
    encoder_inputs = {k: v[:1] for k, v in encoder_inputs.items()}
    mask = encoder_inputs.get("attention_mask")
    tokens, onnx_logits, cache = [start], [], {}
    with contextlib.ExitStack() as stack:
        encoder, first, following = (
            stack.enter_context(_session(folder / name))
            for name in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
        )
        hidden = _run(encoder, {k: v.numpy() for k, v in encoder_inputs.items()})["last_hidden_state"]
        for step in range(steps):
            feed = {"input_ids": np.array([[tokens[-1]]], dtype=np.int64), "encoder_hidden_states": hidden, **cache}
            if mask is not None:
                feed["encoder_attention_mask"] = mask.numpy()
            outputs = _run(first if step == 0 else following, feed)
            onnx_logits.append(outputs["logits"][:, -1, :])
            tokens.append(int(onnx_logits[-1].argmax(-1)[0]))
            cache = {name.replace("present.", "past_key_values."): value for name, value in outputs.items() if name.startswith("present.")}
    torch_tokens, torch_logits, past = [start], [], None
    with torch.no_grad():
        encoded = model.get_encoder()(**encoder_inputs).last_hidden_state
        for _ in range(steps):
            out = model(decoder_input_ids=torch.tensor([[torch_tokens[-1]]]), encoder_outputs=(encoded,), attention_mask=mask,
                        use_cache=True, **{cache_argument(model): past})
            past = out.past_key_values
            torch_logits.append(out.logits[:, -1, :])
            torch_tokens.append(int(out.logits[0, -1].argmax()))
    return Verification(_largest_difference(zip(onnx_logits, torch_logits)), tokens == torch_tokens, tokens[1:], torch_tokens[1:])


@dataclass
class QuantizedVerification(Verification):
    """A quantized folder against the float model: not equal by design, so measured.

    ``token_agreement`` is the share of positions where the folder's greedy token is the
    float model's, both reading the float model's greedy text (a difference does not
    carry on into the following positions); ``max_logit_difference`` is over the same
    positions, ``logit_scale`` the largest float logit there, to judge it by."""

    token_agreement: float = 0.0
    logit_scale: float = 0.0

    def summary(self) -> str:
        return (
            f"quantized: largest logit difference {self.max_logit_difference:.3g} (logits up to {self.logit_scale:.3g}), "
            f"greedy tokens agree at {self.token_agreement:.0%} of {len(self.torch_tokens)} positions"
        )


def _prefill_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """The logits of every position of ``tokens`` read at once, with an empty cache."""
    with _session(path) as session:
        inputs = {i.name: i for i in session.get_inputs()}
        past_names = [n for n in inputs if n.startswith("past_key_values.")]
        cache_type = inputs[past_names[0]].type if past_names else "tensor(float)"
        dtype = {"tensor(float16)": np.float16, "tensor(double)": np.float64}.get(cache_type, np.float32)
        cache = {n: np.zeros((1, inputs[n].shape[1], 0, inputs[n].shape[3]), dtype=dtype) for n in past_names}
        feed = {
            "input_ids": np.array([tokens], dtype=np.int64), "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
            "position_ids": np.arange(len(tokens), dtype=np.int64)[None, :], **cache,
        }
        return _run(session, feed)["logits"][0]


def verify_quantized_causal_lm(
    path: Path, model: torch.nn.Module, config: Any, prompt: list[int], new_tokens: int
) -> QuantizedVerification:
    """The quantized decoder at ``path`` against the float ``model``'s greedy generation."""
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    torch_tokens = generated.sequences[0, len(prompt):].tolist()
    logits = _prefill_logits(path, prompt + torch_tokens[:-1])[len(prompt) - 1:]
    onnx_tokens = [int(t) for t in logits.argmax(-1)]
    torch_logits = torch.cat([step[:1] for step in generated.logits]).float()
    agreement = sum(a == b for a, b in zip(onnx_tokens, torch_tokens)) / len(torch_tokens)
    difference = _largest_difference([(logits, torch_logits)])
    return QuantizedVerification(
        difference, None, onnx_tokens, torch_tokens, token_agreement=agreement, logit_scale=float(torch_logits.abs().max())
    )
