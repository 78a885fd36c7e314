"""Type legalization: every standard ONNX node gets input types its schema accepts.

torchlib maps an ATen operator to ONNX ops without checking that the ONNX op accepts the
dtype at hand (`Floor` or `Conv` on int64, `TopK` or `ArgMax` on bool, ...). This stage
runs on the finished model, after translation: for each node of the default domain (in
the main graph, in model-local function bodies and in sub-graphs) the dtypes bound to each
type parameter of the op's schema, for the opset in use, are checked. A type parameter
bound to a dtype the op does not accept is computed in the nearest accepted dtype: its
inputs are cast to it and the outputs it types are cast back, so the result keeps
PyTorch's dtype. Rounding ops on integers are identities and become `Identity`.

An integer or bool type that the schema accepts but ONNX Runtime's CPU provider has no
kernel for (`Gemm` or `DepthToSpace` on int64) is treated the same way, toward a type
that has one, so that the model runs on the reference runtime; floating types are never
changed for a runtime's sake (see `ONNXProgram` for low-precision runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import itertools

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import InlinePass

from diagnostics import DiagnosticContext, Level, rules
from fx2onnx.translate.graph_builder import infer_output_types, op_schema
from fx2onnx.onnx_passes.cpu_kernel_types import cpu_kernel_types
from fx2onnx.onnx_passes.model_graphs import model_nodes
from fx2onnx.translate.values import TracedValue

DataType = ir.DataType

# Rounding is the identity on integers and booleans (and casting through a float would
# lose int64 values above 2**53).
_IDENTITY_ON_INTEGERS = frozenset({"Floor", "Ceil", "Round"})

_INTEGERS = frozenset(
    {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
     DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.BOOL}
)

_FLOATS = frozenset({DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE})

# The dtypes a value is computed in when its own is not accepted, nearest first: wider
# integers keep integer semantics; float64 holds every integer up to 2**53 exactly.
_NEAREST: dict[DataType, tuple[DataType, ...]] = {
    DataType.BOOL: (DataType.INT32, DataType.INT64, DataType.UINT8, DataType.FLOAT, DataType.DOUBLE),
    DataType.INT8: (DataType.INT32, DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.UINT8: (DataType.INT32, DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.INT16: (DataType.INT32, DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.UINT16: (DataType.INT32, DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.INT32: (DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.UINT32: (DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.INT64: (DataType.DOUBLE, DataType.FLOAT, DataType.INT32),
    DataType.UINT64: (DataType.INT64, DataType.DOUBLE, DataType.FLOAT),
    DataType.FLOAT16: (DataType.FLOAT, DataType.DOUBLE),
    DataType.BFLOAT16: (DataType.FLOAT, DataType.DOUBLE),
    DataType.FLOAT: (DataType.DOUBLE, DataType.FLOAT16),
    DataType.DOUBLE: (DataType.FLOAT,),
}

# Largest integer magnitude a float dtype holds exactly (its mantissa's range).
_EXACT_INTEGER_LIMIT = {DataType.FLOAT: "2**24", DataType.DOUBLE: "2**53", DataType.FLOAT16: "2**11"}

METADATA_KEY = "pkg.fx2onnx.fx_node"

# The domain of torchlib's functions (and of its helpers' sub-domains).
_LIBRARY_DOMAIN = "pkg.onnxscript.torch_lib"


def type_string(dtype: DataType) -> str:
    """The ONNX schema spelling of a tensor type, e.g. ``tensor(int64)``."""
    return f"tensor({onnx.TensorProto.DataType.Name(dtype.value).lower()})"


def string_type(spelled: str) -> DataType:
    """The tensor type an ONNX schema spells ``spelled`` (``tensor(int64)``): `type_string`'s inverse."""
    return DataType(onnx.TensorProto.DataType.Value(spelled.removeprefix("tensor(").removesuffix(")").upper()))


@dataclass
class LegalizationReport:
    """What legalization changed: (op, from dtype, to dtype) -> number of nodes."""

    changes: dict[tuple[str, DataType, DataType | None], int] = field(default_factory=dict)
    _names: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def fresh_name(self, base: str) -> str:
        return f"{base}_legal{next(self._names)}"

    def add(self, op_type: str, source: DataType, target: DataType | None) -> None:
        key = (op_type, source, target)
        self.changes[key] = self.changes.get(key, 0) + 1


def legalize_types(model: ir.Model, context: DiagnosticContext | None = None) -> LegalizationReport:
    """Make every default-domain node of ``model`` accept its input types (in place).

    Returns what was changed; each kind of change is also recorded as a note in
    ``context`` with the precision limit it implies, if any.
    """
    report = LegalizationReport()
    _inline_library_calls_on_integers(model)
    opset = model.opset_imports.get("", model.graph.opset_imports.get("", 18))
    for graph, graph_opset in _graphs(model, opset):
        for node in list(graph):
            if node.domain in ("", "ai.onnx"):
                if any(output.dtype is None for output in node.outputs):
                    # e.g. after an inlined node that is now legal: type from its inputs
                    infer_output_types(node)
                _legalize_node(graph, node, node.version or graph_opset, report)
    if context is not None:
        _record(report, context)
    return report


