"""In-place operators on tensors the graph made itself, made functional where they stand.

torch.export hands over graphs that still mutate: a mask built by assigning to slices of a
fresh zeros tensor (``mask[a:b, c:d] = k``), an intermediate scaled in place. Otherwise
only a re-trace of the whole program (``run_decompositions``) removes them, the slowest
stage of an export with symbolic sizes. Here such an operator becomes its functional form,
written back into the tensor through the views it wrote to (``slice_scatter``,
``select_scatter``), and every later reader of the tensor reads that new value.

Only what is safe to see locally is rewritten: the tensor is made by an operator that
returns new memory (not an input, a buffer or a view), the views are slices and selects,
and no other alias of it made before the mutation is read after it. The rest stays for
the whole-program path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from fx2onnx.fx_passes.node_meta import call_in_place_of

_aten = torch.ops.aten

# view operator -> the operator that writes a value back through it (same arguments after `src`)
_WRITE_BACK = {_aten.slice.Tensor: _aten.slice_scatter.default, _aten.select.int: _aten.select_scatter.default}


def _functional_form(target: Any) -> torch._ops.OpOverload | None:
    """The functional twin of an in-place ATen operator that writes only its first
    argument (``fill_.Tensor`` -> ``fill.Tensor``), with the same arguments; else None."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    schema = target._schema
    written = [arg for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]
    if len(written) != 1 or written[0] is not schema.arguments[0] or not schema.name.endswith("_"):
        return None
    packet = getattr(_aten, schema.name.split("::")[-1][:-1], None)
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None or functional._schema.is_mutable:
        return None
    if [arg.name for arg in functional._schema.arguments] != [arg.name for arg in schema.arguments]:
        return None
    return functional


def _returns_alias(node: torch.fx.Node) -> bool:
    """The node's result shares memory with an argument: a view, or an in-place result."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return node.op == "call_function"  # getitem and Python calls: assume it may
    schema = node.target._schema
    return schema.is_mutable or any(ret.alias_info is not None for ret in schema.returns)


def _is_fresh(node: torch.fx.Node) -> bool:
    """Made by an operator that returns new memory (not an input, constant or view)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and not _returns_alias(node)


def _written_views(mutated: Any) -> tuple[list[torch.fx.Node], torch.fx.Node | None]:
    """``(views, base)``: the chain of slices and selects ``mutated`` is of ``base``,
    innermost first; base None when the chain does not end at a fresh tensor."""
    views: list[torch.fx.Node] = []
    node = mutated
    while isinstance(node, torch.fx.Node) and node.target in _WRITE_BACK:
        views.append(node)
        node = node.args[0]
    return views, node if isinstance(node, torch.fx.Node) and _is_fresh(node) else None


def _other_alias_read_after(base: torch.fx.Node, mutation: torch.fx.Node, place: dict[torch.fx.Node, int]) -> bool:
    """Some alias of ``base`` made before ``mutation`` (a view of it, of a view, ...) is
    read after it: that reader would see the mutation, which the rewrite cannot give it."""
    seen, todo = {base}, [base]
    while todo:
        for user in todo.pop().users:
            if user in seen or place.get(user, -1) >= place[mutation]:
                continue
            if _returns_alias(user):
                seen.add(user)
                todo.append(user)
    return any(place.get(user, -1) > place[mutation] for alias in seen - {base} for user in alias.users)


def functionalize_fresh_mutations(graph: torch.fx.Graph, fake_mode: Any) -> int:
    """Rewrite the in-place operators on fresh tensors (see the module's docstring);
    returns how many. Nodes without FakeTensor metadata are left alone."""
    rewritten = 0
    # positions of the nodes as captured; the nodes a rewrite adds stand where an earlier
    # mutation stood, before every later one (-1)
    place = {node: index for index, node in enumerate(graph.nodes)}
    for mutation in list(graph.nodes):
        functional = _functional_form(mutation.target) if mutation.op == "call_function" else None
        if functional is None or fake_mode is None:
            continue
        views, base = _written_views(mutation.args[0])
        if base is None or any("val" not in node.meta for node in (*views, base)):
            continue
        if _other_alias_read_after(base, mutation, place):
            continue
        with graph.inserting_before(mutation):
            result = call_in_place_of(graph, functional, mutation.args, dict(mutation.kwargs), mutation.meta, fake_mode)
            dtype = mutation.args[0].meta["val"].dtype
            if result.meta["val"].dtype != dtype:  # in place, the result keeps the tensor's dtype
                result = call_in_place_of(graph, _aten._to_copy.default, (result,), {"dtype": dtype}, mutation.meta, fake_mode)
            new_value = result
            for view in views:  # innermost first: write the new part into the view around it
                new_value = call_in_place_of(graph, _WRITE_BACK[view.target], (view.args[0], new_value, *view.args[1:]),
                                             dict(view.kwargs), mutation.meta, fake_mode, like=view.args[0].meta["val"])
        mutation.replace_all_uses_with(result)  # the in-place result is the view's new value
        graph.erase_node(mutation)
        base.replace_all_uses_with(new_value, delete_user_cb=lambda user: place.get(user, -1) > place[mutation])
        rewritten += 1
    return rewritten
