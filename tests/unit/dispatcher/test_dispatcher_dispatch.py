"""OnnxFunctionDispatcher: overload lookup, complex filtering, perfect/nearest matching,
diagnostics and errors."""

from __future__ import annotations

import itertools
import logging
import operator

import pytest
import torch
import torch.fx
from onnxscript import BOOL, FLOAT, opset18 as op, script
from onnxscript.values import Opset, TracedOnnxFunction

from diagnostics import DiagnosticContext, DiagnosticOptions, Level, rules
from dispatcher import (
    DispatchError,
    OnnxFunctionDispatcher,
    OnnxRegistry,
    node_location,
    node_stack,
)

# -- hand-made ONNX functions ----------------------------------------------------------


@script()
def custom_add(self: FLOAT, other: FLOAT, alpha: float = 1.0) -> FLOAT:
    return op.Add(self, other)


@script()
def mul_float(self: FLOAT, other: FLOAT) -> FLOAT:
    return op.Mul(self, other)


@script()
def mul_float_again(self: FLOAT, other: FLOAT) -> FLOAT:
    return op.Mul(other, self)


@script()
def mul_float_third(self: FLOAT, other: FLOAT) -> FLOAT:
    return op.Mul(self, other)


@script()
def mul_bool(self: BOOL, other: BOOL) -> BOOL:
    return op.And(self, other)


@script()
def one_input(self: FLOAT) -> FLOAT:
    return op.Identity(self)


@script()
def softmax_str_dim(self: FLOAT, dim: str, half_to_float: int = 0) -> FLOAT:
    return op.Identity(self)


EXAMPLE = Opset("com.example", 1)


@script(EXAMPLE)
def example_scale(x: FLOAT) -> FLOAT:
    return op.Add(x, x)


def _complex_mul(self, other):
    return op.Mul(self, other)


traced_complex_mul = TracedOnnxFunction(EXAMPLE, _complex_mul)


