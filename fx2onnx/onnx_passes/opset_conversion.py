"""The ONNX opset the user asks for (`ExportOptions(opset_version=N)`).

The model is built at torchlib's opset (18) and converted once, after optimization and
before validation, module functions included (they keep being functions):

- up (19 and later): onnxscript's version converter steps every node up one opset at a
  time; only DFT, GridSample and GroupNormalization changed meaning on the way and get
  rewritten. Its per-model entry point inlines functions first, so its per-node converter
  is reached here, in one place (private to onnxscript; a test fails when it moves). A
  function that reads attributes of its call (torchlib's `aten_hardtanh`, ReLU6) is
  inlined first: the converter refuses such references.
- down (17): ONNX's own converter has no adapter from 18 for Split and drops functions,
  so the few operators whose form changed in opset 18 are rewritten here: the reductions'
  `axes` input back to an attribute, Split's `num_outputs` to split sizes. An operator
  that opset 17 cannot express (new in 18, or a new mode) is a clear error.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from fx2onnx.onnx_passes.model_graphs import model_graphs

from diagnostics import DiagnosticContext, Level, rules

# Below 17 the conversion would need adapters for many more operators.
MIN_OPSET = 17

# Operators whose `axes` became an input in opset 18 (ReduceSum did so in 13).
_REDUCTIONS_WITH_AXES_INPUT = frozenset(
    {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSumSquare"}
)
# Operators opset 17 does not have.
_NEW_IN_18 = frozenset(
    {"BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "CenterCropPad", "Col2Im", "GroupNormalization", "Mish",
     "OptionalGetElement", "OptionalHasElement"}
)


class OpsetConversionError(ValueError):
    """The model cannot be written at the opset asked for."""


def _converter() -> Any:
    """onnxscript's per-node version converter (private to onnxscript; reached only here)."""
    from onnxscript.version_converter import _version_converter

    return _version_converter


@functools.cache
def newest_opset() -> int:
    """The newest ONNX opset that the installed onnx, onnxruntime and onnxscript's
    converter all know."""
    newest = min(onnx.defs.onnx_opset_version(), int(_converter().SUPPORTED_MAX_ONNX_OPSET))
    try:
        import onnxruntime as ort
    except ImportError:  # no runtime installed: onnx's newest opset is the limit
        return newest
    for version in range(newest, MIN_OPSET - 1, -1):
        if _runtime_accepts(ort, version):
            return version
    return MIN_OPSET


def _runtime_accepts(ort, version: int) -> bool:  # noqa: ANN001 - the onnxruntime module
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)], ir_version=8)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - any refusal means: not this opset
        logging.getLogger(__name__).debug("onnxruntime refuses opset %d: %s", version, error)
        return False
    return True


def check_opset_version(version: int | None) -> None:
    """Refuse an opset outside what fx2onnx writes and the installed runtime runs."""
    if version is None:
        return
    newest = newest_opset()
    if isinstance(version, bool) or not isinstance(version, int) or not MIN_OPSET <= version <= newest:
        raise ValueError(
            f"ExportOptions(opset_version={version!r}) is not supported: give an ONNX opset from {MIN_OPSET} "
            f"to {newest} (the newest that the installed onnx, onnxruntime and onnxscript convert to and run), or None for the default."
        )


def convert_to_opset(model: ir.Model, target: int, context: DiagnosticContext) -> bool:
    """`convert_opset`, with a failure recorded as an error (FXE0022); False then."""
    try:
        convert_opset(model, target)
    except OpsetConversionError as error:
        context.record(rules.MODEL_VALIDATION, Level.ERROR, message=str(error))
        return False
    return True


def convert_opset(model: ir.Model, target: int) -> None:
    """Convert ``model`` (built at one default-domain opset) to ``target`` in place,
    functions included. Raises `OpsetConversionError` naming the node that cannot be."""
    current = model.opset_imports.get("", model.graph.opset_imports.get(""))
    if current is None or current == target:
        return
    if target > current:
        _convert_up(model, target)
    else:
        for container in model_graphs(model):
            for node in list(container):
                if node.domain == "" and (node.version or current) > target:
                    _convert_node_down(container, node, target)
    _set_default_opset(model, target)


def _reads_attributes_of_its_call(function: ir.Function) -> bool:
    """Whether a node of ``function`` takes an attribute from the calling node (torchlib's
    `aten_hardtanh`: a Constant of its `min_val`), which the converter refuses."""
    return any(attribute.is_ref() for node in function for attribute in node.attributes.values())


