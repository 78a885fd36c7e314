"""The optimization stage: constant folding and no-op removal, keeping what fx2onnx promises.

The stage is built from onnxscript's public optimizer pieces, in one pass:

1. constant folding (`onnxscript.optimizer.fold_constants_ir`):
   shape computations, casts of constants, `Shape`/`Size` of static values; what its
   evaluator cannot compute, by onnxruntime (`fx2onnx.onnx_passes.runtime_folding`);
2. the rewrite rules that remove no-ops and merge chains (`Add 0`, `Mul 1`, inference
   `Dropout`, identity `Cast`/`Expand`/`Transpose`, `Cast`-`Cast`, `Reshape`-`Reshape`,
   `Transpose`-`Transpose`, `Unsqueeze`-`Unsqueeze`), and fx2onnx's own:
   `x * Reciprocal(Sqrt(v))` (``x * torch.rsqrt(v)``, how RMSNorm is written) becomes
   `x / Sqrt(v)`, the form onnxruntime fuses into one normalization kernel (measured:
   the Reciprocal form stays six kernels); the layout rules of `fx2onnx.onnx_passes.layout_rules`
   move Transposes past the Squeezes and Gathers that read them, where they vanish
   (one copy less per `nn.MultiheadAttention` call);
   the dim rules of `fx2onnx.onnx_passes.dim_rules` (a dim read from a shape used as read,
   a scalar made a one-element tensor by Unsqueeze: TVM's frontend refuses the Reshape);
3. removal of the Identity nodes the rules leave (not those that name an output), of
   unused nodes, functions and opset imports; common subexpressions; the nodes a rule
   made named after their module (flat graphs).

Constants are folded through the folder's own results: only the model's weights (the
initializers before folding) stop a node from being folded.

Why not onnxscript's whole `optimize_ir`: measured on the benchmark models
(`bench/export_speed.py`), its other rules never fire on fx2onnx's output after folding
(fusions such as Conv+BatchNormalization span module functions, which are kept: the
portable target and inlined saves fold batch norm in flat graphs,
`fx2onnx.onnx_passes.batch_norm_folding`), yet
matching them costs more than the folding itself; onnxruntime applies those fusions at
load time after inlining the functions. Every rule here matches from a single output
node: a rule with several output nodes (such as Slices forming a Split) makes the
matcher try every combination of nodes, quadratic in the graph's size (minutes on the
unrolled linear-algebra graphs).

Three things of the exported model must survive:

- module functions: nothing here inlines them;
- parameter names: folding a node that reads a weight (a Transpose, a Slice of a fused
  projection) would replace the named initializer with an anonymous constant, so nodes
  reading weights are not folded (onnxruntime folds them itself at load time; the
  portable target folds them after, `fx2onnx.onnx_passes.weight_folding`);
- the model's opset imports of domains used only inside functions;
- initializers are the model's weights: the constants the folder registers as
  initializers become Constant nodes again.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import onnx_ir as ir

from fx2onnx.onnx_passes.dim_rules import dim_rules
from fx2onnx.onnx_passes.layout_rules import layout_rules
from fx2onnx.onnx_passes.fake_weights import fake_weights_hidden
from fx2onnx.onnx_passes.model_graphs import model_graphs
from fx2onnx.onnx_passes.runtime_folding import fold_with_onnxruntime
from fx2onnx.translate.module_scope import MODULE_KEY


def _reads_a_weight(weights: set[str], node: ir.Node) -> bool | None:
    # the folder registers what it computes as initializers: only the model's own
    # weights (initializers before folding) stop a node from being folded
    if any(value is not None and value.is_initializer() and value.name in weights for value in node.inputs):
        return False
    return None  # the folder's own rules decide


@contextlib.contextmanager
def _dynamic_split_sizes_unshaped(model: ir.Model) -> Iterator[None]:
    """Hide, while the folder runs, the shape of every size ``SplitToSequence`` splits by
    that is one number computed in the graph (``torch.split`` by a size read from a dynamic
    dim): onnxscript's folder, told that it is a scalar, reads its value, which it does not
    have, and fails; without a shape it leaves the node as it is."""
    hidden = [(node.inputs[1], node.inputs[1].shape) for container in model_graphs(model) for node in container
              if node.op_type == "SplitToSequence" and node.domain == "" and len(node.inputs) > 1
              and node.inputs[1] is not None and node.inputs[1].const_value is None
              and node.inputs[1].shape is not None and node.inputs[1].shape.rank() == 0]
    for value, _ in hidden:
        value.shape = None
    try:
        yield
    finally:
        for value, shape in hidden:
            value.shape = shape


def _fold_what_the_folder_left(model: ir.Model, weights: set[str]) -> int:
    """Nodes of constants alone that the folder's evaluator could not compute, computed by
    onnxruntime (`fx2onnx.onnx_passes.runtime_folding`); returns how many."""
    opset = model.opset_imports.get("", 18)
    return sum(len(fold_with_onnxruntime(container, container.opset_imports.get("", opset),
                                         lambda node: _reads_a_weight(weights, node) is None))
               for container in model_graphs(model))


def _times_reciprocal_sqrt(op, x, variance):
    return op.Mul(x, op.Reciprocal(op.Sqrt(variance)))


def _divide_by_sqrt(op, x, variance):
    return op.Div(x, op.Sqrt(variance))


@functools.cache
def _rewrite_rules():
    """The rewrite rules of step 2 (built once per process)."""
    from onnxscript.rewriter import RewriteRule, RewriteRuleSet
    from onnxscript.rewriter.rules import common as rules

    divide_by_sqrt = RewriteRule(_times_reciprocal_sqrt, _divide_by_sqrt, name="DivideBySqrt")
    return RewriteRuleSet(
        [
            rules.add_0_rule,
            rules.sub_0_rule,
            rules.mul_by_1_rule,
            rules.div_by_1_rule,
            rules.dropout_inference_rule,
            rules.dropout_zero_rule,
            rules.no_op_cast_rule,
            rules.no_op_expand_rule,
            rules.no_op_transpose_rule,
            rules.cast_cast_rule,
            rules.reshape_reshape_rule,
            rules.transpose_transpose_rule,
            rules.unsqueeze_unsqueeze_rule,
            *divide_by_sqrt.commute(),  # x * r and r * x
            *layout_rules(),
            *dim_rules(),
        ]
    )


def _remove_inner_identities(model: ir.Model) -> None:
    """Remove the Identity nodes whose output is not an output of its graph or function
    (those keep the output's name where another value holds it)."""
    for graph in model_graphs(model):
        outputs = set(graph.outputs)
        for node in list(graph):
            if node.op_type == "Identity" and node.domain == "" and node.inputs[0] is not None and node.outputs[0] not in outputs:
                node.outputs[0].replace_all_uses_with(node.inputs[0])
                graph.remove(node, safe=True)


def _name_rewritten_nodes_after_their_module(graph: ir.Graph) -> None:
    """The nodes a rewrite rule made (``node_Div_3``) named after the module their
    metadata names, as every other node of a flat graph is (`fx2onnx.translate.module_scope`)."""
    for node in graph:
        module = node.metadata_props.get(MODULE_KEY)
        if module and node.name and not node.name.startswith(module + "/"):
            node.name = f"{module}/{node.name}"


def optimize_keeping_functions(model: ir.Model) -> None:
    """Optimize `model` in place; module functions, weight names and imports are kept."""
    import onnx_ir.passes.common as common_passes
    from onnxscript.optimizer import fold_constants_ir
    from onnxscript.rewriter import RewritePass

    weights = set(model.graph.initializers)
    with fake_weights_hidden(model):  # fake-mode weights have no data to fold
        # No ONNX shape inference: translation already gave every value its type and shape
        # (FakeTensor metadata, node inference), and re-inferring doubled the folding time.
        with _dynamic_split_sizes_unshaped(model):
            fold_constants_ir(model, onnx_shape_inference=False, should_fold=functools.partial(_reads_a_weight, weights))
        _fold_what_the_folder_left(model, weights)
        RewritePass(_rewrite_rules())(model)
        _remove_inner_identities(model)  # the rules' no-ops are Identity nodes
        ir.passes.Sequential(
            common_passes.RemoveUnusedNodesPass(),
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
            common_passes.CommonSubexpressionEliminationPass(),
            common_passes.OutputFixPass(),
        )(model)
        _name_rewritten_nodes_after_their_module(model.graph)
        common_passes.NameFixPass()(model)
    graph = model.graph
    constants_back_to_nodes(graph, [n for n, v in graph.initializers.items() if n not in weights and v.const_value is not None])
    for function in model.functions.values():
        for domain, version in function.opset_imports.items():
            model.graph.opset_imports.setdefault(domain, version)


def constants_back_to_nodes(graph: ir.Graph, names: list[str]) -> None:
    """Turn the initializers ``names`` (constants a folder created, not weights) back into
    Constant nodes at the start of the graph."""
    for name in names:
        value = graph.initializers.pop(name)
        node = ir.node("Constant", [], attributes={"value": value.const_value})
        node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = name, value.type, value.shape
        value.replace_all_uses_with(node.outputs[0], replace_graph_outputs=True)
        if len(graph):
            graph.insert_before(graph[0], node)
        else:
            graph.append(node)