@torch.library.custom_op("fx2onnx_dispatch_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x):
    return torch.empty_like(x)


# -- helpers ---------------------------------------------------------------------------

USER_TRACE = """\
  File "/home/user/project/model.py", line 42, in forward
    y = torch.mul(x, x)
"""


def make_context(level=logging.DEBUG, **options) -> DiagnosticContext:
    return DiagnosticContext("fx2onnx", "0.1.0", DiagnosticOptions(verbosity_level=level, **options))


def make_dispatcher(registry=None, level=logging.DEBUG) -> OnnxFunctionDispatcher:
    return OnnxFunctionDispatcher(registry or OnnxRegistry(), make_context(level))


def call_node(target, *args, stack_trace: str | None = USER_TRACE, **kwargs) -> torch.fx.Node:
    """A call_function node whose tensor arguments are placeholders carrying meta["val"]."""
    graph = torch.fx.Graph()
    ids = itertools.count()

    def lift(value):
        if isinstance(value, torch.Tensor):
            node = graph.placeholder(f"x{next(ids)}")
            node.meta["val"] = value
            return node
        if isinstance(value, (list, tuple)):
            return type(value)(lift(v) for v in value)
        return value

    node = graph.call_function(target, tuple(lift(a) for a in args), {k: lift(v) for k, v in kwargs.items()})
    if stack_trace is not None:
        node.meta["stack_trace"] = stack_trace
    graph.output(node)
    return node


def t(dtype=torch.float32, shape=(2, 3)) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def recorded(dispatcher, rule=None, level=None):
    return [
        d
        for d in dispatcher.diagnostic_context._diagnostics
        if (rule is None or d.rule == rule) and (level is None or d.level == level)
    ]


MATCH = rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION
NO_FUNCTION = rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION
OVERLOADS = rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY


# -- perfect matches -------------------------------------------------------------------


def test_torchlib_perfect_match_is_recorded_at_level_none():
    dispatcher = make_dispatcher()
    node = call_node(torch.ops.aten.add.Tensor, t(), t())
    function = dispatcher.dispatch(node)
    assert function.name == "aten_add"
    [diagnostic] = recorded(dispatcher)
    assert diagnostic.rule == MATCH
    assert diagnostic.level == Level.NONE
    assert "perfect match" in diagnostic.message and "aten::add.Tensor" in diagnostic.message
    assert diagnostic.location.path == "/home/user/project/model.py"
    assert diagnostic.location.line == 42
    assert "aten_add" in diagnostic.markdown()  # the candidates are logged


def test_perfect_match_is_recorded_cheaply_below_debug_verbosity():
    """Every dispatch decision is in the report (the former exporter's contract); below
    DEBUG without the user's line and the candidates' log, which cost time."""
    dispatcher = make_dispatcher(level=logging.INFO)
    for _ in range(2):  # the second time the choice is remembered, and still recorded
        assert dispatcher.dispatch(call_node(torch.ops.aten.add.Tensor, t(), t())).name == "aten_add"
    records = recorded(dispatcher)
    assert [(d.rule.id, d.level) for d in records] == [("FXE0014", Level.NONE)] * 2
    assert all("perfect match" in d.message and "aten.add.Tensor" in d.message for d in records)
    assert all(d.location is None and not d.markdown() for d in records)


def test_user_function_overrides_the_default():
    registry = OnnxRegistry()
    registry.register_op(custom_add, "aten", "add", "Tensor")
    dispatcher = make_dispatcher(registry)
    assert dispatcher.dispatch(call_node(torch.ops.aten.add.Tensor, t(), t())) is custom_add
    assert dispatcher.dispatch_registered(call_node(torch.ops.aten.add.Tensor, t(), t())).is_custom


def test_perfect_default_beats_a_nearest_custom():
    registry = OnnxRegistry()
    registry.register_op(mul_float, "aten", "mul", "Tensor")
    dispatcher = make_dispatcher(registry)
    function = dispatcher.dispatch(call_node(torch.ops.aten.mul.Tensor, t(), t(torch.int64)))
    assert function.name == "aten_mul"
    assert recorded(dispatcher, level=Level.WARNING) == []


def test_latest_registration_wins_among_perfect_matches():
    registry = OnnxRegistry()
    for function in (mul_float, mul_float_again, mul_float_third):
        registry.register_op(function, "aten", "mul", "Tensor")
    dispatcher = make_dispatcher(registry)
    assert dispatcher.dispatch(call_node(torch.ops.aten.mul.Tensor, t(), t())) is mul_float_third


def test_ignored_and_none_kwargs_keep_a_perfect_match():
    dispatcher = make_dispatcher()
    node = call_node(torch.ops.aten.clone.default, t(), memory_format=torch.preserve_format)
    assert dispatcher.dispatch(node).name == "aten_clone"
    assert recorded(dispatcher, MATCH)[0].level == Level.NONE


# -- nearest matches -------------------------------------------------------------------


def _only_customs(*functions) -> OnnxRegistry:
    registry = OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor")
    registry.remove_op("aten", "mul")  # torchlib also has the default overload
    for function in functions:
        registry.register_op(function, "aten", "mul", "Tensor")
    return registry


def test_nearest_match_is_used_with_a_warning_naming_the_misfit():
    dispatcher = make_dispatcher(_only_customs(mul_float, mul_bool))
    function = dispatcher.dispatch(call_node(torch.ops.aten.mul.Tensor, t(), t(torch.int64)))
    assert function is mul_float
    [warning] = recorded(dispatcher, MATCH, Level.WARNING)
    assert "nearest match" in warning.message
    assert "'other'" in warning.message
    assert "INT64" in warning.message and "FLOAT" in warning.message
    assert warning.properties["score"] == 1


def test_nearest_match_ties_go_to_the_latest_registration():
    dispatcher = make_dispatcher(_only_customs(mul_float, mul_float_again, mul_float_third))
    node = call_node(torch.ops.aten.mul.Tensor, t(), t(torch.int64))
    assert dispatcher.dispatch(node) is mul_float_third


def test_nearest_match_ties_prefer_custom_over_default():
    registry = OnnxRegistry()
    registry.register_op(softmax_str_dim, "aten", "softmax", "int")  # dim: STRING
    dispatcher = make_dispatcher(registry)
    # dim=1.5 fits neither torchlib's INT nor the custom STRING attribute: both score 1.
    node = call_node(torch.ops.aten.softmax.int, t(), 1.5)
    assert dispatcher.dispatch(node) is softmax_str_dim
    [warning] = recorded(dispatcher, MATCH, Level.WARNING)
    assert warning.properties["score"] == 1 and warning.properties["is_custom"]
    assert "aten_softmax" in warning.markdown()  # the rejected candidate is logged


def test_attribute_type_mismatch_is_a_nearest_match():
    registry = OnnxRegistry()
    registry.remove_op("aten", "softmax", "int")
    registry.register_op(softmax_str_dim, "aten", "softmax", "int")
    dispatcher = make_dispatcher(registry)
    assert dispatcher.dispatch(call_node(torch.ops.aten.softmax.int, t(), 1)) is softmax_str_dim
    [warning] = recorded(dispatcher, MATCH, Level.WARNING)
    assert "attribute 'dim'" in warning.message and "STRING" in warning.message


def test_input_count_mismatch_leaves_no_candidate():
    dispatcher = make_dispatcher(_only_customs(one_input))
    node = call_node(torch.ops.aten.mul.Tensor, t(), t())
    with pytest.raises(DispatchError) as info:
        dispatcher.dispatch(node)
    error = info.value
    assert error.diagnostic.level == Level.ERROR
    assert error.diagnostic.rule == MATCH
    assert "2 were given" in str(error)
    assert "one_input" in str(error)


def test_warnings_as_errors_promotes_a_nearest_match():
    registry = _only_customs(mul_float)
    dispatcher = OnnxFunctionDispatcher(registry, make_context(warnings_as_errors=True))
    dispatcher.dispatch(call_node(torch.ops.aten.mul.Tensor, t(), t(torch.int64)))
    assert dispatcher.diagnostic_context.has_errors()


# -- overload fallback -----------------------------------------------------------------


def test_missing_overload_falls_back_to_the_default_overload_with_a_warning():
    registry = OnnxRegistry()
    assert registry.is_registered_op("aten", "add", "Tensor")
    registry.remove_op("aten", "add", "Tensor")
    registry.register_op(custom_add, "aten", "add")  # the default overload
    dispatcher = make_dispatcher(registry)
    assert dispatcher.dispatch(call_node(torch.ops.aten.add.Tensor, t(), t())) is custom_add
    [warning] = recorded(dispatcher, OVERLOADS, Level.WARNING)
    assert "aten::add.Tensor" in warning.message
    assert "aten::add " in warning.message or "aten::add instead" in warning.message
    assert warning.location.line == 42


def test_overload_packet_uses_its_registered_overload():
    dispatcher = make_dispatcher()
    node = call_node(torch.ops.aten.sym_size, t(), 0)
    assert dispatcher.dispatch(node).name == "aten_sym_size"
    assert recorded(dispatcher, OVERLOADS, Level.WARNING)


# -- complex ---------------------------------------------------------------------------


def test_complex_inputs_choose_the_complex_implementation():
    dispatcher = make_dispatcher()
    node = call_node(torch.ops.aten.mul.Tensor, t(torch.complex64), t(torch.complex64))
    assert dispatcher.dispatch(node).name == "aten_mul_complex"
    real = call_node(torch.ops.aten.mul.Tensor, t(), t())
    assert dispatcher.dispatch(real).name == "aten_mul"


def test_complex_tensors_inside_lists_and_kwargs_count():
    dispatcher = make_dispatcher()
    cat = call_node(torch.ops.aten.cat.default, [t(), t(torch.complex64)], dim=0)
    assert dispatcher.dispatch_registered(cat).is_complex
    add = call_node(torch.ops.aten.add.Tensor, t(torch.complex64), other=t(torch.complex64))
    assert dispatcher.dispatch(add).name == "aten_add_complex"


def test_missing_complex_implementation_is_an_error():
    registry = OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    dispatcher = make_dispatcher(registry)
    node = call_node(torch.ops.aten.mul.Tensor, t(torch.complex64), t(torch.complex64))
    with pytest.raises(DispatchError) as info:
        dispatcher.dispatch(node)
    message = str(info.value)
    assert "aten::mul.Tensor has no complex implementation" in message
    assert "is_complex=True" in message
    assert info.value.diagnostic.rule == NO_FUNCTION
    assert info.value.diagnostic.level == Level.ERROR
    assert info.value.node_target is torch.ops.aten.mul.Tensor


def test_registered_complex_implementation_is_used():
    registry = OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    registry.register_op(traced_complex_mul, "aten", "mul", "Tensor", is_complex=True)
    dispatcher = make_dispatcher(registry)
    node = call_node(torch.ops.aten.mul.Tensor, t(torch.complex128), t(torch.complex128))
    assert dispatcher.dispatch(node) is traced_complex_mul


def test_complex_only_operator_with_real_inputs_is_an_error():
    dispatcher = make_dispatcher()
    with pytest.raises(DispatchError, match="only has complex implementations"):
        dispatcher.dispatch(call_node(torch.ops.aten.view_as_real.default, t()))


# -- unsupported operators -------------------------------------------------------------


def test_unregistered_operator_raises_with_the_users_line():
    dispatcher = make_dispatcher()
    node = call_node(torch.ops.aten._assert_tensor_metadata.default, t())
    with pytest.raises(DispatchError) as info:
        dispatcher.dispatch(node)
    error = info.value
    message = str(error)
    assert "aten::_assert_tensor_metadata" in message
    assert f"'{node.name}'" in message
    assert "/home/user/project/model.py:42" in message
    assert "register_op" in message
    assert error.node_name == node.name
    diagnostic = error.diagnostic
    assert diagnostic.rule == NO_FUNCTION and diagnostic.level == Level.ERROR
    assert diagnostic.location.path == "/home/user/project/model.py"
    assert diagnostic.stack is not None and len(diagnostic.stack.frames) == 1
    assert dispatcher.diagnostic_context.has_errors()


def test_unnameable_target_raises_dispatch_error():
    dispatcher = make_dispatcher()
    with pytest.raises(DispatchError, match="Cannot name the call_function target"):
        dispatcher.dispatch(call_node(lambda x: x, t()))


# -- custom operators in a custom domain -----------------------------------------------


class ScaleModel(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fx2onnx_dispatch_test.scale(x).relu()


def _exported_scale_graph() -> torch.fx.GraphModule:
    return torch.export.export(ScaleModel(), (torch.randn(2, 3),)).graph_module


def test_custom_operator_dispatches_to_a_custom_domain_function():
    graph_module = _exported_scale_graph()
    registry = OnnxRegistry()
    dispatcher = make_dispatcher(registry)
    [unsupported] = dispatcher.unsupported_nodes(graph_module)
    assert unsupported.target is torch.ops.fx2onnx_dispatch_test.scale.default

    registered = registry.register_op(example_scale, "fx2onnx_dispatch_test", "scale")
    assert registered.domain == "com.example"
    assert dispatcher.unsupported_nodes(graph_module) == []
    assert dispatcher.dispatch(unsupported) is example_scale
    diagnostic = recorded(dispatcher, MATCH)[-1]
    assert diagnostic.location.path == __file__
    assert "fx2onnx_dispatch_test.scale(x)" in diagnostic.location.snippet


def test_unsupported_nodes_recurse_into_submodules_and_skip_getitem():
    inner = torch.fx.Graph()
    x = inner.placeholder("x")
    bad = inner.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,))
    pair = inner.call_function(torch.ops.aten.split.Tensor, (x, 1))
    first = inner.call_function(operator.getitem, (pair, 0))
    inner.output(first)
    inner_module = torch.fx.GraphModule(torch.nn.Module(), inner)

    outer = torch.fx.Graph()
    y = outer.placeholder("y")
    z = outer.call_module("block", (y,))
    unsupported_outer = outer.call_function(torch.ops.fx2onnx_dispatch_test.scale.default, (z,))
    outer.output(outer.call_function(torch.ops.aten.relu.default, (unsupported_outer,)))
    root = torch.nn.Module()
    root.block = inner_module
    graph_module = torch.fx.GraphModule(root, outer)

    dispatcher = make_dispatcher()
    found = dispatcher.unsupported_nodes(graph_module)
    assert [n.name for n in found] == [bad.name, unsupported_outer.name]
    assert "aten::_assert_tensor_metadata" in dispatcher.unsupported_reason(bad)
    assert dispatcher.diagnostic_context._diagnostics == []  # analysis records nothing