def _convert_up(model: ir.Model, target: int) -> None:
    _version_converter = _converter()
    # inlined where called: each call's own values instead of references to them
    common_passes.InlinePass(criteria=_reads_attributes_of_its_call)(model)
    failures: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            failures.append(record.getMessage())

    # The converter logs a node it cannot convert and goes on: here that is an error.
    handler, logger = _Collect(level=logging.WARNING), logging.getLogger(_version_converter.__name__)
    logger.addHandler(handler)
    try:
        _version_converter.convert_version(model, target)
    except (_version_converter.VersionConverterError, ValueError) as error:
        raise OpsetConversionError(f"The model cannot be converted to opset {target}: {error}") from error
    finally:
        logger.removeHandler(handler)
    if failures:
        raise OpsetConversionError(f"The model cannot be converted to opset {target}: " + "; ".join(failures))


def _set_default_opset(model: ir.Model, target: int) -> None:
    model.graph.opset_imports[""] = target
    for function in model.functions.values():
        if "" in function.opset_imports:
            function.opset_imports[""] = target
    for container in model_graphs(model):
        for node in container:
            if node.domain == "":
                node.version = None  # the opset import of its graph says it


def _convert_node_down(container: ir.Graph | ir.Function, node: ir.Node, target: int) -> None:
    where = f"node '{node.name}' ({node.op_type})"
    if node.op_type in _NEW_IN_18:
        raise OpsetConversionError(f"{where} has no form in opset {target}: {node.op_type} is new in opset 18. Export with opset_version=18 or later.")
    if node.op_type in _REDUCTIONS_WITH_AXES_INPUT:
        _axes_as_attribute(node, where)
    elif node.op_type == "Split" and "num_outputs" in node.attributes:
        _split_sizes_as_input(container, node, where)
    elif node.op_type == "Pad" and len(node.inputs) > 3 and node.inputs[3] is not None:
        raise OpsetConversionError(f"{where} pads chosen axes, which needs opset 18. Export with opset_version=18 or later.")
    elif node.op_type == "Resize" and any(name in node.attributes for name in ("antialias", "axes", "keep_aspect_ratio_policy")):
        raise OpsetConversionError(f"{where} uses an attribute of opset 18 (antialias, axes or keep_aspect_ratio_policy). Export with opset_version=18 or later.")
    elif node.op_type in ("ScatterElements", "ScatterND") and node.attributes.get("reduction") is not None and node.attributes["reduction"].as_string() in ("max", "min"):
        raise OpsetConversionError(f"{where} reduces with max or min, which needs opset 18. Export with opset_version=18 or later.")


def _axes_as_attribute(node: ir.Node, where: str) -> None:
    """A reduction of opset 18 (axes input, `noop_with_empty_axes`) in opset 17's form."""
    axes = _constant(node.inputs[1], where, "axes") if len(node.inputs) > 1 and node.inputs[1] is not None else None
    noop = node.attributes.pop("noop_with_empty_axes", None)
    if noop is not None and noop.as_int() and (axes is None or axes.size == 0):
        raise OpsetConversionError(f"{where} reduces over no axes as an identity, which needs opset 18. Export with opset_version=18 or later.")
    if axes is not None:
        if axes.size:
            node.attributes["axes"] = ir.AttrInt64s("axes", [int(a) for a in axes.reshape(-1)])
        node.replace_input_with(1, None)
        node.resize_inputs(1)


def _constant(value: ir.Value, where: str, what: str) -> np.ndarray:
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        raise OpsetConversionError(f"{where} takes its {what} at run time; opset 17 needs them constant. Export with opset_version=18 or later.")
    return tensor.numpy()


def _split_sizes_as_input(container: ir.Graph | ir.Function, node: ir.Node, where: str) -> None:
    """Split with `num_outputs` (opset 18) as Split with the sizes as an input: the split
    axis must be static; the last part is the smaller one, as in opset 18."""
    parts = node.attributes["num_outputs"].as_int()
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
    shape = node.inputs[0].shape if node.inputs[0] is not None else None
    size = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
    if not isinstance(size, int):
        raise OpsetConversionError(f"{where} splits a dim whose size is known only at run time into {parts} parts; opset 17 needs the sizes. Export with opset_version=18 or later.")
    chunk = -(-size // parts)
    sizes = [min(chunk, size - chunk * index) for index in range(parts)]
    constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(sizes, dtype=np.int64), name=f"{node.name}_sizes")})
    constant.outputs[0].name = f"{node.name}_split_sizes"
    container.insert_before(node, constant)
    del node.attributes["num_outputs"]
    node.resize_inputs(2)
    node.replace_input_with(1, constant.outputs[0])
