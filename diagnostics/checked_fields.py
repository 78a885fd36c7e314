"""Option dataclasses checked where they are given: each field against its type hint.

One place checks every option of the public API (`ExportOptions`, `ModuleFunctionOptions`,
`DiagnosticOptions`, and the arguments of `dynamo_export` that take them): a value whose
type is not in the field's type hint is a TypeError, a value outside what the field's
metadata accepts (`one_of`, `at_least`) a ValueError, and both messages name the option,
the value given and what is accepted, when the object is made or a field is set. A
misspelt option then fails at the line that gave it, not deep in an export (`"no"` is not
read as True, a dict is not taken for an options object).

    @dataclasses.dataclass
    class Options(CheckedFields):
        runtime: str = dataclasses.field(default="a", metadata=one_of("a", "b"))
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

_ONE_OF = "checked_fields.one_of"
_AT_LEAST = "checked_fields.at_least"
_ACCEPTS = "checked_fields.accepts"  # a text that says what is accepted, for the message


def one_of(*values: Any, accepts: str | None = None) -> dict[str, Any]:
    """Field metadata: only these values are accepted."""
    return {_ONE_OF: values, **({_ACCEPTS: accepts} if accepts else {})}


def at_least(minimum: float, accepts: str | None = None) -> dict[str, Any]:
    """Field metadata: numbers from ``minimum`` on are accepted."""
    return {_AT_LEAST: minimum, **({_ACCEPTS: accepts} if accepts else {})}


def described(accepts: str) -> dict[str, Any]:
    """Field metadata: what the message says is accepted (instead of the type hint)."""
    return {_ACCEPTS: accepts}


class CheckedFields:
    """Base of an option dataclass whose fields are checked against their type hints and
    metadata when it is made and whenever a field is set."""

    def __post_init__(self) -> None:
        # a frozen dataclass's __init__ sets its fields without __setattr__
        if type(self).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            for field in dataclasses.fields(self):  # type: ignore[arg-type]
                _check_field(self, field.name, getattr(self, field.name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _hints(type(self)):
            _check_field(self, name, value)
        super().__setattr__(name, value)


def check_argument(owner: str, name: str, value: Any, hint: Any) -> None:
    """Check an argument of a function (``owner``) as a field of that type is checked."""
    _check(f"{owner}({name}={_short_repr(value)})", name, value, hint, {})


def _check_field(instance: CheckedFields, name: str, value: Any) -> None:
    cls = type(instance)
    field = {f.name: f for f in dataclasses.fields(cls)}[name]  # type: ignore[arg-type]
    _check(f"{cls.__name__}({name}={_short_repr(value)})", name, value, _hints(cls)[name], field.metadata)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    names = {field.name for field in dataclasses.fields(cls)}
    return {name: hint for name, hint in typing.get_type_hints(cls).items() if name in names}


def _check(given: str, name: str, value: Any, hint: Any, metadata: Mapping[str, Any]) -> None:
    accepts = metadata.get(_ACCEPTS) or _describe(hint)
    if not _fits(value, hint):
        raise TypeError(f"{given}: {name} takes {accepts}; got {_what(value)}.{_hint_for(value, hint)}")
    choices = metadata.get(_ONE_OF)
    if choices is not None and value not in choices:
        raise ValueError(f"{given}: {name} takes {metadata.get(_ACCEPTS) or _alternatives([repr(c) for c in choices])}; got {value!r}.")
    minimum = metadata.get(_AT_LEAST)
    if minimum is not None and isinstance(value, (int, float)) and not value >= minimum:
        raise ValueError(f"{given}: {name} takes {accepts} of at least {minimum}; got {value!r}.")


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if origin is tuple:
        items = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(items) == 2 and items[1] is Ellipsis:
            return all(_fits(item, items[0]) for item in value)
        return len(items) == len(value) and all(_fits(v, h) for v, h in zip(value, items))
    if origin is not None:  # other generics (dict[str, int]): their container type
        return isinstance(value, origin)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # True is an int to Python, not an opset or a level
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    return _alternatives(_described_options(hint))


def _described_options(hint: Any) -> list[str]:
    if hint is Any:
        return ["anything"]
    if hint is None or hint is type(None):
        return ["None"]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [text for option in typing.get_args(hint) for text in _described_options(option)]
        # None last: "True, False or None"
        return [o for o in options if o != "None"] + [o for o in options if o == "None"]
    if origin is tuple:
        items = typing.get_args(hint)
        if len(items) == 2 and items[1] is Ellipsis:
            return [f"a tuple of {_alternatives(_described_options(items[0]), plural=True)}"]
        return ["a tuple"]
    if origin is not None:
        return [_article(origin.__name__)]
    if hint is bool:
        return ["True", "False"]
    if hint is float:
        return ["a number"]
    if hint is type:
        return ["a class"]
    if hint is os.PathLike:
        return ["a path"]
    return [_article(hint.__name__)]


def _alternatives(options: list[str], plural: bool = False) -> str:
    if plural:  # "a tuple of str or class": the items without articles
        options = [o.split(" ", 1)[1] if o.startswith(("a ", "an ")) else o for o in options]
    if len(options) == 1:
        return options[0]
    last = ", or " if any(" or " in option or " of " in option for option in options) else " or "  # "a tuple of str, or None"
    return ", ".join(options[:-1]) + last + options[-1]


def _article(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _what(value: Any) -> str:
    return f"{_article(type(value).__name__)} {_short_repr(value)}" if value is not None else "None"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hint_for(value: Any, hint: Any) -> str:
    """What to write instead, for the usual mistakes."""
    classes = [option for option in _plain_types(hint) if dataclasses.is_dataclass(option)]
    if isinstance(value, Mapping) and classes:
        return f" Give {classes[0].__name__}(**{{...}}) for a dict of its fields."
    if isinstance(value, str) and any(typing.get_origin(option) is tuple for option in _plain_types(hint)):
        return f" A tuple of one item is written ({value!r},)."
    return ""


def _plain_types(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [t for option in typing.get_args(hint) for t in _plain_types(option)]
    return [hint]


__all__ = ["CheckedFields", "at_least", "check_argument", "described", "one_of"]
