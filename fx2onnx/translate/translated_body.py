"""What `FxOnnxInterpreter.translate` takes and gives: how the placeholders of a
GraphModule are bound, and the translated graph body.

A placeholder is bound to one of:
- `BodyInput`: a new input of the body graph (the default for unbound placeholders);
- `BodyInitializer`: a weight of the body graph;
- anything else (an `ir.Value` of an enclosing graph, a Python constant, None): used
  as it is. An ONNX subgraph (If branch, Loop body) reads outer values by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from fx2onnx.translate.fake_metadata import OnnxTypeInfo
from fx2onnx.translate.graph_builder import GraphBuilder


class _Failed:
    """Marks the result of a node whose translation failed (or that was skipped because
    it was reported before), so its users are skipped instead of reporting again."""

    def __repr__(self) -> str:
        return "<failed>"


FAILED = _Failed()


@dataclasses.dataclass(frozen=True)
class BodyInput:
    """Bind a placeholder to a new graph input named ``name`` (the placeholder's name by
    default), typed by ``info`` (the placeholder's FakeTensor metadata by default)."""

    name: str | None = None
    info: OnnxTypeInfo | None = None


@dataclasses.dataclass(frozen=True)
class BodyInitializer:
    """Bind a placeholder to an initializer named ``name`` holding ``tensor``."""

    name: str
    tensor: torch.Tensor


@dataclasses.dataclass
class TranslatedBody:
    """The result of translating one GraphModule into one graph body.

    ``outputs`` are the output node's leaves, flattened: an `ir.Value`, a Python constant,
    or `FAILED`; ``output_metas`` their FX metadata (sizes go back to users as ints).
    The outputs are not yet the graph's outputs: the caller decides (see
    `GraphBuilder.set_outputs`).
    """

    builder: GraphBuilder
    outputs: list[Any]
    output_metas: list[Any]
    env: Mapping[torch.fx.Node, Any]

    @property
    def failed(self) -> bool:
        """True when a node of the body failed or was skipped (reported already)."""
        return any(value is FAILED for value in self.env.values())
