"""`export_hf(..., verify=True)`: run the folder the way its runtime will and compare with
transformers. For a causal LM: a prefill with an empty cache, then decode steps feeding
`present.*` back, greedy, against `model.generate(do_sample=False)`, at the lengths where
the model changes (`fx2onnx.hub.decoders.verify_lengths`); for the others: the model's outputs on
two input sizes.

Every task is judged: each output element must satisfy ``|onnx - torch| <= atol + rtol *
|torch|`` (a :class:`Tolerance` fitting the model's dtype, see :data:`DEFAULT_TOLERANCES`),
and the greedy tokens of a decoder must be equal as well; an output that may be tiny (a
waveform, a spectrogram) is first divided by min(1, its largest |torch| value)
(:func:`peak_scaled`). A model that fails to run fails
the verification (:class:`FolderRunError`, said in one sentence), never with a traceback."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.decoders.decode_step import cache_argument, encoder_output, output_cache
from fx2onnx.hub.precision.float32_io import in_declared_floats
from fx2onnx.hub.shared.dim_roles import PAST, own_length, present_name
from fx2onnx.hub.shared.peak_scale import peak_scaled
from fx2onnx.hub.shared.quantization_error import float_weights, rounded_model, stored_weights
from fx2onnx.onnx_passes import WeightQuantization
from fx2onnx import ExportOptions
from fx2onnx.program import session_on_cpu


@dataclass(frozen=True)
class Tolerance:
    """An output element passes when ``|onnx - torch| <= atol + rtol * |torch|``."""

    rtol: float
    atol: float

    def worst_ratio(self, actual: np.ndarray, expected: np.ndarray) -> float:
        """The largest ``|onnx - torch| / (atol + rtol * |torch|)``: at most 1 within tolerance."""
        bound = self.atol + self.rtol * np.abs(expected)
        return float((np.abs(actual - expected) / np.maximum(bound, np.finfo(np.float64).tiny)).max())


# The tolerance of each dtype the folders are written in (`--rtol`/`--atol` override it),
# measured on the tests' two-layer LLaMA (logits up to 0.59) and BERT (hidden states up to
# 3.1). float32: the exporter's own `--verify` bounds; the folders differ from transformers
# by 2.4e-7 (logits) and 7.2e-7 (hidden states). float16: onnxruntime and PyTorch both
# compute in float16 and round in different places; eager float16 PyTorch itself is off
# float64 by 4.3e-4 (logits) and 3.9e-3 (hidden states, 1.0e-3 of 1 + |x|), the folders
# differ from it by 4.9e-4 and 3.9e-3: rtol = atol = 1e-2, ten times eager's own error.
# bfloat16: onnxruntime has no bfloat16 CPU kernels, the folder is verified in float32 (see
# `session_on_cpu`) against PyTorch in bfloat16, whose own error against float64 is 4.3e-3
# (logits) and 2.8e-2 (hidden states, 9.2e-3 of 1 + |x|); the folders differ from it by
# 3.0e-3 and 3.7e-2: rtol = atol = 5e-2, five times eager's error. A wrong kernel is off by
# the size of the values themselves.
DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(ExportOptions.verify_rtol, ExportOptions.verify_atol),
    torch.float16: Tolerance(1e-2, 1e-2),
    torch.bfloat16: Tolerance(5e-2, 5e-2),
}


def tolerance_for(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The default tolerance of ``dtype`` (float32's for a dtype without one), with
    ``rtol`` and ``atol`` replacing its values where given."""
    default = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[torch.float32])
    return Tolerance(default.rtol if rtol is None else rtol, default.atol if atol is None else atol)


