"""The client releases the end-to-end tests run exported folders in, in one place.

The suite pins Transformers.js so that a release cannot turn main red;
`FX2ONNX_TRANSFORMERS_JS_VERSION` runs the same tests on another release (bench/compat.py
sets it to the newest the npm registry serves)."""

from __future__ import annotations

import os
from pathlib import Path

PINNED_TRANSFORMERS_JS = "4.3.2"
TRANSFORMERS_JS_VERSION = os.environ.get("FX2ONNX_TRANSFORMERS_JS_VERSION", PINNED_TRANSFORMERS_JS)


def npm_cache() -> Path:
    """Where the tests install npm packages (FX2ONNX_TEST_CACHE, default ~/.cache/fx2onnx-tests)."""
    return Path(os.environ.get("FX2ONNX_TEST_CACHE", Path.home() / ".cache" / "fx2onnx-tests"))


def transformers_js_folder() -> Path:
    """The npm prefix Transformers.js ``TRANSFORMERS_JS_VERSION`` is installed into."""
    return npm_cache() / f"transformers-js-{TRANSFORMERS_JS_VERSION}"
