"""Sliding-window attention exact past the window, in every client of an `export-hf` folder.

Tiny models of every family transformers ships with a sliding window (all layers as
Mistral and Phi-3; some layers as Qwen2's `use_sliding_window`; local and global layers
interleaved as Gemma 2, Gemma 3 text, Cohere 2 and gpt-oss, the last with its attention
sinks), windows of 16 to 32 tokens: after a prompt of twice the window plus 8, 24 greedy
tokens equal transformers' in ONNX Runtime GenAI (the default folder; a batch padded on
the right, as it pads) and in Transformers.js (the same folder; a batch padded on the
left, as it pads), each prompt alone and 3 prompts of different lengths as one batch.
A `--runtime standard` folder does the same in both clients, and a decode step exported
with `fx2onnx.dynamo_export` over a cache past the window matches transformers step by
step in onnxruntime."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnx
import pytest
import torch

import fx2onnx
from conftest import ATOL, RTOL, all_nodes, check_saved_model
from fx2onnx.hub.decoders.decode_step import cache_argument
from fx2onnx.hub.decoders.windowed_cache import windowed_decoder_file
from fx2onnx.hub.shared.verification import greedy_in_genai
from fx2onnx.hub import export_hf
from test_padded_batches import onnx_step
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 - the fixture

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

NEW_TOKENS = 24
PAD, VOCAB = 0, 300
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=256, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=PAD)
INTERLEAVED = ["sliding_attention", "full_attention"]


def config_of(family: str, window: int) -> transformers.PreTrainedConfig:
    """A two-layer config of ``family`` whose sliding layers see ``window`` tokens."""
    made = {
        "mistral": lambda: transformers.MistralConfig(**DECODER, sliding_window=window),
        "phi3": lambda: transformers.Phi3Config(**DECODER, sliding_window=window),
        # layer 0 full, layer 1 sliding (layers from max_window_layers on slide)
        "qwen2": lambda: transformers.Qwen2Config(**DECODER, use_sliding_window=True, sliding_window=window, max_window_layers=1),
        "gemma2": lambda: transformers.Gemma2Config(**DECODER, head_dim=16, sliding_window=window),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(**DECODER, head_dim=16, sliding_window=window,
                                                             layer_types=INTERLEAVED),
        # larger weights: at the default scale its tiny model repeats one token, window or not
        "cohere2": lambda: transformers.Cohere2Config(**DECODER, sliding_window=window, layer_types=INTERLEAVED,
                                                      initializer_range=0.1),
        "gpt_oss": lambda: transformers.GptOssConfig(**DECODER, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                     sliding_window=window),
    }
    return made[family]()


# each family's window, 16 to 32 tokens
WINDOWS = {"mistral": 16, "phi3": 20, "qwen2": 24, "gemma2": 16, "gemma3_text": 16, "cohere2": 24, "gpt_oss": 32}


def prompts_for(window: int) -> list[list[int]]:
    """A prompt of twice the window plus 8, and two shorter ones for the batch (one past the
    window, one inside it), random ids that are not the pad token."""
    generator = torch.Generator().manual_seed(window)
    return [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in (2 * window + 8, window + 5, 9)]


def padded(prompts: list[list[int]], side: str) -> tuple[list[list[int]], list[list[int]]]:
    width = max(map(len, prompts))
    rows, masks = [], []
    for p in prompts:
        pad = [PAD] * (width - len(p))
        rows.append(pad + p if side == "left" else p + pad)
        masks.append([0] * len(pad) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * len(pad))
    return rows, masks


def greedy(model: torch.nn.Module, rows: list[list[int]], masks: list[list[int]]) -> list[list[int]]:
    ids = torch.tensor(rows)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.tensor(masks), do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    return out[:, ids.shape[1]:].tolist()


def expected_tokens(model: torch.nn.Module, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """transformers' tokens for each prompt alone, and for the left-padded batch of them."""
    alone = [greedy(model, [p], [[1] * len(p)])[0] for p in prompts]
    return alone, greedy(model, *padded(prompts, "left"))


