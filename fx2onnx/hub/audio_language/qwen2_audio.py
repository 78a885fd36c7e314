"""Qwen2-Audio's audio features, which its forward computes inline (no `get_audio_features`):
the audio tower over the mel features with a bidirectional mask of the frames its
`feature_attention_mask` keeps (after the tower's stride-2 convolution), the projector, then
each clip's rows up to its length after the tower's pooling, clips in order."""

from __future__ import annotations

import torch

from fx2onnx.hub.audio_language.tower_lengths import tower_output_lengths


def audio_features(model: torch.nn.Module, audio: dict[str, torch.Tensor]) -> torch.Tensor:
    """The projected embeddings of ``audio`` (`input_features`, `feature_attention_mask`) as rows."""
    from transformers.masking_utils import create_bidirectional_mask

    inner = model.model
    features, mask = audio["input_features"], audio["feature_attention_mask"]
    conv_lengths, output_lengths = tower_output_lengths(inner.audio_tower, mask.sum(-1))
    frames = (features.shape[-1] - 2) // 2 + 1  # after the tower's stride-2 convolution
    kept = (torch.arange(frames, device=features.device)[None, :] < conv_lengths[:, None]).to(torch.long)
    placeholder = torch.zeros(features.shape[0], frames, 1, dtype=features.dtype, device=features.device)
    attention = create_bidirectional_mask(config=inner.audio_tower.config, inputs_embeds=placeholder, attention_mask=kept)
    hidden = inner.audio_tower(features, attention_mask=attention).last_hidden_state
    projected = inner.multi_modal_projector(hidden)
    valid = torch.arange(projected.shape[1], device=projected.device)[None, :] < output_lengths[:, None]
    return projected[valid]
