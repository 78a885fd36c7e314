"""Decompose only the operators that no registered ONNX function covers.

Pending nodes are replaced one by one, in place, by the trace of their decomposition;
the whole program is re-traced (`run_decompositions`) only when a node cannot be
decomposed alone. An operator stays whole when the registry has a function for its exact overload
(`aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`...). A node on
complex tensors needs a complex implementation; when only a real one exists, PyTorch's
decomposition of the operator is used instead (e.g. complex `reshape` becomes `view`,
which has one).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table as _torch_decompositions
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from dispatcher import OnnxRegistry
from dispatcher.fx_nodes import node_value, walk_graph_modules
from fx2onnx.fx_passes.aliasing_prims import rewrite_aliasing_prims
from fx2onnx.fx_passes.fresh_mutations import functionalize_fresh_mutations
from fx2onnx.fx_passes.node_meta import SOURCE_META, call_in_place_of
from fx2onnx.private_ops import assertion_ops

_logger = logging.getLogger(__name__)
# Building torch.export's table costs ~0.6 s; it depends only on which operators the
# registry covers, so it is kept per set of registered names.
_TABLES: dict[frozenset[str], dict] = {}
# Decompositions may expose further complex operators without a complex implementation.
_MAX_COMPLEX_ROUNDS = 3


def _has_exact_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    """An ONNX function registered for this very overload. A function registered for the
    default overload does not cover e.g. `aten::min.other`, which PyTorch decomposes."""
    namespace, _, rest = op.name().partition("::")
    name, _, overload = rest.partition(".")
    return registry.is_registered_op(namespace, name, overload or "default")


def _has_complex_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    for name in registry.candidate_names(op):
        if any(function.is_complex for function in registry.get_functions(name) or ()):
            return True
    return False


def onnx_decomposition_table(registry: OnnxRegistry) -> dict:
    """torch.export's default decompositions minus every operator the registry implements,
    so `aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`... stay whole."""
    key = frozenset(registry.all_registered_ops())
    table = _TABLES.get(key)
    if table is None:
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if _has_exact_function(registry, op):
                del table[op]
        _TABLES[key] = table
    return table.copy()


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_CORE: dict[frozenset[str], dict] = {}


def _core_table(registry: OnnxRegistry) -> dict:
    """PyTorch's core ATen decompositions minus the operators the registry implements:
    the part of `onnx_decomposition_table` that is cheap to build (its composite-kernel
    entries are found per node, by `_is_composite`)."""
    key = frozenset(registry.all_registered_ops())
    table = _CORE.get(key)
    if table is None:
        table = {op: fn for op, fn in _core_aten_decompositions().items() if not _has_exact_function(registry, op)}
        _CORE[key] = table
    return table


def _core_aten_decompositions() -> dict:
    """torch's core ATen decomposition table, without the composite-kernel entries that
    the public `core_aten_decompositions()` materializes for every operator (~0.3 s).
    Private: reached here only; tests/unit/fx_passes/test_decompose_per_node.py fails if it moves."""
    from torch._decomp import _core_aten_decompositions_post_autograd

    return _core_aten_decompositions_post_autograd()


@functools.cache
def _is_composite(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _decomposition_of(op: torch._ops.OpOverload) -> Callable | None:
    """PyTorch's decomposition of an operator: its composite kernel, or a registered one."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        python_kernel = op.py_kernels.get(_COMPOSITE)
        if callable(python_kernel):  # a Python decomposition (a DispatchKey entry is not callable)
            return python_kernel
        return functools.partial(_run_composite_kernel, op)
    return _torch_decompositions.get(op)


