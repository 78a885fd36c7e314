"""Reductions of dispatcher/functions/reduction.py match PyTorch in onnxruntime."""

from __future__ import annotations

import pytest
import torch

from conftest import Apply, check_saved_model, export_program, flat_leaves


X = torch.tensor([[1.5, -2.0, 0.0, 3.0], [0.5, 2.0, -1.0, 4.0], [2.0, 0.25, 1.0, -3.0]])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.cumprod(x, 0),
        lambda x: torch.cumprod(x, -1),
        lambda x: torch.cumprod(x, 1, dtype=torch.float64),
        lambda x: torch.linalg.vander(x[0], N=3),
    ],
    ids=["cumprod0", "cumprod_last", "cumprod_dtype", "vander"],
)
def test_cumulative_products(fn, export_and_compare) -> None:
    export_and_compare(Apply(fn), (X,))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_cumprod_of_integers_and_bools(dtype, export_and_compare) -> None:
    x = torch.tensor([[1, 2, 0, 3], [2, 1, 1, 5]]).to(dtype)
    export_and_compare(Apply(lambda t: torch.cumprod(t, 1)), (x,))


NAN = float("nan")
WITH_NAN = torch.tensor([[NAN, NAN, NAN, NAN], [1.0, NAN, 3.0, -2.0], [NAN, 2.0, NAN, 0.5], [4.0, 1.0, 2.0, 1.0]])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.nanmedian(x, 1),
        lambda x: torch.nanmedian(x, 0, keepdim=True),
        lambda x: torch.nanmedian(x, -1),
        lambda x: torch.nanmedian(x),
        lambda x: torch.nanmedian(x[1:]),
    ],
    ids=["dim1", "dim0_keepdim", "dim_last", "all", "all_with_numbers"],
)
def test_nanmedian_skips_nan(fn, tmp_path) -> None:
    program = export_program(Apply(fn), (WITH_NAN,), tmp_path=tmp_path)
    check_saved_model(program, tmp_path / "m.onnx")
    for x in (WITH_NAN, torch.randn(4, 4)):
        got, want = flat_leaves(program(x)), flat_leaves(fn(x))
        torch.testing.assert_close(got[0], want[0], equal_nan=True)
        if len(want) == 2:  # the index of a slice of NaN only is PyTorch's selection detail
            numbers = ~torch.isnan(want[0])
            torch.testing.assert_close(got[1][numbers], want[1][numbers])


def test_nanmedian_of_integers_takes_the_lower_median(export_and_compare) -> None:
    x = torch.tensor([[3, 3, 1, 3], [7, -2, 5, 0], [1, 2, 3, 4]])
    export_and_compare(Apply(lambda t: torch.nanmedian(t, 1)), (x,))
    export_and_compare(Apply(torch.nanmedian), (x,))


@pytest.mark.parametrize("reduce", ["sum", "mean", "prod", "max", "min"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_lengths_and_offsets(reduce, initial, tmp_path) -> None:
    data = torch.randn(3, 6, 2)
    lengths = torch.tensor([[2, 0, 3, 1], [0, 6, 0, 0], [1, 1, 1, 3]])  # segments along axis 1
    offsets = torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1)
    for key, segments in (("lengths", lengths), ("offsets", offsets)):
        model = Apply(lambda d, s, k=key: torch.segment_reduce(d, reduce, **{k: s}, axis=1, initial=initial))
        program = export_program(model, (data, segments), tmp_path=tmp_path)
        check_saved_model(program, tmp_path / "m.onnx")
        # an empty mean segment without initial is NaN in PyTorch too
        torch.testing.assert_close(program(data, segments), model(data, segments), equal_nan=True)


# Every reduction that takes keepdim without a dim reduces every element and keeps the
# input's rank (all sizes 1); the comparison checks the shape as well as the values.
KEEPDIM_WITHOUT_DIM = {
    "argmax": lambda x: x.argmax(keepdim=True),
    "argmin": lambda x: x.argmin(keepdim=True),
    "sum": lambda x: x.sum(dim=None, keepdim=True),
    "nansum": lambda x: torch.nansum(x, dim=None, keepdim=True),
    "mean": lambda x: x.mean(dim=None, keepdim=True),
    "nanmean": lambda x: torch.nanmean(x, dim=None, keepdim=True),
    "amax": lambda x: x.amax(dim=(), keepdim=True),
    "amin": lambda x: x.amin(dim=(), keepdim=True),
    "aminmax": lambda x: torch.aminmax(x, keepdim=True),
    "std": lambda x: x.std(dim=None, keepdim=True),
    "var": lambda x: x.var(dim=None, keepdim=True),
    "std_mean": lambda x: torch.std_mean(x, dim=None, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, dim=None, keepdim=True),
    "logsumexp": lambda x: torch.logsumexp(x, dim=(), keepdim=True),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, keepdim=True),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), keepdim=True),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, keepdim=True),
}
INTEGER_KEEPDIM_WITHOUT_DIM = ("argmax", "argmin", "sum", "nansum", "amax", "amin", "aminmax", "logsumexp")


