"""nn.Module calls as ONNX model-local functions: grouping, names, domains, shared
definitions, options, and numerics (onnxruntime, with and without inlining)."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnxruntime
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import ATOL, RTOL, assert_outputs_close
from fx2onnx.translate.module_functions import function_name, package_domain, structural_key
from fx2onnx.options import ModuleFunctionOptions
from fx2onnx.fx_passes.modularize import ModuleCall

TORCH_DOMAIN = f"pkg.torch.{torch.__version__.split('+')[0]}"


# -- helpers ----------------------------------------------------------------------------------
def export(model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, **options: Any) -> fx2onnx.ONNXProgram:
    options.setdefault("failure_report_path", None)
    return fx2onnx.dynamo_export(model.eval(), *args, export_options=fx2onnx.ExportOptions(**options), **dict(kwargs or {}))


def _run_proto(proto: onnx.ModelProto, inputs: list[torch.Tensor]) -> list[np.ndarray]:
    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3  # inlined models carry many unused constants
    session = onnxruntime.InferenceSession(proto.SerializeToString(), session_options, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.detach().numpy() for i, t in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)


def check_numerics(program: fx2onnx.ONNXProgram, model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> None:
    """Valid ONNX; onnxruntime matches PyTorch; the inlined model gives the same outputs."""
    kwargs = dict(kwargs or {})
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = model(*args, **kwargs)
    assert_outputs_close(program(*args, **kwargs), expected)
    inputs = program.adapt_torch_inputs_to_onnx(*args, **kwargs)
    with_functions = _run_proto(proto, inputs)
    inlined = onnx.inliner.inline_local_functions(proto)
    assert not inlined.functions
    for got, want in zip(_run_proto(inlined, inputs), with_functions):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def module_functions(proto: onnx.ModelProto) -> list[onnx.FunctionProto]:
    """Functions made from module calls (not torchlib's own helper functions)."""
    return [f for f in proto.functions if not f.domain.startswith("pkg.onnxscript")]


def call_counts(proto: onnx.ModelProto) -> collections.Counter[str]:
    """How many call nodes refer to each function, over the graph and every function body."""
    names = {(f.domain, f.name) for f in proto.functions}
    counter: collections.Counter[str] = collections.Counter()
    for nodes in [proto.graph.node, *(f.node for f in proto.functions)]:
        for node in nodes:
            if (node.domain, node.op_type) in names:
                counter[node.op_type] += 1
    return counter


def definitions_of(proto: onnx.ModelProto, class_name: str) -> list[onnx.FunctionProto]:
    prefix = class_name.replace(".", "_") + "_"
    return [f for f in proto.functions if f.name.startswith(prefix)]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# -- a 3-level hierarchy with repeated instances -------------------------------------------------
class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Mid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Leaf()
        self.second = Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) * 0.5


class Top(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Mid(), Mid()])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) + x
        return self.head(x)


def test_hierarchy_shares_one_definition_per_repeated_module() -> None:
    model, x = Top(), torch.randn(4, 8)
    program = export(model, (x,))
    proto = program.model_proto
    check_numerics(program, model, (x,))

    domain = package_domain(_qualname(Mid))
    assert domain == "pkg." + Mid.__module__.split(".")[0]
    names = {f.name: f.domain for f in module_functions(proto)}
    mid = function_name(ModuleCall("", "blocks.0", _qualname(Mid), 0))
    leaf = function_name(ModuleCall("", "blocks.0.first", _qualname(Leaf), 0))
    assert names == {
        mid: domain,
        leaf: domain,
        "torch_nn_modules_linear_Linear_blocks_0_first_linear": TORCH_DOMAIN,
        "torch_nn_modules_linear_Linear_head": TORCH_DOMAIN,
    }
    counts = call_counts(proto)
    assert counts[mid] == 2  # the two blocks, from the main graph
    assert counts[leaf] == 2  # first and second, inside the one Mid definition
    assert counts["torch_nn_modules_linear_Linear_blocks_0_first_linear"] == 1
    assert [n.op_type for n in proto.graph.node if n.domain == domain] == [mid, mid]
    opsets = {o.domain: o.version for o in proto.opset_import}
    assert opsets[domain] == 1 and opsets[TORCH_DOMAIN] == 1


def test_hierarchy_without_sharing_has_one_function_per_call() -> None:
    model, x = Top(), torch.randn(4, 8)
    program = export(model, (x,), module_functions=ModuleFunctionOptions(share_identical=False))
    check_numerics(program, model, (x,))
    proto = program.model_proto
    assert len(definitions_of(proto, _qualname(Mid))) == 2
    assert len(definitions_of(proto, _qualname(Leaf))) == 4
    assert len(definitions_of(proto, "torch.nn.modules.linear.Linear")) == 5
    assert set(call_counts(proto).values()) == {1}
    leaf_names = {f.name for f in definitions_of(proto, _qualname(Leaf))}
    prefix = _qualname(Leaf).replace(".", "_")
    assert leaf_names == {f"{prefix}_blocks_{i}_{which}" for i in (0, 1) for which in ("first", "second")}


