"""Mamba (v1) selective scans (Zamba's one a head) computed, during a capture, as a scan over a symbolic length
from the cache's state (library_adapters.CAPTURE_REWRITES): transformers' one-token update
when started from a state, several tokens after a cache equal to as many one-token steps,
and an ONNX model (one flat graph) exported from 3 tokens with the same outputs and final
states as transformers' loop at every length."""

from __future__ import annotations

import copy
import importlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import fx2onnx
from conftest import make_options
from fx2onnx.capture.library_adapters import CAPTURE_REWRITES, rewritten_library_functions
from fx2onnx.capture.libraries.transformers_selective_scans import (
    SELECTIVE_SCAN_FUNCTION, SELECTIVE_SCAN_MIXERS, scan_over_symbolic_length, selective_scan,
)

transformers = pytest.importorskip("transformers")
modeling_mamba = importlib.import_module("transformers.models.mamba.modeling_mamba")
CHANNELS, STATE = 6, 4
LENGTHS = (1, 2, 7, 33)


def _scan_inputs(length: int, seed: int) -> tuple[torch.Tensor, ...]:
    """hidden states, time steps (batch, channels, length), B, C (batch, state, length) and a gate, batch 2."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(2, CHANNELS, length, generator=generator), torch.randn(2, CHANNELS, length, generator=generator),
            torch.randn(2, STATE, length, generator=generator), torch.randn(2, STATE, length, generator=generator),
            torch.randn(2, CHANNELS, length, generator=generator))


class _Scan(torch.nn.Module):
    """A mixer's call of the scan: its decay, skip weights and time-step bias."""

    def __init__(self, scan) -> None:
        super().__init__()
        self.scan = scan
        self.A = torch.nn.Parameter(-torch.linspace(0.5, 2.0, CHANNELS * STATE).reshape(CHANNELS, STATE))
        self.D = torch.nn.Parameter(torch.linspace(0.1, 1.0, CHANNELS))
        self.dt_bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, CHANNELS))

    def forward(self, x, dt, B, C, z):
        return self.scan(x, dt, self.A, B, C, D=self.D, z=z, delta_bias=self.dt_bias, delta_softplus=True,
                         return_last_state=True)


def test_every_family_has_the_scan_and_mixer_rewrites() -> None:
    for name, mixer in SELECTIVE_SCAN_MIXERS.items():
        module = f"transformers.models.{name}.modeling_{name}"
        rewritten = {r.attribute for r in CAPTURE_REWRITES if r.module == module}
        assert {SELECTIVE_SCAN_FUNCTION, f"{mixer}.forward"} <= rewritten
        loaded = importlib.import_module(module)  # both exist in this transformers
        assert callable(getattr(loaded, SELECTIVE_SCAN_FUNCTION)) and callable(getattr(loaded, mixer).forward)


def test_from_a_state_each_token_is_the_one_token_update() -> None:
    """transformers' full-sequence scan ignores any state; its one-token update reads it."""
    scan = _Scan(selective_scan)
    x, dt, B, C, z = _scan_inputs(3, seed=5)
    start = torch.randn(2, CHANNELS, STATE, generator=torch.Generator().manual_seed(6))
    got, got_state = selective_scan(x, dt, scan.A, B, C, scan.D, z, scan.dt_bias, True, True, start)
    state = start.clone()
    for token in range(3):
        want = modeling_mamba.mamba_selective_state_update(
            state, x[..., token], dt[..., token], scan.A, B[..., token], C[..., token], scan.D, z=z[..., token],
            dt_bias=scan.dt_bias, dt_softplus=True)  # updates `state` in place
        torch.testing.assert_close(got[..., token], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_state, state, rtol=1e-5, atol=1e-6)


# tiny causal LMs whose Mamba layers scan with one state (Mamba) or one state a head (Zamba: two heads,
# after a Mamba layer two hybrid ones, which share their attention block)
_CACHED_LMS = {
    "mamba": lambda: transformers.MambaForCausalLM(transformers.MambaConfig(
        hidden_size=16, num_hidden_layers=2, state_size=STATE, expand=2, conv_kernel=4, time_step_rank=4,
        vocab_size=50)),
    "zamba": lambda: transformers.ZambaForCausalLM(transformers.ZambaConfig(
        hidden_size=16, num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "hybrid"], num_attention_heads=2,
        num_key_value_heads=2, attention_hidden_size=32, attention_head_dim=16, intermediate_size=32,
        mamba_d_state=STATE, mamba_dt_rank=4, n_mamba_heads=2, mamba_expand=2, vocab_size=50)),
}


@pytest.mark.parametrize("family", sorted(_CACHED_LMS))
def test_tokens_after_a_cache_are_as_many_one_token_steps(family: str) -> None:
    """The mixer hands its cache's recurrent state to the scan (each head its own, Zamba's):
    3 tokens read at once after a prompt give transformers' logits and states of 3 one-token
    steps, where its own scan, starting from zeros, leaves other states."""
    torch.manual_seed(0)
    model = _CACHED_LMS[family]().eval()
    with torch.no_grad():  # short time steps: the state decays slowly, so the prompt's state still counts
        for name, parameter in model.named_parameters():
            if "dt_proj" in name and name.endswith("bias"):
                parameter.fill_(-2.0)
    mixer = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"),
                    SELECTIVE_SCAN_MIXERS[family])
    prompt, more = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 3))
    own_forward = mixer.forward
    with torch.no_grad():
        cache = model(prompt, use_cache=True).cache
        stepped, unrewritten = copy.deepcopy(cache), copy.deepcopy(cache)
        want = torch.cat([model(more[:, i:i + 1], cache=stepped, use_cache=True).logits for i in range(3)], dim=1)
        with rewritten_library_functions():
            got = model(more, cache=cache, use_cache=True).logits
        model(more, cache=unrewritten, use_cache=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the states are small (Zamba's about 1e-8): compared relative to their size
    assert not torch.allclose(unrewritten.get_recurrent_state(0), stepped.get_recurrent_state(0), rtol=1e-2, atol=0)
    for layer in range(model.config.num_hidden_layers):
        want_state = stepped.get_recurrent_state(layer)
        torch.testing.assert_close(cache.get_recurrent_state(layer), want_state, rtol=1e-5,
                                   atol=1e-5 * float(want_state.abs().max()))
    assert mixer.forward is own_forward  # transformers' own again after the block


def test_a_flat_onnx_model_from_3_tokens_is_the_originals_at_every_length(tmp_path) -> None:
    """Exported with module functions off from 3 tokens: transformers' outputs and final
    states at 1, 2, 7 and 33 tokens (its loop, run for each length)."""
    model = _Scan(scan_over_symbolic_length(modeling_mamba.mamba_selective_scan))
    length = torch.export.Dim("length", min=1, max=1024)
    options = make_options(tmp_path, module_functions=False,
                           dynamic_shapes=tuple({2: length} for _ in range(5)))
    program = fx2onnx.dynamo_export(model, *_scan_inputs(3, seed=0), export_options=options)
    path = tmp_path / "scan.onnx"
    program.save(path)
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path)).graph
    assert "Scan" in {node.op_type for node in graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = _Scan(modeling_mamba.mamba_selective_scan)
    for size in LENGTHS:
        inputs = _scan_inputs(size, seed=size + 100)
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
        outputs, expected = session.run(None, feeds), reference(*inputs)
        assert len(outputs) == len(expected) == 2 and outputs[0].shape == (2, CHANNELS, size)
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)