@dataclass
class Verification:
    max_logit_difference: float
    tokens_equal: bool | None
    onnx_tokens: list[int]
    torch_tokens: list[int]
    tolerance: Tolerance = DEFAULT_TOLERANCES[torch.float32]
    worst_ratio: float = 0.0  # the largest difference over its bound (Tolerance.worst_ratio)
    failure: str | None = None  # what failed, when a run or a token did (FolderRunError's words)

    @property
    def within_tolerance(self) -> bool:
        return self.worst_ratio <= 1.0

    @property
    def passed(self) -> bool:
        """Every run done, every output within the tolerance, and the greedy tokens (if any) equal."""
        return self.failure is None and self.within_tolerance and self.tokens_equal is not False

    @staticmethod
    def failed(failure: str, tolerance: Tolerance) -> Verification:
        """The verdict on a folder that could not be compared, saying why (``failure``)."""
        return Verification(float("inf"), None, [], [], tolerance, float("inf"), failure)

    @staticmethod
    def failed_run(error: FolderRunError, tolerance: Tolerance) -> Verification:
        """The verdict on a folder whose model failed to run."""
        return Verification.failed(str(error), tolerance)

    def summary(self) -> str:
        if self.failure is not None and self.max_logit_difference == float("inf"):
            return self.failure
        tokens = "" if self.tokens_equal is None else f", greedy tokens {'equal' if self.tokens_equal else 'DIFFERENT'}"
        verdict = "within" if self.within_tolerance else f"{self.worst_ratio:.3g} times"
        return (
            f"largest difference {self.max_logit_difference:.3g} ({verdict} the tolerance rtol={self.tolerance.rtol:g}, "
            f"atol={self.tolerance.atol:g}){tokens}"
        )

    @staticmethod
    def merged(runs: list[Verification]) -> Verification:
        """One verdict over several runs, with the first run's tokens (None where no run compares tokens)."""
        compared = [r.tokens_equal for r in runs if r.tokens_equal is not None]
        return Verification(
            max(r.max_logit_difference for r in runs), all(compared) if compared else None, runs[0].onnx_tokens,
            runs[0].torch_tokens, runs[0].tolerance, max(r.worst_ratio for r in runs),
            next((r.failure for r in runs if r.failure is not None), None),
        )


