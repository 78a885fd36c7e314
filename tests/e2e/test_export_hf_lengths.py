"""Causal LMs past the lengths where they change: rope scalings on both sides of their
switch points, and `export-hf --verify` at those lengths.

Every rope scaling transformers has (linear, dynamic NTK, YaRN, LongRoPE with Phi-3's
short and long factors, Llama 3), tiny, with an original context of 64: 24 greedy tokens
equal transformers' after a prompt of 72 (the whole prompt past the switch) and after one
of 56 (the decode steps cross it), in ONNX Runtime GenAI and Transformers.js (the
default folder and `--runtime standard`'s; Transformers.js also as one left-padded
batch), and through `dynamo_export` of the decode step (Phi-3's generation loop aside:
see `reference`). `--verify` reaches past every window, switch
point and scan chunk, says the lengths, and fails on a windowed folder that differs or crashes past
its window with the length where it happened.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from unittest import mock

import pytest
import torch

from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.model_lengths import change_points, context_length, verification_lengths
from fx2onnx.hub.shared.verification import greedy_in_folder, greedy_in_genai
from fx2onnx.hub.decoders.verify_lengths import fresh_rope_state, greedy_in_transformers
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 - the session fixture

transformers = pytest.importorskip("transformers")

COMMON = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=120)
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
ORIGINAL = 64  # the original context every rope scaling here switches at
NEW_TOKENS = 24
# the prompt lengths: past the switch as a whole, and crossing it while decoding
PAST, CROSSING = ORIGINAL + 8, ORIGINAL - 8
BATCH = (PAST, CROSSING, 20)


def rope_config(kind: str):
    """A tiny model whose rope switches at ``ORIGINAL``: dynamic NTK stretches past its
    max_position_embeddings, the others are made for 256 positions."""
    if kind == "longrope":
        half = DECODER["hidden_size"] // DECODER["num_attention_heads"] // 2
        rope = dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=ORIGINAL,
                    short_factor=[1.0 + 0.1 * i for i in range(half)], long_factor=[2.0 + 0.5 * i for i in range(half)])
        return transformers.Phi3Config(**DECODER, **COMMON, max_position_embeddings=256,
                                       original_max_position_embeddings=ORIGINAL, rope_parameters=rope)
    rope = {
        "linear": dict(rope_type="linear", factor=4.0),
        "dynamic": dict(rope_type="dynamic", factor=4.0),
        "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL),
        "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=ORIGINAL),
    }[kind]
    positions = ORIGINAL if kind == "dynamic" else 256
    return transformers.LlamaConfig(**DECODER, **COMMON, max_position_embeddings=positions,
                                    rope_parameters=dict(rope_theta=10000.0, **rope))


def reference(model, prompts: list[list[int]]):
    """transformers' greedy generation; for Phi-3 without the step its generation loop adds
    at the first token past the switch (it drops the cache and reads the whole sequence
    again with the long factors), which no client's loop does (docs/guides/export-hf/text-generation.md)."""
    with contextlib.ExitStack() as stack:
        if isinstance(model, transformers.Phi3ForCausalLM):
            stack.enter_context(mock.patch.object(
                transformers.Phi3ForCausalLM, "prepare_inputs_for_generation", transformers.GenerationMixin.prepare_inputs_for_generation))
        return greedy_in_transformers(model, prompts, NEW_TOKENS, pad=0)


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, COMMON["vocab_size"], (n,), generator=generator).tolist() for n in BATCH]


ROPES = ["linear", "dynamic", "yarn", "longrope", "llama3"]


@pytest.fixture(scope="module", params=[(k, r) for k in ROPES for r in ("onnxruntime", "standard")], ids=lambda p: "-".join(p))
def rope_folder(request, tmp_path_factory):
    """A rope model's folder, written with --verify (which must pass past the switch)."""
    kind, runtime = request.param
    root = tmp_path_factory.mktemp(f"{kind}-{runtime}")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(rope_config(kind)).eval()
    model.save_pretrained(root / "source")
    said: list[str] = []
    result = export_hf(root / "source", root / "out", runtime=runtime, verify=True, say=said.append)
    return kind, runtime, model, root, result, said


def test_verify_passes_past_the_rope_switch(rope_folder):
    kind, runtime, model, root, result, said = rope_folder
    assert result.verification.passed, result.verification.summary()
    lengths = next(line for line in said if line.startswith("verification lengths:"))
    if kind == "linear":  # the same scaling at every length: nothing to pass
        assert "a prompt of 6 tokens, 16 decode steps" in lengths, lengths
    else:
        assert f"a prompt of {ORIGINAL + 8} tokens (past " in lengths and f" {ORIGINAL})" in lengths, lengths


