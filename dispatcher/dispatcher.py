"""``OnnxFunctionDispatcher``: choose the ONNX function that translates one FX node.

For a ``call_function`` node the dispatcher

1. names the target (``aten::add.Tensor``) and collects the functions registered for the
   exact overload, else for the default overload (a warning: the default overload may
   not take these arguments);
2. keeps the complex implementations when an argument is a complex tensor, the real
   ones otherwise;
3. matches each candidate's signature against the node's arguments (see
   :mod:`dispatcher._matching`), user functions first and the latest registration
   first. The first perfect match wins; otherwise the best-scoring candidate is used
   and a warning says which argument did not fit.

When nothing can be used it records an error diagnostic at the user's source line and
raises :class:`DispatchError`.
"""

from __future__ import annotations

import enum
import functools
import logging
import operator
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from diagnostics import Diagnostic, DiagnosticContext, Level, Location, Rule, Stack, rules

from dispatcher._locations import node_stack, stack_location
from dispatcher._matching import SignatureMatch, clean_kwargs, match_signature, optional_parameters, schema_defaults
from dispatcher._names import OpName, op_name_of
from dispatcher._types import is_complex_value
from dispatcher.registry import OnnxRegistry, OnnxScriptFunction, RegisteredFunction

__all__ = ["DispatchError", "NodeRoute", "OnnxFunctionDispatcher", "is_tuple_constructor", "node_route", "walk_graph_modules"]


class NodeRoute(enum.Enum):
    """Who translates a ``call_function`` node."""

    ONNX_FUNCTION = "onnx_function"  # the dispatcher picks a registered ONNX function
    GETITEM = "getitem"  # the interpreter picks an element of a multi-output node
    TUPLE = "tuple"  # the interpreter groups values (named-tuple constructors)
    HIGHER_ORDER = "higher_order"  # control flow (cond, while_loop, scan, map): subgraphs


def is_tuple_constructor(target: Any) -> bool:
    """A named-tuple class (``torch.return_types.var_mean``) called in the graph: it only
    groups values, so the interpreter builds the tuple itself."""
    return isinstance(target, type) and issubclass(target, tuple)


def node_route(target: Any) -> NodeRoute:
    """The one decision of who translates a call of ``target``: both the analysis of
    unsupported nodes and the interpreter ask here."""
    if target is operator.getitem:
        return NodeRoute.GETITEM
    if is_tuple_constructor(target):
        return NodeRoute.TUPLE
    if isinstance(target, torch._ops.HigherOrderOperator):
        return NodeRoute.HIGHER_ORDER
    return NodeRoute.ONNX_FUNCTION


