"""Signature matching of FX arguments against ONNX Script signatures."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.fx
from onnxscript import BOOL, FLOAT, INT64, opset18 as op, script
from onnx_ir.schemas import OpSignature
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from dispatcher import match_signature, optional_parameters
from dispatcher.registry import OnnxRegistry

# -- hand-made signatures -------------------------------------------------------------


@script()
def mul_float(self: FLOAT, other: FLOAT) -> FLOAT:
    return op.Mul(self, other)


@script()
def mul_bool(self: BOOL, other: BOOL) -> BOOL:
    return op.And(self, other)


@script()
def reduce_with_attrs(
    self: FLOAT, axis: int, keepdim: int = 0, mode: str = "mean", axes: list[int] = [0], scale: float = 1.0
) -> FLOAT:
    return op.Identity(self)


@script()
def reshape_int64(self: FLOAT, shape: INT64) -> FLOAT:
    return op.Reshape(self, shape)


def signature(function) -> OpSignature:
    return function.op_signature


def torchlib(qualified_name: str):
    return OnnxRegistry().get_functions(qualified_name)[0].onnx_function.op_signature


# -- FX arguments with FakeTensor-like metadata -----------------------------------------

_shape_env = ShapeEnv()


class Graph:
    """Makes placeholder nodes whose meta["val"] is a given value."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self._ids = itertools.count()

    def node(self, val) -> torch.fx.Node:
        node = self.graph.placeholder(f"arg{next(self._ids)}")
        node.meta["val"] = val
        return node

    def tensor(self, dtype=torch.float32, shape=(2, 3)) -> torch.fx.Node:
        return self.node(torch.empty(shape, dtype=dtype, device="meta"))


@pytest.fixture
def g() -> Graph:
    return Graph()


# -- inputs -------------------------------------------------------------------------


def test_two_float_tensors_match_perfectly(g):
    match = match_signature(signature(mul_float), (g.tensor(), g.tensor()), {})
    assert match.is_perfect
    assert match.score == 2


def test_scores_count_fitting_inputs(g):
    floats = (g.tensor(), g.tensor())
    bools = (g.tensor(torch.bool), g.tensor(torch.bool))
    assert match_signature(signature(mul_float), bools, {}).score == 0
    assert match_signature(signature(mul_bool), bools, {}).score == 2
    assert match_signature(signature(mul_bool), floats, {}).score == 0
    mixed = match_signature(signature(mul_float), (g.tensor(), g.tensor(torch.int64)), {})
    assert mixed.score == 1
    assert not mixed.is_perfect
    [misfit] = mixed.mismatches
    assert misfit.name == "other"
    assert "INT64" in misfit.got and "FLOAT" in misfit.allowed


def test_complex_tensors_are_their_real_component_type(g):
    assert match_signature(signature(mul_float), (g.tensor(torch.complex64),) * 2, {}).is_perfect


def test_symbolic_scalars_are_0d_tensors(g):
    sym_int = g.node(_shape_env.create_unbacked_symint())
    sym_float = g.node(_shape_env.create_unbacked_symfloat())
    sym_bool = g.node(_shape_env.create_unbacked_symbool())
    add = torchlib("_operator::add")
    assert match_signature(add, (sym_int, 1), {}).is_perfect
    ceil = torchlib("math::ceil")
    assert match_signature(ceil, (sym_float,), {}).is_perfect
    assert not match_signature(ceil, (sym_int,), {}).is_perfect
    assert match_signature(signature(mul_bool), (sym_bool, sym_bool), {}).is_perfect
    assert match_signature(signature(reshape_int64), (g.tensor(), sym_int), {}).is_perfect


@pytest.mark.parametrize(
    ("function", "value", "fits"),
    [
        (mul_float, 2, True),  # an int scalar is fine for a float tensor
        (mul_float, 2.5, True),
        (mul_float, True, True),
        (mul_bool, True, True),
        (mul_bool, 2, False),
        (reshape_int64, 2.5, False),  # a float cannot become an int64 tensor
        (reshape_int64, 2, True),
    ],
)
def test_python_scalars_fit_by_kind(g, function, value, fits):
    params = signature(function).inputs
    first = g.tensor(torch.bool if function is mul_bool else torch.float32)
    match = match_signature(signature(function), (first, value), {})
    assert match.is_candidate
    check = {c.name: c for c in match.checks}[params[1].name]
    assert check.fits is fits


def test_lists_of_ints_and_symints_fit_int64_inputs(g):
    view = torchlib("aten::view")  # size: Sequence(Tensor(INT64))
    sym = g.node(_shape_env.create_unbacked_symint())
    assert match_signature(view, (g.tensor(), [2, -1]), {}).is_perfect
    assert match_signature(view, (g.tensor(), [sym, 3]), {}).is_perfect
    assert match_signature(view, (g.tensor(), []), {}).is_perfect  # a 0-d view
    assert not match_signature(view, (g.tensor(), [2.5, 1]), {}).is_perfect