def model_of(family: str, window: int) -> torch.nn.Module:
    """A tiny random model of ``family``; gpt-oss's sinks of the size of its scores (at the
    default scale they take about one part in the sequence's length of each query's
    attention, too little to change a greedy token)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_of(family, window)).eval()
    for layer in model.model.layers if family == "gpt_oss" else ():
        torch.nn.init.normal_(layer.self_attn.sinks, std=2.0)
    return model


def without_sinks(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a gpt-oss ``model`` whose sinks take no attention."""
    sinkless = copy.deepcopy(model)
    for layer in sinkless.model.layers:
        torch.nn.init.constant_(layer.self_attn.sinks, -1e4)
    return sinkless


def exported_folder(root, family: str, runtime: str = "onnxruntime", window: int | None = None) -> tuple[torch.nn.Module, object]:
    model = model_of(family, window or WINDOWS[family])
    model.save_pretrained(root / "source")
    export_hf(root / "source", root / "out", runtime=runtime)
    onnx.checker.check_model(os.fspath(root / "out" / "onnx" / "model.onnx"), full_check=True)
    return model, root / "out"


@pytest.fixture(scope="module", params=list(WINDOWS))
def folder(request, tmp_path_factory):
    family = request.param
    model, out = exported_folder(tmp_path_factory.mktemp(family), family)
    prompts = prompts_for(WINDOWS[family])
    return family, model, out, prompts, expected_tokens(model, prompts)


