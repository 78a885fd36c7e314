"""Causal LM folders give transformers' answer for every attention mask it accepts.

For each runtime's folder (`export-hf` default: onnxruntime's GroupQueryAttention; and
`--runtime standard`): a left-padded batch of prompts (as transformers and Transformers.js
pad for generation) decoded greedily in onnxruntime, feeding `present.*` back, equals
`model.generate` with the same mask; a right-padded batch (as ONNX Runtime GenAI pads)
equals the model on its prompt and on a step after it; several new tokens over a cache at
batch 3 equal the model's; and ONNX Runtime GenAI, which pads a batch on the right,
generates transformers' tokens for every row."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.decode_step import cache_argument
from fx2onnx.hub.shared.verification import greedy_in_genai

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

PAD = 0
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15], [16, 17]]
NEW_TOKENS = 8
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=256, vocab_size=300, bos_token_id=1, eos_token_id=2, pad_token_id=PAD)
# Cohere: its pairs rotated interleaved, inside the kernel and out
CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "phi3": transformers.Phi3Config,
           "cohere": transformers.CohereConfig}


def padded(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """PROMPTS as one batch padded on ``side``, and its attention mask."""
    width = max(map(len, PROMPTS))
    rows = [[PAD] * (width - len(p)) + p if side == "left" else p + [PAD] * (width - len(p)) for p in PROMPTS]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * (width - len(p))
                         for p in PROMPTS])
    return torch.tensor(rows), mask


def positions(mask: torch.Tensor, new: int) -> torch.Tensor:
    """The position ids transformers' `generate` gives the last ``new`` tokens of ``mask``."""
    held = mask.cumsum(-1) - 1
    return held.masked_fill(mask == 0, 1)[:, -new:]


def onnx_step(session, ids: torch.Tensor, mask: torch.Tensor, cache: dict | None) -> tuple[np.ndarray, dict]:
    """One run of the folder's model: logits and the cache to feed back (present.* as past)."""
    inputs = {i.name: i for i in session.get_inputs()}
    if cache is None:  # an empty cache: (batch, heads, 0, head size)
        cache = {n: np.zeros((ids.shape[0], i.shape[1], 0, i.shape[3]), np.float32) for n, i in inputs.items() if n.startswith("past")}
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": positions(mask, ids.shape[1]).numpy(), **cache}
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {n: feed[n] for n in inputs})))
    return outputs["logits"], {n: outputs[n.replace("past_key_values.", "present.")] for n in cache}


def torch_step(model, ids: torch.Tensor, mask: torch.Tensor, cache) -> tuple[np.ndarray, object]:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask, ids.shape[1]), use_cache=True,
                    **({cache_argument(model): cache} if cache is not None else {}))
    return out.logits.numpy(), out.past_key_values


def steps_with_positions(model, session, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each (ids, mask, position ids) over the cache of the steps before it, in the
    folder's model and in transformers: (onnxruntime's logits, transformers')."""
    shapes = {i.name: i.shape for i in session.get_inputs() if i.name.startswith("past")}
    cache = {n: np.zeros((steps[0][0].shape[0], shape[1], 0, shape[3]), np.float32) for n, shape in shapes.items()}
    torch_cache, results = None, []
    for ids, mask, at in steps:
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": at.numpy(), **cache}
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        cache = {n: outputs[n.replace("past_key_values.", "present.")] for n in cache}
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=at, use_cache=True,
                        **({cache_argument(model): torch_cache} if torch_cache is not None else {}))
        torch_cache = out.past_key_values
        results.append((outputs["logits"], out.logits.numpy()))
    return results


def generate_with_genai(folder, rows: torch.Tensor) -> list[list[int]]:
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    return greedy_in_genai(folder, rows.tolist(), NEW_TOKENS, ends_early=True).tokens


@pytest.fixture(scope="module", params=[("llama", "onnxruntime"), ("llama", "standard"), ("qwen2", "onnxruntime"),
                                        ("phi3", "onnxruntime"), ("cohere", "onnxruntime")], ids=lambda p: "-".join(p))
