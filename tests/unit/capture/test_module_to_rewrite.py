"""``module.to(...)`` in forward (Switch Transformers' router casts its classifier to the
model's dtype at every call): torch swaps each parameter even for itself, which a capture's
parameters refuse. During a capture a call that changes nothing returns the module as it is."""

from __future__ import annotations

import warnings

import torch

from conftest import make_options
from fx2onnx.capture.library_adapters import rewritten_library_functions


class Router(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(4, 3)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(torch.float32)
        self.classifier.to("cpu", non_blocking=True)
        return self.classifier(hidden).softmax(-1)


def test_a_router_that_casts_its_layer_in_forward_captures_without_strict_mode(export_and_compare, tmp_path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_and_compare(Router().eval(), (torch.randn(2, 5, 4),), options=make_options(tmp_path, dynamic_shapes=True),
                           second_inputs=((torch.randn(3, 7, 4),), {}))
    said = [str(w.message) for w in caught]
    assert not [text for text in said if "FXE0017" in text or "Couldn't swap" in text], said


def test_only_a_call_that_changes_nothing_is_skipped() -> None:
    module = torch.nn.Linear(4, 3)
    weight = module.weight
    with rewritten_library_functions():
        assert module.to(torch.float32) is module and module.weight is weight
        assert module.to(dtype=torch.float32, device="cpu") is module
        doubled = module.to(torch.float64)  # a real change: torch's own conversion
        assert doubled.weight.dtype == torch.float64
        buffers = torch.nn.BatchNorm1d(3).to(torch.float16)  # its integer counter keeps its dtype
        assert buffers.to(torch.float16) is buffers and buffers.num_batches_tracked.dtype == torch.int64
    assert torch.nn.Module.to.__qualname__ == "Module.to"  # undone after the capture