class DispatchError(RuntimeError):
    """No ONNX function can translate an FX node.

    ``diagnostic`` is the recorded ERROR diagnostic, ``node_target`` the node's target
    (an OpOverload or a builtin function) and ``node_name`` the FX node's name.
    """

    def __init__(
        self,
        message: str,
        diagnostic: Diagnostic | None = None,
        *,
        node_target: Any = None,
        node_name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.diagnostic = diagnostic
        self.node_target = node_target
        self.node_name = node_name


class OnnxFunctionDispatcher:
    """Finds the ONNX Script function for FX nodes, recording why in diagnostics."""

    def __init__(self, registry: OnnxRegistry, diagnostic_context: DiagnosticContext) -> None:
        self.registry = registry
        # dispatch key -> the function chosen (see dispatch_registered)
        self._choices: dict[Any, tuple[RegisteredFunction, str | None]] = {}
        self.diagnostic_context = diagnostic_context

    # -- dispatch ----------------------------------------------------------------------

    def dispatch(self, node: torch.fx.Node) -> OnnxScriptFunction:
        """The ONNX function that translates ``node`` (a ``call_function`` node)."""
        return self.dispatch_registered(node).onnx_function

    def dispatch_registered(self, node: torch.fx.Node) -> RegisteredFunction:
        """Like :meth:`dispatch`, returning the registry entry (custom? complex?).

        Models repeat the same call (operator, argument types and constants) layer after
        layer: a choice that was a perfect match with nothing to report is remembered for
        the next node of the same kind (the registry must not change meanwhile).
        """
        key = _dispatch_key(node)
        cached = self._choices.get(key) if key is not None else None
        if cached is not None:
            chosen, qualified_name = cached
            self._record_perfect_match(node, chosen, qualified_name)
            return chosen
        call = _Call(node)
        candidates = self._overload_candidates(call)
        candidates = self._filter_complex(call, candidates)
        chosen = self._best_match(call, candidates)
        quiet = call.overloads_tried[:1] == [call.qualified_name] and not self.diagnostic_context.would_record(Level.NONE)
        if key is not None and call.perfect and quiet:
            self._choices[key] = (chosen, call.qualified_name)
        return chosen

    def _record_perfect_match(self, node: torch.fx.Node, function: RegisteredFunction, qualified_name: str | None) -> None:
        """The level-none record of a perfect match, without the costly parts (the
        user's line, the candidates), which verbosity DEBUG adds."""
        self.diagnostic_context.record(
            rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
            Level.NONE,
            f"The ONNX function {function.name} is the perfect match for {qualified_name} "
            f"(FX node '{node.name}', {node.target}).",
            properties={"target": qualified_name, "fx_node": node.name, "function": function.name,
                        "is_custom": function.is_custom, "is_complex": function.is_complex},
        )

    def _overload_candidates(self, call: _Call) -> list[RegisteredFunction]:
        try:
            name = op_name_of(call.node.target)
        except ValueError as exc:
            raise self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"{call.target_text} cannot be exported: {exc}",
                "Rewrite this call with torch operators, or keep it out of the exported "
                "forward().",
            ) from None
        call.qualified_name = name.qualified_name()
        keys = self.registry.candidate_names(call.node.target)
        if not keys:
            tried = [name] if name.is_default else [name, name.default()]
            raise self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"No ONNX function is registered for {call.qualified_name} "
                f"(looked up: {', '.join(str(n) for n in tried)}), used by {call.where}.",
                f"Register one with OnnxRegistry.register_op(function, "
                f"{name.namespace!r}, {name.op_name!r}, {name.overload!r}), or "
                f"decompose the operator before export.",
            )
        if keys[0] != call.qualified_name:
            used = ", ".join(keys)
            self.diagnostic_context.record(
                rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY,
                Level.WARNING,
                f"No ONNX function is registered for the exact overload "
                f"{call.qualified_name} of {call.where}; using the functions of {used} "
                f"instead. Check that they handle this overload's arguments.",
                location=call.location,
                stack=call.stack,
                properties={"target": call.qualified_name, "used": keys, "fx_node": call.node.name},
            )
        functions: list[RegisteredFunction] = []
        for key in keys:
            functions.extend(self.registry.get_functions(key) or ())
        call.overloads_tried = keys
        return functions

    def _filter_complex(
        self, call: _Call, functions: list[RegisteredFunction]
    ) -> list[RegisteredFunction]:
        is_complex = call.has_complex_input()
        kept = [f for f in functions if f.is_complex == is_complex]
        if kept:
            return kept
        name = OpName.parse(call.qualified_name)
        if is_complex:
            message = (
                f"{call.qualified_name} has no complex implementation, but {call.where} "
                f"takes complex tensors."
            )
            advice = (
                f"Register one with OnnxRegistry.register_op(function, {name.namespace!r}, "
                f"{name.op_name!r}, {name.overload!r}, is_complex=True); it receives "
                f"complex tensors as real tensors with a trailing dimension of 2."
            )
        else:
            message = (
                f"{call.qualified_name} only has complex implementations, but {call.where} "
                f"takes no complex tensor."
            )
            advice = (
                f"Register a real implementation with OnnxRegistry.register_op(function, "
                f"{name.namespace!r}, {name.op_name!r}, {name.overload!r})."
            )
        raise self._fail(call, rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, message, advice)

    def _best_match(self, call: _Call, functions: list[RegisteredFunction]) -> RegisteredFunction:
        # Priority: the user's functions first, then the latest registered first.
        ordered = [f for f in reversed(functions) if f.is_custom] + [
            f for f in reversed(functions) if not f.is_custom
        ]
        results: list[tuple[RegisteredFunction, SignatureMatch]] = []
        chosen = None
        for function in ordered:
            match = match_signature(
                function.onnx_function.op_signature,
                call.args,
                call.kwargs_for(function.onnx_function.op_signature),
                optional=optional_parameters(function.onnx_function),
            )
            results.append((function, match))
            if match.is_perfect:
                chosen = (function, match)
                break
        if chosen is not None:
            call.perfect = True
            self._report_match(call, chosen, results, Level.NONE)
            return chosen[0]

        scored = [(f, m) for f, m in results if m.is_candidate]
        if not scored:
            raise self._fail(
                call,
                rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
                f"None of the {len(results)} ONNX function(s) registered for "
                f"{call.qualified_name} accepts the arguments of {call.where}: "
                + "; ".join(f"{f.name} {m.summary()}" for f, m in results)
                + ".",
                "Register a function whose signature takes these arguments with "
                "OnnxRegistry.register_op().",
                results=results,
            )
        # max() keeps the first of equal scores: the priority order breaks ties.
        best = max(scored, key=lambda item: item[1].score)
        self._report_match(call, best, results, Level.WARNING)
        return best[0]

    # -- diagnostics -------------------------------------------------------------------

    def _report_match(
        self,
        call: _Call,
        chosen: tuple[RegisteredFunction, SignatureMatch],
        results: list[tuple[RegisteredFunction, SignatureMatch]],
        level: Level,
    ) -> None:
        ctx = self.diagnostic_context
        function, match = chosen
        if match.is_perfect and not ctx.would_record(level):
            self._record_perfect_match(call.node, function, call.qualified_name)
            return
        if match.is_perfect:
            message = (
                f"The ONNX function {function.name} is the perfect match for "
                f"{call.qualified_name} ({call.where})."
            )
        else:
            misfits = "; ".join(
                f"{'attribute' if c.is_attribute else 'input'} '{c.name}' got {c.got} "
                f"but allows {c.allowed}"
                for c in match.mismatches
            )
            message = (
                f"The ONNX function {function.name} is the nearest match for "
                f"{call.qualified_name} ({call.where}), not a perfect one: {misfits}. "
                f"Check the exported ONNX graph around this node."
            )
        diagnostic = ctx.record(
            rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
            level,
            message,
            location=call.location,
            stack=call.stack,
            properties={
                "target": call.qualified_name,
                "fx_node": call.node.name,
                "function": function.name,
                "is_custom": function.is_custom,
                "is_complex": function.is_complex,
                "score": match.score,
            },
        )
        _log_candidates(diagnostic, call, results)

    def _fail(
        self,
        call: _Call,
        rule: Rule,
        message: str,
        advice: str,
        results: list[tuple[RegisteredFunction, SignatureMatch]] | None = None,
    ) -> DispatchError:
        """Record an ERROR diagnostic and build the exception to raise."""
        diagnostic = self.diagnostic_context.record(
            rule,
            Level.ERROR,
            f"{message} {advice}",
            location=call.location,
            stack=call.stack,
            properties={"target": call.qualified_name or call.target_text, "fx_node": call.node.name},
        )
        if results:
            _log_candidates(diagnostic, call, results)
        return DispatchError(
            f"{message}\n{advice}",
            diagnostic,
            node_target=call.node.target,
            node_name=call.node.name,
        )

    # -- analysis ----------------------------------------------------------------------

    def unsupported_nodes(self, graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
        """Every call_function node, in this graph and in the GraphModules it calls,
        that no registered ONNX function can translate (see :meth:`unsupported_reason`);
        nodes that :func:`node_route` gives to the interpreter are left out. Records no
        diagnostics."""
        return [
            node
            for _, node in walk_graph_modules(graph_module)
            if node.op == "call_function" and self.unsupported_reason(node) is not None
        ]

    def unsupported_reason(self, node: torch.fx.Node) -> str | None:
        """Why :meth:`dispatch` would fail for ``node`` (None when it would not):
        no function registered, none of the right kind (complex or real), or none whose
        signature can bind the node's arguments. Records no diagnostics."""
        if node_route(node.target) is not NodeRoute.ONNX_FUNCTION:
            return None  # not the dispatcher's to judge
        try:
            name = op_name_of(node.target)
        except ValueError as exc:
            return str(exc)
        keys = self.registry.candidate_names(node.target)
        if not keys:
            return f"no ONNX function is registered for {name}"
        call = _Call(node)
        is_complex = call.has_complex_input()
        functions = [
            f
            for key in keys
            for f in self.registry.get_functions(key) or ()
            if f.is_complex == is_complex
        ]
        if not functions:
            kind = "complex" if is_complex else "real"
            return WrongKindOfFunction(f"{', '.join(keys)} has no {kind} implementation")
        for function in functions:
            match = match_signature(
                function.onnx_function.op_signature,
                call.args,
                call.kwargs_for(function.onnx_function.op_signature),
                optional=optional_parameters(function.onnx_function),
            )
            if match.is_candidate:
                return None
        return f"no function registered for {', '.join(keys)} takes these arguments"


def walk_graph_modules(graph_module: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.GraphModule, torch.fx.Node]]:
    """Every node of ``graph_module`` and of the GraphModules it reaches through
    ``get_attr`` or ``call_module`` (module calls, control-flow branches and bodies), with
    the GraphModule that holds it. A reached GraphModule's nodes come right after the node
    that reaches it (source order); each GraphModule is walked once."""
    seen: set[int] = set()

    def walk(module: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.GraphModule, torch.fx.Node]]:
        seen.add(id(module))
        for node in module.graph.nodes:
            yield module, node
            if node.op in ("call_module", "get_attr") and isinstance(node.target, str):
                try:
                    sub = module.get_submodule(node.target)
                except AttributeError:
                    continue
                if isinstance(sub, torch.fx.GraphModule) and id(sub) not in seen:
                    yield from walk(sub)

    return walk(graph_module)