def generate_with_genai(folder, rows: list[list[int]]) -> list[list[int]]:
    """NEW_TOKENS greedy tokens for each row of one batch (ONNX Runtime GenAI reads PAD as padding)."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    return greedy_in_genai(folder, rows, NEW_TOKENS).tokens


def check_in_genai(out, prompts, expected) -> None:
    alone, batch = expected
    for prompt, tokens in zip(prompts, alone):
        assert generate_with_genai(out, [prompt])[0] == tokens, len(prompt)
    # ONNX Runtime GenAI pads a batch on the right: the padding sits between a short row's
    # prompt and its new tokens, inside the window
    assert generate_with_genai(out, padded(prompts, "right")[0]) == batch


def check_in_transformers_js(prefix, scratch, out, prompts, expected) -> None:
    alone, batch = expected
    ids, mask = padded(prompts, "left")
    job = {"folder": os.fspath(out), "task": "text-generation", "prompts": prompts, "new_tokens": NEW_TOKENS,
           "batch": {"input_ids": ids, "attention_mask": mask}}
    result = run_in_transformers_js(prefix, scratch, job)
    assert result["generated"] == alone
    assert result["batch_generated"] == batch


def test_the_window_changes_the_tokens(folder):
    """The prompts reach the hard region: without its window the model generates other tokens."""
    family, model, _, prompts, (alone, _) = folder
    windowless = copy.deepcopy(model)
    windowless.config.sliding_window = 10_000
    assert greedy(windowless, [prompts[0]], [[1] * len(prompts[0])])[0] != alone[0], family
    if family == "gpt_oss":  # nor without its sinks
        assert greedy(without_sinks(model), [prompts[0]], [[1] * len(prompts[0])])[0] != alone[0]


def test_attention_sinks_are_the_kernels_head_sink(folder):
    """gpt-oss's every layer runs onnxruntime's GroupQueryAttention (with and without the
    padding's bias) with its sinks as `head_sink`, so past and present are one buffer, and
    its experts as onnxruntime's MoE; no other family's kernel has sinks."""
    family, model, out, _, _ = folder
    nodes = list(all_nodes(onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False)))
    kernels = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    experts = [n for n in nodes if n.op_type == "MoE"]
    assert len(experts) == (model.config.num_hidden_layers if family == "gpt_oss" else 0)
    sinks = [n.input[11] for n in kernels if len(n.input) > 11 and n.input[11]]
    if family != "gpt_oss":
        assert sinks == []
        return
    layers = model.config.num_hidden_layers
    assert sinks == [f"model.layers.{i}.self_attn.sinks" for i in range(layers) for _ in range(2)] and len(kernels) == 2 * layers
    windows = [next((a.i for a in n.attribute if a.name == "local_window_size"), None) for n in kernels]
    assert windows == [WINDOWS[family] if kind == "sliding_attention" else None for kind in model.config.layer_types for _ in range(2)]
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is True


def test_every_layer_runs_group_query_attention(folder):
    """Every layer's attention is onnxruntime's GroupQueryAttention (with and without the
    padding's bias), so ONNX Runtime GenAI shares one buffer for past and present; Cohere 2's
    sliding layers rotate their interleaved pairs inside the kernel (`rotary_interleaved`).
    Gemma 2's soft-capped logits keep the standard form, its cache returned anew (the
    export-hf guide)."""
    family, model, out, _, _ = folder
    nodes = list(all_nodes(onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False)))
    kernels = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    layers = [int(n.name.split(".")[2]) for n in kernels]
    fused = family != "gemma2"
    assert sorted(layers) == [i for i in range(model.config.num_hidden_layers) for _ in range(2 * fused)], family
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is fused
    if family == "cohere2":  # rotated by its sliding layers only, pairs interleaved
        rotating = [n for n in kernels if any(a.name == "do_rotary" and a.i for a in n.attribute)]
        interleaved = [n for n in nodes if n.op_type == "RotaryEmbedding"] + rotating
        assert rotating and all(any(a.name in ("interleaved", "rotary_interleaved") and a.i == 1 for a in n.attribute)
                                for n in interleaved)
        check_rotating_kernel_logits(model, out, folder[3][0])


def check_rotating_kernel_logits(model, out, prompt: list[int]) -> None:
    """An unpadded batch of a prompt past the window and 2 decode steps: the kernels that
    rotate the pairs themselves run (seen in the profiler), and the logits equal transformers'."""
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, os.fspath(out / "rotating")
    session = ort.InferenceSession(os.fspath(out / "onnx" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    ids = torch.tensor([prompt, prompt[::-1]])
    mask, cache, torch_cache = torch.ones_like(ids), None, None
    for _ in range(3):
        logits, cache = onnx_step(session, ids, mask, cache)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask, use_cache=True,
                             **({cache_argument(model): torch_cache} if torch_cache is not None else {}))
        np.testing.assert_allclose(logits, expected.logits.numpy(), rtol=RTOL, atol=ATOL)
        torch_cache, ids = expected.past_key_values, expected.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones_like(ids)], 1)
    events = json.loads(open(session.end_profiling()).read())
    assert {e["name"].rsplit("/", 1)[-1].removesuffix("_kernel_time") for e in events if e.get("cat") == "Node"
            and e.get("args", {}).get("op_name") == "GroupQueryAttention"} == {"unpadded_kernel"}


def test_onnxruntime_genai_generates_transformers_tokens_past_the_window(folder):
    family, _, out, prompts, expected = folder
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["max_length"] >= 2 * WINDOWS[family] + 8 + NEW_TOKENS
    check_in_genai(out, prompts, expected)


def steps_equal_transformers(session, model, cache: dict, steps: list) -> torch.Tensor:
    """Run ``steps`` (new ids and their mask for a batch of 3, or None for each row's next
    greedy token, or "gap" for 2 tokens a row, row 1's first one padding) from ``cache``:
    each row's logits at its held tokens equal transformers' for the row alone. Returns the mask."""
    alone, mask, last = [None] * 3, None, None
    for step in steps:
        if step is None:
            ids, new_mask = last, torch.ones(3, 1, dtype=torch.int64)
        elif step == "gap":
            ids = torch.cat([last + 1, last], 1) % VOCAB
            ids[1, 0] = PAD
            new_mask = torch.tensor([[1, 1], [0, 1], [1, 1]])
        else:
            ids, new_mask = step
        mask = new_mask if mask is None else torch.cat([mask, new_mask], 1)
        logits, cache = onnx_step(session, ids, mask, cache)
        tokens = []
        for b in range(3):
            held = new_mask[b].bool()
            with torch.no_grad():
                expected = model(input_ids=ids[b][held][None], past_key_values=alone[b], use_cache=True)
            np.testing.assert_allclose(logits[b][held.numpy()], expected.logits[0].numpy(), rtol=RTOL, atol=ATOL)
            alone[b] = expected.past_key_values
            tokens.append(expected.logits[0, -1].argmax())
        last = torch.stack(tokens)[:, None]
    return mask


