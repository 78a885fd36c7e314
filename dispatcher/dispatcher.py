"""``OnnxFunctionDispatcher``: the ONNX function that translates one FX node, with the
diagnostics that say why.

The decision (overload, complex or real, signature matching) is
:func:`dispatcher.decision.decide`, shared with the up-front analysis of unsupported
nodes. The dispatcher remembers decisions for calls alike and reports each node's: a
perfect match at level none (FXE0014), a nearest match and a fall back to the default
overload as warnings (FXE0014, FXE0016) naming what did not fit. When nothing can be used
it records an error diagnostic at the user's source line and raises
:class:`DispatchError`.
"""

from __future__ import annotations

import enum
import functools
import logging
import operator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from diagnostics import Diagnostic, DiagnosticContext, Level, Location, Rule, Stack, rules

from dispatcher.decision import Candidate, DispatchDecision, Refusal, decide
from dispatcher.fx_nodes import node_stack, stack_location, walk_graph_modules
from dispatcher.registry import OnnxRegistry, OnnxScriptFunction, RegisteredFunction

__all__ = ["DispatchError", "NodeRoute", "OnnxFunctionDispatcher", "is_tuple_constructor", "node_route"]


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
        # dispatch key -> the decision that chose a function (see decide)
        self._decisions: dict[Any, DispatchDecision] = {}
        self.diagnostic_context = diagnostic_context

    # -- the decision ------------------------------------------------------------------

    def decide(self, node: torch.fx.Node) -> DispatchDecision:
        """The dispatch decision for ``node``; records nothing.

        Models repeat the same call (operator, argument types and constants) layer after
        layer: a decision that chose a function is remembered for the next node of the
        same kind (the registry must not change meanwhile). A refusal is decided again:
        the user may register a function after an analysis found none.
        """
        key = _dispatch_key(node)
        remembered = self._decisions.get(key) if key is not None else None
        if remembered is not None:
            return remembered
        decision = decide(self.registry, node)
        if key is not None and decision.is_supported:
            self._decisions[key] = decision
        return decision

    # -- dispatch ----------------------------------------------------------------------

    def dispatch(self, node: torch.fx.Node) -> OnnxScriptFunction:
        """The ONNX function that translates ``node`` (a ``call_function`` node)."""
        return self.dispatch_registered(node).onnx_function

    def dispatch_registered(self, node: torch.fx.Node) -> RegisteredFunction:
        """Like :meth:`dispatch`, returning the registry entry (custom? complex?).

        Records the node's decision: FXE0016 for a fall back to the default overload,
        FXE0014 for the match; a refusal is recorded as an error and raised as a
        :class:`DispatchError`."""
        decision = self.decide(node)
        call = _Call(node, decision)
        if decision.fell_back:
            self._report_fall_back(call)
        if decision.chosen is None:
            raise self._refuse(call)
        self._report_match(call, decision.chosen)
        return decision.chosen.function

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
        """Why :meth:`dispatch` would fail for ``node`` (None when it would not): the
        reason of its decision's refusal. Records no diagnostics."""
        if node_route(node.target) is not NodeRoute.ONNX_FUNCTION:
            return None  # not the dispatcher's to judge
        return self.decide(node).reason

    # -- diagnostics -------------------------------------------------------------------

    def _report_fall_back(self, call: _Call) -> None:
        overloads = list(call.decision.overloads)
        self.diagnostic_context.record(
            rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY,
            Level.WARNING,
            f"No ONNX function is registered for the exact overload "
            f"{call.qualified_name} of {call.where}; using the functions of {', '.join(overloads)} "
            f"instead. Check that they handle this overload's arguments.",
            location=call.location,
            stack=call.stack,
            properties={"target": call.qualified_name, "used": overloads, "fx_node": call.node.name},
        )

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

    def _report_match(self, call: _Call, chosen: Candidate) -> None:
        ctx = self.diagnostic_context
        function, match = chosen.function, chosen.match
        level = Level.NONE if match.is_perfect else Level.WARNING
        if match.is_perfect and not ctx.would_record(level):
            self._record_perfect_match(call.node, function, call.qualified_name)
            return
        properties: dict[str, Any] = {
            "target": call.qualified_name,
            "fx_node": call.node.name,
            "function": function.name,
            "is_custom": function.is_custom,
            "is_complex": function.is_complex,
            "score": match.score,
        }
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
            # what did not fit, for tools reading the SARIF: argument, expected, got
            properties["mismatches"] = [
                {"argument": c.name, "kind": "attribute" if c.is_attribute else "input", "expected": c.allowed, "got": c.got}
                for c in match.mismatches
            ]
        diagnostic = ctx.record(
            rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
            level,
            message,
            location=call.location,
            stack=call.stack,
            properties=properties,
        )
        _log_candidates(diagnostic, call)

    def _refuse(self, call: _Call) -> DispatchError:
        """Record the error of a refused decision; the exception to raise."""
        decision = call.decision
        name = decision.op_name
        if decision.refusal is Refusal.UNNAMED or name is None:
            return self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"{call.target_text} cannot be exported: {decision.reason}",
                "Rewrite this call with torch operators, or keep it out of the exported "
                "forward().",
            )
        if decision.refusal is Refusal.NOT_REGISTERED:
            tried = [name] if name.is_default else [name, name.default()]
            return self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"No ONNX function is registered for {call.qualified_name} "
                f"(looked up: {', '.join(str(n) for n in tried)}), used by {call.where}.",
                f"Register one with OnnxRegistry.register_op(function, "
                f"{name.namespace!r}, {name.op_name!r}, {name.overload!r}), or "
                f"decompose the operator before export.",
            )
        if decision.refusal is Refusal.WRONG_KIND and decision.complex_input:
            return self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"{call.qualified_name} has no complex implementation, but {call.where} "
                f"takes complex tensors.",
                f"Register one with OnnxRegistry.register_op(function, {name.namespace!r}, "
                f"{name.op_name!r}, {name.overload!r}, is_complex=True); it receives "
                f"complex tensors as real tensors with a trailing dimension of 2.",
            )
        if decision.refusal is Refusal.WRONG_KIND:
            return self._fail(
                call,
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                f"{call.qualified_name} only has complex implementations, but {call.where} "
                f"takes no complex tensor.",
                f"Register a real implementation with OnnxRegistry.register_op(function, "
                f"{name.namespace!r}, {name.op_name!r}, {name.overload!r}).",
            )
        candidates = decision.candidates
        return self._fail(
            call,
            rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
            f"None of the {len(candidates)} ONNX function(s) registered for "
            f"{call.qualified_name} accepts the arguments of {call.where}: "
            + "; ".join(f"{c.function.name} {c.match.summary()}" for c in candidates)
            + ".",
            "Register a function whose signature takes these arguments with "
            "OnnxRegistry.register_op().",
        )

    def _fail(self, call: _Call, rule: Rule, message: str, advice: str) -> DispatchError:
        """Record an ERROR diagnostic and build the exception to raise."""
        diagnostic = self.diagnostic_context.record(
            rule,
            Level.ERROR,
            f"{message} {advice}",
            location=call.location,
            stack=call.stack,
            properties={"target": call.qualified_name or call.target_text, "fx_node": call.node.name},
        )
        if call.decision.candidates:
            _log_candidates(diagnostic, call)
        return DispatchError(
            f"{message}\n{advice}",
            diagnostic,
            node_target=call.node.target,
            node_name=call.node.name,
        )


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




class _Call:
    """One FX node being dispatched and its decision, with what the diagnostics say
    about them."""

    def __init__(self, node: torch.fx.Node, decision: DispatchDecision) -> None:
        self.node = node
        self.decision = decision
        self.qualified_name = decision.qualified_name

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




def _log_candidates(diagnostic: Diagnostic, call: _Call) -> None:
    if not diagnostic.would_log(logging.DEBUG):
        return
    with diagnostic.log_section("Candidates"):
        diagnostic.log(f"FX node `{call.node.format_node()}`")
        if call.decision.overloads:
            diagnostic.log(f"Registry keys: {', '.join(call.decision.overloads)}")
        for candidate in call.decision.candidates:
            function = candidate.function
            diagnostic.log(
                f"- `{function.name}` (custom={function.is_custom}, "
                f"complex={function.is_complex}): {candidate.match.summary()}"
            )
