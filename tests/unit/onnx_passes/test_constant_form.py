"""Constants as `value` tensors (`onnx_passes/constant_form.py`)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx.onnx_passes.constant_form import constants_as_tensors


def test_every_short_form_becomes_a_tensor_of_its_type():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    forms = {"value_int": 3, "value_ints": [1, 2], "value_float": 0.5, "value_floats": [1.5, -2.0]}
    constants = [ir.node("Constant", [], attributes={name: data}) for name, data in forms.items()]
    kept = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([7], dtype=np.int32))})
    graph = ir.Graph([x], [c.outputs[0] for c in [*constants, kept]], nodes=[*constants, kept], opset_imports={"": 18})
    assert constants_as_tensors(ir.Model(graph, ir_version=10)) == 4
    got = {name: c.attributes["value"].value for name, c in zip(forms, constants)}
    assert [list(c.attributes) for c in constants] == [["value"]] * 4
    assert got["value_int"].dtype == ir.DataType.INT64 and got["value_int"].numpy().shape == ()
    assert got["value_ints"].numpy().tolist() == [1, 2]
    assert got["value_float"].dtype == ir.DataType.FLOAT and float(got["value_float"].numpy()) == 0.5
    assert got["value_floats"].numpy().tolist() == [1.5, -2.0]
    assert kept.attributes["value"].value.dtype == ir.DataType.INT32


def test_a_function_attribute_reference_is_left_as_it_is():
    constant = ir.node("Constant", [], attributes={"value_float": ir.RefAttr("value_float", "alpha", ir.AttributeType.FLOAT)})
    function = ir.Function(
        "custom", "scaled", graph=ir.Graph([], [constant.outputs[0]], nodes=[constant], opset_imports={"": 18}),
        attributes=[ir.Attr("alpha", ir.AttributeType.FLOAT, 1.0)],
    )
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 18}, name="main")
    model = ir.Model(graph, ir_version=10, functions=[function])
    assert constants_as_tensors(model) == 0
    assert constant.attributes["value_float"].is_ref()
