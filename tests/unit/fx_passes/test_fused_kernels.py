"""Fused kernels chosen on the FX graph: scaled-dot-product attention as one ONNX
`Attention` from opset 23, equal to PyTorch; the cases it does not cover stay unfused
with a note saying why."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import onnx.inliner
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

import fx2onnx
from conftest import ATOL, RTOL, all_nodes, check_saved_model, export_and_compare_impl, export_program, inlined, make_options
from diagnostics import rules


class Attention(torch.nn.Module):
    """SDPA in one of the forms models write it."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        form = self.form
        if form == "repeat_kv":  # transformers' repeat_kv: each key/value head for 2 query heads
            b, h, length, d = k.shape
            k = k[:, :, None].expand(b, h, 2, length, d).reshape(b, 2 * h, length, d)
            v = v[:, :, None].expand(b, h, 2, length, d).reshape(b, 2 * h, length, d)
        if form in ("plain", "repeat_kv"):
            return F.scaled_dot_product_attention(q, k, v)
        if form == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if form == "bool_mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if form == "float_mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(mask, 0.0, -1e4))
        if form == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3)
        raise AssertionError(form)


def _inputs(form: str, dtype: torch.dtype = torch.float32, queries: int = 5, keys: int = 7) -> tuple[torch.Tensor, ...]:
    kv_heads = 2 if form in ("repeat_kv", "enable_gqa") else 4
    q = torch.randn(2, 4, queries, 16, dtype=dtype)
    k, v = torch.randn(2, kv_heads, keys, 16, dtype=dtype), torch.randn(2, kv_heads, keys, 16, dtype=dtype)
    mask = torch.rand(2, 1, queries, keys) > 0.3
    mask[..., 0] = True  # no row fully masked
    return q, k, v, mask


def _counts(program) -> collections.Counter:
    """The nodes onnxruntime runs (function calls inlined: the same counts in both modes)."""
    return collections.Counter(node.op_type for node in all_nodes(inlined(program.model_proto)))


FORMS = ["plain", "causal", "bool_mask", "float_mask", "repeat_kv", "enable_gqa"]


# float16 results against eager float16 PyTorch: the two round in different places and
# differ by one float16 ulp (2^-10 = 9.8e-4 relative) where measured; rtol = atol = 1e-3
# admits one ulp at any magnitude, and a wrong kernel is off by far more.
FLOAT16_TOLERANCE = dict(rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("form", FORMS)
def test_attention_is_one_kernel_from_opset_23(tmp_path, form, module_functions):
    dynamic = {"q": {2: torch.export.Dim("queries")}, "k": {2: torch.export.Dim("keys")},
               "v": {2: torch.export.Dim("keys")}, "mask": {2: torch.export.Dim("queries"), 3: torch.export.Dim("keys")}}
    if form == "causal":
        dynamic = None
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic, module_functions=module_functions)
    other_size = None if dynamic is None else (_inputs(form, queries=3, keys=11), {})
    program = export_and_compare_impl(Attention(form), _inputs(form), options=options, tmp_path=tmp_path, second_inputs=other_size)
    counts = _counts(program)
    assert counts["Attention"] == 1
    # no unfused attention left: no Softmax, and the key/value heads are not copied
    assert not {"Softmax", "Expand", "MatMul"} & set(counts)


def test_attention_in_float16(tmp_path):
    options = make_options(tmp_path, opset_version=23)
    # FLOAT16_TOLERANCE: outputs up to 1.95 differ from eager float16 PyTorch by 9.8e-4, one
    # ulp (eager float16 itself is off float64 by 5.6e-4)
    program = export_and_compare_impl(Attention("repeat_kv"), _inputs("repeat_kv", torch.float16), options=options,
                                      tmp_path=tmp_path, **FLOAT16_TOLERANCE)
    assert _counts(program)["Attention"] == 1


def _notes(program) -> list[str]:
    return [d.message or "" for d in program.diagnostic_context.diagnostics
            if d.rule is rules.FX_PASS and d.level.name == "NOTE" and "unfused" in (d.message or "")]


def test_before_opset_23_attention_stays_unfused_and_a_note_names_the_opset(tmp_path):
    options = make_options(tmp_path, opset_version=21)
    program = export_and_compare_impl(Attention("bool_mask"), _inputs("bool_mask"), options=options, tmp_path=tmp_path)
    assert "Attention" not in _counts(program)
    (note,) = _notes(program)
    assert "opset_version=23" in note
    # at the default opset, nothing is said: the default is not a choice to explain
    program = export_and_compare_impl(Attention("bool_mask"), _inputs("bool_mask"), tmp_path=tmp_path)
    assert "Attention" not in _counts(program) and not _notes(program)


@pytest.mark.parametrize(("dtype", "reason"), [(torch.bfloat16, "bfloat16"), (torch.float64, "float64")])
def test_types_the_kernel_lacks_stay_unfused_with_the_reason(tmp_path, dtype, reason):
    model = Attention("bool_mask")
    program = export_program(model, _inputs("bool_mask", dtype), options=make_options(tmp_path, opset_version=23))
    assert "Attention" not in _counts(program)
    (note,) = _notes(program)
    assert reason in note
    q, k, v, mask = _inputs("bool_mask", dtype)
    if dtype == torch.float64:  # onnxruntime's CPU provider runs it unfused
        torch.testing.assert_close(program(q, k, v, mask), model(q, k, v, mask))


