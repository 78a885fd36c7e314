"""The layouts Qwen's vision towers take for a run of images (and LFM3-VL's, with its
convolutions' taps), computed from their patch grids (`image_grid_thw` [images, 3]) with
tensor operations only, so that one exported vision model serves images of every size, one
or several at a time.

transformers computes these layouts (transformers.vision_utils) with Python loops over
`grid_thw.tolist()`, which a capture would freeze to one grid. Here the grid's numbers stay
tensors and the patch count is `pixel_values`' first dim: each patch's layout is arithmetic
on its index within its image. The patches come in the image processor's order: image by
image; frames, then blocks of `merge` x `merge` patches in rows, then the patches of a block
in rows.

Segment bounds (`cu_seqlens`) are given as the attention takes them, cumulative and
starting at 0, padded at the end with the patch count: a padded bound closes an empty
segment, so the attention's segments are transformers' own while the tensor's length
depends only on the patch count (not on the grid's numbers).
"""

from __future__ import annotations

import torch

# `cu_seqlens`' dtype, as transformers makes it
_BOUNDS = torch.int32


def _per_image(grid_thw: torch.Tensor, indices: torch.Tensor, unit: int = 1) -> tuple[torch.Tensor, ...]:
    """For each of ``indices`` (``arange(count)`` over the patches, or over the merged tokens
    with ``unit`` patches each): its image, its index within that image, and the image's
    grid height and width (in patches)."""
    sizes = grid_thw.prod(-1) // unit
    ends = torch.cumsum(sizes, 0)
    image = (indices[:, None] >= ends[None, :]).sum(-1)
    return image, indices - (ends - sizes)[image], grid_thw[image, 1], grid_thw[image, 2]


def patch_rows_and_columns(grid_thw: torch.Tensor, patches: torch.Tensor, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's row and column in its frame; ``patches``: the patch indices (``arange(count)``)."""
    _, local, height, width = _per_image(grid_thw, patches)
    within = local % (height * width)
    blocks_per_row = width // merge
    block = within // (merge * merge)
    row = (block // blocks_per_row) * merge + (within // merge) % merge
    column = (block % blocks_per_row) * merge + within % merge
    return row, column


def position_ids(grid_thw: torch.Tensor, patches: torch.Tensor, merge: int) -> torch.Tensor:
    """The rotary positions ([patches, 2]: row, column) of transformers' `get_vision_position_ids`."""
    return torch.stack(patch_rows_and_columns(grid_thw, patches, merge), dim=-1)


def _bounds(starts: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Cumulative bounds over ``indices`` (``arange(count)``) from the segment starts after the
    first, ``count`` where no segment starts: sorted, after 0, and closed by ``count``."""
    count = indices[-1:] + 1  # as a tensor: the count is a dim of the input
    starts = torch.where(starts < 0, count, starts)
    return torch.cat([torch.zeros_like(count), torch.sort(starts).values, count]).to(_BOUNDS)


def frame_bounds(grid_thw: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """`cu_seqlens` of full attention: each frame (height x width patches) of each image a segment."""
    _, local, height, width = _per_image(grid_thw, patches)
    # a frame starts at every multiple of its size within its image, after the first patch
    starts = (local % (height * width) == 0)[1:]
    return _bounds(torch.where(starts, patches[1:], -1), patches)


def window_layout(grid_thw: torch.Tensor, patches: torch.Tensor, merge: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's windowed attention as transformers' `get_vision_window_index` lays it out:
    the merged tokens' order (window by window, rows within a window) and the windows'
    `cu_seqlens` in patches. ``window``: the window's side in merged tokens."""
    unit = merge * merge
    tokens = patches[: patches.shape[0] // unit]  # the merged tokens' indices
    image, local, height, width = _per_image(grid_thw, tokens, unit)
    rows, columns = height // merge, width // merge
    frame = local // (rows * columns)
    within = local % (rows * columns)
    row, column = within // columns, within % columns
    # transformers pads each frame's grid to whole windows (a whole window more when it fits);
    # an image's windows are numbered after those of the images before it
    windows_down, windows_across = rows // window + 1, columns // window + 1
    per_image = grid_thw[:, 0] * (grid_thw[:, 1] // merge // window + 1) * (grid_thw[:, 2] // merge // window + 1)
    first_window = (torch.cumsum(per_image, 0) - per_image)[image]
    window_id = first_window + (frame * windows_down + row // window) * windows_across + column // window
    order = torch.argsort(window_id * (window * window) + (row % window) * window + column % window)
    ordered = window_id[order]
    starts = torch.where(ordered[1:] != ordered[:-1], tokens[1:], -1)
    return order, _bounds(starts, tokens) * unit


def interpolation_taps(
    grid_thw: torch.Tensor, patches: torch.Tensor, merge: int, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL's position embeddings resampled to the grid: for each patch the 4 rows of the
    ``side`` x ``side`` table and their weights (bilinear, corners aligned, edges clamped),
    as transformers' `get_vision_interpolation_indices_and_weights` gives them."""
    _, _, height, width = _per_image(grid_thw, patches)
    row, column = patch_rows_and_columns(grid_thw, patches, merge)

    def taps(index: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        source = index.to(torch.float32) * (side - 1) / torch.clamp(size - 1, min=1)
        floor = torch.floor(source)
        offsets = torch.arange(0, 2, device=index.device)
        taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
        weights = (1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
        return taps, weights

    row_taps, row_weights = taps(row, height)
    column_taps, column_weights = taps(column, width)
    indices = (row_taps[:, :, None] * side + column_taps[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * column_weights[:, None, :]).reshape(-1, 4)
    return indices, weights


def neighbour_patches(grid_thw: torch.Tensor, patches: torch.Tensor, merge: int, kernel: int) -> torch.Tensor:
    """For each patch the indices of the ``kernel`` x ``kernel`` patches around it in its frame
    ([patches, kernel x kernel], the kernel's taps in rows, as a 2-D convolution with `kernel // 2`
    zero padding reads them), the patch count where a tap falls outside the frame."""
    _, local, height, width = _per_image(grid_thw, patches)
    within = local % (height * width)
    row, column = patch_rows_and_columns(grid_thw, patches, merge)
    offsets = torch.arange(kernel, device=patches.device) - kernel // 2
    rows = (row[:, None] + offsets)[:, :, None]  # [patches, kernel, 1]
    columns = (column[:, None] + offsets)[:, None, :]  # [patches, 1, kernel]
    inside = (rows >= 0) & (rows < height[:, None, None]) & (columns >= 0) & (columns < width[:, None, None])
    rows, columns = rows.clamp(min=0), columns.clamp(min=0)
    # a patch's place in its frame, blocks of merge x merge in rows, the patches of a block in rows
    block = (rows // merge) * (width // merge)[:, None, None] + columns // merge
    index = (patches - within)[:, None, None] + block * (merge * merge) + (rows % merge) * merge + columns % merge
    return torch.where(inside, index, patches.shape[0]).reshape(patches.shape[0], kernel * kernel)
