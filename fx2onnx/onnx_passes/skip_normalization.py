"""A residual `Add` and the `RMSNormalization` of its sum as onnxruntime's one kernel,
`SkipSimplifiedLayerNormalization` (domain ``com.microsoft``).

Every decoder layer of a transformers LLM adds its residual and normalizes the sum
(``h = x + attention(...)``, then ``norm(h)``): two nodes a layer, and the sum read twice.
The kernel adds, normalizes over the last axis in float32 and returns the sum as its
fourth output, which takes the place of the `Add`'s for the residual's other readers.
Only an `Add` of two inputs of one shape and an `RMSNormalization` over the last axis
computed in float32 (``stash_type`` 1) with a 1-D scale are rewritten: the kernel computes
the same thing for them, and nothing else.
"""

from __future__ import annotations

import onnx_ir as ir

from dispatcher.functions.fused import ONNXRUNTIME_DOMAIN
from fx2onnx.onnx_passes.model_graphs import model_graphs

_FLOAT_STASH = 1  # RMSNormalization's stash_type for float32
_KERNEL_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})  # the kernel's CPU types
_SUM = 3  # the kernel's output of input + skip


def _attribute(node: ir.Node, name: str, default: object) -> object:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _same_dim(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    """Known to be equal: the same number, or symbolic dims of one name."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


def _same_shape(first: ir.Value, second: ir.Value) -> bool:
    """Both shapes known and equal, dim by dim."""
    if first.shape is None or second.shape is None or first.shape.rank() != second.shape.rank():
        return False
    return all(_same_dim(a, b) for a, b in zip(first.shape.dims, second.shape.dims))


def _skip_add(norm: ir.Node) -> ir.Node | None:
    """The `Add` ``norm`` normalizes the sum of, when the pair is the kernel's."""
    if (norm.domain, norm.op_type) != ("", "RMSNormalization") or len(norm.inputs) != 2:
        return None
    source, scale = norm.inputs
    add = None if source is None else source.producer()
    if add is None or (add.domain, add.op_type) != ("", "Add") or source.dtype not in _KERNEL_TYPES:
        return None
    if add.graph is not norm.graph:  # a sub-graph's norm of an outer sum: the Add stays outside
        return None
    first, second = add.inputs
    if first is None or second is None or not _same_shape(first, second) or first.shape.rank() not in (2, 3):
        return None
    rank = first.shape.rank()
    if scale is None or scale.shape is None or scale.shape.rank() != 1 or scale.dtype != source.dtype:
        return None
    if not _same_dim(scale.shape[0], first.shape[-1]):  # the kernel's scale is one per hidden unit
        return None
    if _attribute(norm, "axis", -1) not in (-1, rank - 1) or _attribute(norm, "stash_type", _FLOAT_STASH) != _FLOAT_STASH:
        return None
    return add


def _fuse(graph: ir.Graph | ir.Function, add: ir.Node, norm: ir.Node, index: int) -> None:
    epsilon = float(_attribute(norm, "epsilon", 1e-5))  # ONNX's default
    fused = ir.node("SkipSimplifiedLayerNormalization", [add.inputs[0], add.inputs[1], norm.inputs[1]],
                    attributes={"epsilon": epsilon}, domain=ONNXRUNTIME_DOMAIN, num_outputs=4,
                    name=f"{norm.name}/skip" if norm.name else f"SkipSimplifiedLayerNormalization_{index}")
    graph.insert_before(norm, fused)
    for replacing, old in ((fused.outputs[0], norm.outputs[0]), (fused.outputs[_SUM], add.outputs[0])):
        replacing.type, replacing.shape = old.type, old.shape
        name, old.name = old.name, None
        replacing.name = name
        ir.convenience.replace_all_uses_with(old, replacing, replace_graph_outputs=True)
    graph.remove([norm, add], safe=True)


def fuse_skip_normalizations(model: ir.Model) -> int:
    """Each residual `Add` whose sum an `RMSNormalization` reads, with that normalization,
    as one `SkipSimplifiedLayerNormalization`, in every graph of ``model``; returns how many."""
    fused = 0
    for graph in list(model_graphs(model)):
        pairs: dict[int, tuple[ir.Node, ir.Node]] = {}  # by Add: a sum two norms read is fused with the first
        for norm in graph:
            add = _skip_add(norm)
            if add is not None:
                pairs.setdefault(id(add), (add, norm))
        for add, norm in pairs.values():
            _fuse(graph, add, norm, fused)
            fused += 1
        if pairs and isinstance(graph, ir.Function):
            graph.opset_imports.setdefault(ONNXRUNTIME_DOMAIN, 1)
    if fused:
        model.opset_imports.setdefault(ONNXRUNTIME_DOMAIN, 1)
    return fused