def test_dropout_stays_unfused_with_the_reason(tmp_path):
    class Dropout(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    q, k, v, _ = _inputs("plain")
    program = export_program(Dropout(), (q, k, v), options=make_options(tmp_path, opset_version=23))
    assert "Attention" not in _counts(program)
    assert "dropout" in _notes(program)[0]


def test_fused_kernels_can_be_turned_off(tmp_path):
    options = make_options(tmp_path, opset_version=23, fused_kernels=False)
    program = export_and_compare_impl(Attention("repeat_kv"), _inputs("repeat_kv"), options=options, tmp_path=tmp_path)
    counts = _counts(program)
    assert "Attention" not in counts and counts["Softmax"] == 1


def test_a_repetition_read_elsewhere_is_kept(tmp_path):
    class Shared(torch.nn.Module):
        def forward(self, q, k, v):
            b, h, length, d = k.shape
            repeated = k[:, :, None].expand(b, h, 2, length, d).reshape(b, 2 * h, length, d)
            values = v[:, :, None].expand(b, h, 2, length, d).reshape(b, 2 * h, length, d)
            return F.scaled_dot_product_attention(q, repeated, values), repeated.sum()

    q, k, v, _ = _inputs("repeat_kv")
    program = export_and_compare_impl(Shared(), (q, k, v), options=make_options(tmp_path, opset_version=23), tmp_path=tmp_path)
    counts = _counts(program)
    assert counts["Attention"] == 1 and counts["Expand"] == 1  # the key's repetition stays for the sum


class Rotary(torch.nn.Module):
    """The rotary embedding as transformers' LLaMA writes it: tables from cat(freqs, freqs)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return self.rotate(q, emb.cos() * 1.0, emb.sin() * 1.0)

    def rotate(self, x, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        turned = torch.cat([-x[..., 8:], x[..., :8]], dim=-1)
        return x * cos + turned * sin


class RotaryFromTables(Rotary):
    """Tables given as inputs: nothing says their halves are equal."""

    def forward(self, q, cos, sin):
        return self.rotate(q, cos, sin)


def _rotary_inputs(length: int, batch: int = 2, position_rows: int = 2) -> tuple[torch.Tensor, ...]:
    positions = torch.arange(3, 3 + length).expand(position_rows if position_rows == 1 else batch, length)
    return torch.randn(batch, 4, length, 16), torch.randn(batch, 2, length, 16), positions


@pytest.mark.parametrize("shared_positions", [False, True], ids=["positions_per_sequence", "positions_shared"])
def test_rotary_embedding_is_one_kernel_from_opset_23(tmp_path, shared_positions, module_functions):
    length, batch = torch.export.Dim("length"), torch.export.Dim("batch")
    rows = 1 if shared_positions else 2
    dynamic = {"q": {0: batch, 2: length}, "k": {0: batch, 2: length},
               "positions": {1: length} if shared_positions else {0: batch, 1: length}}
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic, module_functions=module_functions)

    class Both(Rotary):
        def forward(self, q, k, positions):
            freqs = positions[..., None].float() * self.inv_freq
            emb = torch.cat([freqs, freqs], dim=-1)
            return self.rotate(q, emb.cos(), emb.sin()), self.rotate(k, emb.cos(), emb.sin())

    program = export_and_compare_impl(Both(), _rotary_inputs(5, 2, rows), options=options, tmp_path=tmp_path,
                                      second_inputs=(_rotary_inputs(9, 3, rows), {}))
    counts = _counts(program)
    assert counts["RotaryEmbedding"] == 2
    assert "Neg" not in counts  # rotate_half is gone


class RotaryOfHalves(Rotary):
    """The rotary embedding as transformers' gpt-oss writes it: the halves of x rotated by
    half tables (B, S, D/2), scaled."""

    def forward(self, q, k, positions):
        freqs = positions[..., None].float() * self.inv_freq
        cos, sin = (freqs.cos() * 1.3)[:, None], (freqs.sin() * 1.3)[:, None]

        def rotate(x):
            first, second = torch.chunk(x, 2, dim=-1)
            return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

        return rotate(q), rotate(k)


def test_the_rotation_of_halves_is_one_kernel(tmp_path, module_functions):
    length, batch = torch.export.Dim("length"), torch.export.Dim("batch")
    dynamic = {"q": {0: batch, 2: length}, "k": {0: batch, 2: length}, "positions": {0: batch, 1: length}}
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic, module_functions=module_functions)
    program = export_and_compare_impl(RotaryOfHalves(), _rotary_inputs(5), options=options, tmp_path=tmp_path,
                                      second_inputs=(_rotary_inputs(9, 3), {}))
    counts = _counts(program)
    assert counts["RotaryEmbedding"] == 2 and not {"Split", "Slice", "Concat"} & set(counts)


def test_rotary_tables_of_unknown_halves_stay_as_written(tmp_path):
    q = torch.randn(2, 4, 5, 16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    program = export_and_compare_impl(RotaryFromTables(), (q, cos, sin), options=make_options(tmp_path, opset_version=23), tmp_path=tmp_path)
    counts = _counts(program)
    assert "RotaryEmbedding" not in counts and counts["Neg"] == 1
    assert not _notes(program)  # an add that is not a rotation says nothing


class PooledToAGrid(torch.nn.Module):
    # pooling any image size to a 3 x 3 grid (BEiT's and UPerNet's pyramid pooling) computes each
    # cell's bounds as sums of products of sizes, SymInts that the rotary rules read as operands too
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, 3)


def test_a_sum_of_products_of_sizes_is_no_rotation(tmp_path):
    dynamic = {"x": {2: torch.export.Dim("height"), 3: torch.export.Dim("width")}}
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic)
    program = export_and_compare_impl(PooledToAGrid(), (torch.randn(2, 4, 8, 16),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(2, 4, 10, 7),), {}))
    assert "RotaryEmbedding" not in _counts(program)


class Gelus(torch.nn.Module):
    def forward(self, x):
        return F.gelu(x), F.gelu(x, approximate="tanh")


@pytest.mark.parametrize("opset", [20, 23])
def test_gelu_is_one_kernel_from_opset_20(tmp_path, opset, module_functions):
    program = export_and_compare_impl(Gelus(), (torch.randn(3, 8) * 3,), options=make_options(tmp_path, opset_version=opset, module_functions=module_functions), tmp_path=tmp_path)
    counts = _counts(program)
    assert counts["Gelu"] == 2 and not {"Erf", "Tanh"} & set(counts)


def test_gelu_in_float16_stays_unfused_with_the_reason(tmp_path):
    x = torch.randn(3, 8, dtype=torch.float16)
    program = export_program(Gelus(), (x,), options=make_options(tmp_path, opset_version=23))
    assert "Gelu" not in _counts(program)
    assert all("float32 only" in note for note in _notes(program)) and len(_notes(program)) == 2
    # FLOAT16_TOLERANCE: outputs up to 1.0 differ by 2.4e-4 (eager float16 is off float64 by 1.6e-4)
    torch.testing.assert_close(program(x), Gelus()(x), **FLOAT16_TOLERANCE)


class Encoder(torch.nn.Module):
    """Heads split from (B, S, 32) projections and merged after, as encoders write it."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, 4, 8).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=mask)
        return out.transpose(1, 2).contiguous().reshape(b, s, 32)


@pytest.mark.parametrize("runtime", ["onnxruntime", "standard"])
@pytest.mark.parametrize("boolean", [False, True])
def test_attention_takes_the_projections_layout_and_the_head_transposes_go(tmp_path, runtime, boolean, module_functions):
    """For onnxruntime the kernel is its MultiHeadAttention (onnxruntime-web's WebGPU has it,
    not the standard Attention); a boolean mask's query that sees no key gives 0, as in PyTorch."""
    def inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        held = torch.ones(b, 1, s, s, dtype=torch.bool)
        held[..., -1] = False  # the last key padded
        held[1, :, 2] = False  # a query that sees no key
        return torch.randn(b, s, 32), held if boolean else torch.where(held, 0.0, -1e4)

    length, batch = torch.export.Dim("length"), torch.export.Dim("batch")
    dynamic = {"x": {0: batch, 1: length}, "mask": {0: batch, 2: length, 3: length}}
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic, module_functions=module_functions, runtime=runtime)
    program = export_and_compare_impl(Encoder(), inputs(2, 7), options=options, tmp_path=tmp_path, second_inputs=(inputs(3, 12), {}))
    nodes = list(all_nodes(program.model_proto))
    kernel = "MultiHeadAttention" if runtime == "onnxruntime" else "Attention"
    (attention,) = [n for n in nodes if n.op_type == kernel]
    assert not [n for n in nodes if n.op_type in {"Attention", "MultiHeadAttention"} - {kernel}]
    heads = {"num_heads": 4} if runtime == "onnxruntime" else {"q_num_heads": 4, "kv_num_heads": 4}
    assert {a.name: a.i for a in attention.attribute if a.name.endswith("num_heads")} == heads
    head_transposes = [n for n in nodes if n.op_type == "Transpose"
                       and any(p.value == "call_function:aten.transpose.int" for p in n.metadata_props)]
    assert not head_transposes
    if boolean:
        x, held = inputs(2, 7)
        assert torch.equal(torch.as_tensor(program(x, held))[1, 2], torch.zeros(32))


