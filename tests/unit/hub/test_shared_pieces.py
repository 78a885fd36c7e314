"""The pieces export-hf's recipes share, each on a tiny input without an export: dims named
by role, the source files copied, the growing-cache check, the onnxruntime-only operators,
the merged decoder's branch choice, weights by the model's names, and what each decoder or
Whisper or vision-language module reads from a config."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from safetensors.torch import save_file
from transformers import LlamaConfig, MistralConfig

from diagnostics import Diagnostic, Level, rules
from fx2onnx.capture import FIXED_DIM
from fx2onnx.hub.decoders.decode_step import returns_no_cache
from fx2onnx.hub.decoders.growing_cache import check_growing_cache
from fx2onnx.hub.decoders.sliding_window import growing_cache, masks_for, window_of
from fx2onnx.hub.precision.prequantized import checkpoint_codes, quant_method
from fx2onnx.hub.shared.dim_roles import BATCH, PAST, SEQUENCE, TOTAL, fixed_size_states, name_dims_by_role
from fx2onnx.hub.shared.folder_files import copy_folder_files
from fx2onnx.hub.shared.genai_config import shared_cache_note, unequal_head_sizes_note
from fx2onnx.hub.shared.merged_decoder import USE_CACHE_BRANCH, merge_decoders
from fx2onnx.hub.shared.renamed_weights import RenamedCheckpoint, part_checkpoint
from fx2onnx.hub.shared.runtime_check import onnxruntime_only_operators
from fx2onnx.hub.shared.verification import empty_cache
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.hub.whisper.whisper_suppress import suppress_lists


def _value(name: str, shape: list) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))


def test_dims_are_named_by_their_roles():
    model = ir.Model(ir.Graph([_value("input_ids", ["s0", "s1"]), _value("attention_mask", ["s0", "s2"]),
                               _value("past_key_values.0.key", ["s0", 2, "s3", 4])], [], nodes=[]), ir_version=10)
    assert name_dims_by_role(model) == {"s0": BATCH, "s1": SEQUENCE, "s2": TOTAL, "s3": PAST}
    assert [str(d) for d in model.graph.inputs[0].shape] == [BATCH, SEQUENCE]
    # one symbol for two roles is refused: the runtime would be told two lengths are one
    clash = ir.Model(ir.Graph([_value("input_ids", ["s0", "s0"])], [], nodes=[]), ir_version=10)
    with pytest.raises(ValueError, match="one dim"):
        name_dims_by_role(clash)


def test_a_hybrids_fixed_size_states_take_no_past_length():
    # a convolution state keeps its kernel width (4) and a recurrent state its sizes at every
    # step: only the keys' dim 2, which grows by the step's tokens, is the past length
    conv, recurrent = "past_key_values.0.conv_states.0", "past_key_values.0.recurrent_states.0"
    inputs = [_value("input_ids", ["s0", "s1"]), _value("attention_mask", ["s0", "s2"]),
              _value("past_key_values.1.key", ["s0", 2, "s3", 4]), _value(conv, ["s0", 12, 4]),
              _value(recurrent, ["s0", 2, 4, 4])]
    outputs = [_value("logits", ["s0", "s1", 8]), _value("present.1.key", ["s0", 2, "s3 + s1", 4]),
               _value("present.0.conv_states.0", ["s0", 12, 4]), _value("present.0.recurrent_states.0", ["s0", 2, 4, 4])]
    model = ir.Model(ir.Graph(inputs, outputs, nodes=[]), ir_version=10)
    assert fixed_size_states(model) == [conv, recurrent]
    assert name_dims_by_role(model) == {"s0": BATCH, "s1": SEQUENCE, "s2": TOTAL, "s3": PAST}
    assert [str(d) for d in model.graph.inputs[3].shape] == [BATCH, "12", "4"]
    outputs[1].shape = ir.Shape([BATCH, 2, TOTAL, 4])
    check_growing_cache(SimpleNamespace(model=model), SimpleNamespace(model_type="mamba2"))  # the states keep their size
    # an empty cache starts the states as zeros of their own size, the keys with no token
    session = _session_inputs({v.name: [str(d) if isinstance(d, ir.SymbolicDim) else d for d in v.shape] for v in inputs},
                              {v.name: [str(d) if isinstance(d, ir.SymbolicDim) else d for d in v.shape] for v in outputs})
    assert {name: array.shape for name, array in empty_cache(session, batch=3).items()} == {
        "past_key_values.1.key": (3, 2, 0, 4), conv: (3, 12, 4), recurrent: (3, 2, 4, 4)}
    # a cache whose length the export fixed still is an error: its next step's value is longer
    fixed = ir.Model(ir.Graph([_value("past_key_values.0.key", ["s0", 2, 5, 4])],
                              [_value("present.0.key", ["s0", 2, 8, 4])], nodes=[]), ir_version=10)
    with pytest.raises(ValueError, match=r"Dim 2 of input 'past_key_values.0.key' \(past_sequence_length\) is static"):
        name_dims_by_role(fixed)


def test_a_static_dim_cites_the_code_the_exports_structured_warning_names():
    reason = "dim 1 of input 'input_ids' was fixed to 7 by the code at modeling_x.py:12"
    warning = Diagnostic(rules.CAPTURE_FAILURE, Level.WARNING, "any wording",
                         properties={FIXED_DIM: {"input": "input_ids", "dim": 1, "value": 7, "reason": reason}})
    other = Diagnostic(rules.CAPTURE_FAILURE, Level.WARNING, reason)  # the same words without the data: not read

    def model() -> ir.Model:
        return ir.Model(ir.Graph([_value("input_ids", ["s0", 7])], [], nodes=[]), ir_version=10)

    with pytest.raises(UnsupportedTaskError, match=re.escape(reason + ", so its model would accept only")) as error:
        name_dims_by_role(model(), export_warnings=[other, warning])
    assert "Nothing was written" in str(error.value) and "Report this" not in str(error.value)
    with pytest.raises(ValueError, match="Report this with the SARIF report"):
        name_dims_by_role(model(), export_warnings=[other])


def test_the_source_files_the_runtime_needs_are_copied(tmp_path):
    (tmp_path / "src").mkdir(), (tmp_path / "dst").mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (tmp_path / "src" / name).write_text("{}", encoding="utf-8")
    assert copy_folder_files(tmp_path / "src", tmp_path / "dst") == ["config.json", "generation_config.json"]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["config.json", "generation_config.json"]
    # a file the recipe wrote for its client stays as written
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "config.json").write_text('{"written": true}', encoding="utf-8")
    assert copy_folder_files(tmp_path / "src", tmp_path / "recipe") == ["generation_config.json"]
    assert (tmp_path / "recipe" / "config.json").read_text(encoding="utf-8") == '{"written": true}'


def test_a_cache_of_fixed_length_is_refused():
    def program(length):
        outputs = [_value("logits", ["b", "s", 8]), _value("present.0.key", ["b", 2, length, 4])]
        return SimpleNamespace(model=ir.Model(ir.Graph([], outputs, nodes=[]), ir_version=10))

    check_growing_cache(program(TOTAL), SimpleNamespace(model_type="llama"))
    with pytest.raises(NotImplementedError, match=r"llama's cache keeps a fixed number of tokens in 1 layer\(s\).*present.0.key \(b, 2, 16, 4\)"):
        check_growing_cache(program(16), SimpleNamespace(model_type="llama"))


def test_keys_and_values_of_unequal_head_sizes_get_no_genai_config():
    """ONNX Runtime GenAI gives every cache buffer one head size: a latent attention's cache
    (keys of 32, values of 4) gets the reason instead of a genai_config.json."""
    def model(value_size):
        inputs = [_value("past_key_values.0.key", ["b", 2, "p", 32]), _value("past_key_values.0.value", ["b", 2, "p", value_size])]
        return ir.Model(ir.Graph(inputs, [], nodes=[]), ir_version=10)

    assert unequal_head_sizes_note(SimpleNamespace(model_type="llama"), model(32)) is None
    note = unequal_head_sizes_note(SimpleNamespace(model_type="youtu"), model(4))
    assert note is not None and "youtu's cached keys and values have different head sizes (past_key_values.0.key 32, its value 4)" in note


def test_a_cache_read_by_a_later_layer_gets_past_and_present_apart():
    def model(read: bool) -> ir.Model:
        past = _value("past_key_values.0.key", ["b", 2, "p", 8])
        present = ir.node("Identity", [past], name="layer_0").outputs[0]
        present.name = "present.0.key"
        nodes = [present.producer()]
        outputs = [present]
        if read:  # a KV-shared layer attends to it
            nodes.append(ir.node("Relu", [present], name="layer_1"))
            outputs.append(nodes[-1].outputs[0])
            outputs[-1].name = "logits"
        return ir.Model(ir.Graph([past], outputs, nodes=nodes), ir_version=10)

    config = SimpleNamespace(model_type="gemma4_text", num_kv_shared_layers=1)
    assert shared_cache_note(config, model(read=False)) is None
    note = shared_cache_note(config, model(read=True))
    assert note is not None and note.startswith("genai_config.json with past and present apart (past_present_share_buffer "
                                                "false): gemma4_text's last 1 layers attend to")
    assert "(present.0.key)" in note
    # the layers in the branches of an If (a kernel branch and a guarded one), their values named there
    for read in (False, True):
        past = _value("past_key_values.0.key", ["b", 2, "p", 8])

        def branch(kind: str) -> ir.Graph:
            present = ir.node("Identity", [past], name=f"layer_0_{kind}").outputs[0]
            present.name = f"present.0.key_{kind}"
            nodes, outputs = [present.producer()], [present]
            if read:
                nodes.append(ir.node("Relu", [present], name=f"layer_1_{kind}"))
                outputs.append(nodes[-1].outputs[0])
                outputs[-1].name = f"logits_{kind}"
            return ir.Graph([], outputs, nodes=nodes, name=kind)

        condition = ir.Value(name="run_kernels", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        stack = ir.node("If", [condition], attributes={"then_branch": branch("fast"), "else_branch": branch("guarded")},
                        num_outputs=1 + read, name="decoder_stack")
        for value, name in zip(stack.outputs, ["present.0.key", "logits"]):
            value.name = name
        wrapped = ir.Model(ir.Graph([past, condition], list(stack.outputs), nodes=[stack]), ir_version=10)
        assert (shared_cache_note(config, wrapped) is not None) is read
    # a layer's own attention reads its present.* in standard operators: no sharing without the config's
    assert shared_cache_note(SimpleNamespace(model_type="llama"), model(read=True)) is None
    assert shared_cache_note(SimpleNamespace(model_type="gemma4_text", num_kv_shared_layers=0), model(read=True)) is None


def test_onnxruntime_only_operators_are_found_in_branches_too(tmp_path):
    branch = helper.make_graph([helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")], "branch", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [1]), helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    assert onnxruntime_only_operators(tmp_path / "m.onnx") == ["FastGelu"]


def _step_model(path, op_type: str) -> None:
    # the two steps share their weights by name, as a decoder's first and next steps do
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x", "w"], ["logits"])], "step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2], [3.0, 3.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_the_merged_decoder_runs_the_step_its_branch_input_names(tmp_path):
    _step_model(tmp_path / "first.onnx", "Mul")
    _step_model(tmp_path / "next.onnx", "Add")
    merge_decoders(tmp_path / "first.onnx", tmp_path / "next.onnx", tmp_path / "merged.onnx", "merged.onnx_data")
    onnx.checker.check_model(str(tmp_path / "merged.onnx"), full_check=True)
    session = ort.InferenceSession(str(tmp_path / "merged.onnx"), providers=["CPUExecutionProvider"])
    x = np.array([1.0, -2.0], dtype=np.float32)
    for branch, expected in ((False, x * 3.0), (True, x + 3.0)):
        (logits,) = session.run(None, {"x": x, USE_CACHE_BRANCH: np.array([branch])})
        np.testing.assert_array_equal(logits, expected)


def test_weights_are_read_by_the_names_a_wrapper_gives_them(tmp_path):
    model = torch.nn.Linear(2, 3)
    save_file({"weight": model.weight.detach().contiguous(), "bias": model.bias.detach()}, tmp_path / "model.safetensors")
    checkpoint = RenamedCheckpoint(tmp_path, model)
    wrapper = torch.nn.Module()
    wrapper.model = model  # a part holding the model under `model`
    wrapped = part_checkpoint(tmp_path, model, wrapper)
    assert sorted(wrapped) == ["model.bias", "model.weight"]
    torch.testing.assert_close(wrapped["model.weight"], model.weight.detach())
    assert list(wrapped.only({"model.bias"})) == ["model.bias"]
    assert list(checkpoint.renamed({"head.weight": ["missing", "weight"]})) == ["head.weight"]


def test_float_checkpoints_have_no_codes_of_their_own(tmp_path):
    assert quant_method(LlamaConfig()) is None and checkpoint_codes(tmp_path, LlamaConfig()) is None
    assert quant_method(SimpleNamespace(quantization_config={"quant_method": "compressed-tensors"})) == "compressed-tensors"


def test_a_sliding_window_is_read_from_the_config():
    assert window_of(LlamaConfig()) is None
    assert window_of(MistralConfig(sliding_window=16)) == 16


def test_a_multimodal_models_window_is_read_from_its_text_config():
    """Gemma 4's windows are in its text config alone: without them its decoder was captured as
    causal over every token, wrong past the window."""
    from transformers import Gemma4Config

    from fx2onnx.hub.decoders.decode_step import attends_causally
    from fx2onnx.hub.decoders.sliding_window import causal_within_windows

    config = Gemma4Config(text_config={"sliding_window": 8, "num_hidden_layers": 2,
                                       "layer_types": ["sliding_attention", "full_attention"]}, vision_config=None)
    assert getattr(config, "sliding_window", None) is None
    assert window_of(config) == 8 and causal_within_windows(config) and not attends_causally(config)


def test_a_hybrids_sliding_masks_give_its_convolution_layers_their_held_tokens():
    # LFM3: convolution layers beside sliding and full attention layers
    from transformers import Lfm3Config
    from transformers.cache_utils import DynamicLayer

    config = Lfm3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                        num_hidden_layers=3, sliding_window=4, layer_types=["conv", "sliding_attention", "full_attention"])
    config._attn_implementation = "sdpa"
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    masks = masks_for(config, mask, 2, torch.float32)
    assert set(masks) == {"conv", "sliding_attention", "full_attention"}
    assert torch.equal(masks["conv"], mask[:, -2:])  # what transformers' recurrent mask gives these tokens
    assert masks["sliding_attention"].shape == (2, 1, 2, 6)
    # the capture's cache grows in the attention layers and keeps the convolution layer's own kind
    kinds = [type(layer) for layer in growing_cache(config).layers]
    assert kinds[1:] == [DynamicLayer, DynamicLayer] and kinds[0] is not DynamicLayer
    config.layer_types = ["chunked_attention", "sliding_attention", "full_attention"]
    with pytest.raises(NotImplementedError, match="layers of kind chunked_attention"):
        masks_for(config, mask, 2, torch.float32)


def test_whispers_suppress_lists_are_sorted_and_unique():
    generation = SimpleNamespace(suppress_tokens=[7, 3, 7], begin_suppress_tokens=None)
    assert suppress_lists(generation) == ([3, 7], []) and suppress_lists(None) == ([], [])


def _session_inputs(shapes: dict[str, list], output_shapes: dict[str, list] | None = None) -> SimpleNamespace:
    def values(of: dict[str, list]) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name, shape=shape, type="tensor(float)") for name, shape in of.items()]

    return SimpleNamespace(get_inputs=lambda: values(shapes), get_outputs=lambda: values(output_shapes or {}))


def test_an_empty_cache_takes_symbolic_heads_from_the_other_cache_inputs():
    # FSMT's cross-attention cache: heads symbolic, the decoder's own cache static
    session = _session_inputs({
        "input_ids": ["batch", "length"],
        "past_key_values.0.decoder.key": ["batch", 4, "past", 8],
        "past_key_values.0.encoder.key": ["batch", "past_key_values.0.encoder.key_dim_1", "encoder", 8],
    })
    cache = empty_cache(session, batch=3)
    assert {name: array.shape for name, array in cache.items()} == {
        "past_key_values.0.decoder.key": (3, 4, 0, 8), "past_key_values.0.encoder.key": (3, 4, 0, 8),
    }
    with pytest.raises(ValueError, match="dim 1 the sizes none"):
        empty_cache(_session_inputs({"past_key_values.0.key": ["batch", "heads", "past", 8]}))


def test_an_empty_cache_keeps_each_inputs_own_static_head_size():
    # a latent attention's keys (rotary and plain parts, 12) and values (8)
    session = _session_inputs({"past_key_values.0.key": ["batch", 4, "past", 12],
                               "past_key_values.0.value": ["batch", 4, "past", 8]})
    assert {name: array.shape for name, array in empty_cache(session).items()} == {
        "past_key_values.0.key": (1, 4, 0, 12), "past_key_values.0.value": (1, 4, 0, 8),
    }


def test_a_causal_lm_class_returning_no_cache_is_told_apart():
    from transformers import LlamaForCausalLM, MambaForCausalLM, XLMWithLMHeadModel

    tiny = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    assert returns_no_cache(XLMWithLMHeadModel)  # MaskedLMOutput: logits only
    assert not returns_no_cache(LlamaForCausalLM(tiny)) and not returns_no_cache(MambaForCausalLM)  # cache, cache_params
