"""transformers decoder LLMs and encoder-decoders exported with their default cache
(use_cache=True): prefill and decode-step programs whose `present` caches match PyTorch's,
cache objects in and out of `ONNXProgram.__call__`, Optimum's ONNX names, and greedy
generation in onnxruntime that gives the tokens `generate()` gives."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

import fx2onnx
from conftest import assert_outputs_close, check_saved_model, make_options
from fx2onnx.capture.libraries.transformers_caches import registered_containers

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

VOCAB = 100
LAYERS = 2


def _decoder(name: str) -> torch.nn.Module:
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64)
        )
    elif name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    elif name == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**small))
    elif name == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small))
    elif name == "phi3":
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**small, pad_token_id=0))
    elif name == "gemma":
        model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**small, head_dim=8))
    else:
        raise ValueError(name)
    assert model.config.use_cache  # the default config, as people export it
    return model.eval()


def _cache_argument(model: torch.nn.Module) -> str:
    """forward's name for the cache: `cache` from transformers 5.24 on, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _spelled(kwargs: dict[str, Any], model: torch.nn.Module, spelling: str) -> dict[str, Any]:
    """The inputs with the cache passed under `spelling`."""
    renamed = dict(kwargs)
    renamed[spelling] = renamed.pop(_cache_argument(model))
    return renamed


def _takes_position_ids(model: torch.nn.Module) -> bool:
    return "position_ids" in inspect.signature(model.forward).parameters