def test_a_mask_shared_by_every_query_stays_unfused_with_the_reason(tmp_path):
    x, mask = torch.randn(2, 7, 32), torch.zeros(2, 1, 1, 7)
    mask[..., -1] = -1e4
    program = export_and_compare_impl(Encoder(), (x, mask), options=make_options(tmp_path, opset_version=23), tmp_path=tmp_path)
    assert "Attention" not in _counts(program)
    assert "one row per query" in _notes(program)[0]


class SharedQueries(torch.nn.Module):
    """Learned queries of batch 1 attending to every window's keys (a Q-Former over windows,
    Granite Speech's projector): scaled_dot_product_attention broadcasts the query's batch."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = torch.nn.Parameter(torch.randn(1, 4, 3, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = x.view(x.shape[0], x.shape[1], 4, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(self.queries, keys, keys)


@pytest.mark.parametrize("runtime", ["onnxruntime", "standard"])
def test_a_batch_broadcast_between_query_and_keys_stays_unfused_with_the_reason(tmp_path, runtime):
    """The attention kernels take one batch size for query, key and value: a query of batch 1
    over keys of several windows stays as written, equal to PyTorch at other window counts."""
    batch = torch.export.Dim("batch")
    options = make_options(tmp_path, opset_version=23, dynamic_shapes={"x": {0: batch}}, runtime=runtime)
    program = export_and_compare_impl(SharedQueries(), (torch.randn(5, 6, 32),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(2, 6, 32),), {}))
    assert not {"Attention", "MultiHeadAttention"} & set(_counts(program))
    assert "batch broadcast" in _notes(program)[0]


def test_the_fused_operators_compute_what_the_patterns_they_replace_compute():
    q, k, v, mask = _inputs("repeat_kv")
    repeated = [t.repeat_interleave(2, dim=1) for t in (k, v)]
    torch.testing.assert_close(torch.ops.fx2onnx.attention(q, k, v, mask, 0.25, False),
                               F.scaled_dot_product_attention(q, *repeated, attn_mask=mask, scale=0.25))
    packed = [t.transpose(1, 2).flatten(-2) for t in (q, k, v)]
    torch.testing.assert_close(torch.ops.fx2onnx.attention_3d(*packed, mask, 0.25, False, 4, 2),
                               F.scaled_dot_product_attention(q, *repeated, attn_mask=mask, scale=0.25).transpose(1, 2).flatten(-2))
    x, _, positions = _rotary_inputs(6)
    freqs = positions[..., None].float() * Rotary().inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    torch.testing.assert_close(torch.ops.fx2onnx.rotary(x, freqs.cos(), freqs.sin()), Rotary().rotate(x, emb.cos(), emb.sin()))
    torch.testing.assert_close(torch.ops.fx2onnx.gelu(x, "tanh"), F.gelu(x, approximate="tanh"))


class RMSNorms(torch.nn.Module):
    """RMS normalization as transformers writes it (in float32, cast back before the
    weight), Gemma's ``1 + weight`` scale, and torch's own over one and two dims."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16))
        self.torch_norm, self.two_dims = torch.nn.RMSNorm(16, eps=1e-5), torch.nn.RMSNorm((3, 16))
        with torch.no_grad():
            self.torch_norm.weight.normal_()
            self.two_dims.weight.normal_()

    @staticmethod
    def transformers_norm(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return scale * h.to(dtype)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.transformers_norm(x, self.weight), self.transformers_norm(x, 1.0 + self.weight.to(x.dtype)),
                self.torch_norm(x), self.two_dims(x))


