"""DepthPro's ``len()`` of its patches, read during a capture as the tensor's first dim
(library_adapters.CAPTURE_REWRITES, transformers_query_selection.first_dim_as_is): the batch
stays symbolic, the numbers are eager PyTorch's at another batch, and the module has no
``len`` of its own after the capture."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.capture.library_adapters import rewritten_library_functions

transformers = pytest.importorskip("transformers")


def test_the_patch_counts_stay_symbolic_in_the_batch_and_the_shadow_is_removed():
    """Under the rewrite a capture of a function counting patches as DepthPro's encoder does
    keeps the batch dynamic (the builtin fixes it), and gives the eager numbers at another batch."""
    from torch.export import Dim

    from transformers.models.depth_pro import modeling_depth_pro

    class Patches(torch.nn.Module):
        def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
            scales = [modeling_depth_pro.split_to_patches(pixels, 4, 0.0), pixels.reshape(-1, 3, 4, 4)]
            counts = [modeling_depth_pro.__dict__.get("len", len)(s) for s in scales]
            return torch.split_with_sizes(torch.cat(scales), counts)

    module, pixels = Patches(), torch.randn(2, 3, 8, 8)
    with pytest.raises(Exception, match="specialized"):
        torch.export.export(module, (pixels,), dynamic_shapes=({0: Dim("batch")},), strict=False)
    with rewritten_library_functions():
        assert "len" in vars(modeling_depth_pro)
        program = torch.export.export(module, (pixels,), dynamic_shapes=({0: Dim("batch")},), strict=False)
    assert "len" not in vars(modeling_depth_pro)
    other = torch.randn(3, 3, 8, 8)
    for got, want in zip(program.module()(other), module(other)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