def test_rope_scaling_in_genai_and_transformers_js(rope_folder, transformers_js, tmp_path):  # noqa: F811
    """24 greedy tokens equal transformers' on both sides of the switch in Transformers.js
    (each prompt alone and the left-padded batch) and in ONNX Runtime GenAI (which runs
    both folder kinds: a standard one with past and present apart)."""
    kind, runtime, model, root, _, _ = rope_folder
    single = prompts()[:2]
    expected = [reference(model, [p]).tokens[0] for p in single]
    batch = reference(model, prompts())
    ids = [[0] * (PAST - len(p)) + p for p in prompts()]
    mask = [[0] * (PAST - len(p)) + [1] * len(p) for p in prompts()]
    job = {"folder": str(root / "out"), "task": "text-generation", "prompts": single, "new_tokens": NEW_TOKENS,
           "batch": {"input_ids": ids, "attention_mask": mask}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)
    assert result["generated"] == expected
    assert result["batch_generated"] == batch.tokens
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    for prompt, tokens in zip(single, expected):
        genai = greedy_in_genai(root / "out", [prompt], NEW_TOKENS, logits=True)
        assert genai.tokens[0] == tokens
        # the end of text's column set aside: GenAI's min_length keeps it from being chosen
        kept = [i for i in range(COMMON["vocab_size"]) if i != COMMON["eos_token_id"]]
        for ours, theirs in zip(genai.logits, reference(model, [prompt]).logits):
            torch.testing.assert_close(torch.from_numpy(ours[0, kept]), torch.from_numpy(theirs[0, kept]), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("kind", "module_functions"), [("dynamic", False), ("dynamic", True), ("longrope", False)])
def test_dynamic_ropes_through_dynamo_export(tmp_path, kind, module_functions):
    """The decode step exported with `dynamo_export` at 5 cached and 3 new tokens computes
    its frequencies from the positions it is given: exact before and after the switch."""
    import fx2onnx
    from fx2onnx.hub.decoders import decode_step
    from fx2onnx.hub.loading import LoadedModel

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(rope_config(kind)).eval()
    loaded = LoadedModel(model=model, config=model.config, task="text-generation", folder=tmp_path, fake_context=None)
    options = fx2onnx.ExportOptions(dynamic_shapes=True, module_functions=module_functions)
    rotary = model.model.rotary_emb
    frequencies = rotary.inv_freq.clone()
    program = fx2onnx.dynamo_export(model, **decode_step.decode_step_inputs(loaded), export_options=options)
    # the capture's adapter is undone: the module's own forward and buffer as they were
    assert "forward" not in vars(rotary) and torch.equal(rotary.inv_freq, frequencies)
    program.save(tmp_path / "model.onnx")
    for prompt in prompts()[:2]:
        ours = greedy_in_folder(tmp_path / "model.onnx", [prompt], NEW_TOKENS, pad=0, banned=[COMMON["eos_token_id"]])
        theirs = reference(model, [prompt])
        assert ours.tokens == theirs.tokens
        for a, b in zip(ours.logits, theirs.logits):
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-3, atol=1e-4)
        if kind == "longrope" and len(prompt) == CROSSING:  # Phi-3's generation reads the sequence again past the switch
            generated = greedy_in_transformers(model, [prompt], NEW_TOKENS, pad=0)
            gaps = [float(abs(a - b).max()) for a, b in zip(ours.logits, generated.logits)]
            assert max(gaps[:ORIGINAL - CROSSING]) < 1e-5 < 1e-3 < max(gaps[ORIGINAL - CROSSING:]), gaps