def exported(request, tmp_path_factory):
    family, runtime = request.param
    root = tmp_path_factory.mktemp(f"{family}-{runtime}")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](**DECODER)).eval()
    if family == "qwen2":  # biases of Q and K through every branch; V's stays zeros (left out of the folder)
        with torch.no_grad():
            for layer in model.model.layers:
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    projection.bias.normal_(std=0.5)
    model.save_pretrained(root / "source")
    export_hf(root / "source", root / "out", runtime=runtime)
    session = ort.InferenceSession(os.fspath(root / "out" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    return model, root / "out", session, runtime


def test_the_folder_adds_the_biases_that_are_not_zeros(exported):
    """A bias of zeros (Qwen2's V here) changes no number: the folder leaves it out and
    keeps every other."""
    model, folder, _, _ = exported
    graph = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    read = {name for node in graph.node for name in node.input}
    in_file = {t.name for t in graph.initializer if t.name.endswith(".bias") and t.name in read}
    held = {name for name, p in model.named_parameters() if name.endswith(".bias") and bool(p.abs().max() > 0)}
    zeros = {name for name, p in model.named_parameters() if name.endswith(".bias") and not bool(p.abs().max() > 0)}
    assert in_file == held and not in_file & zeros
    if isinstance(model.config, transformers.Qwen2Config):
        assert len(held) == 4 and len(zeros) == 2  # two layers


def test_a_left_padded_batch_generates_transformers_tokens(exported):
    model, _, session, _ = exported
    ids, mask = padded("left")
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  pad_token_id=PAD)[:, ids.shape[1]:]
    tokens, step, cache = [], ids, None
    for _ in range(NEW_TOKENS):
        logits, cache = onnx_step(session, step, mask, cache)
        step = torch.from_numpy(logits[:, -1].argmax(-1))[:, None]
        tokens.append(step)
        mask = torch.cat([mask, torch.ones_like(step)], 1)
    assert torch.cat(tokens, 1).tolist() == expected.tolist()


def test_a_right_padded_prompt_and_the_step_after_it(exported):
    model, _, session, _ = exported
    ids, mask = padded("right")
    logits, cache = onnx_step(session, ids, mask, None)
    expected, torch_cache = torch_step(model, ids, mask, None)
    held = mask.bool().numpy()  # the padding's logits are no token's
    np.testing.assert_allclose(logits[held], expected[held], rtol=1e-4, atol=1e-4)
    step, mask = torch.tensor([[20], [21], [22]]), torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
    logits, _ = onnx_step(session, step, mask, cache)
    expected, _ = torch_step(model, step, mask, torch_cache)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_padding_with_positions_in_the_kernels_order(exported):
    """Every row's positions ``total - S .. total - 1`` (what the kernel assumes), but a mask
    with padding: the mask, not the positions, says the kernel without the bias may not
    run (a left-padded prompt, then a step over its cache)."""
    model, _, session, _ = exported
    ids, mask = padded("left")
    longer = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
    in_order = [torch.arange(m.shape[1] - n, m.shape[1])[None].repeat(3, 1) for m, n in ((mask, ids.shape[1]), (longer, 1))]
    steps = [(ids, mask, in_order[0]), (torch.tensor([[20], [21], [22]]), longer, in_order[1])]
    for (actual, expected), (_, step_mask, at) in zip(steps_with_positions(model, session, steps), steps):
        held = step_mask[:, -at.shape[1]:].bool().numpy()  # the padding's logits are no token's
        np.testing.assert_allclose(actual[held], expected[held], rtol=1e-4, atol=1e-4)


def test_several_new_tokens_over_a_cache_at_batch_3(exported):
    """onnxruntime's kernel refuses this step: the folder takes the standard form for it."""
    model, _, session, _ = exported
    ids, mask = padded("left")
    _, cache = onnx_step(session, ids, mask, None)
    _, torch_cache = torch_step(model, ids, mask, None)
    more, mask = torch.tensor([[20, 21, 22], [23, 24, 25], [26, 27, 28]]), torch.cat([mask, torch.ones(3, 3, dtype=mask.dtype)], 1)
    logits, cache = onnx_step(session, more, mask, cache)
    expected, torch_cache = torch_step(model, more, mask, torch_cache)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    step, mask = torch.tensor([[30], [31], [32]]), torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
    logits, _ = onnx_step(session, step, mask, cache)  # and a decode step over the cache it wrote
    np.testing.assert_allclose(logits, torch_step(model, step, mask, torch_cache)[0], rtol=1e-4, atol=1e-4)


def test_onnxruntime_genai_generates_transformers_tokens_for_a_batch(exported):
    """ONNX Runtime GenAI pads a batch on the right (its mask and positions from the pad
    token at the end), past and present one buffer for the default folder."""
    model, folder, _, runtime = exported
    shared = json.loads((folder / "genai_config.json").read_text())["search"]["past_present_share_buffer"]
    assert shared is (runtime == "onnxruntime")
    ids, mask = padded("left")
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  pad_token_id=PAD)[:, ids.shape[1]:]
    assert generate_with_genai(folder, padded("right")[0]) == expected.tolist()


def _kernels_run(folder, ids: torch.Tensor, mask: torch.Tensor) -> set[str]:
    """The GroupQueryAttention nodes onnxruntime's profiler saw run for one prompt."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.fspath(folder / "profile")
    session = ort.InferenceSession(os.fspath(folder / "onnx" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    onnx_step(session, ids, mask, None)
    events = json.loads(open(session.end_profiling()).read())
    return {e["name"].removesuffix("_kernel_time").rsplit("/", 1)[-1] for e in events
            if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "GroupQueryAttention"}


def test_an_unpadded_batch_takes_the_kernel_without_the_bias(exported, tmp_path):
    """No row padded: the kernel runs without the attention bias (exact: the bias is all
    zeros); a padded batch takes the kernel with it. Both give transformers' logits."""
    model, folder, session, runtime = exported
    ids, mask = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]), torch.ones(3, 4, dtype=torch.int64)
    logits, cache = onnx_step(session, ids, mask, None)
    expected, torch_cache = torch_step(model, ids, mask, None)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    step, mask = torch.tensor([[20], [21], [22]]), torch.ones(3, 5, dtype=torch.int64)
    logits, _ = onnx_step(session, step, mask, cache)
    np.testing.assert_allclose(logits, torch_step(model, step, mask, torch_cache)[0], rtol=1e-4, atol=1e-4)
    if runtime == "onnxruntime":
        assert _kernels_run(folder, ids, mask[:, :4]) == {"unpadded_kernel"}
        assert _kernels_run(folder, *padded("right")) == {"kernel"}