def inline_library_functions(model: ir.Model) -> int:
    """Inline every call of a library function (torchlib's functions it writes as calls,
    `aten_fill`'s CastLike, Shape and Expand) in place, for a file that must hold no
    functions (the portable target: OpenVINO and TVM take none); returns how many kinds
    were inlined. Run before `legalize_types`, which types and legalizes their nodes."""
    library = {key for key, function in model.functions.items() if function.domain.startswith(_LIBRARY_DOMAIN)}
    if library:
        InlinePass(criteria=lambda function: function.identifier() in library)(model)
    return len(library)


def _inline_library_calls_on_integers(model: ir.Model) -> None:
    """Inline the library functions (torchlib's) that get integer or bool inputs.

    A library function's body is generic (its values have no types), so its nodes cannot
    be legalized for one call site; inlined, they can. Their new values are typed by
    ONNX's per-node inference, as the graph builder types every node it emits.
    """
    library = {
        key: function for key, function in model.functions.items() if function.domain.startswith(_LIBRARY_DOMAIN)
    }
    chosen: set[ir.OperatorIdentifier] = set()
    for node in model_nodes(model):
        key = (node.domain, node.op_type, node.overload)
        if key in library and any(value is not None and _tensor_dtype(value) in _INTEGERS for value in node.inputs):
            chosen.add(key)
    if not chosen:
        return
    InlinePass(criteria=lambda function: function.identifier() in chosen)(model)


def _graphs(model: ir.Model, opset: int) -> Iterator[tuple[ir.Graph | ir.Function, int]]:
    """The main graph, every function body and every sub-graph, with their opset."""
    containers: list[tuple[ir.Graph | ir.Function, int]] = [(model.graph, opset)]
    for function in model.functions.values():
        containers.append((function, function.opset_imports.get("", opset)))
    for container, container_opset in containers:
        yield container, container_opset
        for node in list(container.all_nodes()):
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    yield attribute.value, container_opset
                elif attribute.type == ir.AttributeType.GRAPHS:
                    for subgraph in attribute.value:
                        yield subgraph, container_opset


def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return op_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return None


def _bindings(formals: list, actuals: list[ir.Value | None]) -> list[tuple[str, ir.Value]]:
    """(type string, value) for each present actual; the last variadic formal takes the rest."""
    bound = []
    for index, value in enumerate(actuals):
        if value is None:
            continue
        if index < len(formals):
            formal = formals[index]
        elif formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            formal = formals[-1]
        else:
            return []
        bound.append((formal.type_str, value))
    return bound


def _tensor_dtype(value: ir.Value) -> DataType | None:
    if value.type is not None and not isinstance(value.type, ir.TensorType):
        return None
    return value.dtype


def _legalize_node(graph: ir.Graph | ir.Function, node: ir.Node, opset: int, report: LegalizationReport) -> None:
    schema = _schema(node.op_type, opset)
    if schema is None:
        return
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    inputs = _bindings(list(schema.inputs), list(node.inputs))
    outputs = _bindings(list(schema.outputs), list(node.outputs))
    by_param: dict[str, list[ir.Value]] = {}
    for type_str, value in inputs:
        by_param.setdefault(type_str, []).append(value)

    for param, values in by_param.items():
        accepted = allowed.get(param, {param})
        dtypes = {_tensor_dtype(v) for v in values}
        if None in dtypes or len(dtypes) != 1:
            # Unknown or mixed dtypes are not a legalization matter: validation reports them.
            continue
        (source,) = dtypes
        if type_string(source) in accepted and not _lacks_runtime_kernel(node.op_type, opset, param, source):
            continue
        if node.op_type in _IDENTITY_ON_INTEGERS and source in _INTEGERS:
            _replace_with_identity(graph, node)
            report.add(node.op_type, source, None)
            return
        target = _nearest_accepted(node.op_type, opset, param, source, accepted)
        if target is None:
            continue
        for index, value in enumerate(node.inputs):
            if value is not None and value in values:
                node.replace_input_with(index, _cast_before(graph, node, value, target, report))
        for type_str, output in outputs:
            if type_str == param:
                _cast_after(graph, node, output, source, target, report)
        report.add(node.op_type, source, target)


def _lacks_runtime_kernel(op_type: str, opset: int, param: str, source: DataType) -> bool:
    """An integer or bool type the schema accepts but ONNX Runtime's CPU provider has no
    kernel for (Gemm or DepthToSpace on int64): computing it in a wider type keeps the
    model runnable there. Floating types are never changed for the runtime's sake."""
    if source not in _INTEGERS:
        return False
    runnable = cpu_kernel_types(op_type, opset, param)
    return runnable is not None and type_string(source) not in runnable


