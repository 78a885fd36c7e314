"""Where in the user's code an FX node comes from, read from ``node.stack_trace``."""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig

import torch.fx
from diagnostics import Location, Stack

# Packages whose frames are never the user's line: the exporter's own packages and the
# libraries it drives. They are matched by where they are installed, so a user project
# that happens to live in a folder named "torch" or "fx2onnx" is still the user's code.
_TOOL_PACKAGES = ("torch", "onnxscript", "onnx_ir", "onnx", "fx2onnx", "dispatcher", "diagnostics")
# Fallback for paths that are not absolute or not where the packages are installed now
# (e.g. a stack trace recorded on another machine).
_NOT_USER_CODE = (
    "/site-packages/torch/",
    "/dist-packages/torch/",
    "/site-packages/onnxscript/",
    "/site-packages/onnx_ir/",
    "/site-packages/onnx/",
)
_INSTALLED_PACKAGES = ("/site-packages/", "/dist-packages/")


def node_stack(node: torch.fx.Node) -> Stack:
    """The Python stack recorded for the node (innermost frame last); empty if none."""
    text = node.meta.get("stack_trace") or getattr(node, "stack_trace", None)
    return Stack.from_python_traceback(text)


def node_location(node: torch.fx.Node) -> Location | None:
    """The user's source line that created the node.

    The innermost frame outside torch and the exporter; frames of installed packages
    (e.g. transformers) are passed over when the user's own code is on the stack, and
    used otherwise (a model defined by a library is still located in that library).
    """
    return stack_location(node_stack(node))


def stack_location(stack: Stack) -> Location | None:
    """The user's frame of ``stack`` (see :func:`node_location`); None when every frame
    is in torch or the exporter."""
    own_code = _innermost(stack, _NOT_USER_CODE + _INSTALLED_PACKAGES)
    if own_code is not None:
        return own_code
    return _innermost(stack, _NOT_USER_CODE)


def _innermost(stack: Stack, exclude: tuple[str, ...]) -> Location | None:
    for frame in reversed(stack.frames):
        if not is_tool_frame(frame.path) and not _contains(frame.path, exclude):
            return frame
    return None


def is_tool_frame(path: str) -> bool:
    """Whether a frame's file belongs to torch, the exporter, or the Python standard
    library (or is a pseudo-file such as ``<frozen ...>`` or ``<eval_with_key>.3``)."""
    if not path or path.startswith("<"):
        return True
    if _contains(path, _NOT_USER_CODE):
        return True
    if not os.path.isabs(path):
        # "torch/fx/passes/x.py": relative to a sys.path entry.
        return path.replace("\\", "/").split("/", 1)[0] in _TOOL_PACKAGES
    path = os.path.normcase(os.path.normpath(path))
    if any(path.startswith(root) for root in _tool_roots()):
        return True
    stdlib = _stdlib_root()
    return path.startswith(stdlib) and not _contains(path, _INSTALLED_PACKAGES)


def _contains(path: str, parts: tuple[str, ...]) -> bool:
    # Relative paths ("torch/fx/...") and Windows separators match like absolute ones.
    normalized = "/" + path.replace("\\", "/")
    return any(part in normalized for part in parts)


@functools.cache
def _tool_roots() -> tuple[str, ...]:
    roots = []
    for name in _TOOL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.append(os.path.normcase(os.path.normpath(location)) + os.sep)
    return tuple(roots)


@functools.cache
def _stdlib_root() -> str:
    return os.path.normcase(os.path.normpath(sysconfig.get_paths()["stdlib"])) + os.sep