def test_names_are_the_same_on_every_export() -> None:
    model, x = Top(), torch.randn(4, 8)
    first = [(f.domain, f.name, [n.op_type for n in f.node]) for f in export(model, (x,)).model_proto.functions]
    second = [(f.domain, f.name, [n.op_type for n in f.node]) for f in export(model, (x,)).model_proto.functions]
    assert first == second


def test_functions_have_value_info_and_unique_node_names() -> None:
    model, x = Top(), torch.randn(4, 8)
    proto = export(model, (x,)).model_proto
    for function in module_functions(proto):
        typed = {v.name for v in function.value_info}
        produced = {o for n in function.node for o in n.output} | set(function.input)
        assert produced <= typed, f"{function.name}: untyped {produced - typed}"
        names = [n.name for n in function.node]
        assert all(names) and len(set(names)) == len(names), function.name
    main_names = [n.name for n in proto.graph.node]
    assert all(main_names) and len(set(main_names)) == len(main_names)


def test_weights_stay_initializers_of_the_main_graph_named_after_parameters() -> None:
    model, x = Top(), torch.randn(4, 8)
    proto = export(model, (x,)).model_proto
    assert {i.name for i in proto.graph.initializer} == set(model.state_dict())
    linear = next(f for f in proto.functions if f.name == "torch_nn_modules_linear_Linear_head")
    assert list(linear.input)[1:] == ["weight", "bias"]


# -- a module called twice in a row ----------------------------------------------------------------
class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.inner(x))


def test_consecutive_calls_of_one_instance_stay_two_calls() -> None:
    model, x = Twice(), torch.randn(3, 8)
    program = export(model, (x,))
    check_numerics(program, model, (x,))
    proto = program.model_proto
    leaf = function_name(ModuleCall("", "inner", _qualname(Leaf), 0))
    assert [n.op_type for n in proto.graph.node] == [leaf, leaf]

    unshared = export(model, (x,), module_functions=ModuleFunctionOptions(share_identical=False)).model_proto
    assert [n.op_type for n in unshared.graph.node] == [leaf, leaf + "_call1"]


# -- options ------------------------------------------------------------------------------------
def test_flat_option_gives_no_module_functions() -> None:
    model, x = Top(), torch.randn(4, 8)
    program = export(model, (x,), module_functions=False)
    check_numerics(program, model, (x,))
    assert not module_functions(program.model_proto)
    assert {n.op_type for n in program.model_proto.graph.node} >= {"Gemm", "Tanh"}


def test_only_chosen_classes_and_paths_become_functions() -> None:
    model, x = Top(), torch.randn(4, 8)
    by_class = export(model, (x,), module_functions=ModuleFunctionOptions(include=(Mid,))).model_proto
    assert {f.name for f in module_functions(by_class)} == {function_name(ModuleCall("", "blocks.0", _qualname(Mid), 0))}
    by_path = export(model, (x,), module_functions=ModuleFunctionOptions(include=("blocks.1.*",), share_identical=False)).model_proto
    assert {f.name.split("_Leaf_")[-1] for f in definitions_of(by_path, _qualname(Leaf))} == {"blocks_1_first", "blocks_1_second"}
    assert not definitions_of(by_path, _qualname(Mid))
    excluded = export(model, (x,), module_functions=ModuleFunctionOptions(exclude=("Leaf",))).model_proto
    assert not definitions_of(excluded, _qualname(Leaf)) and definitions_of(excluded, _qualname(Mid))


def test_torch_nn_leaves_can_be_inlined() -> None:
    model, x = Top(), torch.randn(4, 8)
    program = export(model, (x,), module_functions=ModuleFunctionOptions(torch_nn_leaves=False))
    check_numerics(program, model, (x,))
    domains = {f.domain for f in module_functions(program.model_proto)}
    assert TORCH_DOMAIN not in domains and domains == {package_domain(_qualname(Mid))}


def test_optimizer_keeps_module_functions() -> None:
    model, x = Top(), torch.randn(4, 8)
    program = export(model, (x,), optimize=True)
    check_numerics(program, model, (x,))
    proto = program.model_proto
    assert call_counts(proto)[function_name(ModuleCall("", "blocks.0", _qualname(Mid), 0))] == 2


