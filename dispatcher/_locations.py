"""Where in the user's code an FX node comes from, read from ``node.stack_trace``."""

from __future__ import annotations

import torch.fx
from diagnostics import Location, Stack

# Frames in these are never the user's line: the exporter's own packages and the
# libraries it drives.
_NOT_USER_CODE = (
    "/torch/",
    "/fx2onnx/",
    "/dispatcher/",
    "/diagnostics/",
    "/onnxscript/",
    "/onnx_ir/",
    "<frozen ",
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
        # Relative paths ("torch/fx/...") and Windows separators match like absolute ones.
        path = "/" + frame.path.replace("\\", "/")
        if not any(part in path for part in exclude):
            return frame
    return None
