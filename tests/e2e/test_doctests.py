"""The examples in the docstrings of fx2onnx, dispatcher and diagnostics run and pass.

Only the modules whose source holds an example (a `>>>` line) are collected: a module
without one would pass by construction and count as a test."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

PACKAGES = ("diagnostics", "dispatcher", "fx2onnx")


def _all_modules() -> list[str]:
    names = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def _has_example(module_name: str) -> bool:
    """Whether the module's source has a `>>>` line (read, not imported: collection stays cheap)."""
    origin = importlib.util.find_spec(module_name).origin
    return origin is not None and any(line.lstrip().startswith(">>>") for line in Path(origin).read_text(encoding="utf-8").splitlines())


MODULES_WITH_EXAMPLES = [name for name in _all_modules() if _has_example(name)]


@pytest.mark.parametrize("module_name", MODULES_WITH_EXAMPLES)
def test_docstring_examples(module_name: str) -> None:
    module = importlib.import_module(module_name)
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    # a `>>>` line doctest does not collect (outside a docstring, say) would be an example that never runs
    assert results.attempted > 0, f"{module_name} has a `>>>` line but doctest finds no example in it"
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed in {module_name}"


def test_the_entry_points_have_examples() -> None:
    # The packages document their entry points with examples: each package's own.
    assert set(PACKAGES) <= set(MODULES_WITH_EXAMPLES), sorted(set(PACKAGES) - set(MODULES_WITH_EXAMPLES))