def _rotating_kernels(folder) -> list[str]:
    """The unpadded kernels of the folder's model that rotate the query and key themselves."""
    import onnx

    proto = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False)
    kernels = [n for node in proto.graph.node if node.op_type == "If" for attribute in node.attribute if attribute.g.node
               for n in attribute.g.node if n.op_type == "GroupQueryAttention" and n.name.endswith("/unpadded_kernel")]
    return [k.name for k in kernels if any(a.name == "do_rotary" and a.i == 1 for a in k.attribute) and k.input[7]]


def test_the_kernel_rotates_only_at_its_own_positions(exported):
    """The unpadded kernel rotates the query and key itself from tables of the positions
    it assumes (the new tokens after the mask's earlier ones): an unpadded batch whose
    position ids are shifted takes the branch that rotates as the model does, in a
    prompt and in a decode step, and gives transformers' logits."""
    model, folder, _, runtime = exported
    if runtime != "onnxruntime":  # the standard runtime's folder has no kernel of onnxruntime's to rotate
        import onnx
        from conftest import all_nodes

        proto = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False)
        assert {node.domain for node in all_nodes(proto)} <= {"", "ai.onnx"}
        return
    assert len(_rotating_kernels(folder)) == DECODER["num_hidden_layers"]
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.fspath(folder / "shifted")
    session = ort.InferenceSession(os.fspath(folder / "onnx" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    steps, total = [], 0
    for ids, shift in ((torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), 3), (torch.tensor([[20], [21]]), 3),
                       (torch.tensor([[22], [23]]), 0)):
        total += ids.shape[1]
        steps.append((ids, torch.ones(2, total, dtype=torch.int64), torch.arange(total - ids.shape[1], total).expand(2, -1) + shift))
    for actual, expected in steps_with_positions(model, session, steps):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
    events = json.loads(open(session.end_profiling()).read())
    ran = [e["name"].removesuffix("_kernel_time").rsplit("/", 1)[-1] for e in events
           if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "GroupQueryAttention"]
    layers = DECODER["num_hidden_layers"]
    # shifted prompt and step: the kernel with its (zero) bias after the rotations; then its own positions
    assert ran == ["kernel"] * 2 * layers + ["unpadded_kernel"] * layers


def test_the_guards_condition_casts_no_input_back(exported):
    """The condition computed once a step reads the int64 position ids and the mask's int64
    length as they are: no Cast of its own (the kernel's int32 length is cast from the
    int64 one; casting it back was a node a step for nothing)."""
    _, folder, _, runtime = exported
    if runtime != "onnxruntime":
        pytest.skip("the standard runtime's folder has no kernel to guard")
    proto = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False)
    condition = [n for n in proto.graph.node if "/kernel_runs/" in n.name]
    assert condition and not [n.op_type for n in condition if n.op_type == "Cast"]
    readers = {n.op_type for n in condition if "position_ids" in n.input}
    assert readers == {"Equal"}  # compared with the kernel's positions directly


def test_the_main_graph_computes_only_what_the_kernels_path_reads(exported):
    """What only the guards' exact branches read (the rotary cos and sin, the mask expanded
    to the scores' shape) is computed inside them: every node of the main graph feeds the
    condition, a kernel or the layers, so a step that takes the kernels runs none of it."""
    _, folder, _, runtime = exported
    if runtime != "onnxruntime":
        pytest.skip("the standard runtime's folder has no kernel to guard")
    onnx.checker.check_model(os.fspath(folder / "onnx" / "model.onnx"), full_check=True)
    graph = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    guards = [n for n in graph.node if n.op_type == "If" and n.name.endswith("/unpadded_or_not")]
    assert len(guards) == DECODER["num_hidden_layers"]
    kernel_reads = {name for guard in guards for a in guard.attribute if a.name == "then_branch"
                    for node in a.g.node for name in node.input}
    read = {name for node in graph.node for name in node.input} | kernel_reads | {o.name for o in graph.output}
    assert [n.name for n in graph.node if not set(n.output) & read] == []
    assert not {n.op_type for n in graph.node} & {"Sin", "Cos", "Where"}
    for guard in guards:  # each exact branch computes its own tables and bias
        exact = next(a.g for a in guard.attribute if a.name == "else_branch")
        assert {"Cos", "Sin", "Where"} <= {n.op_type for n in exact.node}
