"""Unit tests of the FX passes on small graphs, one pass at a time, and of the private
torch operators they name."""

from __future__ import annotations

import torch
import torch.fx

from dispatcher import OnnxRegistry
from fx2onnx.private_ops import assertion_ops, missing_private_ops, torch_op, training_batch_norm_ops


def test_every_private_torch_operator_still_resolves() -> None:
    # A failure here means PyTorch renamed or removed an operator fx2onnx names:
    # update fx2onnx/private_ops.py.
    assert missing_private_ops() == []
    assert torch.ops.aten._assert_scalar.default in assertion_ops()
    assert training_batch_norm_ops()[torch.ops.aten._native_batch_norm_legit_functional.default] == 5


def test_a_missing_operator_is_none_not_an_error() -> None:
    assert torch_op("aten.no_such_operator.default") is None
    assert torch_op("no_such_namespace.op.default") is None
