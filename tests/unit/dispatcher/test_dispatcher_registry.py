"""OnnxRegistry: torchlib's functions plus user registrations."""

from __future__ import annotations

import math
import operator

import pytest
import torch
from onnxscript import FLOAT, opset18 as op, script
from onnxscript.values import OnnxFunction, Opset, TracedOnnxFunction

from dispatcher import OnnxRegistry, RegisteredFunction


@script()
def custom_relu(x: FLOAT) -> FLOAT:
    return op.Relu(x)


@script()
def custom_add(self: FLOAT, other: FLOAT, alpha: float = 1.0) -> FLOAT:
    return op.Add(self, other)


def traced_add(self, other, alpha: float = 1.0):
    return op.Add(self, other)


traced_custom_add = TracedOnnxFunction(Opset("com.example", 1), traced_add)


@pytest.fixture(scope="module")
def registry() -> OnnxRegistry:
    return OnnxRegistry()


def test_torchlib_functions_are_registered(registry):
    names = registry.all_registered_ops()
    assert len(names) >= 500
    for name in (
        "aten::add.Tensor",
        "aten::relu",
        "aten::sym_size.int",
        "aten::convolution",
        "math::ceil",
        "_operator::add",
        "_operator::getitem",
        "prims::convert_element_type",
    ):
        assert name in names, name
    assert not any(name.startswith("internal::") for name in names)
    assert not any(name.endswith(".default") for name in names)


def test_torchlib_entries_carry_their_kind(registry):
    functions = registry.get_op_functions("aten", "add", "Tensor")
    assert [(f.is_custom, f.is_complex) for f in functions] == [(False, False), (False, True)]
    assert all(isinstance(f, RegisteredFunction) for f in functions)
    assert all(f.qualified_name == "aten::add.Tensor" for f in functions)
    assert all(isinstance(f.onnx_function, (OnnxFunction, TracedOnnxFunction)) for f in functions)
    total = sum(len(v) for v in registry._registry.values())
    assert total >= 550


def test_opset_version_is_torchlibs(registry):
    assert registry.opset_version == 18


def test_default_overload_spellings_are_the_same_key(registry):
    by_none = registry.get_op_functions("aten", "relu")
    assert by_none is not None
    assert registry.get_op_functions("aten", "relu", "default") == by_none
    assert registry.get_op_functions("aten", "relu", "") == by_none
    assert registry.get_functions("aten::relu.default") == by_none
    assert registry.is_registered_op("aten", "relu", None)


def test_unknown_op_gives_none(registry):
    assert registry.get_op_functions("aten", "no_such_op") is None
    assert not registry.is_registered_op("aten", "add", "no_such_overload")


def test_register_op_registers_a_custom_function():
    registry = OnnxRegistry()
    registered = registry.register_op(custom_relu, "test", "test_op", "default")
    assert registry.is_registered_op("test", "test_op", "default")
    assert registry.is_registered_op("test", "test_op")
    assert registry.get_op_functions("test", "test_op") == [registered]
    assert registered == RegisteredFunction(custom_relu, "test::test_op", is_custom=True)
    assert "test::test_op" in registry.all_registered_ops()


def test_custom_function_joins_after_the_default_ones():
    registry = OnnxRegistry()
    registry.register_op(custom_add, "aten", "add", "Tensor")
    registry.register_op(traced_custom_add, "aten", "add", "Tensor", is_complex=True)
    functions = registry.get_op_functions("aten", "add", "Tensor")
    assert [f.onnx_function for f in functions[2:]] == [custom_add, traced_custom_add]
    assert [(f.is_custom, f.is_complex) for f in functions] == [
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    ]
    assert functions[3].domain == "com.example"


def test_registrations_do_not_leak_between_registries():
    first = OnnxRegistry()
    first.register_op(custom_relu, "test", "leak_check")
    assert first.is_registered_op("test", "leak_check")
    assert not OnnxRegistry().is_registered_op("test", "leak_check")
    first.remove_op("aten", "add", "Tensor")
    assert OnnxRegistry().is_registered_op("aten", "add", "Tensor")


def test_get_op_functions_returns_a_copy(registry):
    functions = registry.get_op_functions("aten", "relu")
    functions.clear()
    assert registry.get_op_functions("aten", "relu")


@pytest.mark.parametrize("bad", [lambda x: x, "aten_relu", None, torch.relu])
def test_register_op_rejects_non_onnxscript_functions(bad):
    registry = OnnxRegistry()
    with pytest.raises(TypeError, match="needs an ONNX Script function"):
        registry.register_op(bad, "test", "bad_op")
    assert not registry.is_registered_op("test", "bad_op")


def test_remove_op_by_kind():
    registry = OnnxRegistry()
    removed = registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    assert [f.is_complex for f in removed] == [True]
    assert [f.is_complex for f in registry.get_op_functions("aten", "mul", "Tensor")] == [False]
    registry.remove_op("aten", "mul", "Tensor")
    assert not registry.is_registered_op("aten", "mul", "Tensor")
    assert "aten::mul.Tensor" not in registry.all_registered_ops()


@pytest.mark.parametrize(
    ("target", "supported"),
    [
        (torch.ops.aten.add.Tensor, True),
        (torch.ops.aten.relu.default, True),
        (torch.ops.aten.sym_size.int, True),
        (torch.ops.aten.sym_size, True),  # the packet resolves to its registered overload
        (operator.add, True),
        (operator.mul, True),
        (math.ceil, True),
        (torch.ops.aten._assert_tensor_metadata.default, False),
        (lambda x: x, False),
    ],
)
def test_is_supported(registry, target, supported):
    assert registry.is_supported(target) is supported


def test_is_supported_falls_back_to_the_default_overload():
    registry = OnnxRegistry()
    registry.remove_op("aten", "add", "Tensor")
    assert not registry.is_supported(torch.ops.aten.add.Tensor)
    registry.register_op(custom_add, "aten", "add")  # default overload only
    assert registry.is_supported(torch.ops.aten.add.Tensor)
    assert registry.candidate_names(torch.ops.aten.add.Tensor) == ["aten::add"]


def test_default_overload_that_cannot_take_the_arguments_does_not_count():
    registry = OnnxRegistry()
    # Without its own function, squeeze.dims falls back to aten::squeeze, which takes
    # only `self`: squeeze.dims needs `dim` too.
    registry.remove_op("aten", "squeeze", "dims")
    assert registry.candidate_names(torch.ops.aten.squeeze.dims) == ["aten::squeeze"]
    assert not registry.is_supported(torch.ops.aten.squeeze.dims)
    assert registry.is_supported(torch.ops.aten.squeeze.dim)
    # `out=` overloads need a keyword argument no ONNX function has.
    registry.register_op(custom_relu, "aten", "hardtanh")
    assert not registry.is_supported(torch.ops.aten.hardtanh.out)


def test_torchlib_registry_read_directly_matches_onnxscripts_public_listing():
    """The registry reads torchlib's registration table directly (the public listing
    builds every function's IR, seconds of work); both must list the same functions."""
    from onnxscript._framework_apis import torch_2_5

    from dispatcher.registry import _torchlib_functions

    public = {
        (meta.qualified_name, meta.function.name, meta.is_complex)
        for meta in torch_2_5.get_torchlib_ops()
        if not meta.qualified_name.startswith("internal::")
    }
    ours = {(f.onnx_function and key, f.name, f.is_complex) for key, f in _torchlib_functions()}
    assert {name for _, name, _ in ours} == {name for _, name, _ in public}
    assert {(name, complex_) for _, name, complex_ in ours} == {(name, complex_) for _, name, complex_ in public}