def genai_buffer_lengths(out, rows: list[list[int]], max_length: int) -> list[int]:
    """The length of each layer's key buffer ONNX Runtime GenAI gives the folder's decoder."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    model = og.Model(os.fspath(out))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length, batch_size=len(rows))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(rows, dtype=np.int32))
    generator.generate_next_token()
    layers = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["num_hidden_layers"]
    return [generator.get_output(f"present.{i}.key").shape[2] for i in range(layers)]


def test_genai_decoder_holds_a_window_and_its_exact_form_writes_the_kernels_layout(folder, tmp_path):
    """ONNX Runtime GenAI's decoder (`genai_config.json`'s file) gives its sliding layers a
    window-sized cache, listed in the config's `sliding_window` section: the runtime gives
    them a buffer of the window plus 16 slots, the full layers one of the whole length.
    Fed as the runtime feeds it (those buffers, the present fed back), each row's logits
    equal transformers' for the row alone through a left-padded prompt and a step of 2
    tokens with a gap before a held one (the exact form, which the kernel cannot take)
    and decode steps between and after (the kernel, reading what the exact form wrote),
    past the buffer's length; and on a buffer shorter than the window (the kernel without
    the windowed cache). All three seen in the profiler. Gemma 2 (no kernel) keeps the
    folder's decoder."""
    family, model, out, prompts, _ = folder
    config = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    window = WINDOWS[family]
    layer_types = getattr(model.config, "layer_types", None) or ["sliding_attention"] * 2
    sliding = [1] if family == "qwen2" else [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if family == "gemma2":
        assert config["filename"] == "onnx/model.onnx" and "sliding_window" not in config
        return
    assert config["filename"] == windowed_decoder_file("onnx/model.onnx") == "onnx/model_windowed_cache.onnx"
    assert config["sliding_window"] == {"window_size": window, "slide_key_value_cache": False, "slide_inputs": False,
                                        "layers": sliding, "cache_slack": 0}
    path = os.fspath(out / config["filename"])
    onnx.checker.check_model(path, full_check=True)
    graph = onnx.load(path, load_external_data=False).graph
    lengths = {i.name: i.type.tensor_type.shape.dim[2].dim_param for i in graph.input if i.name.startswith("past_key_values.")}
    assert {name for name, dim in lengths.items() if dim == "window_cache_length"} == {
        f"past_key_values.{i}.{kind}" for i in sliding for kind in ("key", "value")}
    longest = len(prompts[0]) + 8
    buffers = [window + 16 if i in sliding else longest for i in range(model.config.num_hidden_layers)]
    assert genai_buffer_lengths(out, padded(prompts, "right")[0], longest) == buffers
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, os.fspath(tmp_path / "windowed")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def buffers_of(lengths: list[int]) -> dict[str, np.ndarray]:
        return {i.name: np.zeros((3, i.shape[1], lengths[int(i.name.split(".")[1])], i.shape[3]), np.float32)
                for i in session.get_inputs() if i.name.startswith("past_key_values.")}

    rows, masks = padded(prompts, "left")
    mask = steps_equal_transformers(session, model, buffers_of(buffers),
                                    [(torch.tensor(rows), torch.tensor(masks)), None, None, None, "gap", None, None, None])
    assert mask.sum(1).max() > window + 16  # past the buffer's length
    size = window - 8  # 3 rows of that many tokens on buffers of window - 4 slots: 4 steps fit
    short = [prompts[0][i * size:(i + 1) * size] for i in range(3)]
    ids = torch.tensor(short)
    steps_equal_transformers(session, model, buffers_of([window - 4] * len(buffers)), [(ids, torch.ones_like(ids)), None, None])
    events = json.loads(open(session.end_profiling()).read())
    ran = {e["name"] for e in events if e.get("cat") == "Node"}
    assert {kind for kind in ("/windowed_kernel", "/held_kernel", "/held_exact/Attention") if any(kind in n for n in ran)} == {
        "/windowed_kernel", "/held_kernel", "/held_exact/Attention"}


def test_transformers_js_generates_transformers_tokens_past_the_window(folder, tmp_path, transformers_js):
    _, _, out, prompts, expected = folder
    check_in_transformers_js(transformers_js, tmp_path, out, prompts, expected)


@pytest.mark.parametrize("family", ["gpt_oss"])
def test_runtime_standard_folder_past_the_window(tmp_path, family, transformers_js):
    """Standard ONNX operators only (no onnxruntime kernels), in both clients."""
    model, out = exported_folder(tmp_path, family, runtime="standard")
    domains = {node.domain for node in onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False).graph.node}
    assert domains <= {"", "ai.onnx"}
    prompts = prompts_for(WINDOWS[family])
    expected = expected_tokens(model, prompts)
    check_in_genai(out, prompts, expected)
    check_in_transformers_js(transformers_js, tmp_path, out, prompts, expected)