def _inputs(model: torch.nn.Module, batch: int, length: int, past: int, seed: int = 0) -> dict[str, Any]:
    """input_ids, a left-padded attention_mask, position_ids, and a past cache of `past`
    tokens made by running the model (none when past is 0)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, past + length), generator=generator)
    mask = torch.ones(batch, past + length, dtype=torch.long)
    # one padded position in the first row: inside the past, or (prefill) the last one, so
    # that no query row has every key masked (PyTorch's result for such rows is arbitrary)
    mask[0, 0 if past else -1] = 0
    kwargs: dict[str, Any] = {"input_ids": ids[:, past:], "attention_mask": mask}
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if _takes_position_ids(model):
        kwargs["position_ids"] = positions[:, past:]
    if past:
        with torch.no_grad():
            prefix = {"input_ids": ids[:, :past], "attention_mask": mask[:, :past]}
            if _takes_position_ids(model):
                prefix["position_ids"] = positions[:, :past]
            kwargs[_cache_argument(model)] = model(**prefix).past_key_values
    return kwargs


def _eager(model: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(**copy.deepcopy(kwargs))


def _export(model: torch.nn.Module, kwargs: dict[str, Any], tmp_path: Path) -> fx2onnx.ONNXProgram:
    tmp_path.mkdir(parents=True, exist_ok=True)
    options = make_options(tmp_path, dynamic_shapes=True)
    program = fx2onnx.dynamo_export(model, **copy.deepcopy(kwargs), export_options=options)
    check_saved_model(program, tmp_path / "model.onnx")
    return program


def _compare(program: fx2onnx.ONNXProgram, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    expected = _eager(model, kwargs)
    actual = program(**copy.deepcopy(kwargs))
    assert type(actual.past_key_values) is type(expected.past_key_values)
    with registered_containers():  # compares the caches tensor by tensor
        assert_outputs_close((actual.logits, actual.past_key_values), (expected.logits, expected.past_key_values))


def _names(values: Any) -> list[str]:
    return [value.name for value in values]


def _dims(value: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


DECODERS = ["gpt2", "llama", "mistral", "qwen2", "phi3", "gemma"]


@pytest.fixture(scope="module", params=DECODERS)
def decoder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One model with its prefill and decode-step programs, shared by the checks below."""
    torch.manual_seed(0)
    model = _decoder(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    prefill = _export(model, _inputs(model, batch=2, length=5, past=0), folder / "prefill")
    decode = _export(model, _inputs(model, batch=2, length=3, past=4), folder / "decode")
    return {"name": request.param, "model": model, "prefill": prefill, "decode": decode}


@pytest.mark.parametrize("batch,length", [(2, 5), (3, 7)])
def test_prefill_matches_pytorch(decoder: dict[str, Any], batch: int, length: int) -> None:
    model = decoder["model"]
    _compare(decoder["prefill"], model, _inputs(model, batch, length, past=0, seed=batch))


@pytest.mark.parametrize("batch,length,past", [(2, 3, 4), (3, 1, 6), (1, 2, 9)])
def test_decode_step_matches_pytorch(decoder: dict[str, Any], batch: int, length: int, past: int) -> None:
    model = decoder["model"]
    _compare(decoder["decode"], model, _inputs(model, batch, length, past, seed=batch + past))


def test_onnx_names_follow_optimum(decoder: dict[str, Any]) -> None:
    takes_positions = _takes_position_ids(decoder["model"])
    caches = [f"{kind}.{i}.{part}" for i in range(LAYERS) for part in ("key", "value") for kind in ("present",)]
    past = [name.replace("present", "past_key_values") for name in caches]
    leading = ["input_ids", "attention_mask"] + (["position_ids"] if takes_positions else [])
    prefill = decoder["prefill"].model_proto.graph
    decode = decoder["decode"].model_proto.graph
    assert _names(prefill.input) == leading
    assert _names(decode.input) == leading + past
    assert _names(prefill.output) == _names(decode.output) == ["logits", *caches]
    # batch, sequence and past-sequence dims are symbolic
    inputs = {value.name: _dims(value) for value in decode.input}
    assert all(isinstance(d, str) for d in inputs["input_ids"])
    assert all(isinstance(inputs[name][d], str) for name in past for d in (0, 2))
    outputs = {value.name: _dims(value) for value in decode.output}
    assert all(isinstance(outputs[name][d], str) for name in caches for d in (0, 2))


def _session(program: fx2onnx.ONNXProgram) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decoder", ["gpt2", "llama"], indirect=True)
def test_greedy_generation_in_onnxruntime_matches_generate(decoder: dict[str, Any]) -> None:
    """The prompt goes through the prefill model, then each new token through the
    decode-step model, `present.*` fed back as `past_key_values.*` by name."""
    model, new_tokens = decoder["model"], 8
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=0,
        )[:, prompt.shape[1]:]
    prefill, decode = _session(decoder["prefill"]), _session(decoder["decode"])
    feeds: dict[str, Any] = {"input_ids": prompt.numpy()}
    tokens: list[torch.Tensor] = []
    session = prefill
    for _ in range(new_tokens):
        length = feeds["input_ids"].shape[1]
        total = prompt.shape[1] + len(tokens)
        feeds["attention_mask"] = torch.ones(prompt.shape[0], total, dtype=torch.long).numpy()
        if "position_ids" in [i.name for i in session.get_inputs()]:
            feeds["position_ids"] = torch.arange(total - length, total).expand(prompt.shape[0], -1).numpy()
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        token = torch.from_numpy(outputs["logits"][:, -1]).argmax(-1)
        tokens.append(token)
        feeds = {"input_ids": token[:, None].numpy()}
        feeds.update({name.replace("present", "past_key_values"): value for name, value in outputs.items() if name.startswith("present.")})
        session = decode
    assert torch.equal(torch.stack(tokens, 1), expected)