def test_unsupported_reason_checks_kind_and_binding():
    registry = OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    registry.remove_op("aten", "squeeze", "dims")  # left: aten::squeeze, which takes only `self`
    dispatcher = make_dispatcher(registry)
    complex_mul = call_node(torch.ops.aten.mul.Tensor, t(torch.complex64), t(torch.complex64))
    assert "no complex implementation" in dispatcher.unsupported_reason(complex_mul)
    squeeze = call_node(torch.ops.aten.squeeze.dims, t(), [0])
    assert "takes these arguments" in dispatcher.unsupported_reason(squeeze)
    assert dispatcher.unsupported_reason(call_node(torch.ops.aten.squeeze.dim, t(), 0)) is None
    assert dispatcher.unsupported_reason(call_node(operator.getitem, (t(), t()), 0)) is None


# -- locations -------------------------------------------------------------------------

LIBRARY_TRACE = """\
  File "/home/user/project/train.py", line 10, in forward
    y = self.block(x)
  File "/usr/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py", line 300, in forward
    h = self.attn(h)
  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1700, in _call_impl
    return forward_call(*args, **kwargs)
"""


def _node_with_trace(text):
    return call_node(torch.ops.aten.relu.default, t(), stack_trace=text)


def test_node_location_prefers_the_users_own_code():
    location = node_location(_node_with_trace(LIBRARY_TRACE))
    assert (location.path, location.line) == ("/home/user/project/train.py", 10)
    assert location.snippet == "y = self.block(x)"