def test_rms_normalization_is_one_kernel_from_opset_23(tmp_path, module_functions):
    program = export_and_compare_impl(RMSNorms(), (torch.randn(2, 3, 16) * 4,), options=make_options(tmp_path, opset_version=23, module_functions=module_functions), tmp_path=tmp_path)
    counts = _counts(program)
    assert counts["RMSNormalization"] == 4 and not {"ReduceMean", "Sqrt", "Pow"} & set(counts)
    assert not _notes(program)


def test_rms_normalization_in_float16_computes_in_float32(tmp_path):
    model, x = RMSNorms().half(), torch.randn(2, 3, 16, dtype=torch.float16) * 4
    program = export_program(model, (x,), options=make_options(tmp_path, opset_version=23))
    assert _counts(program)["RMSNormalization"] == 4
    for got, want in zip(program(x), model(x)):
        assert got.dtype == torch.float16
        # FLOAT16_TOLERANCE: outputs up to 4.4 differ by 2.0e-3, one ulp in [2, 4) (eager
        # float16 is off float64 by 2.4e-3)
        torch.testing.assert_close(got, want, **FLOAT16_TOLERANCE)


def test_rms_normalization_below_opset_23_or_without_a_scale_stays_as_written(tmp_path):
    x = torch.randn(2, 3, 16)
    assert "RMSNormalization" not in _counts(export_and_compare_impl(RMSNorms(), (x,), tmp_path=tmp_path))
    program = export_and_compare_impl(lambda x: F.rms_norm(x, (16,)), (x,), options=make_options(tmp_path, opset_version=23), tmp_path=tmp_path)
    assert "RMSNormalization" not in _counts(program)
    assert "no scale over the normalized dims" in _notes(program)[0]


def test_the_fused_rms_norm_computes_what_torch_computes():
    x, scale = torch.randn(2, 3, 16, dtype=torch.float16), torch.randn(3, 16, dtype=torch.float16)
    torch.testing.assert_close(torch.ops.fx2onnx.rms_norm(x, scale, 1e-5, 2), F.rms_norm(x.float(), (3, 16), eps=1e-5).half() * scale)


