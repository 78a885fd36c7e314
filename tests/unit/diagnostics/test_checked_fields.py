"""diagnostics.checked_fields: option dataclasses checked against their type hints."""

from __future__ import annotations

import dataclasses
import re

import pytest

from diagnostics.checked_fields import CheckedFields, at_least, check_argument, one_of


@dataclasses.dataclass
class Mutable(CheckedFields):
    flag: bool = False
    count: int = dataclasses.field(default=1, metadata=at_least(1))
    mode: str = dataclasses.field(default="a", metadata=one_of("a", "b"))
    names: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Frozen(CheckedFields):
    ratio: float = 0.5
    inner: Mutable | None = None


def test_fields_are_checked_at_construction_and_when_set():
    with pytest.raises(TypeError, match=re.escape("Mutable(flag=1): flag takes True or False; got an int 1.")):
        Mutable(flag=1)
    with pytest.raises(TypeError, match=re.escape("Mutable(count=True): count takes an int; got a bool True.")):
        Mutable(count=True)
    with pytest.raises(ValueError, match=re.escape("Mutable(count=0): count takes an int of at least 1; got 0.")):
        Mutable(count=0)
    with pytest.raises(ValueError, match=re.escape("Mutable(mode='c'): mode takes 'a' or 'b'; got 'c'.")):
        Mutable(mode="c")
    options = Mutable(names=("x",))
    with pytest.raises(TypeError, match=re.escape("names takes a tuple of str, or None; got a list ['x'].")):
        options.names = ["x"]
    assert options.names == ("x",)


def test_frozen_dataclasses_are_checked_at_construction():
    assert Frozen(ratio=1).ratio == 1
    with pytest.raises(TypeError, match=re.escape("Frozen(ratio='1'): ratio takes a number; got a str '1'.")):
        Frozen(ratio="1")
    with pytest.raises(TypeError, match=re.escape("got a dict {'flag': True}. Give Mutable(**{...}) for a dict of its fields.")):
        Frozen(inner={"flag": True})


def test_arguments_are_checked_like_fields():
    check_argument("run", "options", None, Mutable | None)
    with pytest.raises(TypeError, match=re.escape("run(options=3): options takes a Mutable or None; got an int 3.")):
        check_argument("run", "options", 3, Mutable | None)
