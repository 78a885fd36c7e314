"""The examples in the docstrings of fx2onnx, dispatcher and diagnostics run and pass."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("diagnostics", "dispatcher", "fx2onnx")


def _modules() -> list[str]:
    names = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples(module_name: str) -> None:
    module = importlib.import_module(module_name)
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed in {module_name}"


def test_docstring_examples_exist() -> None:
    # The packages document their entry points with examples: they must be collected.
    finder = doctest.DocTestFinder()
    examples = sum(len(test.examples) for name in _modules() for test in finder.find(importlib.import_module(name)))
    assert examples >= 5
