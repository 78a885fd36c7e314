"""Which runtimes a written model is for: the operators of onnxruntime's own domain.

A folder written for onnxruntime (``--runtime onnxruntime``, the default) may hold
onnxruntime's kernels (domain ``com.microsoft``: ``GroupQueryAttention``,
``MatMulNBits``...). Other runtimes implement some of them their own way or not at all:
OpenVINO 2026.4 loads the default causal-LM folder and runs it, but fails on a batch of
two prompts and has been seen returning empty logits. A model that uses none of them is
for any ONNX runtime (``--runtime standard``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import onnx

ONNXRUNTIME_DOMAIN = "com.microsoft"


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from _nodes(subgraph)


def onnxruntime_only_operators(model_path: str | os.PathLike) -> list[str]:
    """The operators of onnxruntime's own domain that the ONNX file ``model_path`` uses
    (in its graph, branches and functions), sorted; empty when it is for any runtime."""
    model = onnx.load(os.fspath(model_path), load_external_data=False)
    nodes = [*_nodes(model.graph)] + [node for function in model.functions for node in function.node]
    return sorted({node.op_type for node in nodes if node.domain == ONNXRUNTIME_DOMAIN})