@contextlib.contextmanager
def cpu_session(path: Path) -> Iterator[Any]:
    """An onnxruntime CPU session on a model of the folder (a bfloat16 one in float32, as a temporary copy)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failed run is reported by the verification, with its length
    with tempfile.TemporaryDirectory(prefix="fx2onnx-verify-") as scratch:
        try:  # a model the runtime refuses to load fails the verification too, saying why
            session = session_on_cpu(path, options, Path(scratch))
        except Exception as error:
            raise FolderRunError(f"to load {path.name}", error) from error
        yield session


class FolderRunError(RuntimeError):
    """A model of the folder failed to run in onnxruntime: the verification states it
    (where it happened and the runtime's first line) instead of a traceback."""

    def __init__(self, where: str, error: BaseException, length: int | None = None) -> None:
        first_line = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
        super().__init__(f"onnxruntime failed {where}: {first_line}")
        self.length = length


def run_session(session: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The session's outputs by name, fed with the entries of ``feed`` it takes (its inputs, and the
    optional ones with a default: a speech folder's mask); a failed run is a :class:`FolderRunError`."""
    # a session of another runtime (or a test's stand-in) may have no optional inputs to list
    optional = getattr(session, "get_overridable_initializers", list)()
    names = {i.name for i in [*session.get_inputs(), *optional]}
    given = in_declared_floats(session, {k: v for k, v in feed.items() if k in names})
    try:
        results = session.run(None, given)
    except Exception as error:  # the runtime's own error, stated by the verification
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in given.items() if not (_is_past(k) or k.startswith("past.")))
        raise FolderRunError(f"on inputs {shapes}", error) from error
    return dict(zip([o.name for o in session.get_outputs()], results))


def verdict_of(pairs: Any, tolerance: Tolerance, tokens_equal: bool | None = None, onnx_tokens: list[int] | None = None,
              torch_tokens: list[int] | None = None) -> Verification:
    """The verdict over pairs of (numpy result, torch result), compared in float64."""
    pairs = [(a.astype(np.float64), b.double().numpy()) for a, b in pairs]
    return Verification(
        max(float(np.abs(a - b).max()) for a, b in pairs), tokens_equal, onnx_tokens or [], torch_tokens or [], tolerance,
        max(tolerance.worst_ratio(a, b) for a, b in pairs),
    )


def _is_past(name: str) -> bool:
    """A cache input: keys and values (`past_key_values.*`) and a hybrid's states as
    Transformers.js names them (`past_conv.*`, `past_ssm.*`, `past_recurrent.*`, DeepSeek-V4's compressors'
    `past_compressor.*` and `past_indexer.*`), RWKV's (`past_state.*`)."""
    return name.startswith(("past_key_values.", "past_conv.", "past_ssm.", "past_recurrent.", "past_state.",
                             "past_compressor.", "past_indexer."))


def empty_cache(session: Any, batch: int = 1, is_cache: Callable[[str], bool] = _is_past) -> dict[str, np.ndarray]:
    """An empty cache for a decoder session: each cache input (``is_cache``: default the
    ``past_key_values.*`` ones and a hybrid's states) with the model's own heads and head size, (batch, heads, 0,
    head size), in the cache's dtype: each input's own where static (a latent attention's keys
    and values have head sizes of their own); a state of fixed size (a hybrid's convolution
    or recurrent state) is zeros of its own size, as a model starts it. A heads or head-size dim the graph leaves
    symbolic (an encoder-decoder's cross-attention cache, which the first step does not read)
    takes the size the other cache inputs give it."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    past_names = [n for n in inputs if is_cache(n)]
    cache_type = inputs[past_names[0]].type if past_names else "tensor(float)"
    dtype = {"tensor(float16)": np.float16, "tensor(double)": np.float64}.get(cache_type, np.float32)

    def size(name: str, axis: int) -> int:
        dim = inputs[name].shape[axis]
        return int(dim) if isinstance(dim, int) else _static_size(inputs, past_names, axis)

    def empty(name: str) -> np.ndarray:
        shape = inputs[name].shape
        if _fixed_size(shape, outputs.get(present_name(name))):  # a hybrid's convolution or recurrent state
            return np.zeros((batch, *shape[1:]), dtype=dtype)
        # no tokens along the past length: dim 2 of keys and values, dim 1 of a cache
        # without heads (an indexer's keys, [batch, length, size])
        length = shape.index(PAST) if PAST in shape else _own_past_axis(name, shape)
        return np.zeros((batch, *(0 if axis == length else size(name, axis) for axis in range(1, len(shape)))),
                        dtype=dtype)

    return {n: empty(n) for n in past_names}


def _own_past_axis(name: str, shape: list[Any]) -> int:
    """The axis of the state ``name``'s own past length (dim_roles.own_length: DeepSeek-V4's
    states, each of its own length), else 2 (keys' and values' length)."""
    own = own_length(name)
    return shape.index(own) if own in shape else 2


def _fixed_size(shape: list[Any], present: Any) -> bool:
    """Whether a cache input of ``shape`` is a state of fixed size: every dim but the batch
    static and the same in its next step's value (``present``), as dim_roles.fixed_size_states
    finds them in the graph."""
    return present is not None and all(isinstance(d, int) for d in shape[1:]) and list(present.shape[1:]) == list(shape[1:])


def _static_size(inputs: dict[str, Any], past_names: list[str], axis: int) -> int:
    """The one size the cache inputs give ``axis`` where it is static."""
    static = {int(inputs[n].shape[axis]) for n in past_names if isinstance(inputs[n].shape[axis], int)}
    if len(static) != 1:
        raise ValueError(
            f"the decoder's cache inputs give dim {axis} the sizes {sorted(static) or 'none (every one symbolic)'}: an empty "
            "cache cannot be sized from them; export the model with its heads and head size static."
        )
    return static.pop()


# the generation config's entries a plain greedy search keeps: the special tokens' ids
_TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


@contextlib.contextmanager
def plain_greedy(model: torch.nn.Module) -> Iterator[None]:
    """`model.generate` as plain greedy search, as the folder's verification decodes: the
    model's generation config keeps only its token ids while inside, so that none of its
    logits processors (Blenderbot's forced end of text at the last position, a repetition
    penalty, banned n-grams) picks a token the logits alone would not."""
    from transformers import GenerationConfig

    kept = getattr(model, "generation_config", None)
    if kept is None:
        yield
        return
    model.generation_config = GenerationConfig(**{name: getattr(kept, name, None) for name in _TOKEN_ID_FIELDS})
    try:
        yield
    finally:
        model.generation_config = kept


@dataclass
class Greedy:
    """Greedy generation of a batch: the new tokens of each row, each step's last logits
    (batch, vocab) and the sequence length each step ends at."""

    tokens: list[list[int]]
    logits: list[np.ndarray]
    lengths: list[int]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """The prompts as one batch padded on the left, and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return ids, mask


def positions_of(mask: np.ndarray) -> np.ndarray:
    """Each token's position as transformers' generation counts it: the real tokens before
    it; a padding token's is 0."""
    return np.where(mask == 1, np.cumsum(mask, axis=-1) - 1, 0)