def record_identity_removed(context: DiagnosticContext, node: torch.fx.Node) -> None:
    """The dispatch record of a node that needs no ONNX function: it returns its input
    unchanged (a clone, or a view to the shape the input has) and is removed before
    translation."""
    context.record(
        rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
        Level.NONE,
        f"FX node '{node.name}' ({node.target}) needs no ONNX function: it returns its input unchanged "
        "and was removed before translation.",
        properties={"fx_node": node.name, "target": str(node.target), "function": None},
    )


class WrongKindOfFunction(str):
    """An `unsupported_reason`: the operator has functions, but only real ones for a
    complex input (or the other way round). Dispatch reports it under FXE0011, as the
    former exporter did, and so does the analysis that finds it first."""


class _Call:
    """One FX node being dispatched, with what the diagnostics say about it."""

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node
        self.args = tuple(node.args)
        self.kwargs = clean_kwargs(node.kwargs)
        self.qualified_name: str | None = None
        self.overloads_tried: list[str] = []
        self.perfect = False

    @functools.cached_property
    def stack(self) -> Stack | None:
        return node_stack(self.node) or None

    @functools.cached_property
    def location(self) -> Location | None:
        return stack_location(self.stack) if self.stack else None

    @property
    def fx_target(self) -> str:
        """The node's target as torch prints it (``aten.add.Tensor``)."""
        target = self.node.target
        return str(target) if isinstance(target, torch._ops.OpOverload) else self.target_text

    @property
    def target_text(self) -> str:
        target = self.node.target
        return getattr(target, "__qualname__", None) or str(target)

    @property
    def where(self) -> str:
        """``FX node 'add_1' at model.py:12`` (the user's line when known)."""
        text = f"FX node '{self.node.name}', {self.fx_target}"
        if self.location is not None:
            text += f" at {self.location.path}:{self.location.line}"
            snippet = self.location.snippet
            if snippet:
                snippet = snippet if len(snippet) <= 60 else snippet[:57] + "..."
                text += f" ({snippet})"
        return text

    def kwargs_for(self, signature: Any) -> dict[str, Any]:
        """The keyword arguments, plus ATen schema defaults for parameters that
        ``signature`` requires and the node leaves out."""
        defaults = schema_defaults(self.node.target, signature, self.args, self.kwargs)
        return {**self.kwargs, **defaults} if defaults else self.kwargs

    def has_complex_input(self) -> bool:
        return any(is_complex_value(v) for v in _node_values(self.args + tuple(self.node.kwargs.values())))