class CachedDecoder(torch.nn.Module):
    """One decoder attention over a KV cache, as decoders write it: projections split
    into heads, the rotary embedding, the new tokens appended to the cache, key/value
    heads repeated, and a boolean mask built from ``attention_mask``: causal, over the
    tokens it holds (within the last ``window`` of them, as a sliding layer's)."""

    def __init__(self, additive_mask: bool = False, window: int | None = None, head_size: int = 8,
                 switch: int | None = None) -> None:
        super().__init__()
        d = self.head_size = head_size
        self.switch = switch  # positions from which the frequencies halve (a length-dependent scaling, as LongRoPE's)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(32, 4 * d), torch.nn.Linear(32, 2 * d), torch.nn.Linear(32, 2 * d),
                                          torch.nn.Linear(4 * d, 32))
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d), persistent=False)
        self.additive_mask, self.window = additive_mask, window

    def tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq
        if self.switch is not None:
            freqs = freqs * torch.where(position_ids.max() + 1 > self.switch, 0.5, 1.0)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_size // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

    def forward(self, x, attention_mask, position_ids, past_key, past_value):
        b, s, _ = x.shape
        cos, sin = self.tables(position_ids)

        d = self.head_size

        def heads(t: torch.Tensor, count: int) -> torch.Tensor:
            return t.view(b, s, count, d).transpose(1, 2)

        q, k, v = self.rotate(heads(self.q(x), 4), cos, sin), self.rotate(heads(self.k(x), 2), cos, sin), heads(self.v(x), 2)
        key, value = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        total = key.shape[2]
        causal = torch.arange(total)[None, :] <= torch.arange(total - s, total)[:, None]
        mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
        if self.window is not None:
            counts = attention_mask.cumsum(-1)
            mask = mask & (counts[:, total - s:, None] - counts[:, None, :] < self.window)[:, None]
        if self.additive_mask:
            mask = torch.where(mask, 0.0, float("-inf"))
        repeated = [t[:, :, None].expand(b, 2, 2, total, d).reshape(b, 4, total, d) for t in (key, value)]
        out = self.attend(q, *repeated, mask)
        return self.o(out.transpose(1, 2).reshape(b, s, 4 * d)), key, value

    def attend(self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, key, value, attn_mask=mask)