def greedy_in_folder(
    path: Path, prompts: list[list[int]], new_tokens: int, pad: int, banned: Sequence[int] = (), embedding: Path | None = None,
) -> Greedy:
    """Greedy generation with the folder's decoder in onnxruntime (`greedy_decode`); with
    ``embedding``, each step's ids go through that model first and the decoder takes its
    outputs (Transformers.js's `embed_tokens` before `decoder_model_merged`)."""
    with cpu_session(path) as session, (cpu_session(embedding) if embedding else contextlib.nullcontext()) as embed:

        def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return run_session(session, feed if embed is None else {**feed, **run_session(embed, feed)})

        return greedy_decode(run, empty_cache(session, len(prompts)), prompts, new_tokens, pad, banned)


# what a decoder is fed beside its cache at a step: from the step's ids, the attention mask
# of the whole sequence so far and the step's index (0: the prompt)
StepFeed = Callable[[np.ndarray, np.ndarray, int], dict[str, np.ndarray]]


def causal_lm_feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
    """A causal LM's step: its ids, the mask and the positions of its tokens."""
    return {"input_ids": step, "attention_mask": mask, "position_ids": positions_of(mask)[:, mask.shape[1] - step.shape[1]:]}


def end_tokens(model: torch.nn.Module) -> list[int]:
    """The end-of-text tokens `model.generate`'s ``min_new_tokens`` keeps it from choosing."""
    ends = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [] if ends is None else [int(token) for token in ([ends] if isinstance(ends, int) else ends)]


def greedy_decode(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], cache: dict[str, np.ndarray],
    prompts: list[list[int]], new_tokens: int, pad: int = 0, banned: Sequence[int] = (), feed: StepFeed = causal_lm_feed,
) -> Greedy:
    """Greedy generation of a left-padded batch with a decoder that ``run`` computes
    (inputs to outputs by name, in any runtime), from the empty ``cache`` (its inputs,
    fed back from the outputs `present_name` gives), each step fed what ``feed`` makes
    (default: a causal LM's ids, mask and positions), never choosing the ``banned``
    tokens (the end of text while the generation must go on, as transformers'
    ``min_new_tokens`` keeps it); a run that fails with a :class:`FolderRunError` is said
    again with the length it failed at. A decoder without a cache (``cache`` empty) is fed
    the whole sequence at every step. The one greedy loop of every verification."""
    ids, mask = left_padded(prompts, pad)
    new: list[list[int]] = [[] for _ in prompts]
    logits, lengths = [], []
    past_names, step = list(cache), ids
    recompute = not past_names
    for index in range(new_tokens):
        length = mask.shape[1]
        try:
            outputs = run({**feed(step, mask, index), **cache})
        except FolderRunError as error:  # said again with the length it failed at
            step_name = "the prefill" if index == 0 else f"decode step {index}"
            raise FolderRunError(f"at sequence length {length} ({step_name})", error.__cause__, length) from error
        logits.append(outputs["logits"][:, -1, :])
        lengths.append(length)
        chosen = np.where(np.isin(np.arange(logits[-1].shape[-1]), list(banned)), -np.inf, logits[-1]).argmax(-1)
        for row, token in zip(new, chosen):
            row.append(int(token))
        cache = {n: outputs[present_name(n)] for n in past_names}
        chosen = chosen[:, None].astype(np.int64)
        step = np.concatenate([step, chosen], axis=1) if recompute else chosen
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
    return Greedy(new, logits, lengths)