# -- dynamic shapes and complex values across a function boundary ---------------------------------------
def test_dynamic_shapes_cross_function_boundaries() -> None:
    model = Top()
    program = export(model, (torch.randn(4, 8),), dynamic_shapes=True)
    check_numerics(program, model, (torch.randn(4, 8),))
    check_numerics(program, model, (torch.randn(9, 8),))
    mid = next(f for f in program.model_proto.functions if f.name == function_name(ModuleCall("", "blocks.0", _qualname(Mid), 0)))
    first_input = next(v for v in mid.value_info if v.name == mid.input[0])
    assert first_input.type.tensor_type.shape.dim[0].dim_param


class ComplexInner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.polar(torch.ones(4), torch.linspace(0, 1, 4)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.scale + 1


class ComplexOuter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ComplexInner()

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.inner(z)
        return y, torch.view_as_real(self.inner(y)).sum(-1)


def test_complex_values_cross_function_boundaries() -> None:
    model, z = ComplexOuter(), torch.randn(3, 4, dtype=torch.complex64)
    program = export(model, (z,))
    check_numerics(program, model, (z,))
    inner = function_name(ModuleCall("", "inner", _qualname(ComplexInner), 0))
    assert call_counts(program.model_proto)[inner] == 2


# -- structural identity ------------------------------------------------------------------------------------
def test_structural_key_ignores_names_and_sees_shapes() -> None:
    import onnx_ir as ir

    def body(name: str, width: int) -> ir.Graph:
        x = ir.Value(name=f"{name}_x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, width]))
        node = ir.node("Relu", [x], name=f"{name}_relu")
        node.outputs[0].name = f"{name}_y"
        node.outputs[0].dtype = ir.DataType.FLOAT
        node.outputs[0].shape = ir.Shape([2, width])
        return ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 18})

    assert structural_key(body("a", 4)) == structural_key(body("b", 4))
    assert structural_key(body("a", 4)) != structural_key(body("a", 5))


# -- transformers --------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
LAYERS = 3


def _assert_one_shared_layer(proto: onnx.ModelProto, class_name: str, calls: int = LAYERS) -> None:
    """One definition; `calls` call nodes refer to it (a module inside the repeated layer
    is called once, from the one definition of the layer)."""
    definitions = definitions_of(proto, class_name)
    assert len(definitions) == 1, [f.name for f in definitions]
    assert call_counts(proto)[definitions[0].name] == calls
    assert definitions[0].domain == package_domain(class_name)
    assert definitions[0].domain == f"pkg.transformers.{transformers.__version__}"


def _export_and_check_against_eager(model: torch.nn.Module, kwargs: dict, output: str) -> onnx.ModelProto:
    """Export with module functions; the model and its inlined form both match eager."""
    program = export(model, kwargs=kwargs)
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = getattr(model.eval()(**kwargs), output)
    torch.testing.assert_close(program(**kwargs)[output], expected, rtol=RTOL, atol=ATOL)
    inlined = onnx.inliner.inline_local_functions(proto)
    (first,) = _run_proto(inlined, program.adapt_torch_inputs_to_onnx(**kwargs))[:1]
    np.testing.assert_allclose(first, expected.numpy(), rtol=RTOL, atol=ATOL)
    return proto


def test_gpt2_blocks_share_one_definition() -> None:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, use_cache=False)
    ids = torch.randint(0, 100, (2, 8))
    proto = _export_and_check_against_eager(transformers.GPT2LMHeadModel(config), {"input_ids": ids}, "logits")
    _assert_one_shared_layer(proto, "transformers.models.gpt2.modeling_gpt2.GPT2Block")
    for inner in ("GPT2Attention", "GPT2MLP"):
        _assert_one_shared_layer(proto, f"transformers.models.gpt2.modeling_gpt2.{inner}", calls=1)


def test_bert_layers_share_one_definition() -> None:
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=64)
    ids = torch.randint(0, 100, (2, 8))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    proto = _export_and_check_against_eager(transformers.BertModel(config), kwargs, "last_hidden_state")
    _assert_one_shared_layer(proto, "transformers.models.bert.modeling_bert.BertLayer")


def test_llama_decoder_layers_share_one_definition() -> None:
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
    )
    ids = torch.randint(0, 100, (2, 8))
    proto = _export_and_check_against_eager(transformers.LlamaForCausalLM(config), {"input_ids": ids}, "logits")
    _assert_one_shared_layer(proto, "transformers.models.llama.modeling_llama.LlamaDecoderLayer")


def test_module_call_graphs_defer_their_python_code():
    """Modularize builds torch.fx's private lazy GraphModule (it skips code generation
    nobody uses); this fails loudly when torch moves it."""
    from fx2onnx.fx_passes.modularize import lazy_graph_module

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    module = lazy_graph_module({}, graph, "Lazy")
    assert isinstance(module, torch.fx.GraphModule)
    from torch.fx._lazy_graph_module import _LazyGraphModule

    assert isinstance(module, _LazyGraphModule) and module._needs_recompile()
    torch.testing.assert_close(module(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
    assert "relu" in module.code