# -- encoder-decoders: EncoderDecoderCache ------------------------------------------------
def _seq2seq(name: str) -> torch.nn.Module:
    sizes = dict(vocab_size=VOCAB, d_model=32, encoder_layers=LAYERS, decoder_layers=LAYERS,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)
    if name == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=LAYERS,
                                       num_heads=4, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(config)
    elif name == "bart":
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(**sizes, max_position_embeddings=64))
    elif name == "whisper":
        config = transformers.WhisperConfig(**sizes, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
                                            decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = transformers.WhisperForConditionalGeneration(config)
    else:
        raise ValueError(name)
    assert model.config.use_cache
    return model.eval()


def _seq2seq_inputs(model: torch.nn.Module, batch: int, source: int, target: int, past: int, seed: int = 0) -> dict[str, Any]:
    """Encoder inputs and decoder_input_ids; with `past`, the decoder's and the cross
    attention's cache and the encoder's output from a PyTorch run instead of the encoder inputs."""
    generator = torch.Generator().manual_seed(seed)
    if isinstance(model, transformers.WhisperForConditionalGeneration):
        encoder = {"input_features": torch.randn(batch, 8, 32, generator=generator)}
    else:
        mask = torch.ones(batch, source, dtype=torch.long)
        mask[0, -1] = 0
        encoder = {"input_ids": torch.randint(0, VOCAB, (batch, source), generator=generator), "attention_mask": mask}
    decoder_ids = torch.randint(0, VOCAB, (batch, past + target), generator=generator)
    kwargs = {**encoder, "decoder_input_ids": decoder_ids[:, past:]}
    if past:
        with torch.no_grad():
            first = model(**encoder, decoder_input_ids=decoder_ids[:, :past])
        kwargs.pop("input_ids", None)
        kwargs.pop("input_features", None)
        kwargs[_cache_argument(model)] = first.past_key_values
        kwargs["encoder_outputs"] = (first.encoder_last_hidden_state,)
    return kwargs


@pytest.fixture(scope="module", params=["t5", "bart", "whisper"])
def seq2seq(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _seq2seq(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    prefill = _export(model, _seq2seq_inputs(model, 2, 5, 2, past=0), folder / "prefill")
    decode = _export(model, _seq2seq_inputs(model, 2, 5, 2, past=3), folder / "decode")
    return {"model": model, "prefill": prefill, "decode": decode}


def _compare_all(program: fx2onnx.ONNXProgram, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    expected = _eager(model, kwargs)
    actual = program(**copy.deepcopy(kwargs))
    assert type(actual.past_key_values) is transformers.EncoderDecoderCache
    with registered_containers():
        assert_outputs_close(
            (actual.logits, actual.past_key_values, actual.encoder_last_hidden_state),
            (expected.logits, expected.past_key_values, expected.encoder_last_hidden_state),
        )


@pytest.mark.parametrize("batch,source,target", [(2, 5, 2), (3, 7, 4)])
def test_seq2seq_prefill_matches_pytorch(seq2seq: dict[str, Any], batch: int, source: int, target: int) -> None:
    model = seq2seq["model"]
    _compare_all(seq2seq["prefill"], model, _seq2seq_inputs(model, batch, source, target, past=0, seed=batch))


@pytest.mark.parametrize("batch,source,target,past", [(2, 5, 2, 3), (3, 7, 1, 6)])
def test_seq2seq_decode_step_matches_pytorch(seq2seq: dict[str, Any], batch: int, source: int, target: int, past: int) -> None:
    model = seq2seq["model"]
    _compare_all(seq2seq["decode"], model, _seq2seq_inputs(model, batch, source, target, past, seed=past))


def test_seq2seq_cache_names_follow_optimum(seq2seq: dict[str, Any]) -> None:
    parts = [f"{i}.{side}.{kind}" for side in ("decoder", "encoder") for i in range(LAYERS) for kind in ("key", "value")]
    decode = seq2seq["decode"].model_proto.graph
    assert [name for name in _names(decode.input) if name.startswith("past_key_values.")] == [f"past_key_values.{p}" for p in parts]
    for graph in (decode, seq2seq["prefill"].model_proto.graph):
        assert _names(graph.output) == ["logits", *[f"present.{p}" for p in parts], "encoder_last_hidden_state"]
    inputs = {value.name: _dims(value) for value in decode.input}
    assert isinstance(inputs["past_key_values.0.decoder.key"][2], str)  # past length
    assert isinstance(inputs["past_key_values.0.encoder.key"][2], str)  # source length


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_deprecated_cache_spelling_exports_alike(name: str, tmp_path: Path) -> None:
    """transformers 5.24 renamed forward's `past_key_values` to `cache`; the old name still
    works in eager PyTorch because it lands in forward's **kwargs. Both spellings export with
    dynamic dims, give the same ONNX names and values, and the program takes the spelling
    the export used."""
    model = _decoder(name) if name in DECODERS else _seq2seq(name)
    if _cache_argument(model) == "past_key_values":
        pytest.skip("forward has no `cache` argument before transformers 5.24: one spelling only")
    if name in DECODERS:
        make = lambda seed, **sizes: _inputs(model, **sizes, seed=seed)  # noqa: E731
        example, second = dict(batch=2, length=3, past=4), dict(batch=3, length=2, past=6)
    else:
        make = lambda seed, **sizes: _seq2seq_inputs(model, **sizes, seed=seed)  # noqa: E731
        example, second = dict(batch=2, source=5, target=2, past=3), dict(batch=3, source=7, target=1, past=6)
    programs = {}
    for spelling in ("cache", "past_key_values"):
        program = _export(model, _spelled(make(0, **example), model, spelling), tmp_path / spelling)
        for seed, sizes in ((1, example), (2, second)):
            inputs = make(seed, **sizes)
            expected = _eager(model, inputs)
            actual = program(**copy.deepcopy(_spelled(inputs, model, spelling)))
            with registered_containers():
                assert_outputs_close((actual.logits, actual.past_key_values), (expected.logits, expected.past_key_values))
        programs[spelling] = program.model_proto.graph
    cache, deprecated = programs["cache"], programs["past_key_values"]
    assert _names(cache.input) == _names(deprecated.input)
    assert _names(cache.output) == _names(deprecated.output)
    assert any(name.startswith("past_key_values.0.") for name in _names(cache.input))
    assert [_dims(value) for value in cache.input] == [_dims(value) for value in deprecated.input]


def test_static_cache_decode_step(tmp_path: Path) -> None:
    """StaticCache: preallocated keys and values updated in place at cache_position."""
    model = _decoder("llama")

    def step(batch: int, past: int) -> dict[str, Any]:
        ids = torch.randint(0, VOCAB, (batch, past + 1), generator=torch.Generator().manual_seed(past))
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            model(input_ids=ids[:, :past], past_key_values=cache, cache_position=torch.arange(past))
        return {"input_ids": ids[:, past:], "past_key_values": cache, "cache_position": torch.arange(past, past + 1)}

    program = fx2onnx.dynamo_export(model, **step(2, 4), export_options=make_options(tmp_path))
    check_saved_model(program, tmp_path / "model.onnx")
    graph = program.model_proto.graph
    assert "past_key_values.1.key" in _names(graph.input) and "present.1.value" in _names(graph.output)
    assert "past_key_values.0.key.mutated" in _names(graph.output)
    for past in (4, 9):
        inputs = step(2, past)
        expected, actual = _eager(model, inputs), program(**copy.deepcopy(inputs))
        assert type(actual.past_key_values) is transformers.StaticCache
        with registered_containers():
            assert_outputs_close((actual.logits, actual.past_key_values), (expected.logits, expected.past_key_values))


def test_batch_of_one_example_stays_dynamic(tmp_path: Path) -> None:
    """dynamic_shapes=True with a batch-1 prompt: the ONNX model runs other batch sizes."""
    model = _decoder("gpt2")
    program = _export(model, {"input_ids": torch.randint(0, VOCAB, (1, 6))}, tmp_path)
    assert _dims(program.model_proto.graph.input[0]) == ["input_ids_dim_0", "input_ids_dim_1"]
    for batch, length in ((3, 5), (1, 6)):
        inputs = {"input_ids": torch.randint(0, VOCAB, (batch, length))}
        expected, actual = _eager(model, inputs), program(**inputs)
        with registered_containers():
            assert_outputs_close((actual.logits, actual.past_key_values), (expected.logits, expected.past_key_values))


class GroupedMatmul(torch.nn.Module):
    """transformers' mixture-of-experts matmul (a custom operator of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4, 5))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offsets)


def test_grouped_mm_fallback(export_and_compare) -> None:
    import transformers.integrations.moe  # noqa: F401 - defines the operator

    # experts 0, 1, 2 take rows [0, 2), [2, 2) (none) and [2, 5); rows 5 and 6 none: zeros
    export_and_compare(GroupedMatmul(), (torch.randn(7, 4), torch.tensor([2, 2, 5], dtype=torch.int32)))
