"""The dispatch decision: which registered ONNX function translates one FX node, or why none.

:func:`decide` is the one place that decides. It

1. names the target (``aten::add.Tensor``) and takes the functions registered for the
   exact overload, else for the default overload (``fell_back``);
2. keeps the complex implementations when an argument is a complex tensor, the real
   ones otherwise;
3. matches each candidate's signature against the node's arguments (see
   :mod:`dispatcher._matching`), the user's functions first and the latest registration
   first: the first perfect match wins, otherwise the best-scoring candidate (ties go to
   the priority order).

The result, a :class:`DispatchDecision`, is either a choice or a :class:`Refusal` with its
reason. It records nothing: the dispatcher reports it (FXE0014, FXE0016, FXE0011) and the
up-front analysis lists the refused nodes (FXE0012), both from the same decision.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch.fx

from dispatcher._matching import SignatureMatch, clean_kwargs, match_signature, optional_parameters, schema_defaults
from dispatcher._names import OpName, op_name_of
from dispatcher._types import is_complex_value
from dispatcher.fx_nodes import node_values
from dispatcher.registry import OnnxRegistry, RegisteredFunction

__all__ = ["Candidate", "DispatchDecision", "Refusal", "decide", "node_arguments"]


class Refusal(enum.Enum):
    """Why no registered ONNX function can translate a node."""

    UNNAMED = "unnamed"  # the target is not an operator with a qualified name
    NOT_REGISTERED = "not_registered"  # no function for the overload nor its default
    WRONG_KIND = "wrong_kind"  # functions exist, but only complex (or only real) ones
    NO_SIGNATURE_FITS = "no_signature_fits"  # no function's signature binds the arguments


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One registered function and how its signature fits the node's arguments."""

    function: RegisteredFunction
    match: SignatureMatch


@dataclasses.dataclass(frozen=True)
class DispatchDecision:
    """The function chosen for a node, or the refusal and its reason.

    ``candidates`` are the functions matched, in priority order, up to the first perfect
    match; ``overloads`` the registry keys whose functions were considered.
    """

    op_name: OpName | None
    overloads: tuple[str, ...] = ()
    complex_input: bool = False
    candidates: tuple[Candidate, ...] = ()
    chosen: Candidate | None = None
    refusal: Refusal | None = None
    reason: str | None = None

    @property
    def qualified_name(self) -> str | None:
        return self.op_name.qualified_name() if self.op_name is not None else None

    @property
    def fell_back(self) -> bool:
        """The exact overload has no function: those of the default overload are used."""
        return bool(self.overloads) and self.overloads[0] != self.qualified_name

    @property
    def is_perfect(self) -> bool:
        return self.chosen is not None and self.chosen.match.is_perfect

    @property
    def is_supported(self) -> bool:
        return self.chosen is not None


def node_arguments(node: torch.fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The node's positional arguments and the keyword arguments that carry data for ONNX."""
    return tuple(node.args), clean_kwargs(node.kwargs)


def kwargs_for(node: torch.fx.Node, signature: Any) -> dict[str, Any]:
    """The node's keyword arguments, plus ATen schema defaults for parameters that
    ``signature`` requires and the node leaves out."""
    args, kwargs = node_arguments(node)
    defaults = schema_defaults(node.target, signature, args, kwargs)
    return {**kwargs, **defaults} if defaults else kwargs


def decide(registry: OnnxRegistry, node: torch.fx.Node) -> DispatchDecision:
    """The dispatch decision for a ``call_function`` node (see the module doc)."""
    try:
        name = op_name_of(node.target)
    except ValueError as exc:
        return DispatchDecision(None, refusal=Refusal.UNNAMED, reason=str(exc))
    keys = tuple(registry.candidate_names(node.target))
    if not keys:
        return DispatchDecision(name, refusal=Refusal.NOT_REGISTERED, reason=f"no ONNX function is registered for {name}")
    is_complex = any(is_complex_value(v) for v in node_values((*node.args, *node.kwargs.values())))
    functions = [f for key in keys for f in registry.get_functions(key) or () if f.is_complex == is_complex]
    if not functions:
        kind = "complex" if is_complex else "real"
        return DispatchDecision(
            name, keys, is_complex, refusal=Refusal.WRONG_KIND, reason=f"{', '.join(keys)} has no {kind} implementation"
        )
    # Priority: the user's functions first, then the latest registered first.
    ordered = [f for f in reversed(functions) if f.is_custom] + [f for f in reversed(functions) if not f.is_custom]
    args = tuple(node.args)
    candidates: list[Candidate] = []
    for function in ordered:
        signature = function.onnx_function.op_signature
        match = match_signature(signature, args, kwargs_for(node, signature), optional=optional_parameters(function.onnx_function))
        candidates.append(Candidate(function, match))
        if match.is_perfect:
            return DispatchDecision(name, keys, is_complex, tuple(candidates), chosen=candidates[-1])
    scored = [c for c in candidates if c.match.is_candidate]
    if not scored:
        return DispatchDecision(
            name, keys, is_complex, tuple(candidates), refusal=Refusal.NO_SIGNATURE_FITS,
            reason=f"no function registered for {', '.join(keys)} takes these arguments",
        )
    # max() keeps the first of equal scores: the priority order breaks ties.
    return DispatchDecision(name, keys, is_complex, tuple(candidates), chosen=max(scored, key=lambda c: c.match.score))
