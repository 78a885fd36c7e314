"""Mamba's and Falcon-Mamba's mixers read, during a capture, the padding mask's positions of
their own tokens (library_adapters.CAPTURE_REWRITES): a decoder with a cache is given the
mask of the past tokens too."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.capture.libraries.transformers_recurrent_masks import mask_of_the_new_tokens

modeling_falcon_mamba = pytest.importorskip("transformers.models.falcon_mamba.modeling_falcon_mamba")


def test_the_mask_of_the_new_tokens_is_the_originals_mask() -> None:
    original = modeling_falcon_mamba.apply_mask_to_padding_states
    rewritten = mask_of_the_new_tokens(original)
    hidden = torch.randn(2, 3, 8)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    # the prompt's mask, as long as its tokens: the original's result
    torch.testing.assert_close(rewritten(hidden, mask), original(hidden, mask))
    # past tokens' positions before them (left padding among them): the new tokens' positions only
    with_past = torch.cat([torch.tensor([[0, 0], [1, 1]]), mask], dim=1)
    torch.testing.assert_close(rewritten(hidden, with_past), original(hidden, mask))
    assert rewritten(hidden, None) is hidden