class SinkDecoder(CachedDecoder):
    """:class:`CachedDecoder` with gpt-oss's attention as transformers writes it: the
    rotation of the halves by half tables, the boolean mask as a bias, and each head's sink
    logit joined to the scores before the softmax and dropped after it."""

    def __init__(self, window: int | None = None) -> None:
        super().__init__(window=window)
        # sinks of the scores' size: they take a visible share of the attention
        self.sinks = torch.nn.Parameter(torch.randn(4) * 2)

    def tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq
        return freqs.cos()[:, None], freqs.sin()[:, None]

    def rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = torch.chunk(t, 2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    def attend(self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = q.shape[0], q.shape[2]
        bias = (~mask).to(q.dtype) * torch.finfo(q.dtype).min
        scores = torch.matmul(q, key.transpose(2, 3)) * self.head_size ** -0.5 + bias
        logits = torch.cat([scores, self.sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probabilities = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
        return torch.matmul(F.dropout(probabilities, p=0.0, training=self.training), value)


def _decoder_inputs(batch: int, past: int, new: int, padding: str = "none", head_size: int = 8) -> tuple[torch.Tensor, ...]:
    """Inputs of a step of ``new`` tokens over ``past`` cached ones; ``padding`` "left" or
    "right": sequence b's mask holds ``2 * b`` fewer tokens (zeros at the start, or at the
    end of the cached part, where a right-padded prompt left them)."""
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    for b in range(batch):
        if padding == "left":
            mask[b, :2 * b] = 0
        elif padding == "right" and 2 * b:
            mask[b, max(past, 1) - 2 * b:max(past, 1)] = 0
    return (torch.randn(batch, new, 32), mask, torch.arange(past, past + new).expand(batch, -1),
            torch.randn(batch, 2, past, head_size), torch.randn(batch, 2, past, head_size))


def _export_decoder(tmp_path, model, **options):
    batch, new, past = torch.export.Dim("batch"), torch.export.Dim("new"), torch.export.Dim("past")
    dynamic = {"x": {0: batch, 1: new}, "attention_mask": {0: batch, 1: torch.export.Dim.AUTO}, "position_ids": {0: batch, 1: new},
               "past_key": {0: batch, 2: past}, "past_value": {0: batch, 2: past}}
    options = make_options(tmp_path, opset_version=23, dynamic_shapes=dynamic, **options)
    return export_program(model, _decoder_inputs(2, 5, 3, head_size=getattr(model, "head_size", 8)), options=options,
                          tmp_path=tmp_path)


# (batch, past, new tokens, padding): prompts, decode steps, and several new tokens over a
# cache at batch 1 and 3, with every mask: onnxruntime's kernel refuses the last at batch 3
STEPS = [(2, 0, 6, "none"), (3, 0, 6, "left"), (3, 0, 6, "right"), (3, 9, 1, "left"), (3, 5, 1, "right"),
         (1, 5, 3, "none"), (3, 5, 3, "none"), (3, 5, 3, "left"), (3, 5, 3, "right")]


def _check_steps(program, model, shift: int = 0) -> None:
    """The program's attention and caches equal the model's at every step of STEPS (the
    attention on the queries that see a token: PyTorch's rows that see none are NaN),
    the position ids ``shift`` after the step's own."""
    for batch, past, new, padding in STEPS:
        inputs = list(_decoder_inputs(batch, past, new, padding, model.head_size))
        inputs[2] = inputs[2] + shift
        with torch.no_grad():
            expected = model(*inputs)
        actual = program(*inputs)
        sees = inputs[1].cumsum(1)[:, past:] > 0
        torch.testing.assert_close(actual[0][sees], expected[0][sees], rtol=1e-4, atol=1e-5, msg=f"{batch, past, new, padding}")
        for present, wanted in zip(actual[1:], expected[1:]):
            torch.testing.assert_close(present, wanted, rtol=1e-5, atol=1e-6)


def test_attention_over_a_cache_is_onnxruntimes_group_query_attention(tmp_path, module_functions):
    torch.manual_seed(0)
    model = CachedDecoder().eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=module_functions)
    check_saved_model(program, tmp_path / "m.onnx")
    counts = _counts(program)
    # the cache's update, the mask and the head repetitions are the kernel's; rotations stay in the projections' layout
    # the kernel twice: without the attention bias (no sequence padded) and with it
    assert counts["GroupQueryAttention"] == 2 and counts["RotaryEmbedding"] == 2
    assert not {"Softmax"} & set(counts)
    unpadded, kernel = sorted((n for n in all_nodes(program.model_proto) if n.op_type == "GroupQueryAttention"),
                              key=lambda n: len(n.input))
    for node in (unpadded, kernel):
        assert node.domain == "com.microsoft"
        assert {a.name: a.i for a in node.attribute if a.type == a.INT} == {"num_heads": 4, "kv_num_heads": 2}
    # the mask's padding is the kernel's attention_bias; each sequence's length is the mask's
    assert len(kernel.input) == 11 and kernel.input[10] and len(unpadded.input) == 7

    def branches(node):
        return (onnx.helper.get_attribute_value(a) for a in sorted(node.attribute, key=lambda a: a.name != "then_branch"))

    # an If runs the kernel without the bias when the kernel runs and no sequence is
    # padded; otherwise a second If runs the kernel with the bias where onnxruntime does,
    # and the standard Attention (the cache written where the kernel writes it) for several
    # new tokens over a cache at batch > 1
    (branch,) = [n for n in program.model_proto.graph.node if n.op_type == "If"]
    fast, padded = branches(branch)
    assert [n.input for n in fast.node] == [unpadded.input]
    # the padded branch: the second If, after the nodes only it reads (the bias), moved out of the main graph
    (inner,) = [n for n in padded.node if n.op_type == "If"]
    assert padded.node[-1] is inner and not {"MatMul", "GroupQueryAttention"} & {n.op_type for n in padded.node}
    then_branch, else_branch = branches(inner)
    assert [n.op_type for n in then_branch.node] == ["GroupQueryAttention"]
    assert {"Attention", "Concat"} <= {n.op_type for n in else_branch.node} and "GroupQueryAttention" not in {n.op_type for n in else_branch.node}
    assert not [o.name for o in program.model_proto.graph.output if o.name.endswith(("_replaced", "_kernel"))]  # names kept
    _check_steps(program, model)
    # the exact form of a past longer than the mask's (past and present one buffer of the
    # context's length, as ONNX Runtime GenAI gives them): the new tokens written after
    # the mask's cached ones, the rest of the buffer kept (in onnxruntime itself: the
    # program's call refuses sizes that the export tied)
    x, mask, positions, past_key, past_value = _decoder_inputs(3, 12, 3, "left")
    inputs = (x, mask[:, :8], positions - 12 + 5, past_key, past_value)
    with torch.no_grad():
        expected = model(*inputs[:3], past_key[:, :, :5], past_value[:, :, :5])
    session = onnxruntime.InferenceSession(os.fspath(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    actual = [torch.from_numpy(a) for a in session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})]
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-4, atol=1e-5)
    for present, wanted, buffer in zip(actual[1:], expected[1:], (past_key, past_value)):
        torch.testing.assert_close(present, torch.cat([wanted, buffer[:, :, 8:]], 2), rtol=1e-5, atol=1e-6)


def test_the_kernel_rotates_itself_at_the_positions_it_assumes(tmp_path, module_functions):
    """Heads of 16: the kernel without the bias rotates the query and key itself (tables
    of the model's cos and sin by position), where every sequence's positions follow the
    mask's earlier tokens (checked at run time); the rotations run before the other
    branch. Every step of STEPS equals the model, with its own positions and shifted."""
    torch.manual_seed(0)
    model = CachedDecoder(head_size=16).eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=module_functions)
    check_saved_model(program, tmp_path / "m.onnx")
    (branch,) = [n for n in program.model_proto.graph.node if n.op_type == "If"]
    fast, padded = (onnx.helper.get_attribute_value(a) for a in sorted(branch.attribute, key=lambda a: a.name != "then_branch"))
    (unpadded,) = fast.node
    attributes = {a.name: a.i for a in unpadded.attribute if a.type == a.INT}
    assert attributes["do_rotary"] == 1 and attributes["rotary_interleaved"] == 0
    tables = {t.name: onnx.numpy_helper.to_array(t) for t in program.model_proto.graph.initializer}
    cos_cache = tables[unpadded.input[7]]
    angles = torch.arange(len(cos_cache)).float()[:, None] * model.inv_freq  # in float32, as the model computes them
    np.testing.assert_allclose(cos_cache, angles.cos().numpy(), rtol=1e-6, atol=1e-6)
    assert "RotaryEmbedding" not in {n.op_type for n in program.model_proto.graph.node}
    assert [n.op_type for n in padded.node if n.op_type == "RotaryEmbedding"] == ["RotaryEmbedding"] * 2
    _check_steps(program, model)
    _check_steps(program, model, shift=2)


@pytest.mark.parametrize("context_length", [None, 64])
def test_a_total_past_the_tables_rotates_outside_the_kernel(tmp_path, context_length):
    """A decode step whose total is past the kernel's tables (TABLE_POSITIONS rows, 4101
    tokens; or the model's `context_length`, 69): the guard takes the branch that rotates
    with the model's own cos and sin, and the step equals the model (the kernel would read
    rows its tables do not have)."""
    from fx2onnx.onnx_passes.rotary_in_attention import TABLE_POSITIONS

    torch.manual_seed(0)
    model = CachedDecoder(head_size=16).eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=False,
                              context_length=context_length)
    check_saved_model(program, tmp_path / "m.onnx")
    rows = context_length or TABLE_POSITIONS
    tables = {t.name: tuple(t.dims) for t in program.model_proto.graph.initializer if t.name.startswith("rotary_")}
    assert tables == {"rotary_cos_cache_0": (rows, 8), "rotary_sin_cache_0": (rows, 8)}
    for past in (rows - 1, rows + 4):  # the last total the tables hold, and one past them
        inputs = _decoder_inputs(1, past, 1, "none", head_size=16)
        with torch.no_grad():
            expected = model(*inputs)
        session = onnxruntime.InferenceSession(os.fspath(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
        actual = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})
        torch.testing.assert_close(torch.from_numpy(actual[0]), expected[0], rtol=1e-4, atol=1e-5)


