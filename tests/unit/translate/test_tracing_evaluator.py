"""TracingEvaluator on its own: onnxscript ops and functions recorded as graph nodes."""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir
import onnxruntime
import onnxscript
import onnxscript.evaluator
import numpy as np
import pytest
import torch
from onnxscript import FLOAT, opset18 as op

from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.tracing_evaluator import GraphConstructionError, TracingEvaluator


@onnxscript.script(onnxscript.values.Opset("pkg.test", 1), default_opset=op)
def _scaled(x: FLOAT, scale: float = 2.0) -> FLOAT:
    return op.Mul(x, op.Constant(value_float=scale))


def _traced(x, y):
    return op.Add(op.Relu(x), y)


def _run(builder: GraphBuilder, outputs, feeds):
    builder.set_outputs(outputs)
    proto = ir.serde.serialize_model(builder.build_model("test"))
    onnx.checker.check_model(proto, full_check=True)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_an_op_call_becomes_a_node_and_python_numbers_constants_of_the_bound_type() -> None:
    builder = GraphBuilder()
    x = builder.add_input("x", ir.DataType.DOUBLE, ir.Shape([2]))
    evaluator = TracingEvaluator(builder)
    with onnxscript.evaluator.default_as(evaluator):
        result = op.Add(x, 1)  # the int binds to T, which x makes DOUBLE
    add = result.producer()
    assert add.op_type == "Add" and add.inputs[1].const_value is not None
    assert add.inputs[1].dtype == ir.DataType.DOUBLE
    assert result.dtype == ir.DataType.DOUBLE and result.shape == ir.Shape([2])  # inferred
    (got,) = _run(builder, [result], {"x": np.array([1.0, 2.0])})
    np.testing.assert_allclose(got, [2.0, 3.0])


def test_a_traced_function_runs_its_python_body_into_primitive_nodes() -> None:
    builder = GraphBuilder()
    x = builder.add_input("x", ir.DataType.FLOAT, ir.Shape([3]))
    y = builder.add_input("y", ir.DataType.FLOAT, ir.Shape([3]))
    evaluator = TracingEvaluator(builder)
    traced = onnxscript.values.TracedOnnxFunction(op, _traced)
    with onnxscript.evaluator.default_as(evaluator):
        result = evaluator.eval_function(traced, [x, y], {})
    assert [n.op_type for n in builder.graph] == ["Relu", "Add"]
    (got,) = _run(builder, [result], {"x": np.array([-1, 0, 2], np.float32), "y": np.ones(3, np.float32)})
    np.testing.assert_allclose(got, [1, 1, 3])


def test_a_compiled_function_becomes_a_call_of_a_local_function() -> None:
    builder = GraphBuilder()
    x = builder.add_input("x", ir.DataType.FLOAT, ir.Shape([2]))
    evaluator = TracingEvaluator(builder)
    with onnxscript.evaluator.default_as(evaluator):
        result = evaluator.eval_function(_scaled, [x], {"scale": 3.0})
    (call,) = list(builder.graph)
    assert (call.domain, call.op_type) == ("pkg.test", "_scaled")
    assert ("pkg.test", "_scaled", "") in builder.functions
    result.dtype, result.shape = ir.DataType.FLOAT, ir.Shape([2])
    (got,) = _run(builder, [result], {"x": np.array([1, 2], np.float32)})
    np.testing.assert_allclose(got, [3, 6])


def test_arguments_that_cannot_bind_are_a_graph_construction_error() -> None:
    builder = GraphBuilder()
    x = builder.add_input("x", ir.DataType.FLOAT, ir.Shape([2]))
    evaluator = TracingEvaluator(builder)
    with pytest.raises(GraphConstructionError, match="Relu"):
        evaluator.eval_op(onnxscript.values.Op(op, "Relu"), [x, x, x], {})


class _ScalarsFromEmptySizes(torch.nn.Module):
    """Factories of 0-d tensors: torchlib writes their size [] as an empty list attribute."""

    def forward(self, x):
        return torch.full((), 3.0) + x.sum(), x.new_zeros(()) + 1, torch.empty(()).fill_(2.0) * x


def test_an_empty_list_attribute_takes_the_declared_type(export_and_compare, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="onnx_ir"):
        program = export_and_compare(_ScalarsFromEmptySizes(), (torch.rand(3),))
    assert not [r for r in caplog.records if "ambiguous" in r.getMessage()]
    constants = [n for n in program.model.graph if n.op_type == "Constant" and "value_ints" in n.attributes]
    assert all(n.attributes["value_ints"].type == ir.AttributeType.INTS for n in constants)