def _run_composite_kernel(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    # Not `op.decompose`: run_decompositions installs table entries as the Python kernel of
    # this very key, so decompose would call this entry again and recurse forever.
    return op._op_dk(_COMPOSITE, *args, **kwargs)


def _is_complex_node(node: torch.fx.Node) -> bool:
    return any(
        isinstance(arg.meta.get("val"), torch.Tensor) and arg.meta["val"].is_complex()
        for arg in node.all_input_nodes
    )


def _complex_gaps(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> dict:
    """Decompositions for complex nodes whose operator has only real implementations."""
    gaps = {}
    for _, node in walk_graph_modules(program.graph_module):  # control-flow bodies too
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in gaps or not _is_complex_node(node) or _has_complex_function(registry, node.target):
            continue
        decomposition = _decomposition_of(node.target)
        if decomposition is not None:
            gaps[node.target] = decomposition
    return gaps


def _leaf_key(leaf: Any) -> Any:
    """What a decomposition's trace depends on for one argument: the metadata of a node
    (dtype, shape, strides, device), the value of a constant."""
    if isinstance(leaf, torch.fx.Node):
        value = leaf.meta.get("val")
        if isinstance(value, torch.Tensor):
            return ("tensor", value.dtype, str(tuple(value.shape)), str(value.stride()), str(value.device))
        return ("node", type(value).__name__, str(value))
    return (type(leaf).__name__, repr(leaf))


class DecompositionTracer:
    """Traces single nodes through a decomposition and inlines the result in their place.

    Nodes of one operator on arguments of the same metadata trace to the same graph, so
    each (operator, argument metadata) is traced once per graph and the trace reused.
    """

    def __init__(self, table: dict) -> None:
        self.table = table
        self._traces: dict[Any, torch.fx.GraphModule] = {}

    def replace(self, graph: torch.fx.Graph, node: torch.fx.Node, decomposition: Callable) -> None:
        """Inline `decomposition` in place of `node` (NotImplementedError: a decomposition
        that creates constants, which is not inlined)."""
        flat, spec = pytree.tree_flatten((node.args, node.kwargs))
        key = (node.target, decomposition, str(spec), tuple(_leaf_key(leaf) for leaf in flat))
        traced = self._traces.get(key)
        if traced is None:
            traced = self._traces[key] = trace_alone(node, decomposition, self.table)
        _require_functional(traced)
        inline_trace(graph, node, traced)


def _require_functional(traced: torch.fx.GraphModule) -> None:
    """A decomposition that mutates (e.g. copies into running statistics) needs the whole
    program functionalized: it is refused here, before the graph is changed, so the whole
    program re-trace starts from the original operator."""
    for inner in traced.graph.nodes:
        schema = getattr(inner.target, "_schema", None)
        if inner.op == "call_function" and schema is not None and schema.is_mutable:
            raise NotImplementedError(f"its decomposition mutates its inputs ({inner.target})")


def trace_alone(node: torch.fx.Node, decomposition: Callable, table: dict) -> torch.fx.GraphModule:
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
    examples = [flat[i].meta["val"] for i in positions]

    def call(*values: Any) -> Any:
        items = list(flat)
        for position, value in zip(positions, values):
            items[position] = value
        args, kwargs = pytree.tree_unflatten(items, spec)
        return decomposition(*args, **kwargs)

    # The node's own inputs' fake mode, else the graph's (a node with no tensor input):
    # new metadata from another mode could not be combined with the graph's.
    fake_mode = detect_fake_mode([e for e in examples if isinstance(e, torch.Tensor)]) or _graph_fake_mode(node.graph)
    if fake_mode is None:
        return make_fx(call, decomposition_table=table, tracing_mode="fake")(*examples)
    with fake_mode:
        return make_fx(call, decomposition_table=table, tracing_mode="real")(*examples)


def _graph_fake_mode(graph: torch.fx.Graph) -> Any:
    for node in graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            mode = detect_fake_mode([value])
            if mode is not None:
                return mode
    return None


def inline_trace(graph: torch.fx.Graph, node: torch.fx.Node, traced: torch.fx.GraphModule) -> None:
    for inner in traced.graph.nodes:
        if inner.op == "get_attr":
            raise NotImplementedError("decompositions that create constants are not inlined")
    inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
    _inline_graph(graph, node, traced.graph, inputs, node_meta=True)


def _inline_graph(
    graph: torch.fx.Graph, node: torch.fx.Node, inner_graph: torch.fx.Graph, inputs: list[torch.fx.Node], node_meta: bool
) -> None:
    """Copy `inner_graph` in place of `node`, its placeholders bound to `inputs`; the
    copies take the node's source metadata when `node_meta` (a decomposition's trace has
    none of its own)."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(inputs)
    result: Any = None
    # Only placeholders can hold a name the graph's namespace does not know (see
    # `_with_unused_name`); the other names it never hands out twice.
    used = {n.name for n in graph.find_nodes(op="placeholder")}
    with graph.inserting_before(node):
        for inner in inner_graph.nodes:
            if inner.op == "placeholder":
                env[inner] = next(placeholders)
            elif inner.op == "output":
                result = pytree.tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else v, inner.args[0])
            else:
                copy = graph.node_copy(inner, lambda n: env[n])
                if copy.name in used:
                    copy = _with_unused_name(graph, copy, used)
                used.add(copy.name)
                for key in SOURCE_META if node_meta else ():
                    if key in node.meta:
                        copy.meta[key] = node.meta[key]
                if node_meta:  # the operator it was decomposed from, as torch's run_decompositions records
                    copy.meta["original_aten"] = node.meta.get("original_aten", node.target)
                env[inner] = copy
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    if not node.users:
        graph.erase_node(node)


def _with_unused_name(graph: torch.fx.Graph, node: torch.fx.Node, used: set[str]) -> torch.fx.Node:
    """Recreate the just-copied, unused ``node`` under a name no node of ``graph`` has.

    torch.export names the placeholders after the forward's arguments without telling
    the graph's namespace, so a copied node may be given a placeholder's name ("Node
    redefined name"); the names in the graph are the ones to avoid.
    """
    index = 1
    while True:
        candidate = f"{node.name}_{index}"
        index += 1
        if candidate in used:
            continue
        fresh = graph.create_node(node.op, node.target, node.args, node.kwargs, name=candidate, type_expr=node.type)
        if fresh.name in used:  # the namespace changed the candidate into a taken name
            graph.erase_node(fresh)
            continue
        fresh.meta = dict(node.meta)
        graph.erase_node(node)
        return fresh


_SET_GRAD_ENABLED = torch.ops.higher_order.wrap_with_set_grad_enabled


def _inline_grad_mode_regions(graph_module: torch.fx.GraphModule) -> None:
    """Inline `with torch.no_grad()` / `enable_grad()` regions (a sub-module called by
    `wrap_with_set_grad_enabled`): the grad mode means nothing in an ONNX graph."""
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target is not _SET_GRAD_ENABLED:
            continue
        body_node, inputs = node.args[1], list(node.args[2:])
        body = getattr(graph_module, body_node.target)
        if any(inner.op == "get_attr" for inner in body.graph.nodes):
            raise NotImplementedError("grad-mode regions holding sub-modules or constants are not inlined")
        _inline_graph(graph_module.graph, node, body.graph, inputs, node_meta=False)
        if not body_node.users:
            graph_module.graph.erase_node(body_node)
            graph_module.delete_submodule(body_node.target)


# -- direct rewrites: one operator call instead of a trace ----------------------------------------
_aten = torch.ops.aten


def _to_as_copy(node: torch.fx.Node) -> Any:
    """`x.to(...)`: the input itself when dtype and device stay (ONNX has no aliasing to
    keep apart), else `_to_copy` to the result's dtype."""
    source, result = node.args[0], node.meta.get("val")
    value = node_value(source)
    if not isinstance(result, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    if value.dtype == result.dtype and value.device == result.device:
        return source
    return (_aten._to_copy.default, (source,), {"dtype": result.dtype}, None)


def _batch_norm_in_eval(node: torch.fx.Node) -> Any:
    """`batch_norm` with running statistics and training=False is the no-training kernel."""
    if len(node.args) < 8 or node.kwargs:
        return None
    input, weight, bias, mean, var, training, momentum, eps = node.args[:8]
    if training is not False or mean is None or var is None:
        return None
    return (_aten._native_batch_norm_legit_no_training.default, (input, weight, bias, mean, var, momentum, eps), {}, 0)


def _detach_in_place(node: torch.fx.Node) -> Any:
    """`x.detach_()` changes autograd metadata only: its result is `x` itself."""
    source = node.args[0]
    return source if isinstance(source, torch.fx.Node) else None


def _adaptive_average(node: torch.fx.Node) -> Any:
    """`adaptive_avg_pool2d` / `3d`: a mean over the pooled dims when every output size is
    1, else the pooling kernel. (The composite kernel does the same, then restrides a
    channels-last result in place, which would need the whole program re-traced.)"""
    rank = 2 if node.target == _aten.adaptive_avg_pool2d.default else 3
    source, output_size = node.args[0], node.args[1]
    if isinstance(output_size, int):
        output_size = [output_size] * rank
    if not isinstance(source, torch.fx.Node) or len(output_size) != rank:
        return None
    if all(isinstance(size, int) and size == 1 for size in output_size):
        return (_aten.mean.dim, (source, list(range(-rank, 0)), True), {}, None)
    kernel = _aten._adaptive_avg_pool2d.default if rank == 2 else _aten._adaptive_avg_pool3d.default
    return (kernel, (source, list(output_size)), {}, None)


# torch.fft's `norm` of a forward transform -> the normalization mode of `_fft_r2c`
_FORWARD_FFT_NORMS = {None: 0, "backward": 0, "ortho": 1, "forward": 2}


def _forward_fft_of_real(node: torch.fx.Node) -> Any:
    """`fft_fft` / `fft_fft2` / `fft_fftn` of a real tensor at its own sizes: the two-sided
    real-to-complex kernel over the same dims, with the node's own metadata (its result
    has the input's sizes). The composite kernel's trace, and even the fake kernel of
    `_fft_r2c`, read the input's sizes as plain numbers, which fixes every dynamic dim
    to its example size."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    source, value = node.args[0], node_value(node.args[0])
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    names = [argument.name for argument in node.target._schema.arguments]
    given = {**dict(zip(names, node.args)), **node.kwargs}
    size_name = "n" if node.target == _aten.fft_fft.default else "s"
    if given.get(size_name) is not None or given.get("norm") not in _FORWARD_FFT_NORMS:
        return None  # a signal size pads or trims the input: the composite kernel's trace
    default_dims = {_aten.fft_fft.default: -1, _aten.fft_fft2.default: [-2, -1]}.get(node.target)
    dims = given.get("dim", default_dims)
    dims = list(range(value.dim())) if dims is None else [dims] if isinstance(dims, int) else list(dims)
    dims = sorted(dim % value.dim() for dim in dims)
    arguments = (source, dims, _FORWARD_FFT_NORMS[given.get("norm")], False)
    with node.graph.inserting_before(node):
        transform = node.graph.call_function(_aten._fft_r2c.default, arguments)
    transform.meta.update(node.meta)
    return transform


# operator -> its rewrite: a node (the result), (target, args, kwargs, output index) or None
# (no rewrite: trace the decomposition). Each is what PyTorch's composite kernel calls.
_DIRECT_REWRITES: dict[Any, Callable[[torch.fx.Node], Any]] = {
    _aten.to.dtype: _to_as_copy,
    _aten.to.dtype_layout: _to_as_copy,
    _aten.to.device: _to_as_copy,
    _aten.batch_norm.default: _batch_norm_in_eval,
    _aten.detach_.default: _detach_in_place,
    _aten.adaptive_avg_pool2d.default: _adaptive_average,
    _aten.adaptive_avg_pool3d.default: _adaptive_average,
    _aten.fft_fft.default: _forward_fft_of_real,
    _aten.fft_fft2.default: _forward_fft_of_real,
    _aten.fft_fftn.default: _forward_fft_of_real,
}


def _rewrite_directly(graph: torch.fx.Graph, node: torch.fx.Node, fake_mode: Any) -> bool:
    """Replace `node` by the single call its decomposition makes (no trace): its result
    metadata comes from running that call on the FakeTensors. False: not applicable."""
    rewrite = _DIRECT_REWRITES.get(node.target)
    plan = rewrite(node) if rewrite is not None and fake_mode is not None else None
    if plan is None:
        return False
    if isinstance(plan, torch.fx.Node):
        node.replace_all_uses_with(plan)
        graph.erase_node(node)
        return True
    target, args, kwargs, index = plan
    with graph.inserting_before(node):
        call = call_in_place_of(graph, target, args, kwargs, node.meta, fake_mode)
        result = call
        if index is not None:
            result = graph.call_function(operator.getitem, (call, index))
            result.meta.update(call.meta)
            result.meta["val"] = call.meta["val"][index]
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True


@dataclass
class Decomposed:
    """The program after decomposition, and why the whole program was re-traced (if it was)."""

    program: torch.export.ExportedProgram
    graph_module: torch.fx.GraphModule
    whole_program_reasons: list[str] = field(default_factory=list)


def _in_table(op: torch._ops.OpOverload, table: dict, registry: OnnxRegistry) -> bool:
    """`op in onnx_decomposition_table(registry)`, without building that table."""
    return op in table or (op.namespace == "aten" and _is_composite(op) and not _has_exact_function(registry, op))


def _pending_nodes(graph: torch.fx.Graph, table: dict, registry: OnnxRegistry) -> list[torch.fx.Node]:
    """Nodes whose operator must be decomposed: in the table, or with no ONNX function, or
    complex with only real implementations."""
    pending = []
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in assertion_ops():
            continue  # removed by a later pass, nothing to decompose
        if _in_table(node.target, table, registry) or not registry.is_supported(node.target):
            pending.append(node)
        elif _is_complex_node(node) and not _has_complex_function(registry, node.target):
            pending.append(node)
    return pending


def _decompose_in_place(graph_module: torch.fx.GraphModule, table: dict, registry: OnnxRegistry) -> list[str]:
    """Replace each pending node by its traced decomposition, node by node; returns why the
    nodes that could not be replaced this way could not (empty: all done)."""
    tracer = DecompositionTracer(table)
    fake_mode = _graph_fake_mode(graph_module.graph)
    failures: dict[str, str] = {}
    for _ in range(_MAX_COMPLEX_ROUNDS + 1):  # decompositions may expose further pending nodes
        pending = [n for n in _pending_nodes(graph_module.graph, table, registry) if str(n.target) not in failures]
        if not pending:
            break
        for node in pending:
            if not _is_complex_node(node) and node.target in _DIRECT_REWRITES:
                try:
                    if _rewrite_directly(graph_module.graph, node, fake_mode):
                        continue
                except Exception as error:  # nothing was changed yet: the node is traced below
                    _logger.debug("direct rewrite of %s failed (%s); tracing its decomposition", node.name, error)
            decomposition = table.get(node.target) or _decomposition_of(node.target)
            if decomposition is None:
                if node.target._schema.is_mutable:  # functionalizing it needs the whole program
                    failures[str(node.target)] = "an in-place operator with no functional decomposition"
                continue  # nothing to decompose with: the analysis reports the node
            try:
                tracer.replace(graph_module.graph, node, decomposition)
            except Exception as error:  # recorded by the caller; the whole program is re-traced
                failures[str(node.target)] = f"{type(error).__name__}: {error}"
    graph_module.graph.lint()
    graph_module.recompile()
    return [f"{op}: {reason}" for op, reason in failures.items()]


def _pending_in_bodies(graph_module: torch.fx.GraphModule, table: dict, registry: OnnxRegistry) -> list[str]:
    """Operators to decompose inside control-flow bodies (or other nested graphs), which
    the node-by-node path does not enter: run_decompositions handles them."""
    reasons: dict[str, str] = {}
    for owner, _ in walk_graph_modules(graph_module):
        if owner is graph_module or id(owner) in reasons:
            continue
        for node in _pending_nodes(owner.graph, table, registry):
            reasons.setdefault(str(node.target), "inside a control-flow body (decomposed with the whole program)")
    return [f"{op}: {reason}" for op, reason in reasons.items()]


def inline_grad_mode_regions(graph_module: torch.fx.GraphModule) -> list[str]:
    """Inline `with torch.no_grad()` / `enable_grad()` regions (a sub-module called by
    `wrap_with_set_grad_enabled`): the grad mode means nothing in an ONNX graph. Returns
    why a region could not be inlined (then `decompose_unsupported` re-traces the whole
    program), empty when all were."""
    try:
        _inline_grad_mode_regions(graph_module)
    except NotImplementedError as error:
        return [f"{_SET_GRAD_ENABLED}: {error}"]
    return []


def functionalize_fresh_mutations_of(graph_module: torch.fx.GraphModule) -> bool:
    """`functionalize_fresh_mutations` on the graph, under its own fake mode, before
    decomposition; whether it changed the graph."""
    if functionalize_fresh_mutations(graph_module.graph, _graph_fake_mode(graph_module.graph)):
        graph_module.recompile()
        return True
    return False


def decompose_unsupported(
    program: torch.export.ExportedProgram,
    graph_module: torch.fx.GraphModule,
    registry: OnnxRegistry,
    whole_program_reasons: list[str] | None = None,
) -> Decomposed:
    """Decompose the operators no ONNX function covers, node by node in `graph_module`
    (the program's graph or a copy of it, its grad-mode regions inlined and its fresh
    mutations functionalized first). Only when a node cannot be decomposed alone, or
    ``whole_program_reasons`` says an earlier step could not do its part, is the whole
    program re-traced with `run_decompositions`; the reasons are returned."""
    table = dict(_core_table(registry))
    if whole_program_reasons:
        return _decompose_whole_program(program, table, registry, list(whole_program_reasons))
    nested = _pending_in_bodies(graph_module, table, registry)
    if nested:
        return _decompose_whole_program(program, table, registry, nested)
    for node in _pending_nodes(graph_module.graph, table, registry):
        if _is_complex_node(node) and node.target not in table:
            decomposition = _decomposition_of(node.target)
            if decomposition is not None:
                table[node.target] = decomposition
    if not _pending_nodes(graph_module.graph, table, registry):
        return Decomposed(program, graph_module)
    reasons = _decompose_in_place(graph_module, table, registry)
    if not reasons:
        return Decomposed(program, graph_module)
    if graph_module is program.graph_module:  # its view primitives would fail the re-trace's functionalization
        rewrite_aliasing_prims(graph_module, DecompositionTracer(table).replace)
    return _decompose_whole_program(program, table, registry, reasons)


def _decompose_whole_program(
    program: torch.export.ExportedProgram, table: dict, registry: OnnxRegistry, reasons: list[str]
) -> Decomposed:
    # Re-traces the program's own graph (with the nodes replaced so far when it is that
    # graph, not a copy: the user's program stays untouched).
    table = {**onnx_decomposition_table(registry), **table}
    program = _run_decompositions(program, table)
    for _ in range(_MAX_COMPLEX_ROUNDS):
        gaps = _complex_gaps(program, registry)
        if not gaps:
            break
        table.update(gaps)
        program = _run_decompositions(program, table)
    return Decomposed(program, program.graph_module, reasons)


def _run_decompositions(program: torch.export.ExportedProgram, table: dict) -> torch.export.ExportedProgram:
    """`program.run_decompositions(table)`, re-tracing the program without its input-guard
    function: torch (2.13) re-traces `program.module()`, whose `_guards_fn` fails on some
    inputs that are registered containers (a transformers cache with dynamic dims, 'NoneType'
    object has no attribute 'size'). The guards check the example inputs again, which the
    capture did already; the ONNX model never had them."""
    unguarded = functools.partial(type(program).module, program, check_guards=False)
    program.module = unguarded  # type: ignore[method-assign]  # this instance, for this call only
    try:
        return program.run_decompositions(table)
    finally:
        del program.module