def _dispatch_key(node: torch.fx.Node) -> Any:
    """What the choice of function for a node depends on: its target, the dtype and rank
    of its tensor arguments, the kind of its symbolic ones, the values of its constants.
    None when some argument cannot be keyed."""
    leaves, spec = pytree.tree_flatten((node.args, dict(node.kwargs)))
    parts: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.fx.Node):
            value = leaf.meta.get("val")
            if isinstance(value, torch.Tensor):
                parts.append(("tensor", value.dtype, value.dim()))
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                parts.append(("symbolic", type(value).__name__))
            else:
                return None
        elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
            parts.append((type(leaf).__name__, repr(leaf)))
        else:
            return None
    key = (node.target, str(spec), tuple(parts))
    try:
        hash(key)
    except TypeError:  # an unhashable target: not remembered
        return None
    return key


def _node_values(values: Iterable[Any]) -> Iterator[Any]:
    """``meta["val"]`` of every FX node among ``values``, looking inside lists."""
    for value in values:
        if isinstance(value, torch.fx.Node):
            yield value.meta.get("val")
        elif isinstance(value, (list, tuple)):
            yield from _node_values(value)
        elif isinstance(value, dict):
            yield from _node_values(value.values())


def _log_candidates(
    diagnostic: Diagnostic, call: _Call, results: list[tuple[RegisteredFunction, SignatureMatch]]
) -> None:
    if not diagnostic.would_log(logging.DEBUG):
        return
    with diagnostic.log_section("Candidates"):
        diagnostic.log(f"FX node `{call.node.format_node()}`")
        if call.overloads_tried:
            diagnostic.log(f"Registry keys: {', '.join(call.overloads_tried)}")
        for function, match in results:
            diagnostic.log(
                f"- `{function.name}` (custom={function.is_custom}, "
                f"complex={function.is_complex}): {match.summary()}"
            )
