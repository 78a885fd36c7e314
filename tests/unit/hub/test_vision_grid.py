"""The layouts Qwen's vision towers take (and LFM3-VL's convolution taps), computed from the patch grid with tensor
operations (hub/vision_language/vision_grid.py), equal transformers' own for grids of every shape:
square and not, windows that tile the grid and that do not, one frame and two, one image and
several of different grids."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.hub.vision_language import vision_grid
vision_utils = pytest.importorskip("transformers.vision_utils")

GRIDS = [(1, 2, 2), (1, 4, 4), (1, 6, 10), (1, 10, 4), (1, 14, 22), (1, 16, 8), (2, 6, 10),
         ((1, 6, 10), (1, 10, 4)), ((1, 4, 4), (2, 6, 10), (1, 14, 22))]  # several images in one run


def grid_and_count(grid) -> tuple[torch.Tensor, int]:
    """``image_grid_thw`` of one grid or of several, and the patch count."""
    grid_thw = torch.tensor(grid if isinstance(grid[0], tuple) else [grid])
    return grid_thw, int(grid_thw.prod(-1).sum())


def segments(bounds: torch.Tensor, count: int) -> torch.Tensor:
    """Each position's segment under cumulative ``bounds``, as the packed attention reads them."""
    return (torch.arange(count)[:, None] >= bounds[None, 1:]).sum(-1)


@pytest.mark.parametrize("grid", GRIDS)
def test_positions_and_frames_equal_transformers(grid):
    grid_thw, count = grid_and_count(grid)
    patches = torch.arange(count)
    assert torch.equal(vision_grid.position_ids(grid_thw, patches, 2), vision_utils.get_vision_position_ids(grid_thw, 2))
    bounds = vision_grid.frame_bounds(grid_thw, patches)
    assert bounds.dtype == torch.int32 and len(bounds) == count + 1 and (bounds[0], bounds[-1]) == (0, count)
    assert torch.equal(segments(bounds, count), segments(vision_utils.get_vision_cu_seqlens(grid_thw), count))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("window_size", [28, 56, 112])  # windows of 1, 2 and 4 merged tokens (patches of 14)
def test_windows_equal_transformers(grid, window_size):
    grid_thw, count = grid_and_count(grid)
    expected_order, expected_bounds = vision_utils.get_vision_window_index(grid_thw, 2, window_size, 14)
    order, bounds = vision_grid.window_layout(grid_thw, torch.arange(count), 2, window_size // 2 // 14)
    assert torch.equal(order, expected_order)
    assert len(bounds) == count // 4 + 1 and bounds.dtype == expected_bounds.dtype
    assert torch.equal(segments(bounds, count), segments(expected_bounds, count))


@pytest.mark.parametrize("grid", GRIDS)
def test_position_embedding_taps_equal_transformers(grid):
    grid_thw, count = grid_and_count(grid)
    expected = vision_utils.get_vision_interpolation_indices_and_weights(
        grid_thw, num_grid_per_side=7, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    indices, weights = vision_grid.interpolation_taps(grid_thw, torch.arange(count), 2, 7)
    assert torch.equal(indices, expected[0]) and torch.equal(weights, expected[1])


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("kernel", [3, 5])
def test_convolution_taps_give_lfm3_vl_convolution(grid, kernel):
    """LFM3-VL's gated depthwise convolution over each frame's grid, as the sum of each patch's taps
    (`neighbour_patches`, zeros past a frame's edge), equals transformers' (each frame reshaped to its grid)."""
    from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionConfig, Lfm3VlVisionShortConv

    from fx2onnx.hub.vision_language.lfm3_vl import short_conv

    grid_thw, count = grid_and_count(grid)
    torch.manual_seed(0)
    conv = Lfm3VlVisionShortConv(Lfm3VlVisionConfig(hidden_size=8, conv_kernel_size=kernel, spatial_merge_size=2), 0)
    hidden = torch.randn(count, 8)
    taps = vision_grid.neighbour_patches(grid_thw, torch.arange(count), 2, kernel)
    assert taps.shape == (count, kernel * kernel) and int(taps.max()) <= count
    with torch.no_grad():
        torch.testing.assert_close(short_conv(conv, hidden, taps), conv(hidden, grid_thw.tolist()), rtol=1e-5, atol=1e-6)
