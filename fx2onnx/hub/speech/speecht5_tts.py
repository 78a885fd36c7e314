"""SpeechT5's text-to-speech (`SpeechT5ForTextToSpeech`) as the three models Transformers.js's
`generate_speech` runs: the encoder (`input_ids` -> `encoder_outputs`, `encoder_attention_mask`),
a decoding step (`output_sequence`, `speaker_embeddings`, `encoder_hidden_states`,
`encoder_attention_mask`, the cache -> `output_sequence_out`, `spectrum`, `prob`, `present.*`)
and the vocoder (`spectrogram` -> `waveform`).

What Transformers.js does unlike transformers' `_generate_speech`, and so what the graphs do:
- it hands the vocoder the decoder's spectra as they come, without the model's postnet (five
  convolutions over the whole spectrogram, weights of the text-to-speech checkpoint): the
  vocoder graph runs the postnet before the HiFi-GAN checkpoint's generator;
- it stops when any value of `prob` reaches the threshold, where transformers sums each
  row's `reduction_factor` stop probabilities: `prob` is that sum (batch, 1);
- it concatenates the steps' `spectrum` on dim 0: `spectrum` is (batch x reduction_factor,
  mel bins), and the vocoder takes (frames, mel bins) and gives (1, samples), the shape its
  pipeline cuts into one waveform per row.
transformers' speech decoder prenet draws a dropout mask at every step even in eval (so its
`generate_speech` differs from run to run); the graphs are captured without it
(`without_prenet_dropout`), and compared with transformers' model without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "DecoderStep", "SpeechEncoder", "PostnetVocoder", "encoder_mask", "first_spectrum", "without_prenet_dropout",
]


@contextlib.contextmanager
def without_prenet_dropout(model: nn.Module) -> Iterator[None]:
    """``model``'s speech decoder prenet without its dropout (the instance's method replaced, restored after)."""
    prenet = model.speecht5.decoder.prenet
    prenet._consistent_dropout = lambda inputs_embeds, p: inputs_embeds
    try:
        yield
    finally:
        del prenet._consistent_dropout


def encoder_mask(input_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """The mask transformers' `generate_speech` gives the encoder without one: every token but the padding."""
    return (input_ids != pad_token_id).to(torch.int64)


class SpeechEncoder(nn.Module):
    """The text encoder, reading the mask from the ids as `generate_speech` does (Transformers.js gives it none)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = encoder_mask(input_ids, int(self.model.config.pad_token_id))
        hidden = self.model.speecht5.encoder(input_values=input_ids, attention_mask=mask).last_hidden_state
        return {"encoder_outputs": hidden, "encoder_attention_mask": mask}


class DecoderStep(nn.Module):
    """One step of `generate_speech`: the prenet over the whole output sequence, the decoder on its last frame."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, output_sequence: torch.Tensor, speaker_embeddings: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor, cache: Any = None) -> dict[str, Any]:
        config, decoder = self.model.config, self.model.speecht5.decoder
        hidden = decoder.prenet(output_sequence, speaker_embeddings)
        outputs = decoder.wrapped_decoder(
            hidden_states=hidden[:, -1:], encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, cache=cache, use_cache=True, return_dict=True,
        )
        last = outputs.last_hidden_state.squeeze(1)
        postnet = self.model.speech_decoder_postnet
        spectrum = postnet.feat_out(last).view(last.shape[0], config.reduction_factor, config.num_mel_bins)
        return {
            "output_sequence_out": torch.cat([output_sequence, spectrum[:, -1:]], dim=1),
            "spectrum": spectrum.reshape(-1, config.num_mel_bins),
            # transformers stops a row when its stop probabilities add up to the threshold
            "prob": torch.sigmoid(postnet.prob_out(last)).sum(dim=-1, keepdim=True),
            "present": outputs.cache,
        }


class PostnetVocoder(nn.Module):
    """The text-to-speech model's postnet, then the HiFi-GAN vocoder: (frames, mel bins) -> (1, samples)."""

    def __init__(self, model: nn.Module, vocoder: nn.Module) -> None:
        super().__init__()
        self.postnet = model.speech_decoder_postnet.postnet
        self.vocoder = vocoder

    def forward(self, spectrogram: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"waveform": self.vocoder(self.postnet(spectrogram.unsqueeze(0)))}


def first_spectrum(num_mel_bins: int, batch: int) -> torch.Tensor:
    """The output sequence `generate_speech` starts from: one frame of zeros."""
    return torch.zeros(batch, 1, num_mel_bins)
