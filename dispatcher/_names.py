"""Qualified operator names: ``namespace::op_name[.overload]``.

The registry keys every ONNX function by the qualified name of the PyTorch operator it
implements. The default overload is written without a suffix (``aten::relu``, the form
``OpOverload.name()`` and torchlib use), so ``aten::relu`` and ``aten::relu.default``
name the same key.

>>> import torch, operator
>>> qualified_name_of(torch.ops.aten.add.Tensor)
'aten::add.Tensor'
>>> qualified_name_of(operator.add)
'_operator::add'
"""

from __future__ import annotations

import dataclasses
import math
import operator
import types
from typing import Any

import torch

DEFAULT_OVERLOAD = "default"

# Modules whose builtin functions appear as call_function targets on SymInt/SymFloat
# values (``s0 + 1`` is ``operator.add``, ``math.ceil(s0 / 2)`` is ``math.ceil``).
_BUILTIN_MODULES = frozenset({operator.__name__, "_operator", math.__name__, "builtins"})


@dataclasses.dataclass(frozen=True, order=True)
class OpName:
    """The parts of a qualified operator name, with the overload normalised.

    ``overload`` is ``"default"`` for the default overload, never None or "".
    """

    namespace: str
    op_name: str
    overload: str = DEFAULT_OVERLOAD

    @classmethod
    def from_parts(cls, namespace: str, op_name: str, overload: str | None = None) -> OpName:
        if not namespace or not op_name:
            raise ValueError(
                f"An operator name needs a namespace and a name, got "
                f"namespace={namespace!r}, op_name={op_name!r}."
            )
        if "::" in namespace or "::" in op_name:
            raise ValueError(
                f"Pass the namespace and the operator name separately, got "
                f"namespace={namespace!r}, op_name={op_name!r}."
            )
        return cls(namespace, op_name, overload or DEFAULT_OVERLOAD)

    @classmethod
    def parse(cls, qualified_name: str) -> OpName:
        """Parse ``"aten::add.Tensor"``, ``"aten::relu"`` or ``"aten::relu.default"``."""
        namespace, sep, rest = qualified_name.partition("::")
        if not sep:
            raise ValueError(
                f"{qualified_name!r} is not a qualified operator name; expected "
                f"'namespace::name[.overload]', e.g. 'aten::add.Tensor'."
            )
        op_name, _, overload = rest.partition(".")
        return cls.from_parts(namespace, op_name, overload)

    @property
    def is_default(self) -> bool:
        return self.overload == DEFAULT_OVERLOAD

    def default(self) -> OpName:
        """The same operator's default overload."""
        return OpName(self.namespace, self.op_name)

    def qualified_name(self) -> str:
        """``aten::add.Tensor``; the default overload has no suffix: ``aten::relu``."""
        if self.is_default:
            return f"{self.namespace}::{self.op_name}"
        return f"{self.namespace}::{self.op_name}.{self.overload}"

    def __str__(self) -> str:
        return self.qualified_name()


def normalize_qualified_name(qualified_name: str) -> str:
    """``aten::relu.default`` -> ``aten::relu``; other names are returned unchanged."""
    return OpName.parse(qualified_name).qualified_name()


def op_name_of(target: Any) -> OpName:
    """The :class:`OpName` of an FX ``call_function`` target (see :func:`qualified_name_of`)."""
    if isinstance(target, torch._ops.OpOverload):
        return OpName.from_parts(
            target.namespace, target._opname, target._overloadname
        )
    if isinstance(target, torch._ops.OpOverloadPacket):
        # The packet stands for its default overload (``aten.sym_size`` -> aten::sym_size).
        namespace, _, op_name = target._qualified_op_name.partition("::")
        return OpName.from_parts(namespace, op_name)
    if isinstance(target, torch._ops.HigherOrderOperator):
        # torch.cond, while_loop...: named so that they can be registered and reported.
        return OpName.from_parts(target.namespace, target.name())
    if isinstance(target, types.BuiltinFunctionType) and target.__module__ in _BUILTIN_MODULES:
        return OpName.from_parts(target.__module__, target.__name__)
    if (
        isinstance(target, types.FunctionType)
        and (target.__module__ or "").split(".")[0] == "torch"
        and target.__name__.lstrip("_").startswith("sym_")
    ):
        # torch.sym_max, torch.sym_float, torch._sym_sqrt...: symbolic-size helpers.
        return OpName.from_parts("torch", target.__name__)
    raise ValueError(
        f"Cannot name the call_function target {_describe(target)}: only torch operator "
        f"overloads (torch.ops.aten.add.Tensor), overload packets, higher-order operators "
        f"and builtin functions on symbolic sizes (operator.add, math.ceil) have a "
        f"qualified name that ONNX functions can be registered under."
    )


def qualified_name_of(target: Any) -> str:
    """The registry key of an FX ``call_function`` target.

    * ``OpOverload`` -> ``aten::add.Tensor`` (default overload: ``aten::relu``)
    * ``OpOverloadPacket`` -> its default overload (``aten.sym_size`` -> ``aten::sym_size``)
    * builtins on SymInts -> ``_operator::add``, ``math::ceil``
    * higher-order operators -> ``higher_order::cond``

    Raises ValueError (naming the target) for anything else, e.g. a lambda.
    """
    return op_name_of(target).qualified_name()


def _describe(target: Any) -> str:
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    module = getattr(target, "__module__", None)
    if name and module:
        return f"{module}.{name} ({type(target).__name__})"
    return f"{target!r} ({type(target).__name__})"