def test_dynamic_rope_state_is_reset_between_generations():
    """transformers' dynamic NTK keeps the frequencies of its longest sequence: a shorter
    generation after a longer one reads stale ones unless the state is made fresh."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(rope_config("dynamic")).eval()
    prompt = prompts()[0]
    first = greedy_in_transformers(model, [prompt], NEW_TOKENS, pad=0)
    rotary = model.model.rotary_emb
    assert rotary.max_seq_len_cached == PAST + NEW_TOKENS - 1
    fresh_rope_state(model)
    assert rotary.max_seq_len_cached == ORIGINAL and torch.equal(rotary.inv_freq, rotary.original_inv_freq)
    again = greedy_in_transformers(model, [prompt], NEW_TOKENS, pad=0)
    assert again.tokens == first.tokens and all(torch.equal(torch.from_numpy(a), torch.from_numpy(b))
                                                for a, b in zip(again.logits, first.logits))


def test_change_points_of_each_family():
    gemma3 = transformers.Gemma3TextConfig(sliding_window=512, max_position_embeddings=4096, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    })
    assert [(p.length, p.what) for p in change_points(gemma3)] == [(512, "sliding window")]
    qwen2 = transformers.Qwen2Config(sliding_window=32, use_sliding_window=False)
    assert change_points(qwen2) == []
    assert [p.length for p in change_points(transformers.Qwen2Config(sliding_window=32, use_sliding_window=True))] == [32]
    assert [p.what for p in change_points(transformers.Llama4TextConfig(attention_chunk_size=128))] == ["attention chunk"]
    # a Mamba2-style mixer scans one chunk, then several: chunk_size or mamba_chunk_size
    assert [(p.length, p.what) for p in change_points(transformers.NemotronHConfig(chunk_size=128))] == [(128, "scan chunk")]
    assert [p.length for p in change_points(transformers.FalconH1Config(mamba_chunk_size=64))] == [64]
    assert verification_lengths(transformers.Mamba2Config(chunk_size=256), 16).prompt == 256 + 8
    assert change_points(transformers.LlamaConfig()) == []  # chunk_size_feed_forward is not a scan's chunk
    # DeepSeek-V4's compressors: an entry per window of 4 and of 128 tokens (its default layers have no sliding one)
    assert [(p.length, p.what) for p in change_points(transformers.DeepseekV4Config())] == [
        (4, "compression window"), (128, "compression window")]
    both = transformers.Phi3Config(sliding_window=24, **DECODER, max_position_embeddings=256,
                                   original_max_position_embeddings=ORIGINAL, rope_parameters=rope_config("longrope").rope_parameters)
    assert [p.length for p in change_points(both)] == [24, ORIGINAL]
    lengths = verification_lengths(both, 16)
    assert (lengths.prompt, lengths.batch, lengths.unreached()) == (72, (72, 48, 18), [])
    assert lengths.describe() == (  # as docs/guides/export-hf/text-generation.md shows it
        "a prompt of 72 tokens (past sliding window 24, LongRoPE's original context 64), 16 decode steps to length 88, "
        "a left-padded batch of 72, 48, 18 tokens")
    assert context_length(rope_config("dynamic")) == 4 * ORIGINAL
    assert context_length(transformers.XLNetConfig()) == 2048  # its -1 says no longest sequence
    # past the context: the prompt is cut so that the decode steps fit, and the points it misses are said
    crossed_by_decoding = verification_lengths(transformers.MistralConfig(**DECODER, sliding_window=250, max_position_embeddings=256), 16)
    assert crossed_by_decoding.prompt == 240 and "the decode steps pass sliding window 250" in crossed_by_decoding.describe()
    beyond = verification_lengths(transformers.MistralConfig(**DECODER, sliding_window=256, max_position_embeddings=256), 16)
    assert beyond.prompt == 6 and "sliding window 256 is not reached within the context of 256" in beyond.describe()


# --verify on a windowed folder that is wrong past its window --------------------------
WINDOW = 16


@pytest.fixture(scope="module")
def windowed_sources(tmp_path_factory):
    """A Mistral with a window of 16 and the same weights without the window, and the
    folder of the latter: a graph that attends to every token (the planted fault)."""
    root = tmp_path_factory.mktemp("windowed")
    torch.manual_seed(0)
    config = transformers.MistralConfig(**DECODER, **COMMON, max_position_embeddings=256, sliding_window=WINDOW)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(root / "windowed")
    model.config.sliding_window = None
    model.save_pretrained(root / "full")
    export_hf(root / "full", root / "full-out")
    return root


def plant(monkeypatch, fault) -> None:
    """Run ``fault(folder)`` on the written folder before --verify runs it."""
    import importlib

    module = importlib.import_module("fx2onnx.hub.export_hf")
    verify = module._verify

    def verify_planted(loaded, folder, *args, **kwargs):
        fault(folder)
        return verify(loaded, folder, *args, **kwargs)

    monkeypatch.setattr(module, "_verify", verify_planted)


def test_verify_fails_on_a_windowed_folder_that_attends_past_its_window(windowed_sources, monkeypatch, capsys):
    def full_attention(folder):
        for name in ("model.onnx", "model.onnx_data"):
            shutil.copy(windowed_sources / "full-out" / "onnx" / name, folder / "onnx" / name)

    plant(monkeypatch, full_attention)
    out = windowed_sources / "out-full-attention"
    assert main(["export-hf", str(windowed_sources / "windowed"), "--output", str(out), "--verify", "--tokens", "8"]) == 1
    captured = capsys.readouterr()
    assert f"verification lengths: a prompt of {WINDOW + 8} tokens (past sliding window {WINDOW})" in captured.out
    found = re.search(r"verification failed: largest difference \S+ after (\d+) tokens \(\S+ times the tolerance", captured.err)
    assert found and int(found[1]) > WINDOW, captured.err
    assert "Traceback" not in captured.err and f"the folder {out} is kept as written" in captured.err
    assert (out / "genai_config.json").is_file() and not [p for p in out.parent.iterdir() if ".partial-" in p.name]


def crash_past_the_window(path) -> None:
    """Make the graph at ``path`` read a table of ``WINDOW + 1`` rows at each position."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    rows = onnx.helper.make_tensor("planted.rows", onnx.TensorProto.FLOAT, [WINDOW + 1], [0.0] * (WINDOW + 1))
    model.graph.initializer.append(rows)
    logits = next(o for o in model.graph.output if o.name == "logits")
    for node in model.graph.node:
        node.output[:] = ["logits.clean" if n == "logits" else n for n in node.output]
    model.graph.node.extend([
        onnx.helper.make_node("Gather", ["planted.rows", "position_ids"], ["planted.gathered"]),
        onnx.helper.make_node("ReduceSum", ["planted.gathered"], ["planted.zero"], keepdims=0),
        onnx.helper.make_node("Add", ["logits.clean", "planted.zero"], [logits.name]),
    ])
    onnx.save(model, str(path))


