"""Batch norm as PyTorch's CPU kernel computes it, for `node_decompositions.decompose_nodes`.

`native_batch_norm` and `_native_batch_norm_legit` return (output, saved mean, saved
inverse std): batch statistics in training mode, empty tensors in evaluation mode.
PyTorch's own decompositions of these overloads also write the new running statistics
into their inputs with `copy_`, a mutation torch.export did not record (the program has
no output for it) and an ONNX graph cannot perform; the decomposition here leaves the
running statistics as they are and stays functional.
"""

from __future__ import annotations

import operator

import torch
import torch.fx


def batch_norm_with_saved_statistics(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dims = [0, *range(2, input.dim())]
    channel = [1, -1] + [1] * (input.dim() - 2)
    if training or running_mean is None or running_var is None:
        mean = input.mean(dims)
        invstd = torch.rsqrt(input.var(dims, correction=0) + eps)
        saved_mean, saved_invstd = mean, invstd
    else:
        mean, invstd = running_mean, torch.rsqrt(running_var + eps)
        saved_mean = saved_invstd = input.new_zeros((0,))  # PyTorch saves nothing in evaluation
    output = (input - mean.reshape(channel)) * invstd.reshape(channel)
    if weight is not None:
        output = output * weight.reshape(channel)
    if bias is not None:
        output = output + bias.reshape(channel)
    return output, saved_mean, saved_invstd


def uses_saved_statistics(node: torch.fx.Node) -> bool:
    """Whether a batch norm node's saved mean or inverse std (outputs 1 and 2) is read."""
    return any(
        user.op == "call_function" and user.target is operator.getitem and user.args[1] in (1, 2)
        for user in node.users
    )