def _nearest_accepted(op_type: str, opset: int, param: str, source: DataType, accepted: set[str]) -> DataType | None:
    """The nearest dtype the schema accepts, preferring one ONNX Runtime's CPU kernels run."""
    candidates = [t for t in _NEAREST.get(source, ()) if type_string(t) in accepted]
    runnable = cpu_kernel_types(op_type, opset, param)
    if runnable is not None:
        candidates.sort(key=lambda t: type_string(t) not in runnable)
        if source in _INTEGERS and type_string(source) in accepted:
            # Only a runtime kernel is missing: change the type only for one that has it.
            candidates = [t for t in candidates if type_string(t) in runnable]
    return candidates[0] if candidates else None


def _new_node(
    node: ir.Node, op_type: str, inputs: list[ir.Value], attributes: list[ir.Attr], suffix: str
) -> ir.Node:
    """A node that carries ``node``'s FX metadata, so that it points at the same user line."""
    return ir.Node(
        "",
        op_type,
        inputs,
        attributes,
        outputs=[TracedValue()],
        name=f"{node.name}/{suffix}" if node.name else None,
        metadata_props=dict(node.metadata_props),
    )


def _cast_before(
    graph: ir.Graph | ir.Function, node: ir.Node, value: ir.Value, target: DataType, report: LegalizationReport
) -> ir.Value:
    cast = _new_node(node, "Cast", [value], [ir.AttrInt64("to", target.value)], report.fresh_name("cast"))
    (output,) = cast.outputs
    output.name = report.fresh_name(f"{value.name}_{target.name.lower()}")
    output.dtype, output.shape = target, value.shape
    graph.insert_before(node, cast)
    return output


def _cast_after(
    graph: ir.Graph | ir.Function,
    node: ir.Node,
    output: ir.Value,
    source: DataType,
    target: DataType,
    report: LegalizationReport,
) -> None:
    """The node's ``output`` is now of ``target``: its users get it cast back to ``source``.

    When every user casts it to a floating type anyway (torchlib's ``softmax(x, dtype=)``
    computes in x's integer type, then casts), the intermediate integer would only
    truncate what PyTorch computes in floating point: the users read ``target`` directly.
    """
    uses = list(output.uses())
    if uses and not output.is_graph_output() and all(_casts_to_float(use.node) for use in uses):
        output.dtype = target
        return
    name = output.name
    restored = TracedValue(shape=output.shape, is_complex=getattr(output, "is_complex", False))
    restored.dtype = source
    output.replace_all_uses_with(restored, replace_graph_outputs=True)
    cast = ir.Node(
        "",
        "Cast",
        [output],
        [ir.AttrInt64("to", source.value)],
        outputs=[restored],
        name=f"{node.name}/{report.fresh_name('cast_back')}",
        metadata_props=dict(node.metadata_props),
    )
    output.name = report.fresh_name(f"{name}_{target.name.lower()}")
    output.dtype = target
    restored.name = name
    graph.insert_after(node, cast)


def _casts_to_float(node: ir.Node) -> bool:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return False
    to = node.attributes.get("to")
    return to is not None and DataType(to.value) in _FLOATS


def _replace_with_identity(graph: ir.Graph | ir.Function, node: ir.Node) -> None:
    identity = _new_node(node, "Identity", [node.inputs[0]], [], "identity")
    (output,) = identity.outputs
    old = node.outputs[0]
    output.dtype, output.shape = node.inputs[0].dtype, node.inputs[0].shape
    output.is_complex = getattr(old, "is_complex", False)
    name = old.name
    old.replace_all_uses_with(output, replace_graph_outputs=True)
    old.name = None
    output.name = name
    graph.insert_after(node, identity)
    graph.remove(node, safe=True)


def _record(report: LegalizationReport, context: DiagnosticContext) -> None:
    for (op_type, source, target), count in sorted(report.changes.items(), key=lambda item: str(item[0])):
        source_name = source.name.lower()
        if target is None:
            how = f"{op_type} is the identity on {source_name}: replaced by Identity"
        else:
            how = f"{op_type} does not accept {source_name}: computed in {target.name.lower()} and cast back"
            limit = _EXACT_INTEGER_LIMIT.get(target)
            if source in _INTEGERS and source != DataType.BOOL and limit is not None:
                how += f" (exact while integer values and results stay within +-{limit})"
        # Integers through float32/float16 lose exactness at everyday magnitudes: warn.
        narrow = target in (DataType.FLOAT, DataType.FLOAT16) and source in _INTEGERS and source != DataType.BOOL
        context.record(
            rules.TYPE_LEGALIZATION,
            Level.WARNING if narrow else Level.NOTE,
            message=f"{how}; {count} node(s).",
            properties={"op_type": op_type, "from": source_name, "to": target.name.lower() if target else "identity", "nodes": count},
        )
