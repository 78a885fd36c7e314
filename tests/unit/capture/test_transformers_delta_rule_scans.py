"""transformers' chunked gated delta rule (and Kimi's, a decay per key channel) computed, during a capture, with a symbolic number
of chunks (library_adapters.CAPTURE_REWRITES): the same outputs and final states as
transformers' at every length, a program captured from a prompt shorter than a chunk that
stays exact past it, and the chunk, a default argument no config names, among the lengths
`--verify` reads past."""

from __future__ import annotations

import importlib

import pytest
import torch

from fx2onnx.capture.library_adapters import CAPTURE_REWRITES, default_scan_chunks
from fx2onnx.capture.libraries.transformers_delta_rule_scans import (
    GATED_DELTA_RULE_FAMILIES, GATED_DELTA_RULE_FUNCTION, KIMI_DELTA_RULE_FAMILIES, KIMI_DELTA_RULE_FUNCTION,
    delta_rule_with_symbolic_chunks, kimi_rule_with_symbolic_chunks,
)
from fx2onnx.hub.decoders.model_lengths import verification_lengths

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
kimi_modeling = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
CHUNK, KEY_HEADS, VALUE_HEADS, DIM = 64, 2, 4, 8


def _inputs(length: int, seed: int, kimi: bool = False) -> tuple[torch.Tensor, ...]:
    """Gated: grouped query/key heads, a decay per head; Kimi's: as many key heads, a decay per key channel."""
    generator = torch.Generator().manual_seed(seed)
    key_heads, decay = (VALUE_HEADS, (VALUE_HEADS, DIM)) if kimi else (KEY_HEADS, (VALUE_HEADS,))
    return (torch.randn(2, length, key_heads, DIM, generator=generator), torch.randn(2, length, key_heads, DIM, generator=generator),
            torch.randn(2, length, VALUE_HEADS, DIM, generator=generator), -torch.rand(2, length, *decay, generator=generator),
            torch.rand(2, length, VALUE_HEADS, generator=generator), torch.randn(2, VALUE_HEADS, DIM, DIM, generator=generator))


class _Rule(torch.nn.Module):
    """A layer's call of the rule with its default chunk: normalized keys, a state in and out."""

    def __init__(self, rule) -> None:
        super().__init__()
        self.rule = rule

    def forward(self, query, key, value, g, beta, state):
        return self.rule(query, key, value, g=g, beta=beta, initial_state=state, output_final_state=True,
                         use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize(("function", "families"), [(GATED_DELTA_RULE_FUNCTION, GATED_DELTA_RULE_FAMILIES),
                                                     (KIMI_DELTA_RULE_FUNCTION, KIMI_DELTA_RULE_FAMILIES)])
def test_every_family_with_the_rule_has_the_rewrite(function: str, families: tuple[str, ...]) -> None:
    rewritten = {r.module for r in CAPTURE_REWRITES if r.attribute == function}
    assert rewritten == {f"transformers.models.{name}.modeling_{name}" for name in families}
    for module in rewritten:
        assert default_scan_chunks(module) == [CHUNK], module  # every family's function defaults to 64


@pytest.mark.parametrize("kimi", [False, True], ids=["gated", "kimi"])
@pytest.mark.parametrize("length", [1, 3, CHUNK // 2 + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 2])
def test_the_rule_is_the_originals_at_every_length(length: int, kimi: bool) -> None:
    inputs = _inputs(length, seed=length, kimi=kimi)
    original = kimi_modeling.chunk_kimi_delta_attention if kimi else modeling.torch_chunk_gated_delta_rule
    rewrite = kimi_rule_with_symbolic_chunks if kimi else delta_rule_with_symbolic_chunks
    (want, want_state) = _Rule(original)(*inputs)
    (got, got_state) = _Rule(rewrite(original))(*inputs)
    assert got.shape == want.shape == (2, length, VALUE_HEADS, DIM)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kimi", [False, True], ids=["gated", "kimi"])
def test_a_capture_from_less_than_a_chunk_is_exact_past_it(kimi: bool) -> None:
    """torch.export of the rewritten rule from 3 tokens keeps the number of chunks symbolic
    (the original's loop is unrolled for the example's one chunk) and runs at 1 to 3 chunks."""
    original = kimi_modeling.chunk_kimi_delta_attention if kimi else modeling.torch_chunk_gated_delta_rule
    rewrite = kimi_rule_with_symbolic_chunks if kimi else delta_rule_with_symbolic_chunks
    length = torch.export.Dim("length", min=1, max=1024)
    program = torch.export.export(_Rule(rewrite(original)), _inputs(3, seed=0, kimi=kimi), strict=False,
                                  dynamic_shapes=({1: length},) * 5 + (None,))
    for size in (1, CHUNK, CHUNK + 1, 2 * CHUNK + 2):
        inputs = _inputs(size, seed=size + 100, kimi=kimi)
        for got, want in zip(program.module()(*inputs), _Rule(original)(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", ["Qwen3NextConfig", "Qwen3_5TextConfig", "OlmoHybridConfig", "KimiLinearConfig"])
def test_verification_reads_past_the_chunk(config: str) -> None:
    lengths = verification_lengths(getattr(transformers, config)(), new_tokens=4)
    assert lengths.prompt == CHUNK + 8 and "past linear attention chunk 64" in lengths.describe()


def test_a_module_that_rewrites_nothing_names_no_chunk() -> None:
    importlib.import_module("transformers.models.llama.modeling_llama")
    assert default_scan_chunks("transformers.models.llama.modeling_llama") == []
