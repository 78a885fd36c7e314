"""``aten::scaled_dot_product_attention`` written out in standard operators
(dispatcher/functions/dot_product_attention.py): every kind of mask, a boolean mask with
rows that hold no key (PyTorch gives 0 there), grouped-query heads and the causal flag,
compared with PyTorch in onnxruntime at two sizes of dynamic dims; no ``IsNaN`` in the
graph (onnxruntime-web's WebGPU has no kernel for it)."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import fx2onnx
from conftest import all_nodes, make_options

_MASKS = ("bool", "float", "none", "causal", "gqa")


class _Attention(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        if self.kind == "bool":
            return F.scaled_dot_product_attention(query, key, value, attn_mask=held)
        if self.kind == "float":
            return F.scaled_dot_product_attention(query, key, value, attn_mask=torch.where(held, 0.0, -1e4))
        if self.kind == "causal":
            return F.scaled_dot_product_attention(query, key, value, is_causal=True)
        if self.kind == "gqa":  # one key/value head for the two query heads
            return F.scaled_dot_product_attention(query, key[:, :1], value[:, :1], enable_gqa=True, scale=0.3)
        return F.scaled_dot_product_attention(query, key, value)


def _inputs(batch: int, length: int, total: int) -> tuple[torch.Tensor, ...]:
    query, key, value = torch.randn(batch, 2, length, 8), torch.randn(batch, 2, total, 8), torch.randn(batch, 2, total, 8)
    held = torch.rand(batch, 1, length, total) > 0.4
    held[0, 0, 1] = False  # a query that sees no key
    held[-1, 0, -1] = False
    held[-1, 0, 0] = True
    return query, key, value, held


@pytest.mark.parametrize("target", ["onnxruntime", "portable"])
@pytest.mark.parametrize("kind", _MASKS)
def test_attention_matches_pytorch_on_every_mask(kind: str, target: str, tmp_path) -> None:
    model = _Attention(kind).eval()
    length, total = Dim("length", min=2), Dim("total", min=2)
    if kind == "causal":  # causal over as many keys as queries
        total = length
    dims = {"query": {0: Dim("batch"), 2: length}, "key": {0: Dim("batch"), 2: total},
            "value": {0: Dim("batch"), 2: total}, "held": {0: Dim("batch"), 2: length, 3: total}}
    first = _inputs(2, 3, 3 if kind == "causal" else 5)
    options = make_options(tmp_path, dynamic_shapes=dims, **({"target": "portable"} if target == "portable" else {}))
    program = fx2onnx.dynamo_export(model, *first, export_options=options)
    onnx.checker.check_model(program.model_proto, full_check=True)
    assert "IsNaN" not in {node.op_type for node in all_nodes(program.model_proto)}
    for inputs in (first, _inputs(3, 4, 4 if kind == "causal" else 7)):
        got = torch.as_tensor(program(*inputs))
        with torch.no_grad():
            want = model(*inputs)
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
        if kind == "bool":  # the rows with no key: 0, as in PyTorch
            assert torch.equal(got[0, :, 1], torch.zeros_like(got[0, :, 1]))