def test_tables_that_depend_on_the_length_keep_the_rotations_outside(tmp_path):
    """cos and sin that change with the longest position (a switch at 64, as LongRoPE's):
    no table by position gives them, so the kernel does not rotate and the model's
    rotations stay before it."""
    torch.manual_seed(0)
    model = CachedDecoder(head_size=16, switch=64).eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=False)
    check_saved_model(program, tmp_path / "m.onnx")
    kernels = [n for n in all_nodes(program.model_proto) if n.op_type == "GroupQueryAttention"]
    assert len(kernels) == 2 and not any(a.name == "do_rotary" for n in kernels for a in n.attribute)
    assert [n.op_type for n in program.model_proto.graph.node].count("RotaryEmbedding") == 2
    _check_steps(program, model, shift=60)  # positions past the switch


def test_a_sliding_window_over_a_cache_is_the_kernels_local_window(tmp_path, module_functions):
    """A mask narrowed to the last 3 held tokens: the kernel with `local_window_size` 3
    where no sequence has padding after a held token (none, or on the left), the exact
    form with the window counted in held tokens otherwise (padding inside the cache, as
    ONNX Runtime GenAI's right-padded batches have); every step of STEPS equals the model."""
    torch.manual_seed(0)
    model = CachedDecoder(window=3).eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=module_functions)
    check_saved_model(program, tmp_path / "m.onnx")
    windows = [a.i for n in all_nodes(program.model_proto) if n.op_type == "GroupQueryAttention"
               for a in n.attribute if a.name == "local_window_size"]
    assert windows == [3, 3]  # the kernel without the bias and with it
    _check_steps(program, model)


@pytest.mark.parametrize("window", [None, 3], ids=["full", "sliding"])
def test_attention_with_sinks_over_a_cache_is_the_kernel_with_head_sink(tmp_path, window, module_functions):
    """gpt-oss's attention with sinks: the kernel with the sinks as `head_sink` (and the
    window as `local_window_size`) in both of its forms, and the exact form keeps the
    sinks; every step of STEPS (each branch: no padding, left, right, several new tokens
    over a cache at batch 3) equals the model."""
    torch.manual_seed(0)
    model = SinkDecoder(window=window).eval()
    program = _export_decoder(tmp_path, model, causal_mask_input="attention_mask", module_functions=module_functions)
    check_saved_model(program, tmp_path / "m.onnx")
    counts = _counts(program)
    assert counts["GroupQueryAttention"] == 2 and counts["RotaryEmbedding"] == 2 and "Softmax" not in counts
    sinks_name = {n.name for n in program.model_proto.graph.initializer if n.dims == [4]} | {i.name for i in program.model_proto.graph.input}
    for node in (n for n in all_nodes(program.model_proto) if n.op_type == "GroupQueryAttention"):
        assert len(node.input) == 12 and node.input[11] in sinks_name, node.input
        assert [a.i for a in node.attribute if a.name == "local_window_size"] == ([] if window is None else [window])
    _check_steps(program, model)
    # without its sinks the model computes other numbers at these steps
    with torch.no_grad():
        model.sinks.fill_(-1e4)
    inputs = _decoder_inputs(3, 5, 1, "right")
    assert not torch.allclose(program(*inputs)[0], model(*inputs)[0], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize(("model", "options", "note"), [
    (CachedDecoder(additive_mask=True), {"causal_mask_input": "attention_mask"}, "an additive mask"),
    (CachedDecoder(), {"causal_mask_input": "attention_mask", "runtime": "standard"}, None),
    (CachedDecoder(), {}, None),
])
def test_attention_over_a_cache_stays_standard_where_the_kernel_does_not_apply(tmp_path, model, options, note):
    program = _export_decoder(tmp_path, model.eval(), **options)
    check_saved_model(program, tmp_path / "m.onnx")
    counts = _counts(program)
    assert counts["Attention"] == 1 and "GroupQueryAttention" not in counts
    notes = [d.message for d in program.diagnostic_context.diagnostics if "GroupQueryAttention" in (d.message or "")]
    assert (note in notes[0]) if note else not notes
    _check_steps(program, model)  # any batch, past and mask: the standard kernel has no limit


def test_options_of_the_runtime_and_of_the_causal_mask_are_checked(tmp_path):
    with pytest.raises(ValueError, match="runtime='tensorrt'.*'onnxruntime' or 'standard'"):
        make_options(tmp_path, runtime="tensorrt")
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"causal_mask_input='mask'\) names no input.*'attention_mask'"):
        _export_decoder(tmp_path, CachedDecoder().eval(), causal_mask_input="mask")