def greedy_in_genai(
    folder: Any, rows: Sequence[Sequence[int]], new_tokens: int, ends_early: bool = False, logits: bool = False,
) -> Greedy:
    """ONNX Runtime GenAI's greedy generation of ``new_tokens`` after the batch ``rows`` (of
    one length: the runtime reads its pad token as padding), with the folder at ``folder`` or
    an ``onnxruntime_genai.Model`` already loaded from it: each row's new tokens and, with
    ``logits``, each step's last logits (batch, vocab). The end of text is not chosen before
    ``new_tokens`` (as transformers' ``min_new_tokens`` keeps it) unless ``ends_early``."""
    import onnxruntime_genai as og

    model = og.Model(os.fspath(folder)) if isinstance(folder, (str, os.PathLike)) else folder
    params = og.GeneratorParams(model)
    length = len(rows[0]) + new_tokens
    ends = {} if ends_early else {"min_length": length}
    params.set_search_options(do_sample=False, max_length=length, batch_size=len(rows), **ends)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(rows, dtype=np.int32))
    steps, step_logits = [], []
    while not generator.is_done():
        generator.generate_next_token()
        steps.append(generator.get_next_tokens().tolist())
        if logits:
            last = np.array(generator.get_output("logits"))
            step_logits.append(last.reshape(len(rows), -1, last.shape[-1])[:, -1])
    tokens = [[int(step[row]) for step in steps] for row in range(len(rows))]
    return Greedy(tokens, step_logits, [len(rows[0]) + index for index in range(len(steps))])


def greedy_in_onnxruntime(path: Path, prompt: list[int], new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy generation with the exported decoder: prefill, then one token per step."""
    greedy = greedy_in_folder(path, [prompt], new_tokens, pad=0)
    return greedy.tokens[0], greedy.logits


def verify_causal_lm(
    path: Path, model: torch.nn.Module, config: Any, prompt: list[int], new_tokens: int, tolerance: Tolerance
) -> Verification:
    onnx_tokens, onnx_logits = greedy_in_onnxruntime(path, prompt, new_tokens)
    with torch.no_grad(), plain_greedy(model):
        generated = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    torch_tokens = generated.sequences[0, len(prompt):].tolist()
    return verdict_of(zip(onnx_logits, generated.logits), tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)


def _output_pairs(path: Path, model: torch.nn.Module, make_inputs: Any, output_name: str) -> list[tuple[np.ndarray, torch.Tensor]]:
    """The ONNX model's and the model's ``output_name`` on two input sizes."""
    pairs = []
    with cpu_session(path) as session:
        for size in (0, 1):
            inputs = make_inputs(size)
            actual = run_session(session, {k: v.numpy() for k, v in inputs.items()})[output_name]
            with torch.no_grad():
                pairs.append((actual, getattr(model(**inputs), output_name)))
    return pairs


def verify_outputs(path: Path, model: torch.nn.Module, make_inputs: Any, output_name: str, tolerance: Tolerance,
                   scaled: bool = False) -> Verification:
    """The ONNX model's ``output_name`` against the model's, on two input sizes; an output
    of another shape than the model's (a waveform whose length the graph computes) fails,
    saying both. ``scaled``: each size's outputs compared as :func:`peak_scaled` gives them."""
    pairs = _output_pairs(path, model, make_inputs, output_name)
    for size, (actual, expected) in enumerate(pairs):
        if tuple(actual.shape) != tuple(expected.shape):
            failure = (f"the {output_name} is {list(actual.shape)} where transformers' is {list(expected.shape)} "
                       f"(the inputs of size {size})")
            return Verification.failed(failure, tolerance)
    return verdict_of([peak_scaled(*pair) for pair in pairs] if scaled else pairs, tolerance)


def verify_seq2seq(
    encoder_path: Path, decoder_path: Path, model: torch.nn.Module, encoder_inputs: dict[str, torch.Tensor], start: int,
    steps: int, tolerance: Tolerance,
) -> Verification:
    """Greedy decoding of the first example with the encoder and the merged decoder (the
    first step with `use_cache_branch` false and an empty past, as Transformers.js feeds
    it) against the same loop in PyTorch."""
    encoder_inputs = {k: v[:1] for k, v in encoder_inputs.items()}
    mask = encoder_inputs.get("attention_mask")
    with cpu_session(encoder_path) as encoder, cpu_session(decoder_path) as decoder:
        hidden = run_session(encoder, {k: v.numpy() for k, v in encoder_inputs.items()})["last_hidden_state"]
        encoder_feed = {"encoder_hidden_states": hidden, **({"encoder_attention_mask": mask.numpy()} if mask is not None else {})}

        def step_feed(step: np.ndarray, _mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            return {"input_ids": step, **encoder_feed, "use_cache_branch": np.array([index > 0])}

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [[start]], steps, feed=step_feed)
    tokens, onnx_logits = [start, *greedy.tokens[0]], greedy.logits
    torch_tokens, torch_logits, past = [start], [], None
    with torch.no_grad():
        encoded = model.get_encoder()(**encoder_inputs).last_hidden_state
        for _ in range(steps):
            out = model(decoder_input_ids=torch.tensor([[torch_tokens[-1]]]), encoder_outputs=encoder_output(encoded), attention_mask=mask,
                        use_cache=True, **{cache_argument(model): past})
            past = output_cache(out)
            torch_logits.append(out.logits[:, -1, :])
            torch_tokens.append(int(out.logits[0, -1].argmax()))
    return verdict_of(zip(onnx_logits, torch_logits), tolerance, tokens == torch_tokens, tokens[1:], torch_tokens[1:])


@dataclass
class QuantizedVerification(Verification):
    """A quantized folder against the float model: not equal by design, so measured.

    ``token_agreement`` is the share of positions where the folder's greedy token is the
    float model's, both reading the float model's greedy text (a difference does not
    carry on into the following positions); ``float_difference`` is the largest logit
    difference from the float model over the same positions, ``logit_scale`` the largest
    float logit there. The folder is judged against the float model with its weights
    rounded as the folder stores them (quantization_error.py): ``max_logit_difference`` is
    the largest difference from that model's logits, ``own_error`` how far the rounding
    alone moves the float logits (the quantization's own error, which depends on the
    model: a third of the largest logit and more for some tiny random ones). It passes
    when ``max_logit_difference`` is at most ``own_error`` plus ``QUANTIZED_ACTIVATION_ERROR``
    of the scale. With an ``atol`` given, the folder is judged against the float model by it
    and nothing is rounded (``own_error`` None, ``max_logit_difference`` the float one)."""

    token_agreement: float = 0.0
    logit_scale: float = 0.0
    float_difference: float = 0.0
    own_error: float | None = None

    def summary(self) -> str:
        if self.own_error is None:
            judged = _bounded(self, "logits", self.logit_scale)
        else:
            verdict = "within" if self.within_tolerance else "OUTSIDE"
            judged = (f"logits up to {self.logit_scale:.3g}; rounding the weights alone moves them by {self.own_error:.3g}; "
                      f"{self.max_logit_difference:.3g} from the float model with the folder's rounding, {verdict} the bound "
                      f"{self.tolerance.atol:.3g}")
        return (
            f"quantized: largest logit difference {self.float_difference:.3g} ({judged}), "
            f"greedy tokens agree at {self.token_agreement:.0%} of {len(self.torch_tokens)} positions"
        )


def _bounded(verification: Verification, what: str, scale: float) -> str:
    """How a quantized folder's largest difference stands against its bound."""
    verdict = "within" if verification.within_tolerance else "OUTSIDE"
    return f"{what} up to {scale:.3g}; {verdict} the bound {verification.tolerance.atol:.3g}"


def prefill_logits(path: Path, texts: list[list[int]], pad: int = 0, embedding: Path | None = None) -> np.ndarray:
    """The logits (batch, width, vocab) of every position of ``texts`` read at once as one
    left-padded batch with an empty cache; with ``embedding``, the ids go through that model
    first (as in `greedy_in_folder`)."""
    ids, mask = left_padded(texts, pad)
    with cpu_session(path) as session, (cpu_session(embedding) if embedding else contextlib.nullcontext()) as embed:
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions_of(mask), **empty_cache(session, len(texts))}
        if embed is not None:
            feed |= run_session(embed, feed)
        return run_session(session, feed)["logits"]