def test_verify_fails_on_a_windowed_folder_that_crashes_past_its_window(windowed_sources, monkeypatch, capsys):
    """The folder's graph reads a table of ``WINDOW + 1`` rows at each position, as the
    folders that crashed past their window did: the runtime's error is stated with its length."""
    plant(monkeypatch, lambda folder: crash_past_the_window(folder / "onnx" / "model.onnx"))
    out = windowed_sources / "out-crash"
    assert main(["export-hf", str(windowed_sources / "windowed"), "--output", str(out), "--verify", "--tokens", "8"]) == 1
    err = capsys.readouterr().err
    found = re.search(r"verification failed: onnxruntime failed at sequence length (\d+) \((the prefill|decode step \d+)\)", err)
    assert found and int(found[1]) > WINDOW, err
    assert "Traceback" not in err and (out / "onnx" / "model.onnx").is_file()


def test_verify_names_genai_windowed_decoder_when_it_crashes(windowed_sources, monkeypatch, capsys):
    """The folder's model is sound and ONNX Runtime GenAI's own decoder (the windowed cache's,
    named by genai_config.json) crashes past the window: --verify runs it too and says which
    file failed."""
    from fx2onnx.hub.shared.genai_config import genai_decoder_file

    planted = []

    def crash_genai_decoder(folder):
        planted.append(genai_decoder_file(folder))
        crash_past_the_window(folder / planted[0])

    plant(monkeypatch, crash_genai_decoder)
    out = windowed_sources / "out-genai-crash"
    assert main(["export-hf", str(windowed_sources / "windowed"), "--output", str(out), "--verify", "--tokens", "8"]) == 1
    err = capsys.readouterr().err
    assert planted == ["onnx/model_windowed_cache.onnx"]
    found = re.search(r"verification failed: onnx/model_windowed_cache.onnx: onnxruntime failed at sequence length (\d+)", err)
    assert found and int(found[1]) > WINDOW, err
    assert "Traceback" not in err


def test_verify_passes_on_the_windowed_folder_as_written(windowed_sources, capsys):
    """The same windowed model's folder as export-hf writes it passes --verify at the
    lengths past its window that the planted folders above fail at."""
    out = windowed_sources / "out-as-written"
    assert main(["export-hf", str(windowed_sources / "windowed"), "--output", str(out), "--verify", "--tokens", "8"]) == 0
    captured = capsys.readouterr()
    assert f"verification lengths: a prompt of {WINDOW + 8} tokens (past sliding window {WINDOW})" in captured.out
    assert re.search(r"verification: largest difference \S+ after \d+ tokens \(within the tolerance .*\), greedy tokens equal", captured.out), captured.out