def test_a_window_of_a_few_tokens(tmp_path):
    """No window is too small: 4 tokens, a prompt of 3 windows, in ONNX Runtime GenAI."""
    model, out = exported_folder(tmp_path, "gemma3_text", window=4)
    prompt = prompts_for(4)[0][:12]
    tokens = greedy(model, [prompt], [[1] * len(prompt)])[0]
    windowless = copy.deepcopy(model)
    windowless.config.sliding_window = 10_000
    assert greedy(windowless, [prompt], [[1] * len(prompt)])[0] != tokens
    assert generate_with_genai(out, [prompt])[0] == tokens


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    """A Gemma 3 text folder: layer 0 slides (window 16), layer 1 is full (module functions
    on and off: tests/unit/fx_passes/test_fused_kernels.py)."""
    return exported_folder(tmp_path_factory.mktemp("gemma3-branches"), "gemma3_text")


def kernels_that_ran(session, windows: dict[str, int | None]) -> set[tuple[int | None, str]]:
    """(window, branch) of each GroupQueryAttention onnxruntime's profiler saw run, from
    ``windows``, each kernel's `local_window_size` by node name."""
    events = json.loads(open(session.end_profiling()).read())
    names = {e["name"].removesuffix("_kernel_time") for e in events
             if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "GroupQueryAttention"}
    return {(windows[name], name.rsplit("/", 1)[-1]) for name in names}


SLIDING = WINDOWS["gemma3_text"]