@pytest.mark.parametrize("name", sorted(KEEPDIM_WITHOUT_DIM))
def test_keepdim_without_dim_keeps_the_rank(name, export_and_compare) -> None:
    fn = KEEPDIM_WITHOUT_DIM[name]
    x = torch.randn(2, 3, 4)
    assert all(out.dim() == 3 for out in flat_leaves(fn(x)))
    export_and_compare(Apply(fn), (x,))


@pytest.mark.parametrize("name", INTEGER_KEEPDIM_WITHOUT_DIM)
def test_keepdim_without_dim_keeps_the_rank_for_integers(name, export_and_compare) -> None:
    x = torch.tensor([[3, -7, 5], [9, 0, 9]])
    export_and_compare(Apply(KEEPDIM_WITHOUT_DIM[name]), (x,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.linalg.vector_norm(x, 2, dim=(0, 2)),
        lambda x: torch.linalg.vector_norm(x, 1, dim=1, keepdim=True),
        lambda x: torch.linalg.vector_norm(x, 0),
        lambda x: torch.linalg.vector_norm(x, -float("inf"), dim=-1),
        lambda x: torch.linalg.vector_norm(x, 0.5, dim=0),
        lambda x: x.mean(dim=(1, 2)),
        lambda x: x.mean(dim=-1, keepdim=True, dtype=torch.float64),
        lambda x: x.argmax(dim=1, keepdim=True),
    ],
    ids=["norm2_dims", "norm1_keepdim", "norm0_all", "norm_minus_inf", "norm_half", "mean_dims", "mean_dtype", "argmax_dim"],
)
def test_reductions_with_dims(fn, export_and_compare) -> None:
    export_and_compare(Apply(fn), (torch.randn(2, 3, 4),))


def test_argmax_of_integers_along_a_dim(export_and_compare) -> None:
    x = torch.tensor([[3, -7, 5], [9, 0, 9]])
    export_and_compare(Apply(lambda t: (t.argmax(1), t.argmin(0, keepdim=True), t.argmax())), (x,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.histc(x, bins=5),  # over the input's own range
        lambda x: torch.histc(x, bins=4, min=-2.0, max=3.0),  # 4.0 and -3.0 outside, 3.0 in the last bin
        lambda x: torch.histc(torch.zeros_like(x), bins=3),  # one value: the range widened to [-1, 1]
        lambda x: torch.histc(torch.sort(torch.tensor([2.0, 0.0, 3.0, 1.0, 3.0, 0.0]) + 0 * x[0, 0]).values, bins=4, min=0,
                              max=3),  # expert ids counted as transformers' grouped experts count them
    ],
    ids=["own_range", "given_range", "one_value", "expert_ids"],
)
def test_histc_counts_as_pytorch(fn, export_and_compare) -> None:
    # torchlib's function refuses min == max (the first and third cases)
    export_and_compare(Apply(fn), (X,), second_inputs=((X * 2 - 1,), {}))
