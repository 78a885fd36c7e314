"""Small models for the runtimes other than onnxruntime (tests/e2e/test_other_runtimes.py)
and the node-count benchmark (bench/node_counts.py), and the checks of a lean graph.

Each builder returns the model in eval mode and its example keyword inputs, from tiny
configs with random weights (nothing downloaded). Batch norms get running statistics and
affine weights away from their defaults, so that folding them is visible in the results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch

from conftest import all_nodes

VOCAB = 100


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Batch norms with statistics and affine weights of their own (not 0 and 1)."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            for tensor, low, high in ((module.running_mean, -1, 1), (module.running_var, 0.5, 2),
                                      (module.weight, 0.5, 2), (module.bias, -1, 1)):
                tensor.data.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)
    return model.eval()


class BasicBlock(torch.nn.Module):
    """ResNet's block: two conv-bn pairs and the shortcut."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class ResNetLike(torch.nn.Module):
    """A stem conv-bn, two basic blocks, global pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.layer1 = torch.nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ConvBnSiLU(torch.nn.Module):
    """YOLO's convolution unit: conv, batch norm, SiLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c_out)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class YoloLike(torch.nn.Module):
    """Conv-bn-SiLU units, a C2f-like split and concatenation, an upsampled branch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvBnSiLU(3, 8, 2)
        self.down = ConvBnSiLU(8, 16, 2)
        self.split = ConvBnSiLU(16, 16)
        self.inner = ConvBnSiLU(8, 8)
        self.fuse = ConvBnSiLU(24, 16)
        self.head = torch.nn.Conv2d(24, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = self.stem(x)
        a, b = self.split(self.down(small)).chunk(2, 1)
        y = self.fuse(torch.cat([a, b, self.inner(b)], 1))
        up = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        return self.head(torch.cat([up, small], 1))


def cnn() -> tuple[torch.nn.Module, dict[str, Any]]:
    return _perturbed(ResNetLike()), {"x": torch.randn(2, 3, 32, 32)}


def yolo() -> tuple[torch.nn.Module, dict[str, Any]]:
    return _perturbed(YoloLike()), {"x": torch.randn(1, 3, 32, 32)}


def mlp() -> tuple[torch.nn.Module, dict[str, Any]]:
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )
    return _perturbed(model), {"input": torch.randn(3, 16)}


def bert() -> tuple[torch.nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    ids = torch.randint(0, VOCAB, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return transformers.BertModel(config).eval(), {"input_ids": ids, "attention_mask": mask}


def vit() -> tuple[torch.nn.Module, dict[str, Any]]:
    import transformers

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)
    return transformers.ViTModel(config).eval(), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _llama_model(use_cache: bool) -> torch.nn.Module:
    import transformers

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=use_cache)
    return transformers.LlamaForCausalLM(config).eval()


def llama() -> tuple[torch.nn.Module, dict[str, Any]]:
    return _llama_model(False), {"input_ids": torch.randint(0, VOCAB, (2, 8))}


class LlamaDecodeStep(torch.nn.Module):
    """One decode step of LLaMA over a cache of two layers given as tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _llama_model(True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, key_0: torch.Tensor, value_0: torch.Tensor,
                key_1: torch.Tensor, value_1: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import transformers

        past = transformers.DynamicCache(config=self.model.config)
        past.update(key_0, value_0, 0)
        past.update(key_1, value_1, 1)
        positions = (attention_mask.sum(-1, keepdim=True) - input_ids.shape[1]) + torch.arange(input_ids.shape[1])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                         past_key_values=past, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def llama_decode_step() -> tuple[torch.nn.Module, dict[str, Any]]:
    past = 5
    cache = {f"{kind}_{layer}": torch.randn(2, 2, past, 8) for layer in range(2) for kind in ("key", "value")}
    return LlamaDecodeStep(), {"input_ids": torch.randint(0, VOCAB, (2, 1)),
                               "attention_mask": torch.ones(2, past + 1, dtype=torch.int64), **cache}


ZOO: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, Any]]]] = {
    "cnn": cnn, "yolo": yolo, "mlp": mlp, "bert": bert, "vit": vit, "llama": llama, "llama_decode_step": llama_decode_step,
}


# -- the checks of a lean graph ---------------------------------------------------------------------
def node_count(model: onnx.ModelProto) -> int:
    """The nodes of the main graph and its branches (a model without functions)."""
    return sum(1 for _ in all_nodes(model))


def constant_only_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes of the main graph whose inputs are all constants (initializers, Constant
    nodes' outputs or nodes like these): each could have been computed at export."""
    constant = {tensor.name for tensor in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            constant.update(node.output)
        elif node.input and all(name == "" or name in constant for name in node.input) and not any(
            attribute.type == onnx.AttributeProto.GRAPH for attribute in node.attribute
        ):
            constant.update(node.output)
            found.append(f"{node.op_type} {node.name}")
    return found


def batch_norms_after_layers(model: onnx.ModelProto) -> int:
    """BatchNormalization nodes fed by a Conv, ConvTranspose or Gemm of the main graph."""
    producers = {output: node.op_type for node in model.graph.node for output in node.output}
    return sum(node.op_type == "BatchNormalization" and producers.get(node.input[0]) in ("Conv", "ConvTranspose", "Gemm")
               for node in model.graph.node)