def test_lists_of_tensors_are_sequences(g):
    cat = torchlib("aten::cat")
    assert match_signature(cat, ([g.tensor(), g.tensor()],), {"dim": 1}).is_perfect
    bad = match_signature(reshape_int64.op_signature, (g.tensor(), [g.tensor(), g.tensor()]), {})
    assert not bad.is_perfect


def test_optional_input_may_be_none(g):
    convolution = torchlib("aten::convolution")
    args = (g.tensor(shape=(1, 3, 8, 8)), g.tensor(shape=(4, 3, 3, 3)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    match = match_signature(convolution, args, {})
    assert match.is_perfect, match.summary()


def test_required_input_given_none_is_rejected(g):
    match = match_signature(signature(mul_float), (g.tensor(), None), {})
    assert not match.is_candidate
    assert "other" in match.rejected


def test_node_without_metadata_is_not_held_against_the_function(g):
    unknown = g.graph.placeholder("unknown")
    assert match_signature(signature(mul_float), (g.tensor(), unknown), {}).is_perfect


# -- attributes -----------------------------------------------------------------------


def test_attributes_of_every_type_fit(g):
    match = match_signature(
        signature(reduce_with_attrs),
        (g.tensor(), 1),
        {"keepdim": True, "mode": "sum", "axes": (0, 1), "scale": 2},
    )
    assert match.is_perfect, match.summary()
    assert match.score == 6


def test_dtype_fits_an_int_attribute(g):
    to_copy = torchlib("aten::_to_copy")
    match = match_signature(
        to_copy, (g.tensor(),), {"dtype": torch.float16, "layout": torch.strided, "device": torch.device("cpu")}
    )
    assert match.is_perfect, match.summary()


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"axis": 1.5}, "axis"),
        ({"axis": 1, "mode": 3}, "mode"),
        ({"axis": 1, "axes": 3}, "axes"),
        ({"axis": 1, "axes": [1.5]}, "axes"),
        ({"axis": 1, "scale": "big"}, "scale"),
        ({"axis": "0"}, "axis"),
    ],
)
def test_attribute_type_mismatch_is_named(g, kwargs, bad):
    match = match_signature(signature(reduce_with_attrs), (g.tensor(),), kwargs)
    assert match.is_candidate
    assert not match.is_perfect
    assert [c.name for c in match.mismatches] == [bad]
    assert match.score == len(kwargs)  # self fits, the bad attribute does not


def test_symbolic_value_does_not_fit_an_attribute(g):
    sym = g.node(_shape_env.create_unbacked_symint())
    match = match_signature(signature(reduce_with_attrs), (g.tensor(), sym), {})
    assert [c.name for c in match.mismatches] == ["axis"]


# -- binding --------------------------------------------------------------------------


def test_too_many_positional_arguments_is_not_a_candidate(g):
    match = match_signature(signature(mul_float), (g.tensor(), g.tensor(), g.tensor()), {})
    assert not match.is_candidate
    assert match.score is None
    assert "3 were given" in match.rejected


def test_unknown_keyword_is_not_a_candidate(g):
    match = match_signature(signature(mul_float), (g.tensor(), g.tensor()), {"alpha": 2})
    assert not match.is_candidate
    assert "alpha" in match.rejected


def test_missing_required_parameter_is_not_a_candidate(g):
    match = match_signature(signature(reduce_with_attrs), (g.tensor(),), {})
    assert not match.is_candidate
    assert "axis" in match.rejected


def test_none_and_ignored_keywords_are_dropped(g):
    args = (g.tensor(), g.tensor())
    kwargs = {"attr": None, "unrelated": None, "memory_format": torch.preserve_format, "device": "cpu"}
    assert match_signature(signature(mul_float), args, kwargs).is_perfect


def test_keyword_and_positional_binding_agree(g):
    x, y = g.tensor(), g.tensor()
    assert match_signature(signature(mul_float), (x,), {"other": y}).is_perfect
    twice = match_signature(signature(mul_float), (x, y), {"other": y})
    assert not twice.is_candidate


def test_signature_none_is_rejected():
    assert not match_signature(None, (), {}).is_candidate


def test_optional_annotations_lost_by_the_signature_still_accept_none(g):
    # torchlib: output_size: Optional[INT64]; onnx_ir's signature says "required INT64".
    [upsample] = OnnxRegistry().get_functions("aten::upsample_bilinear2d.vec")
    function = upsample.onnx_function
    args = (g.tensor(shape=(1, 3, 4, 4)), None, False, [2.0, 2.0])
    assert not match_signature(function.op_signature, args, {}).is_candidate
    match = match_signature(function.op_signature, args, {}, optional=optional_parameters(function))
    assert match.is_perfect, match.summary()
    assert "output_size" in optional_parameters(function)


def test_string_constant_fits_an_any_type_input(g):
    div_mode = torchlib("aten::div.Tensor_mode")
    ids = g.tensor(torch.int64)
    assert match_signature(div_mode, (ids, 3), {"rounding_mode": "floor"}).is_perfect
    assert not match_signature(signature(mul_float), (g.tensor(), "x"), {}).is_perfect