def test_node_location_falls_back_to_the_library_frame():
    library_only = "\n".join(LIBRARY_TRACE.splitlines()[2:])
    location = node_location(_node_with_trace(library_only))
    assert location.path.endswith("transformers/models/gpt2/modeling_gpt2.py")
    assert location.line == 300


def test_node_location_skips_torch_and_exporter_frames():
    torch_only = "\n".join(LIBRARY_TRACE.splitlines()[4:])
    assert node_location(_node_with_trace(torch_only)) is None
    relative = '  File "torch/fx/passes/runtime_assert.py", line 24, in insert\n    x\n'
    assert node_location(_node_with_trace(relative)) is None


def test_node_without_stack_trace_has_no_location():
    node = _node_with_trace(None)
    assert not node_stack(node)
    assert node_location(node) is None


def test_node_location_of_an_exported_model_is_this_file():
    graph_module = _exported_scale_graph()
    relu = next(n for n in graph_module.graph.nodes if n.target is torch.ops.aten.relu.default)
    location = node_location(relu)
    assert location.path == __file__
    assert location.function == "forward"


# -- a whole exported model ------------------------------------------------------------


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(4, 6)

    def forward(self, x, z):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        h = self.fc(h)
        h = torch.cat([h, h * 2], dim=1).view(h.shape[0], -1, 3)
        c = torch.view_as_complex(z) * torch.view_as_complex(z)
        return h.softmax(-1), torch.view_as_real(c), torch.where(h > 0, h, 0.5)


