"""Control flow: torch's higher-order operators as ONNX If, Loop and Scan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx

if TYPE_CHECKING:
    from fx2onnx.interpreter import FxOnnxInterpreter


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why ``node`` (a higher-order operator call) cannot be translated, or None."""
    return f"the higher-order operator {_name(node.target)} has no ONNX translation"


def translate_higher_order(interpreter: "FxOnnxInterpreter", node: torch.fx.Node) -> Any:
    raise NotImplementedError(unsupported_reason(node))


def _name(target: Any) -> str:
    name = getattr(target, "name", None)
    return name() if callable(name) else str(target)