# What a quantized folder may differ by from the float model with its weights rounded as it
# stores them, beyond what that rounding alone moves the logits by (onnxruntime rounds the
# activations to int8 at accuracy level 4, a grid no coarser than the weights', so moving the
# logits no more): a share of the largest float logit, for weights already on their grid (a
# pre-quantized checkpoint's), where the rounding moves nothing.
QUANTIZED_ACTIVATION_ERROR = 0.02


def verify_quantized_causal_lm(
    path: Path, model: torch.nn.Module, config: Any, prompt: list[int], new_tokens: int, atol: float | None = None,
    embedding: Path | None = None, quantization: WeightQuantization | None = None,
) -> QuantizedVerification:
    """The quantized decoder at ``path`` against the float ``model``'s greedy generation
    (with ``embedding``, each position's ids embedded by that model first); ``quantization``:
    how the folder rounded its weights (its algorithms; None: round-to-nearest), or that it
    holds a pre-quantized checkpoint's own codes (``codes_of``: the model's weights as they are)."""
    with torch.no_grad(), plain_greedy(model):
        generated = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    torch_tokens = generated.sequences[0, len(prompt):].tolist()
    tokens = prompt + torch_tokens[:-1]
    logits = prefill_logits(path, [tokens], embedding=embedding)[0][len(prompt) - 1:]
    onnx_tokens = [int(t) for t in logits.argmax(-1)]
    torch_logits = torch.cat([step[:1] for step in generated.logits]).float()
    agreement = sum(a == b for a, b in zip(onnx_tokens, torch_tokens)) / len(torch_tokens)
    scale = float(torch_logits.abs().max())
    float_difference = float(np.abs(logits.astype(np.float64) - torch_logits.double().numpy()).max())
    if atol is not None:
        compared = verdict_of([(logits, torch_logits)], Tolerance(0.0, atol), None, onnx_tokens, torch_tokens)
        return QuantizedVerification(**vars(compared), token_agreement=agreement, logit_scale=scale,
                                     float_difference=float_difference)
    paths = [path, *([embedding] if embedding else [])]
    reference = _rounded_logits(model, paths, tokens, quantization)[-len(torch_logits):]
    own = float((reference - torch_logits).abs().max())
    bound = Tolerance(0.0, own + QUANTIZED_ACTIVATION_ERROR * scale)
    compared = verdict_of([(logits, reference)], bound, None, onnx_tokens, torch_tokens)
    return QuantizedVerification(**vars(compared), token_agreement=agreement, logit_scale=scale,
                                 float_difference=float_difference, own_error=own)


