"""One decoder file for an encoder-decoder's first and next steps, as Transformers.js and
Optimum load it (`decoder_model_merged.onnx`).

The two captured decoders differ in Python-level choices (the first step computes the
cross-attention cache from the encoder's output, the next steps read it from the past),
so they stay two graphs: the merged model takes the next steps' inputs and a boolean
`use_cache_branch` ([1]) and runs one of them in an `If`. With `use_cache_branch` false
the past inputs are empty (length 0) and unused. The graphs' weights (the same
parameters) are stored once, in the main graph (the constants a portable export keeps as
initializers, `CONSTANT_KEY` and `FOLDED_KEY`, stay each step's own, under the branch's
name); model-local functions the two graphs
share by name and body are kept once, and the next-step graph's others are renamed.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx_ir as ir

from fx2onnx.hub.shared.dim_roles import present_name
from fx2onnx.onnx_passes import CONSTANT_KEY, FOLDED_KEY

USE_CACHE_BRANCH = "use_cache_branch"
_FIRST, _NEXT = "first_step", "with_past"
_SELF_CACHE_LENGTH = 2  # (batch, heads, length, head size)


def _function_key(function: ir.Function) -> bytes:
    return ir.serde.serialize_function(function).SerializeToString(deterministic=True)


def _rename_calls(graphs: list[ir.Graph | ir.Function], renamed: dict[ir.OperatorIdentifier, str]) -> None:
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            new_name = renamed.get(node.op_identifier())
            if new_name is not None:
                node.op_type = new_name


def _merge_functions(kept: ir.Model, other: ir.Model, suffix: str) -> dict[ir.OperatorIdentifier, ir.Function]:
    """The functions of both models: one per name where the bodies are equal, ``other``'s
    own version renamed (``suffix`` appended) where they differ."""
    functions = dict(kept.functions)
    renamed: dict[ir.OperatorIdentifier, str] = {}
    for identifier, function in other.functions.items():
        if identifier not in functions:
            functions[identifier] = function
        elif _function_key(functions[identifier]) != _function_key(function):
            renamed[identifier] = f"{function.name}_{suffix}"
    _rename_calls([other.graph, *other.functions.values()], renamed)
    for identifier, new_name in renamed.items():
        function = other.functions[identifier]
        function.name = new_name
        functions[function.identifier()] = function
    return functions


def _as_branch(graph: ir.Graph, prefix: str, main_inputs: dict[str, ir.Value], main: ir.Graph) -> ir.Graph:
    """``graph`` turned into a branch: its inputs and weights read from the main graph,
    its values renamed apart from the main graph's (a subgraph may not shadow them)."""
    for index, output in enumerate(list(graph.outputs)):
        if output.producer() is None:  # a pass-through input (the cross-attention past)
            identity = ir.node("Identity", [output], name=f"{prefix}/{output.name}")
            graph.append(identity)
            graph.outputs[index] = identity.outputs[0]
    for value in list(graph.inputs):
        value.replace_all_uses_with(main_inputs[value.name])
    graph.inputs.clear()
    for name in list(graph.initializers):
        value = graph.initializers.pop(name)
        if CONSTANT_KEY in value.metadata_props or FOLDED_KEY in value.metadata_props:
            # a constant of this step's graph (the portable target), not a weight both share
            value.name = f"{prefix}/{name}"
            main.register_initializer(value)
        elif name in main.initializers:
            kept = main.initializers[name]
            if (kept.shape, kept.dtype) != (value.shape, value.dtype):
                raise ValueError(f"The decoding steps' weight {name} differs: {kept.shape} {kept.dtype} and "
                                 f"{value.shape} {value.dtype}; they are one parameter of the model.")
            value.replace_all_uses_with(kept)
        else:
            main.register_initializer(value)
    for node in graph:
        node.name = f"{prefix}/{node.name or node.op_type}"
        for value in node.outputs:
            value.name = f"{prefix}/{value.name}"
    graph.name = prefix
    return graph


