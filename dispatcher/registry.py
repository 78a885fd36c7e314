"""``OnnxRegistry``: which ONNX functions implement which PyTorch operator.

It starts with torchlib's functions (the ATen library that ships with onnxscript), then
fx2onnx's complex implementations of operators torchlib has none for
(:mod:`dispatcher.functions.complex`), and takes user registrations on top. Every function is stored under the qualified name of
the operator overload it implements, in registration order, so torchlib's come first
and the user's after them; the dispatcher tries them newest first, so user functions win.

>>> registry = OnnxRegistry()
>>> registry.is_registered_op("aten", "add", "Tensor")
True
>>> [f.onnx_function.name for f in registry.get_op_functions("aten", "add", "Tensor")]
['aten_add', 'aten_add_complex']
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

import torch
from onnxscript import values as onnxscript_values

from dispatcher._matching import DROPPED_KWARGS
from dispatcher._names import OpName, op_name_of
from dispatcher.function_table import TableEntry

__all__ = ["OnnxRegistry", "RegisteredFunction", "OnnxScriptFunction"]

OnnxScriptFunction = Union[onnxscript_values.OnnxFunction, onnxscript_values.TracedOnnxFunction]
_FUNCTION_TYPES = (onnxscript_values.OnnxFunction, onnxscript_values.TracedOnnxFunction)

# The opset torchlib's functions are written against.
_TORCHLIB_OPSET_VERSION = 18


@dataclasses.dataclass(frozen=True)
class RegisteredFunction:
    """One ONNX Script function registered for an operator overload.

    ``function`` is the ONNX Script function, or (for fx2onnx's own tables) a maker of
    it, called on first use: see :mod:`dispatcher.function_table`.
    """

    function: OnnxScriptFunction | Callable[[], OnnxScriptFunction]
    qualified_name: str
    is_custom: bool = False
    is_complex: bool = False

    @functools.cached_property
    def onnx_function(self) -> OnnxScriptFunction:
        function = self.function
        return function if isinstance(function, _FUNCTION_TYPES) else function()

    @property
    def name(self) -> str:
        return self.onnx_function.name

    @property
    def domain(self) -> str:
        """The function's ONNX domain (``pkg.onnxscript.torch_lib`` for torchlib)."""
        opset = getattr(self.onnx_function, "opset", None)
        return getattr(opset, "domain", "") or ""

    def __str__(self) -> str:
        flags = [f"custom={self.is_custom}", f"complex={self.is_complex}"]
        return f"{self.name}[{self.qualified_name}; {', '.join(flags)}]"


@functools.cache
def _torchlib_functions() -> tuple[tuple[str, RegisteredFunction], ...]:
    """torchlib's functions as (registry key, function), loaded once per process."""
    entries = []
    for qualified_name, overloads in _torchlib_registry().items():
        if qualified_name.startswith("internal::"):
            continue
        key = OpName.parse(qualified_name).qualified_name()
        for function in overloads.overloads:
            entries.append((key, RegisteredFunction(function, key, is_custom=False, is_complex=False)))
        for function in overloads.complex:
            entries.append((key, RegisteredFunction(function, key, is_custom=False, is_complex=True)))
    return tuple(entries)


def _torchlib_registry() -> Any:
    """torchlib's own registry (qualified name -> its `overloads` and `complex` functions).

    Read directly rather than through `torch_2_5.get_torchlib_ops()`, which builds the IR
    of every traced function (parsing its source, ~2 s) only to report its domain; a
    function's signature is built when the dispatcher first matches it.
    """
    # Imported here: loading torchlib registers ~550 functions, which only the first
    # registry of the process should pay.
    from onnxscript.function_libs.torch_lib import ops, registration

    del ops  # imported for its registrations
    return registration.default_registry


def _defaults_of(entries: Sequence[TableEntry], *, is_complex: bool) -> tuple[tuple[str, RegisteredFunction], ...]:
    """Default registrations of one table of fx2onnx's own functions, by qualified name."""
    return tuple(
        (key, RegisteredFunction(function, key, is_custom=False, is_complex=is_complex))
        for names, function in entries
        for key in (OpName.parse(name).qualified_name() for name in names)
    )


# fx2onnx's own function tables (module, attribute, whether the functions are complex),
# added after torchlib's in this order; each module is imported when the table is built.
OWN_FUNCTION_TABLES: tuple[tuple[str, str, bool], ...] = (
    ("dispatcher.functions.complex", "COMPLEX_FUNCTIONS", True),  # complex operators torchlib lacks
    ("dispatcher.functions.nan", "NAN_FUNCTIONS", False),  # reductions propagating NaN
    ("dispatcher.functions.symbolic", "SYMBOLIC_FUNCTIONS", False),  # symbolic sizes
    ("dispatcher.functions.padding", "PADDING_FUNCTIONS", False),  # pad in every mode
    ("dispatcher.functions.layout", "LAYOUT_FUNCTIONS", False),  # aliases, permuted empty
    ("dispatcher.functions.average_pool", "AVERAGE_POOL_FUNCTIONS", False),  # divisor_override
    ("dispatcher.functions.convolution", "CONVOLUTION_FUNCTIONS", False),  # bias-free convolutions
    ("dispatcher.functions.loss", "LOSS_FUNCTIONS", False),  # probability targets
    ("dispatcher.functions.logical_reduction", "LOGICAL_REDUCTION_FUNCTIONS", False),  # all/any of 0-d
    ("dispatcher.functions.reduction", "REDUCTION_FUNCTIONS", False),  # prod, nanmedian, segment_reduce
    ("dispatcher.functions.indexing", "INDEXING_FUNCTIONS", False),  # masked_select, searchsorted, index_reduce
    ("dispatcher.functions.conjugate", "CONJUGATE_FUNCTIONS", False),  # real _conj_physical
    ("dispatcher.functions.distance", "DISTANCE_FUNCTIONS", False),  # cdist
    ("dispatcher.functions.pooling", "POOLING_FUNCTIONS", False),  # adaptive max and average pooling
    ("dispatcher.functions.polynomial", "POLYNOMIAL_FUNCTIONS", False),  # orthogonal polynomials
    ("dispatcher.functions.elementwise", "ELEMENTWISE_FUNCTIONS", False),  # prims fmax, hypot, frexp...
    ("dispatcher.functions.order", "ORDER_FUNCTIONS", False),  # cummax/cummin, kthvalue, mode
    ("dispatcher.functions.linalg", "LINALG_FUNCTIONS", False),  # factorizations and solves
    ("dispatcher.functions.special", "SPECIAL_FUNCTIONS", False),  # gamma, Bessel, erf family
    ("dispatcher.functions.vision", "VISION_FUNCTIONS", False),  # torchvision's roi_pool, ps_roi_align
    ("dispatcher.functions.dot_product_attention", "DOT_PRODUCT_ATTENTION_FUNCTIONS", False),  # no IsNaN
    ("dispatcher.functions.fused", "FUSED_FUNCTIONS", False),  # kernels chosen by fx_passes/fused_kernels
    ("dispatcher.functions.quantized", "QUANTIZED_FUNCTIONS", False),  # torchao's dequantization, MatMulNBits
)


@functools.cache
def _own_functions() -> tuple[tuple[str, RegisteredFunction], ...]:
    """Default registrations of every table in :data:`OWN_FUNCTION_TABLES`, in order."""
    import importlib

    defaults: list[tuple[str, RegisteredFunction]] = []
    for module_name, attribute, is_complex in OWN_FUNCTION_TABLES:
        entries = getattr(importlib.import_module(module_name), attribute)
        defaults.extend(_defaults_of(entries, is_complex=is_complex))
    return tuple(defaults)


@functools.cache
def _torchlib_opset_version() -> int:
    try:
        from onnxscript._framework_apis import torch_2_6

        return int(torch_2_6.torchlib_opset_version())
    except (ImportError, AttributeError):
        return _TORCHLIB_OPSET_VERSION


def _takes_schema(function: RegisteredFunction, schema: torch.FunctionSchema) -> bool:
    """Whether the function's signature can bind every argument the torch schema
    requires (positional ones by position, keyword-only ones by name)."""
    signature = function.onnx_function.op_signature
    if signature is None:
        return False
    variadic = any(getattr(p, "variadic", False) for p in signature.params)
    required = [a for a in schema.arguments if not a.has_default_value()]
    positional = [a for a in required if not a.kwarg_only]
    if len(positional) > len(signature.params) and not variadic:
        return False
    return all(
        a.name in signature.params_map or a.name in DROPPED_KWARGS
        for a in required
        if a.kwarg_only
    )


class OnnxRegistry:
    """ONNX functions per operator overload: torchlib's defaults plus user registrations.

    Cheap to create: torchlib is loaded once per process, and each registry copies the
    table only when first used.
    """

    def __init__(self) -> None:
        self._table: dict[str, list[RegisteredFunction]] | None = None
        self._custom: list[tuple[str, RegisteredFunction]] = []

    # -- storage ---------------------------------------------------------------------

    @property
    def _registry(self) -> dict[str, list[RegisteredFunction]]:
        """The table itself: qualified name -> functions in registration order.

        Tests may edit it (pop an entry, filter a list) to simulate a smaller library.
        """
        if self._table is None:
            table: dict[str, list[RegisteredFunction]] = {}
            for key, function in _torchlib_functions():
                table.setdefault(key, []).append(function)
            for key, function in _own_functions():
                table.setdefault(key, []).append(function)
            self._table = table
        return self._table

    @property
    def opset_version(self) -> int:
        """The default ONNX opset version of the functions in this registry (18)."""
        return _torchlib_opset_version()

    # -- registration ----------------------------------------------------------------

    def register_op(
        self,
        function: OnnxScriptFunction,
        namespace: str,
        op_name: str,
        overload: str | None = None,
        is_complex: bool = False,
    ) -> RegisteredFunction:
        """Register an ONNX Script function for ``namespace::op_name.overload``.

        ``function`` is an ``onnxscript.OnnxFunction`` (``@onnxscript.script()``) or a
        ``TracedOnnxFunction``. It is tried before every function registered earlier for
        the same overload, torchlib's included. ``is_complex=True`` marks an
        implementation for complex inputs (given as real tensors with a trailing dim 2).
        """
        if not isinstance(function, _FUNCTION_TYPES):
            raise TypeError(
                f"register_op() needs an ONNX Script function (decorated with "
                f"@onnxscript.script() or an onnxscript.values.TracedOnnxFunction), got "
                f"{type(function).__module__}.{type(function).__qualname__}: {function!r}. "
                f"Wrap a plain Python function with onnxscript.values.TracedOnnxFunction("
                f"opset, fn) or decorate it with @onnxscript.script()."
            )
        key = OpName.from_parts(namespace, op_name, overload).qualified_name()
        registered = RegisteredFunction(function, key, is_custom=True, is_complex=is_complex)
        self._registry.setdefault(key, []).append(registered)
        self._custom.append((key, registered))
        return registered

    def remove_op(
        self,
        namespace: str,
        op_name: str,
        overload: str | None = None,
        *,
        is_complex: bool | None = None,
    ) -> list[RegisteredFunction]:
        """Remove the functions of one overload (only the complex or real ones when
        ``is_complex`` is given) and return them."""
        key = OpName.from_parts(namespace, op_name, overload).qualified_name()
        functions = self._registry.get(key, [])
        removed = [f for f in functions if is_complex is None or f.is_complex == is_complex]
        kept = [f for f in functions if f not in removed]
        if kept:
            self._registry[key] = kept
        else:
            self._registry.pop(key, None)
        return removed

    # -- queries ---------------------------------------------------------------------

    def get_op_functions(
        self, namespace: str, op_name: str, overload: str | None = None
    ) -> list[RegisteredFunction] | None:
        """The functions registered for the overload, in registration order, or None."""
        key = OpName.from_parts(namespace, op_name, overload).qualified_name()
        return self.get_functions(key)

    def get_functions(self, qualified_name: str) -> list[RegisteredFunction] | None:
        """Like :meth:`get_op_functions`, by qualified name (``aten::add.Tensor``)."""
        functions = self._registry.get(OpName.parse(qualified_name).qualified_name())
        return list(functions) if functions else None

    def is_registered_op(self, namespace: str, op_name: str, overload: str | None = None) -> bool:
        """Whether any function is registered for exactly this overload."""
        return self.get_op_functions(namespace, op_name, overload) is not None

    def all_registered_ops(self) -> set[str]:
        """Qualified names of every overload that has a function (``aten::add.Tensor``)."""
        return {key for key, functions in self._registry.items() if functions}

    def _all_registered_ops(self) -> set[str]:  # the legacy spelling
        return self.all_registered_ops()

    def is_supported(self, target: Any) -> bool:
        """Whether an FX call_function target (OpOverload, packet, builtin) has a
        function for its exact overload, or for its default overload when one of those
        functions can take the exact overload's arguments (``aten::squeeze.dims`` does
        not fit ``aten::squeeze``'s one-input function, so it is not supported)."""
        keys = self.candidate_names(target)
        if not keys:
            return False
        if not isinstance(target, torch._ops.OpOverload):
            return True
        if keys[0] == op_name_of(target).qualified_name():
            return True
        return any(_takes_schema(f, target._schema) for f in self._registry[keys[0]])

    def candidate_names(self, target: Any) -> list[str]:
        """The registered qualified names whose functions may translate ``target``.

        The exact overload when it is registered; else the default overload; else, for
        an overload packet (``aten.sym_size``), every registered overload of the packet.
        Empty when nothing is registered (or the target cannot be named).
        """
        try:
            name = op_name_of(target)
        except ValueError:
            return []
        for candidate in (name, name.default()):
            key = candidate.qualified_name()
            if self._registry.get(key):
                return [key]
        if isinstance(target, torch._ops.OpOverloadPacket):
            keys = (
                OpName.from_parts(name.namespace, name.op_name, overload).qualified_name()
                for overload in target.overloads()
            )
            return [key for key in keys if self._registry.get(key)]
        return []

    def custom_functions(self) -> Iterator[tuple[str, RegisteredFunction]]:
        """The user's registrations, in registration order."""
        return iter(list(self._custom))

    def __repr__(self) -> str:
        loaded = "not loaded" if self._table is None else f"{len(self._table)} operators"
        return f"{type(self).__name__}(opset_version={self.opset_version}, {loaded}, custom={len(self._custom)})"