@pytest.mark.parametrize(("side", "branches"), [
    # no row padded: both layers' kernels without the bias, the sliding one with its window
    ("none", {(SLIDING, "unpadded_kernel"), (None, "unpadded_kernel")}),
    # padding before the held tokens only: the window counted in cache slots is the model's
    ("left", {(SLIDING, "kernel"), (None, "kernel")}),
    # padding after a held token: the sliding layer's exact form (no kernel), the full layer's kernel
    ("right", {(None, "kernel")}),
])
def test_the_windowed_kernel_and_its_exact_form_equal_transformers(gemma3_folder, tmp_path, side, branches):
    """The folder's sliding layer runs onnxruntime's GroupQueryAttention with
    `local_window_size` where no row has padding after a held token, its exact form
    otherwise (chosen at run time, seen in the profiler): for a batch of prompts past the
    window and 4 decode steps, each row's logits equal transformers' for the row alone."""
    model, out = gemma3_folder
    nodes = [n for n in all_nodes(onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False))
             if n.op_type == "GroupQueryAttention"]
    windows = {n.name: next((a.i for a in n.attribute if a.name == "local_window_size"), None) for n in nodes}
    assert sorted(windows.values(), key=str) == [SLIDING, SLIDING, None, None]  # with and without the bias, each layer
    prompts = prompts_for(WINDOWS["gemma3_text"])
    if side == "none":
        prompts = [prompts[0], prompts[0][::-1]]
    rows, masks = padded(prompts, "left" if side == "none" else side)
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, os.fspath(tmp_path / "profile")
    session = ort.InferenceSession(os.fspath(out / "onnx" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    ids, mask = torch.tensor(rows), torch.tensor(masks)
    logits, cache = onnx_step(session, ids, mask, None)
    alone = []  # each row alone in transformers: (its cache, its next token)
    for b, prompt in enumerate(prompts):
        held = mask[b].bool()
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([prompt]), use_cache=True)
        np.testing.assert_allclose(logits[b][held.numpy()], expected.logits[0].numpy(), rtol=RTOL, atol=ATOL)
        alone.append([expected.past_key_values, expected.logits[0, -1].argmax()])
    for _ in range(4):
        step = torch.stack([token for _, token in alone])[:, None]
        mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
        logits, cache = onnx_step(session, step, mask, cache)
        for b, (row_cache, token) in enumerate(alone):
            with torch.no_grad():
                expected = model(input_ids=token.view(1, 1), past_key_values=row_cache, use_cache=True)
            np.testing.assert_allclose(logits[b, -1], expected.logits[0, -1].numpy(), rtol=RTOL, atol=ATOL)
            alone[b] = [expected.past_key_values, expected.logits[0, -1].argmax()]
    assert kernels_that_ran(session, windows) == branches


def cache_feed(cache) -> dict[str, np.ndarray]:
    return {f"past_key_values.{i}.{kind}": getattr(layer, f"{kind}s").numpy()
            for i, layer in enumerate(cache.layers) for kind in ("key", "value")}


@pytest.mark.parametrize("family, own_cache", [("gemma3_text", True), ("mistral", False)])
def test_a_decode_step_exported_past_the_window(tmp_path, family, own_cache):
    """`fx2onnx.dynamo_export` of one decode step over a cache past the window, run for 12
    steps in onnxruntime with its `present.*` fed back, a left-padded row beside a full
    one: logits equal transformers' at every step. With transformers' own cache
    (local and global layers) a sliding layer's cache keeps window - 1 tokens; a model
    whose every layer slides is exported over a cache that grows (`DynamicCache()`)."""
    torch.manual_seed(0)
    window = WINDOWS[family]
    model = transformers.AutoModelForCausalLM.from_config(config_of(family, window)).eval()
    length = 2 * window + 8
    ids = torch.randint(3, VOCAB, (2, length + 1), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length + 1, dtype=torch.int64)
    mask[1, :window // 2] = 0
    argument = cache_argument(model)
    with torch.no_grad():
        prefill = model(input_ids=ids[:, :length], attention_mask=mask[:, :length], use_cache=True,
                        **({} if own_cache else {argument: transformers.DynamicCache()}))
    cache = prefill.past_key_values
    sliding = [layer.keys.shape[2] for layer in cache.layers]
    assert (min(sliding), max(sliding)) == ((window - 1, length) if own_cache else (length, length))
    program = fx2onnx.dynamo_export(
        model, input_ids=ids[:, length:], attention_mask=mask, use_cache=True, **{argument: copy.deepcopy(cache)},
        export_options=fx2onnx.ExportOptions(dynamic_shapes=True),
    )
    session = ort.InferenceSession(os.fspath(check_saved_model(program, tmp_path / "step.onnx")),
                                   providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    step, past = ids[:, length:], cache_feed(cache)
    for _ in range(12):
        run = dict(zip(outputs, session.run(None, {"input_ids": step.numpy(), "attention_mask": mask.numpy(), **past})))
        with torch.no_grad():
            expected = model(input_ids=step, attention_mask=mask, use_cache=True, **{argument: cache})
        np.testing.assert_allclose(run["logits"], expected.logits.numpy(), rtol=RTOL, atol=ATOL)
        cache = expected.past_key_values
        past = {name: run[name.replace("past_key_values.", "present.")] for name in past}
        step = expected.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)

