"""FxOnnxInterpreter: translates an FX graph into a graph builder, one node at a time.

`translate(graph_module, builder, inputs=..., skip=...)` is the one entry point: the main
graph, the body of a module function and each branch or body of control flow
(`fx2onnx.translate.control_flow`) are translated by it alike. It reads like `torch.fx.Interpreter`:
`run_node` dispatches on `node.op` to one method per opcode, and an environment maps each
FX node to what it became in the ONNX graph (a value, a tuple of values, or a Python
constant). Its state (environment, builder, dispatcher, diagnostics) lives on the instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import onnxscript.evaluator
import torch
import torch.fx

from diagnostics import Diagnostic, DiagnosticContext, Level, rules
from dispatcher import (
    DROPPED_KWARGS,
    DispatchError,
    NodeRoute,
    OnnxFunctionDispatcher,
    node_route,
    schema_defaults,
    torch_dtype_to_onnx,
)
from dispatcher.fx_nodes import argument_value, fetch_attr, node_location, node_stack
from dispatcher.functions.complex import COMPLEX_DOMAIN
from fx2onnx.translate import control_flow
from fx2onnx.translate.fake_metadata import OnnxTypeInfo, SymbolNamer, apply_type, onnx_type_of
from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.module_scope import call_metadata, flat_node_scope
from fx2onnx.progress import node_translated
from fx2onnx.translate.tensor_data import TorchTensorData
from fx2onnx.translate.tracing_evaluator import TracingEvaluator, install_value_arithmetic
from fx2onnx.translate.translated_body import FAILED, BodyInitializer, BodyInput, TranslatedBody
from fx2onnx.translate.values import TracedValue

__all__ = ["FAILED", "BodyInitializer", "BodyInput", "FxOnnxInterpreter", "TranslatedBody"]

CallModuleHandler = Callable[["FxOnnxInterpreter", torch.fx.Node, list[Any]], Any]


class FxOnnxInterpreter:
    """Translates FX graphs into graph builders; `translate` is its one entry point.

    The instance holds what every translation of one export shares (dispatcher,
    diagnostics, symbol names, the module-call handler); each `translate` call runs on
    a fresh body state (environment, builder, evaluator), so bodies nest: a module
    function or an If branch is translated while its caller's graph is.
    """

    def __init__(
        self,
        dispatcher: OnnxFunctionDispatcher,
        context: DiagnosticContext,
        namer: SymbolNamer,
        *,
        call_module_handler: CallModuleHandler | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.context = context
        self.namer = namer
        self.call_module_handler = call_module_handler
        # Per-body state, set by `translate` on the instance that runs the body.
        self.builder: GraphBuilder | None = None
        self.evaluator: TracingEvaluator | None = None
        self.graph_module: torch.fx.GraphModule | None = None
        self.env: dict[torch.fx.Node, Any] = {}
        self._bindings: dict[str, Any] = {}
        self._skip: frozenset[torch.fx.Node] = frozenset()
        self._outputs: list[Any] = []
        self._output_metas: list[Any] = []
        # The FXE0008 diagnostic of the node being translated (None below DEBUG verbosity).
        self._node_diagnostic: Diagnostic | None = None
        install_value_arithmetic()

    # -- driving -------------------------------------------------------------------------
    def translate(
        self,
        graph_module: torch.fx.GraphModule,
        builder: GraphBuilder,
        *,
        inputs: Mapping[str, Any] | None = None,
        skip: Iterable[torch.fx.Node] = (),
    ) -> TranslatedBody:
        """Translate every node of ``graph_module`` into ``builder``'s graph.

        ``inputs`` binds placeholders by name (see `fx2onnx.translate.translated_body`); an unbound
        placeholder becomes a graph input named after it. Nodes in ``skip`` (reported
        already, e.g. by the analysis) are not translated, nor are their users. The
        outputs are returned, not registered: the caller makes them graph outputs.
        """
        body = FxOnnxInterpreter(
            self.dispatcher, self.context, self.namer, call_module_handler=self.call_module_handler
        )
        body.builder = builder
        body.evaluator = TracingEvaluator(builder)
        body.graph_module = graph_module
        body._bindings = dict(inputs or {})
        # Skipped nodes may sit in branches and bodies: nested translations skip them too.
        body._skip = self._skip | frozenset(skip)
        body.env = {node: FAILED for node in body._skip if node.graph is graph_module.graph}
        for node in graph_module.graph.nodes:
            if node not in body.env:
                body.run_node(node)
        return TranslatedBody(builder, body._outputs, body._output_metas, body.env)

    def run_node(self, node: torch.fx.Node) -> None:
        assert self.builder is not None, "run_node runs inside translate()"
        if _uses_failed(node, self.env):
            self.env[node] = FAILED
            return
        diagnostic = None
        if self.context.would_record(Level.NONE):
            diagnostic = self.context.record(
                rules.FX_NODE_TO_ONNX,
                Level.NONE,
                node=f"{node.op}:{node.target}[name={node.name}]",
                location=node_location(node),
                stack=node_stack(node) or None,
            )
            diagnostic.log(lambda: f"FX node: `{node.format_node()}`")
        self._node_diagnostic = diagnostic
        outer_scope, outer_metadata = self.builder.current_scope, self.builder.current_metadata
        self.builder.current_scope = node.name
        self.builder.current_metadata = {"pkg.fx2onnx.fx_node": f"{node.op}:{node.target}"}
        if self.call_module_handler is None:  # a flat graph: its nodes name their module
            self.builder.current_scope, module = flat_node_scope(node)
            self.builder.current_metadata.update(module)
        else:
            self.builder.current_metadata.update(call_metadata(node))
        try:
            self.env[node] = getattr(self, node.op)(node)
        except DispatchError:
            # The dispatcher already recorded an error diagnostic with the user's line.
            self.env[node] = FAILED
        except Exception as error:  # noqa: BLE001 - collect every problem, then report
            self.env[node] = FAILED
            failure = self.context.record(
                rules.GRAPH_BUILDING,
                Level.ERROR,
                message=(
                    f"Translating FX node '{node.name}' ({node.op} {_target_name(node)}) failed: "
                    f"{type(error).__name__}: {error}"
                ),
                location=node_location(node),
                stack=node_stack(node),
                properties={"fx_node": node.format_node(), "target": _target_name(node)},
            )
            failure.log_source_exception(error)
        finally:
            self.builder.current_scope = outer_scope
            self.builder.current_metadata = outer_metadata
            self._node_diagnostic = None
        if diagnostic is not None and self.env[node] is FAILED:
            diagnostic.log("Translation failed: see the error result for this FX node.")
        node_translated()  # progress hook

    # -- one method per opcode -----------------------------------------------------------
    def placeholder(self, node: torch.fx.Node) -> Any:
        binding = self._bindings.get(node.name, BodyInput())
        if isinstance(binding, BodyInitializer):
            tensor = binding.tensor
            value = self.builder.add_initializer(binding.name, TorchTensorData(tensor, name=binding.name), tensor.is_complex())
            apply_type(value, onnx_type_of(node.meta.get("val"), self.namer))
            return value
        if not isinstance(binding, BodyInput):
            return binding  # a value of an enclosing graph or a constant, used as it is
        meta = node.meta.get("val")
        if binding.info is None and not isinstance(meta, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
            # None, Python scalars, strings and other non-tensor inputs were specialized into
            # the graph: a constant, no input (the program checks the value at each call).
            return meta
        info = binding.info or onnx_type_of(meta, self.namer)
        if info is None:
            raise TypeError(f"Input '{node.name}' has an unsupported type {type(meta).__name__}")
        return self.builder.add_input(binding.name or node.name, info.dtype, info.shape, info.is_complex)

    def get_attr(self, node: torch.fx.Node) -> Any:
        assert self.graph_module is not None
        attribute = fetch_attr(self.graph_module, str(node.target))
        if isinstance(attribute, torch.Tensor):
            name = str(node.target)
            value = self.builder.add_initializer(name, TorchTensorData(attribute, name=name), attribute.is_complex())
            return value
        # GraphModules (branches of control flow) and other objects are used by later nodes.
        return attribute

    def call_function(self, node: torch.fx.Node) -> Any:
        route = node_route(node.target)
        if route is NodeRoute.GETITEM and isinstance(self.env.get(node.args[0]), (tuple, list)):
            return self.env[node.args[0]][node.args[1]]  # type: ignore[index]
        if route is NodeRoute.TUPLE:
            items = node.args[0] if len(node.args) == 1 and isinstance(node.args[0], (list, tuple)) else node.args
            return tuple(self.onnx_arg(item) for item in items)
        if route is NodeRoute.HIGHER_ORDER:
            return control_flow.translate_higher_order(self, node)
        registered = self.dispatcher.dispatch_registered(node)
        function = registered.onnx_function
        if self._node_diagnostic is not None:
            origin = "registered by the user" if registered.is_custom else "from torchlib"
            self._node_diagnostic.log(
                f"ONNX function: `{registered.name}` ({origin}), chosen by signature matching "
                "against the node's argument types (the FXE0014 result of this node says how "
                "well it matched)."
            )
        if _has_complex_input(node):
            node_args, node_kwargs = node.args, node.kwargs
            if registered.domain == COMPLEX_DOMAIN:
                # fx2onnx's complex functions tell a complex target dtype from a real one.
                node_args, node_kwargs = _map_leaves((node_args, node_kwargs), _complex_dtype_as_onnx)
            result = self._evaluate(node, function, node_args, node_kwargs, scalars_as_complex=True)
        elif _has_complex_output(node):
            result = self._complex_from_real(node, function)
        else:
            result = self._evaluate(node, function, node.args, node.kwargs)
        return self._finish_outputs(node, result)

    def _evaluate(
        self,
        node: torch.fx.Node,
        function: Any,
        node_args: Sequence[Any],
        node_kwargs: Mapping[str, Any],
        scalars_as_complex: bool = False,
    ) -> Any:
        """Trace ``function`` on the node's arguments (given apart, they may be edited)."""
        args = [self.onnx_arg(arg) for arg in node_args]
        if scalars_as_complex:
            args = _scalars_as_complex(node, args)
        kwargs = {
            key: self.onnx_arg(value)
            for key, value in node_kwargs.items()
            if key not in DROPPED_KWARGS
        }
        # ATen schema defaults for parameters the ONNX function requires but the node omits
        defaults = schema_defaults(node.target, function.op_signature, node_args, node_kwargs)
        kwargs.update((key, self.onnx_arg(value)) for key, value in defaults.items())
        with onnxscript.evaluator.default_as(self.evaluator):
            return self.evaluator.eval_function(function, args, kwargs)

    def _complex_from_real(self, node: torch.fx.Node, function: Any) -> Any:
        """A complex result of a node without complex inputs (``full``, ``zeros``,
        ``linspace``, ``scalar_tensor`` with a complex dtype or fill value).

        The node's real function runs with the component dtype and the real parts of
        complex numbers; when it does not already give the real form (a trailing dim of
        2, as ``view_as_complex`` or ``polar`` do) it runs again with the imaginary parts
        (or the imaginary part is 0) and both are stacked on a new last axis.
        """
        meta = node.meta.get("val")
        real_args, real_kwargs = _map_leaves((node.args, node.kwargs), _real_part)
        real = self._evaluate(node, function, real_args, real_kwargs)
        if not isinstance(real, ir.Value) or real.shape is None:
            return real
        if len(real.shape) == meta.dim() + 1:
            return real  # already the real form
        complex_leaves: list[complex] = []
        _map_leaves((node.args, node.kwargs), lambda leaf: complex_leaves.append(leaf) if isinstance(leaf, complex) else None)
        last_axis = self.builder.constant([-1], ir.DataType.INT64)
        if any(number.imag != 0 for number in complex_leaves):
            imag_args, imag_kwargs = _map_leaves((node.args, node.kwargs), _imag_part)
            imag = self._evaluate(node, function, imag_args, imag_kwargs)
        else:
            zero = self.builder.constant(0, real.dtype or ir.DataType.FLOAT)
            (shape,) = self.builder.add_node("", "Shape", [real])
            (imag,) = self.builder.add_node("", "Expand", [zero, shape])
        (real_column,) = self.builder.add_node("", "Unsqueeze", [real, last_axis])
        (imag_column,) = self.builder.add_node("", "Unsqueeze", [imag, last_axis])
        (pair,) = self.builder.add_node("", "Concat", [real_column, imag_column], [ir.AttrInt64("axis", -1)])
        return pair

    def call_method(self, node: torch.fx.Node) -> Any:
        raise NotImplementedError(
            f"call_method nodes ('{node.target}') are not supported: capture the model with "
            "torch.export (fx2onnx.dynamo_export does) so that methods become ATen operators."
        )

    def call_module(self, node: torch.fx.Node) -> Any:
        if self.call_module_handler is None:
            raise NotImplementedError(
                f"call_module node '{node.target}' reached the interpreter without a module "
                "translator; only graphs produced by the Modularize pass contain call_module."
            )
        args = [self.onnx_arg(arg) for arg in node.args]
        return self.call_module_handler(self, node, args)

    def output(self, node: torch.fx.Node) -> Any:
        flat, _ = torch.utils._pytree.tree_flatten(node.args[0])
        self._outputs = [self.env[arg] if isinstance(arg, torch.fx.Node) else arg for arg in flat]
        self._output_metas = [argument_value(arg) for arg in flat]
        return None

    # -- helpers -------------------------------------------------------------------------
    def onnx_arg(self, arg: Any) -> Any:
        """An FX argument as the graph sees it: a node becomes what it was translated to,
        a dtype its ONNX type number, a device or layout None."""
        if isinstance(arg, torch.fx.Node):
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.onnx_arg(item) for item in arg)
        if isinstance(arg, torch.dtype):
            return torch_dtype_to_onnx(arg).value
        if isinstance(arg, (torch.device, torch.layout, torch.memory_format)):
            return None
        return arg

    def _finish_outputs(self, node: torch.fx.Node, result: Any) -> Any:
        """Type the outputs from FX metadata and name them after the FX node."""
        meta = node.meta.get("val")
        if isinstance(result, (tuple, list)):
            metas = meta if isinstance(meta, (tuple, list)) else [None] * len(result)
            return tuple(
                self._finish_one(node, item, item_meta, index)
                for index, (item, item_meta) in enumerate(zip(result, metas))
            )
        return self._finish_one(node, result, meta, None)

    def _finish_one(self, node: torch.fx.Node, value: Any, meta: Any, index: int | None) -> Any:
        if not isinstance(value, ir.Value):
            if isinstance(value, (int, float, bool)) and not isinstance(meta, torch.Tensor):
                info = onnx_type_of(meta if meta is not None else value, self.namer)
                value = self.builder.constant(value, info.dtype if info else ir.DataType.INT64)
            else:
                return value
        self.namer.name_new_symbols(meta, node.name if index is None else f"{node.name}_{index}")
        info = onnx_type_of(meta, self.namer)
        if info is not None and value.producer() is not None and value.const_value is None:
            if _shapes_conflict(value.shape, info.shape):
                # The ONNX function computes something else than PyTorch does here (e.g. the
                # unused saved statistics of batch norm in eval mode): declare what the
                # node produces, never a shape that the ONNX checker would reject.
                info = OnnxTypeInfo(info.dtype, value.shape, info.is_complex)
            if value.dtype is not None and value.dtype != info.dtype and not info.is_complex:
                # The ONNX function computes in another type than PyTorch (e.g. integer
                # pow in float): cast back so the graph carries PyTorch's dtype.
                (value,) = self.builder.add_node("", "Cast", [value], [ir.AttrInt64("to", info.dtype.value)])
            apply_type(value, info)
            if value.name and value.name.startswith("val_"):
                base = node.name if index is None else f"{node.name}_{index}"
                value.name = self.builder.unique_name(base)
        elif info is not None and isinstance(value, TracedValue):
            value.is_complex = info.is_complex
        return value