def _rounded_logits(
    model: torch.nn.Module, paths: list[Path], tokens: list[int], quantization: WeightQuantization | None,
) -> torch.Tensor:
    """The logits of ``model`` over ``tokens`` with the weights the files at ``paths`` quantize
    rounded as they store them (none for a pre-quantized checkpoint's codes: the model's
    weights are those codes' values already)."""
    own_codes = quantization is not None and quantization.codes_of is not None
    algorithm = quantization.algorithm if quantization is not None else "rtn"
    head_algorithm = (quantization.lm_head_algorithm if quantization is not None else None) or algorithm
    weights = [] if own_codes else stored_weights(paths)
    with rounded_model(model, weights, algorithm, head_algorithm, float_weights(paths)) as missing, torch.no_grad():
        if missing:
            raise ValueError(f"the quantized weights {', '.join(missing)} of {paths[0].name} are not the model's parameters "
                             "of their shape: the folder cannot be judged against its rounding; give atol to judge it "
                             "against the float model.")
        return model(torch.tensor([tokens])).logits[0].float()


@dataclass
class QuantizedOutputVerification(Verification):
    """An int8 encoder (activations quantized at run time) against the float model:
    ``max_logit_difference`` is the largest difference of the output over both input
    sizes, ``output_scale`` the float output's largest magnitude, to judge it by. It passes
    when the difference is at most ``QUANTIZED_OUTPUT_ERROR`` of that scale (or the
    ``atol`` given)."""

    output_scale: float = 0.0

    def summary(self) -> str:
        return f"int8: largest difference {self.max_logit_difference:.3g} ({_bounded(self, 'outputs', self.output_scale)})"


# The largest output difference of an int8 encoder from the float model, as a share of
# the float output's largest magnitude: the tests' 2 x 64 BERT (hidden states up to 3.6)
# differs by 4.7e-4 of it, `bench/precision_folders.py --encoder`'s 4 x 256 one by 4.3e-3
# (onnxruntime's `quantize_dynamic` file of it by 5.6e-3); a wrong kernel is off by the
# size of the values.
QUANTIZED_OUTPUT_ERROR = 0.02


def verify_quantized_outputs(
    path: Path, model: torch.nn.Module, make_inputs: Any, output_name: str, atol: float | None = None
) -> QuantizedOutputVerification:
    """The int8 encoder at ``path`` against the float ``model``, on two input sizes."""
    pairs = _output_pairs(path, model, make_inputs, output_name)
    scale = max(float(expected.abs().max()) for _, expected in pairs)
    compared = verdict_of(pairs, Tolerance(0.0, atol if atol is not None else QUANTIZED_OUTPUT_ERROR * scale))
    return QuantizedOutputVerification(**vars(compared), output_scale=scale)