def test_every_node_of_an_exported_model_matches_perfectly():
    program = torch.export.export(
        SmallNet().eval(),
        (torch.randn(2, 3, 8, 8), torch.randn(5, 2)),
        dynamic_shapes=({0: torch.export.Dim("batch")}, None),
    )
    graph_module = program.run_decompositions({}).graph_module
    dispatcher = make_dispatcher()
    assert dispatcher.unsupported_nodes(graph_module) == []
    chosen = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_function":
            chosen[node.name] = dispatcher.dispatch_registered(node)
    assert recorded(dispatcher, level=Level.WARNING) == []
    assert recorded(dispatcher, level=Level.ERROR) == []
    assert all(d.rule == MATCH for d in recorded(dispatcher))
    complex_choices = {name for name, f in chosen.items() if f.is_complex}
    assert any(name.startswith("mul") for name in complex_choices)
    assert any(name.startswith("view_as_real") for name in complex_choices)
    assert any(f.onnx_function.name == "aten_sym_size" for f in chosen.values())


def test_stack_location_works_on_any_stack():
    from diagnostics import Stack

    from dispatcher import stack_location

    stack = Stack.from_python_traceback(LIBRARY_TRACE)
    assert stack_location(stack).path == "/home/user/project/train.py"
    assert stack_location(Stack()) is None