def models_in_if(
    then_model: ir.Model, else_model: ir.Model, inputs: list[ir.Value], condition: ir.Value, condition_nodes: list[ir.Node],
    names: tuple[str, str], graph_name: str, if_name: str,
) -> ir.Model:
    """One model that runs ``then_model`` where ``condition`` holds and ``else_model``
    otherwise, in an `If`: ``inputs`` (by the models' input names) and ``condition_nodes``
    (which compute ``condition`` from them) make the main graph; the outputs are
    ``else_model``'s, in its order. ``names`` prefix each branch's values."""
    outputs = [value.name for value in else_model.graph.outputs]
    if sorted(outputs) != sorted(value.name for value in then_model.graph.outputs):
        raise ValueError(f"The two decoders differ in outputs: {outputs} and {[value.name for value in then_model.graph.outputs]}.")
    main = ir.Graph(inputs, [], nodes=condition_nodes, opset_imports={**then_model.opset_imports, **else_model.opset_imports},
                    name=graph_name)
    by_name = {value.name: value for value in inputs}
    functions = _merge_functions(else_model, then_model, names[0])
    then_by_name = {value.name: value for value in then_model.graph.outputs}
    then_model.graph.outputs[:] = [then_by_name[name] for name in outputs]
    shapes = [(value.shape, value.type) for value in then_model.graph.outputs]
    branches = {
        "then_branch": _as_branch(then_model.graph, names[0], by_name, main),
        "else_branch": _as_branch(else_model.graph, names[1], by_name, main),
    }
    choose = ir.node("If", [condition], attributes=branches, num_outputs=len(outputs), name=if_name)
    for value, name, (shape, type_) in zip(choose.outputs, outputs, shapes):
        value.name, value.shape, value.type = name, shape, type_
    main.append(choose)
    main.outputs.extend(choose.outputs)
    for identifier in functions:
        main.opset_imports.setdefault(identifier[0], 1)
    return ir.Model(main, ir_version=else_model.ir_version, producer_name=else_model.producer_name,
                    producer_version=else_model.producer_version, functions=list(functions.values()))


def _fix_dims_by_first_step(following: ir.Model, first: ir.Model) -> None:
    """Give the next steps' inputs and outputs the sizes the first step fixes: a dim the next
    steps only pass on (the encoder's width, which they do not read; a cross-attention cache's
    heads, which they read as they are) is free in their capture, while the first step computes
    that value from the weights. A past input takes the size of the first step's output for it,
    but for the length of a self-attention cache, which grows from step to step (a first step that
    decodes one frame, SpeechT5's, gives a cache of length 1)."""
    given = {value.name: value.shape for value in (*first.graph.inputs, *first.graph.outputs)}
    for value in (*following.graph.inputs, *following.graph.outputs):
        name = present_name(value.name) if value.name.startswith("past_key_values.") else value.name
        fixed = given.get(name)
        if value.shape is None or fixed is None or len(fixed) != len(value.shape):
            continue
        growing = _SELF_CACHE_LENGTH if name.startswith("present.") and ".decoder." in name else None
        value.shape = ir.Shape([
            size if isinstance(dim, ir.SymbolicDim) and isinstance(size, int) and index != growing else dim
            for index, (dim, size) in enumerate(zip(value.shape, fixed))
        ])


def merge_decoders(first_path: Path, next_path: Path, destination: Path, data_name: str) -> None:
    """Write the decoder of ``first_path`` (no past) and ``next_path`` (with past) as one
    model at ``destination``, its weights in ``data_name`` beside it."""
    first, following = ir.load(os.fspath(first_path)), ir.load(os.fspath(next_path))
    _fix_dims_by_first_step(following, first)
    inputs = [ir.Value(name=value.name, shape=value.shape, type=value.type) for value in following.graph.inputs]
    condition = ir.Value(name=USE_CACHE_BRANCH, shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.BOOL))
    model = models_in_if(following, first, [*inputs, condition], condition, [], (_NEXT, _FIRST), "decoder_model_merged",
                         "use_cache_branch_if")
    ir.save(model, os.fspath(destination), external_data=data_name, size_threshold_bytes=1024)
