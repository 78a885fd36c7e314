"""The optimization stage (`ExportOptions(optimize=True)`, the default)."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch
from torch import nn

from conftest import all_nodes, make_options


class TwoNorms(nn.Module):
    """Two LayerNorms and two Linears initialized alike: equal weights under different names."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.LayerNorm(8), nn.LayerNorm(8)
        self.up, self.down = nn.Linear(8, 8), nn.Linear(8, 8)
        with torch.no_grad():
            self.down.weight.copy_(self.up.weight)
            self.down.bias.copy_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.down(self.first(self.up(x))))


class NoOps(nn.Module):
    """Operations that are identities for these inputs: x * 1, + 0, a cast to the same
    dtype, inference dropout, reshape to the same shape and a double transpose."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(x * torch.ones(()) + torch.zeros(()))
        y = y.to(torch.float32).reshape(x.shape).transpose(0, 1).transpose(0, 1)
        return torch.relu(y)


def _counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in all_nodes(model))


def test_equal_weights_keep_their_own_names(export_and_compare, tmp_path) -> None:
    # Equal-valued weights (fresh LayerNorms, copied Linears) are distinct parameters: the
    # optimizer must not merge them, or their names (what a checkpoint is loaded by) are lost.
    model = TwoNorms().eval()
    program = export_and_compare(model, (torch.randn(3, 8),), options=make_options(tmp_path, optimize=True))
    names = {initializer.name for initializer in program.model_proto.graph.initializer}
    assert {name for name, _ in model.named_parameters()} <= names


def test_no_op_nodes_are_removed(export_and_compare, tmp_path) -> None:
    x = torch.randn(4, 6)
    plain = export_and_compare(NoOps().eval(), (x,), options=make_options(tmp_path, optimize=False))
    optimized = export_and_compare(NoOps().eval(), (x,), options=make_options(tmp_path, optimize=True))
    before, after = _counts(plain.model_proto), _counts(optimized.model_proto)
    assert sum(after.values()) < sum(before.values())
    for op_type in ("Mul", "Add", "Transpose", "Dropout", "Reshape"):
        assert after[op_type] == 0, (op_type, after)
    assert after["Relu"] == 1


class RMSNorm(nn.Module):
    """Root-mean-square normalization as LLaMA-family models write it (x * rsqrt(...))."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(size) + 0.5), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class TwoRMSNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.proj = RMSNorm(16), RMSNorm(16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.proj(self.first(x)))


def test_rms_norm_is_written_in_the_form_onnxruntime_fuses(export_and_compare, tmp_path) -> None:
    import onnxruntime

    program = export_and_compare(TwoRMSNorms().eval(), (torch.randn(2, 5, 16),), options=make_options(tmp_path, optimize=True))
    counts = _counts(program.model_proto)
    assert counts["Reciprocal"] == 0 and counts["Div"] >= 1 and counts["Sqrt"] >= 1
    # onnxruntime turns Pow-ReduceMean-Add-Sqrt-Div-Mul into one kernel; with Reciprocal it cannot.
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    fused = _counts(onnx.load(tmp_path / "ort_optimized.onnx"))
    assert fused["SimplifiedLayerNormalization"] == 2 and fused["Sqrt"] == 0


def test_every_rewrite_rule_matches_from_one_output_node() -> None:
    # A rule with several output nodes makes onnxscript's matcher try every combination
    # of graph nodes: optimization time quadratic in the graph (minutes on unrolled
    # linear algebra). Every rule of the optimization stage must have a single output node.
    from fx2onnx.onnx_passes.optimization import _rewrite_rules

    rules = _rewrite_rules().rules
    assert rules and all(rule._target_pattern.has_single_output_node for rule in rules)


class _Layout(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor):
        return self.function(x)


def _select_three(packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return packed[0], packed[1], packed[2]


# (model code, input shape, expected op counts after optimization)
_LAYOUT_CASES = {
    # select from a permuted tensor whose other axes keep their order: no Transpose
    "select_of_permute": (lambda x: x.permute(1, 0, 2)[2] + x.permute(1, 0, 2)[-1], (3, 4, 5), {"Transpose": 0, "Gather": 2}),
    # the other axes change order: the Transpose stays
    "select_keeps_needed_transpose": (lambda x: x.permute(2, 0, 1)[:, 1], (3, 4, 5), {"Transpose": 1}),
    # another reader needs the permuted tensor: the Transpose stays for it alone
    "transpose_with_other_reader": (lambda x: (x.permute(1, 0, 2)[0], x.permute(1, 0, 2) * 2), (3, 4, 5), {"Transpose": 1}),
    # squeeze after a permute: the Transpose moves past the Squeeze and stays
    "squeeze_of_permute": (lambda x: x.permute(3, 1, 0, 2).squeeze(1), (2, 1, 3, 4), {"Transpose": 1, "Squeeze": 1}),
    # the packed projection of nn.MultiheadAttention: no Transpose, no Unsqueeze
    "packed_projection": (
        lambda x: _select_three(x.unflatten(-1, (3, 4)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()),
        (5, 2, 12),
        {"Transpose": 0, "Unsqueeze": 0},
    ),
}


@pytest.mark.parametrize("case", sorted(_LAYOUT_CASES))
def test_layout_rules_take_transposes_out_where_they_can(export_and_compare, tmp_path, case) -> None:
    function, shape, expected = _LAYOUT_CASES[case]
    program = export_and_compare(_Layout(function).eval(), (torch.randn(*shape),), options=make_options(tmp_path, optimize=True))
    counts = _counts(program.model_proto)
    assert {op: counts[op] for op in expected} == expected, counts


def test_transformer_layer_attention_has_no_five_dimensional_transpose(export_and_compare, tmp_path) -> None:
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 7, 16)
    plain = export_and_compare(layer, (x,), options=make_options(tmp_path, optimize=False))
    optimized = export_and_compare(layer, (x,), options=make_options(tmp_path, optimize=True))

    def transpose_ranks(model: onnx.ModelProto) -> list[int]:
        return [len(a.ints) for n in all_nodes(model) if n.op_type == "Transpose" for a in n.attribute if a.name == "perm"]

    assert 5 in transpose_ranks(plain.model_proto)
    assert 5 not in transpose_ranks(optimized.model_proto)
    assert len(transpose_ranks(optimized.model_proto)) == len(transpose_ranks(plain.model_proto)) - 1


class SplitByADynamicSize(nn.Module):
    # ZoeDepth's neck splits by a size read from the input's dims: a number computed in the graph
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, x.shape[1] // 3, dim=1)
        return torch.cat([part * (index + 1) for index, part in enumerate(parts)], 1)


def test_a_split_by_a_size_computed_in_the_graph_is_kept(export_and_compare, tmp_path) -> None:
    program = export_and_compare(SplitByADynamicSize(), (torch.randn(2, 6),), options=make_options(tmp_path, dynamic_shapes=True),
                                 second_inputs=((torch.randn(3, 9),), {}))
    split = next(n for n in all_nodes(program.model_proto) if n.op_type == "SplitToSequence")
    assert split.input[1] not in {i.name for i in program.model_proto.graph.initializer}  # the size stays computed