# -- remembered choices ------------------------------------------------------------------


def test_same_call_is_matched_once_and_other_types_are_matched_again(monkeypatch):
    dispatcher = make_dispatcher(level=logging.INFO)  # perfect matches are not recorded
    matched = []
    import dispatcher.dispatcher as dispatcher_module

    original = dispatcher_module.decide

    def counting(registry, node):
        matched.append(node.name)
        return original(registry, node)

    monkeypatch.setattr(dispatcher_module, "decide", counting)
    add = torch.ops.aten.add.Tensor
    first = dispatcher.dispatch(call_node(add, t(), t()))
    again = dispatcher.dispatch(call_node(add, t(shape=(5, 7)), t(shape=(5, 7))))  # same dtypes and ranks
    assert first is again and len(matched) == 1
    integer = dispatcher.dispatch(call_node(add, t(torch.int64), t(torch.int64)))
    scaled = dispatcher.dispatch(call_node(add, t(), t(), alpha=2.0))
    assert len(matched) == 3  # another dtype, another constant: matched again
    assert integer is not None and scaled is not None


def test_choices_are_not_remembered_when_each_must_be_reported():
    dispatcher = make_dispatcher(level=logging.DEBUG)  # every perfect match is a diagnostic
    for _ in range(2):
        dispatcher.dispatch(call_node(torch.ops.aten.add.Tensor, t(), t()))
    assert len(recorded(dispatcher, MATCH)) == 2


# -- the decision ----------------------------------------------------------------------


def test_decide_returns_the_choice_or_a_typed_refusal_and_records_nothing():
    from dispatcher import Refusal, decide

    registry = OnnxRegistry()
    perfect = decide(registry, call_node(torch.ops.aten.add.Tensor, t(), t()))
    assert perfect.is_perfect and not perfect.fell_back and perfect.refusal is None
    assert perfect.qualified_name == "aten::add.Tensor" and perfect.overloads == ("aten::add.Tensor",)
    assert perfect.chosen is perfect.candidates[-1]

    registry.remove_op("aten", "squeeze", "dims")  # left: aten::squeeze, which takes only `self`
    refused = decide(registry, call_node(torch.ops.aten.squeeze.dims, t(), [0]))
    assert refused.refusal is Refusal.NO_SIGNATURE_FITS and refused.chosen is None
    assert refused.fell_back and refused.overloads == ("aten::squeeze",)
    assert all(not c.match.is_candidate for c in refused.candidates) and "takes these arguments" in refused.reason

    unnamed = decide(registry, call_node(lambda x: x, t()))
    assert unnamed.refusal is Refusal.UNNAMED and unnamed.op_name is None and unnamed.reason
    missing = decide(registry, call_node(torch.ops.fx2onnx_dispatch_test.scale.default, t()))
    assert missing.refusal is Refusal.NOT_REGISTERED and "fx2onnx_dispatch_test::scale" in missing.reason
