"""The built-in example: a small transformer exported, verified in onnxruntime, saved."""

from __future__ import annotations

import torch


class DemoTransformer(torch.nn.Module):
    """A tiny language model: embedding, two encoder layers, and a vocabulary head."""

    def __init__(self, vocab_size: int = 100, d_model: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embedding(input_ids))))


def demo_model_and_inputs(seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    model = DemoTransformer().eval()
    input_ids = torch.randint(0, 100, (2, 16))
    return model, (input_ids,)