def test_the_cached_attention_computes_causal_attention_over_the_appended_cache():
    q, k, v = torch.randn(2, 3, 32), torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    past_key, past_value = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    bias = torch.zeros(2, 1, 3, 7)
    bias[1, ..., :2] = torch.finfo(torch.float32).min  # the second sequence left-padded by 2
    out, key, value = torch.ops.fx2onnx.cached_attention(
        q, k, v, past_key, past_value, torch.tensor([6, 6], dtype=torch.int32), torch.tensor(7, dtype=torch.int32), bias,
        0.3, 4, 2,
    )

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (-1, 8)).transpose(1, 2)

    torch.testing.assert_close(key, torch.cat([past_key, heads(k)], 2))
    causal = torch.ones(3, 7, dtype=torch.bool).tril(4)
    held = torch.tensor([[True] * 7, [False] * 2 + [True] * 5])
    expected = F.scaled_dot_product_attention(heads(q), key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                              attn_mask=causal & held[:, None, None, :], scale=0.3)
    torch.testing.assert_close(out, expected.transpose(1, 2).flatten(-2))
    cos, sin = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(torch.ops.fx2onnx.rotary_3d(q, cos, sin, 4),
                               torch.ops.fx2onnx.rotary(heads(q), cos, sin).transpose(1, 2).flatten(-2))


# -- mixtures of experts (onnxruntime's MoE) ----------------------------------------------------------
class Experts(torch.nn.Module):
    """A tiny random sparse-MoE block of one transformers family, its hidden states alone
    (gpt-oss's also returns the router's scores, which the kernel does not give)."""

    def __init__(self, family: str) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        sizes = dict(hidden_size=32, num_experts_per_tok=2)
        if family == "gpt_oss":  # interleaved gate and up, clamped SwiGLU, biases, softmax of the top k
            config = transformers.GptOssConfig(**sizes, intermediate_size=16, num_local_experts=4)
            block = transformers.models.gpt_oss.modeling_gpt_oss.GptOssMLP(config)
        elif family == "qwen2_moe":  # halves side by side, silu, top k of the softmax not renormalized
            config = transformers.Qwen2MoeConfig(**sizes, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                                 num_experts=4, norm_topk_prob=False)
            block = transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config)
        else:  # mixtral: the same, renormalized
            config = transformers.MixtralConfig(**sizes, intermediate_size=16, num_local_experts=4)
            block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config)
        block.experts.config._experts_implementation = "grouped_mm"  # what a model's from_pretrained chooses
        for parameter in block.parameters():  # at the default scale the router's choice hardly matters
            torch.nn.init.normal_(parameter, std=0.5)
        self.block, self.family = block.eval(), family

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden_states)
        return out[0] if self.family == "gpt_oss" else out


@pytest.mark.parametrize(("family", "functions"), [("gpt_oss", True), ("gpt_oss", False), ("qwen2_moe", True), ("mixtral", False)])
def test_experts_routed_by_a_softmax_top_k_are_onnxruntimes_moe(tmp_path, family, functions):
    """One MoE per block for a decode step, a prompt and a batch of 3 (the routing, the
    sort and the grouped products all the kernel's), equal to transformers."""
    torch.manual_seed(0)
    model = Experts(family)
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
    options = make_options(tmp_path, opset_version=23, module_functions=functions,
                           dynamic_shapes={"hidden_states": {0: batch, 1: tokens}})
    program = export_and_compare_impl(model, (torch.randn(1, 7, 32),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(3, 5, 32),), {}))
    torch.testing.assert_close(program(x := torch.randn(1, 1, 32)), model(x).detach(), rtol=RTOL, atol=ATOL)
    counts = _counts(program)
    assert counts["MoE"] == 1 and not {"Sort", "ScatterND"} & set(counts), counts
    (kernel,) = [n for n in all_nodes(program.model_proto) if n.op_type == "MoE"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in kernel.attribute}
    assert kernel.domain == "com.microsoft" and attributes["k"] == 2 and attributes["swiglu_fusion"] == 1
    # always the renormalized kernel (onnxruntime 1.30's gives zeros for normalize_routing_weights=0
    # inside a graph); Qwen2-MoE's weights not renormalized: times the top k's share of the softmax
    assert attributes["normalize_routing_weights"] == 1
    share = {"Softmax": 1, "TopK": 1, "ReduceSum": 1}
    assert {op: counts.get(op, 0) for op in share} == (share if family == "qwen2_moe" else dict.fromkeys(share, 0)), counts
    assert ("swiglu_limit" in attributes) == (family == "gpt_oss")
    # its weights are initializers of the file in its layout (onnxruntime prepacks no others)
    weights = {i.name: list(i.dims) for i in program.model_proto.graph.initializer}
    assert [weights.get(kernel.input[i]) for i in (2, 4)] == [[4, 32, 32], [4, 32, 16]]

