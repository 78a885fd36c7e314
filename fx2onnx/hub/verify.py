"""`export_hf(..., verify=True)`: run the folder the way its runtime will and compare with
transformers. For a causal LM: a prefill with an empty cache, then decode steps feeding
`present.*` back, greedy, against `model.generate(do_sample=False)`; for the others: the
model's outputs on two input sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class Verification:
    max_logit_difference: float
    tokens_equal: bool | None
    onnx_tokens: list[int]
    torch_tokens: list[int]

    def summary(self) -> str:
        tokens = "" if self.tokens_equal is None else f", greedy tokens {'equal' if self.tokens_equal else 'DIFFERENT'}"
        return f"largest logit difference {self.max_logit_difference:.3g}{tokens}"


def _session(path: Path) -> Any:
    """An onnxruntime CPU session on the saved model; a bfloat16 model, for which the CPU
    provider lacks kernels, runs computed in float32 (see `program.low_precision`)."""
    import onnx
    import onnxruntime as ort

    from fx2onnx.program.low_precision import has_bfloat16, widen_bfloat16

    options = ort.SessionOptions()
    options.log_severity_level = 3
    header = onnx.load(str(path), load_external_data=False)
    if not has_bfloat16(header):
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(path))
    return ort.InferenceSession(widen_bfloat16(model).SerializeToString(), options, providers=["CPUExecutionProvider"])


def greedy_in_onnxruntime(path: Path, prompt: list[int], new_tokens: int, kv_heads: int, head_size: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy generation with the exported decoder: prefill, then one token per step."""
    session = _session(path)
    names = [i.name for i in session.get_inputs()]
    past_names = [n for n in names if n.startswith("past_key_values.")]
    cache_type = next(i.type for i in session.get_inputs() if i.name in past_names) if past_names else "tensor(float)"
    dtype = {"tensor(float16)": np.float16, "tensor(double)": np.float64}.get(cache_type, np.float32)
    cache = {n: np.zeros((1, kv_heads, 0, head_size), dtype=dtype) for n in past_names}
    tokens, logits_seen = list(prompt), []
    step = np.array([prompt], dtype=np.int64)
    for _ in range(new_tokens):
        total = len(tokens)
        feed = {"input_ids": step, "attention_mask": np.ones((1, total), dtype=np.int64), **cache}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(total - step.shape[1], total, dtype=np.int64)[None, :]
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        logits = outputs["logits"][:, -1, :]
        logits_seen.append(logits)
        token = int(logits.argmax(-1)[0])
        tokens.append(token)
        cache = {n: outputs[n.replace("past_key_values.", "present.")] for n in past_names}
        step = np.array([[token]], dtype=np.int64)
    return tokens[len(prompt):], logits_seen


def verify_causal_lm(path: Path, model: torch.nn.Module, config: Any, prompt: list[int], new_tokens: int) -> Verification:
    from fx2onnx.hub.causal_lm import head_size

    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    onnx_tokens, onnx_logits = greedy_in_onnxruntime(path, prompt, new_tokens, kv_heads, head_size(config))
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    torch_tokens = generated.sequences[0, len(prompt):].tolist()
    steps = min(len(onnx_logits), len(generated.logits))
    difference = max(
        float(np.abs(onnx_logits[i].astype(np.float64) - generated.logits[i].double().numpy()).max()) for i in range(steps)
    )
    return Verification(difference, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)


def verify_outputs(path: Path, model: torch.nn.Module, make_inputs: Any, output_name: str) -> Verification:
    """The first output of the ONNX model against ``output_name`` of the model's outputs,
    on two input sizes."""
    session = _session(path)
    difference = 0.0
    for size in (0, 1):
        inputs = make_inputs(size)
        feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
        actual = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))[output_name]
        with torch.no_grad():
            expected = getattr(model(**inputs), output_name)
        difference = max(difference, float(np.abs(actual.astype(np.float64) - expected.double().numpy()).max()))
    return Verification(difference, None, [], [])


def verify_seq2seq(folder: Path, model: torch.nn.Module, encoder_inputs: dict[str, torch.Tensor], start: int, steps: int) -> Verification:
    """Greedy decoding of the first example with the three files (encoder, first step,
    next steps) against the same loop in PyTorch."""
    encoder_inputs = {k: v[:1] for k, v in encoder_inputs.items()}
    encoder, first, following = (_session(folder / name) for name in
                                 ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"))
    hidden = encoder.run(None, {k: v.numpy() for k, v in encoder_inputs.items()})[0]
    mask = encoder_inputs.get("attention_mask")
    tokens, onnx_logits, cache = [start], [], {}
    for step in range(steps):
        session = first if step == 0 else following
        feed = {"input_ids": np.array([[tokens[-1]]], dtype=np.int64), "encoder_hidden_states": hidden, **cache}
        if mask is not None:
            feed["encoder_attention_mask"] = mask.numpy()
        names = [i.name for i in session.get_inputs()]
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v for k, v in feed.items() if k in names})))
        onnx_logits.append(outputs["logits"][:, -1, :])
        tokens.append(int(onnx_logits[-1].argmax(-1)[0]))
        cache = {name.replace("present.", "past_key_values."): value for name, value in outputs.items() if name.startswith("present.")}
    torch_tokens, torch_logits, past = [start], [], None
    with torch.no_grad():
        encoded = model.get_encoder()(**encoder_inputs).last_hidden_state
        for _ in range(steps):
            out = model(decoder_input_ids=torch.tensor([[torch_tokens[-1]]]), encoder_outputs=(encoded,), attention_mask=mask,
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            torch_logits.append(out.logits[:, -1, :])
            torch_tokens.append(int(out.logits[0, -1].argmax()))
    difference = max(float(np.abs(a.astype(np.float64) - b.double().numpy()).max()) for a, b in zip(onnx_logits, torch_logits))
    return Verification(difference, tokens == torch_tokens, tokens[1:], torch_tokens[1:])