def _shapes_conflict(inferred: ir.Shape | None, declared: ir.Shape) -> bool:
    """True when ONNX inference gave a shape that the FX metadata contradicts
    (another rank, or another size for a dim both know as a number)."""
    if inferred is None:
        return False
    if len(inferred) != len(declared):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(inferred, declared))


def _has_complex_input(node: torch.fx.Node) -> bool:
    return any(
        isinstance(arg.meta.get("val"), torch.Tensor) and arg.meta["val"].is_complex()
        for arg in node.all_input_nodes
    )


def _has_complex_output(node: torch.fx.Node) -> bool:
    meta = node.meta.get("val")
    return isinstance(meta, torch.Tensor) and meta.is_complex()


_COMPLEX_TO_REAL_DTYPE = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX_TO_ONNX = {torch.complex64: ir.DataType.COMPLEX64.value, torch.complex128: ir.DataType.COMPLEX128.value}


def _map_leaves(tree: Any, function: Callable[[Any], Any]) -> Any:
    """``tree`` (args and kwargs) with ``function`` applied to every non-node leaf
    (``function`` returns None to keep a leaf)."""
    if isinstance(tree, dict):
        return {key: _map_leaves(value, function) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        return type(tree)(_map_leaves(item, function) for item in tree)
    if isinstance(tree, torch.fx.Node):
        return tree
    mapped = function(tree)
    return tree if mapped is None else mapped


def _real_part(leaf: Any) -> Any:
    if isinstance(leaf, complex):
        return leaf.real
    if isinstance(leaf, torch.dtype):
        return _COMPLEX_TO_REAL_DTYPE.get(leaf)
    return None


def _imag_part(leaf: Any) -> Any:
    if isinstance(leaf, complex):
        return leaf.imag
    if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
        return None
    return _real_part(leaf)


def _complex_dtype_as_onnx(leaf: Any) -> Any:
    return _COMPLEX_TO_ONNX.get(leaf) if isinstance(leaf, torch.dtype) else None


def _scalars_as_complex(node: torch.fx.Node, args: list[Any]) -> list[Any]:
    """Python numbers given where the ATen schema takes a Tensor become complex numbers,
    so that `z + 1` adds (1, 0) to the (real, imag) pairs and not 1 to both."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return args
    converted = list(args)
    for index, (arg, parameter) in enumerate(zip(args, schema.arguments)):
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            if isinstance(parameter.type, torch.TensorType):
                converted[index] = complex(arg)
    return converted


def _uses_failed(node: torch.fx.Node, env: Mapping[torch.fx.Node, Any]) -> bool:
    return any(env.get(arg) is FAILED for arg in node.all_input_nodes)


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "name", None)
    if callable(name):
        return name()
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}"

