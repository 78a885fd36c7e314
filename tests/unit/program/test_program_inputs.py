"""ONNXProgram(...) inputs: tensor defaults of forward stay inputs, and inputs that do not
fit the exported signature are an UnsupportedInputError before onnxruntime sees them."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import make_options


class WithDefault(nn.Module):
    def forward(self, x: torch.Tensor, b: torch.Tensor = torch.tensor(2.0), c: torch.Tensor | None = None) -> torch.Tensor:
        out = x * b
        return out if c is None else out + c


@pytest.mark.parametrize("dynamic", [False, True])
def test_tensor_default_stays_an_input(tmp_path, dynamic):
    model = WithDefault()
    x = torch.rand(3, 4)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, dynamic_shapes=dynamic))
    assert [v.name for v in program.model.graph.inputs] == ["x", "b"]
    path = tmp_path / "m.onnx"
    program.save(path)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    x2 = torch.rand(3, 4)
    torch.testing.assert_close(program(x2), model(x2))  # default fed
    torch.testing.assert_close(program(x2, b=torch.tensor(-3.0)), model(x2, torch.tensor(-3.0)))  # by keyword
    torch.testing.assert_close(program(x2, torch.tensor(5.0)), model(x2, torch.tensor(5.0)))  # by position
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"x": x2.numpy(), "b": torch.tensor(7.0).numpy()})
    torch.testing.assert_close(torch.from_numpy(result), model(x2, torch.tensor(7.0)))
    if dynamic:
        x3 = torch.rand(5, 2)
        torch.testing.assert_close(program(x3), model(x3))


def test_tensor_default_given_at_export_is_not_added_twice(tmp_path):
    model = WithDefault()
    x = torch.rand(3, 4)
    program = fx2onnx.dynamo_export(model, x, torch.tensor(4.0), export_options=make_options(tmp_path))
    assert [v.name for v in program.model.graph.inputs] == ["x", "b"]
    torch.testing.assert_close(program(x, torch.tensor(4.0)), model(x, torch.tensor(4.0)))


def test_tensor_default_under_fake_mode(tmp_path):
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, scale: torch.Tensor = torch.tensor(0.5)) -> torch.Tensor:
            return self.fc(x) * scale

    with fx2onnx.enable_fake_mode() as fake_context:
        model = Scaled()
        x = torch.rand(3, 4)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, fake_context=fake_context))
    torch.manual_seed(0)
    real = Scaled()
    x = torch.rand(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(program(x, model_state=real.state_dict()), real(x))
        torch.testing.assert_close(program(x, scale=torch.tensor(3.0)), real(x, torch.tensor(3.0)))


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.sum()


@pytest.fixture
def two_inputs(tmp_path) -> fx2onnx.ONNXProgram:
    return fx2onnx.dynamo_export(TwoInputs(), torch.rand(2, 3), torch.rand(2), export_options=make_options(tmp_path))


@pytest.mark.parametrize(
    ("y", "message"),
    [
        (torch.rand(5), r"Input 'y' has size 5 in dim 0; the program was exported with the static size 2 there.*dynamic_shapes=True"),
        (torch.rand(2).double(), r"Input 'y' is torch.float64; the program was exported with float32 there.*\.to\(torch.float32\)"),
        (torch.rand(2, 1), r"Input 'y' has 2 dim\(s\) \(2, 1\); the program was exported with 1 there"),
        (None, r"Input 'y' is None; the program was exported with a tensor there"),
        (torch.rand(2, device="meta"), r"Input 'y' is a tensor without data \(meta device or FakeTensor\)"),
    ],
    ids=["static_size", "dtype", "rank", "none", "meta"],
)
def test_inputs_that_do_not_fit_are_named(two_inputs, y, message):
    with pytest.raises(fx2onnx.UnsupportedInputError, match=message):
        two_inputs(torch.rand(2, 3), y)


def test_dynamic_dims_accept_other_sizes(tmp_path):
    program = fx2onnx.dynamo_export(
        TwoInputs(), torch.rand(2, 3), torch.rand(2), export_options=make_options(tmp_path, dynamic_shapes=True)
    )
    x, y = torch.rand(4, 6), torch.rand(7)
    torch.testing.assert_close(program(x, y), TwoInputs()(x, y))
    with pytest.raises(fx2onnx.UnsupportedInputError, match="Input 'y' has 2 dim"):
        program(x, torch.rand(7, 1))


class SharedBatch(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, y], dim=1)  # needs x and y of one batch


class PastAndNew(nn.Module):
    def forward(self, past: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.cat([past, new], dim=1) * mask  # mask: total = past + new


def test_shared_dynamic_dim_is_checked_before_onnxruntime(tmp_path, capfd):
    program = fx2onnx.dynamo_export(
        SharedBatch(), torch.rand(2, 3), torch.rand(2, 4), export_options=make_options(tmp_path, dynamic_shapes=True)
    )
    x_dims, y_dims = (list(value.shape) for value in program.model.graph.inputs)
    assert x_dims[0] == y_dims[0]  # one symbol on both inputs
    x, y = torch.rand(6, 3), torch.rand(6, 4)
    torch.testing.assert_close(program(x, y), SharedBatch()(x, y))
    capfd.readouterr()
    with pytest.raises(fx2onnx.UnsupportedInputError, match=rf"Input 'y' has size 6 in dim 0, and input 'x' has size 5 in dim 0; the program was exported with one dim '{x_dims[0]}' for both"):
        program(torch.rand(5, 3), torch.rand(6, 4))
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == "", "onnxruntime printed nothing: it never ran"


def test_sum_of_dynamic_dims_is_checked_before_onnxruntime(tmp_path, capfd):
    program = fx2onnx.dynamo_export(
        PastAndNew(), torch.rand(2, 3), torch.rand(2, 4), torch.rand(2, 7),
        export_options=make_options(tmp_path, dynamic_shapes=True),
    )
    past, new, mask = torch.rand(3, 5), torch.rand(3, 2), torch.rand(3, 7)
    torch.testing.assert_close(program(past, new, mask), PastAndNew()(past, new, mask))
    capfd.readouterr()
    with pytest.raises(
        fx2onnx.UnsupportedInputError,
        match=r"Input 'mask' has size 7 in dim 1; the program was exported with the size '.*' there, which is 8 for these "
        r"inputs \(.* from input 'new' dim 1, .* from input 'past' dim 1\)",
    ):
        program(torch.rand(3, 3), torch.rand(3, 5), torch.rand(3, 7))
    assert capfd.readouterr().err == ""


def test_onnxruntime_failure_raises_without_its_log_line(tmp_path, capfd):
    program = fx2onnx.dynamo_export(
        SharedBatch(), torch.rand(2, 3), torch.rand(2, 4), export_options=make_options(tmp_path, dynamic_shapes=True)
    )
    capfd.readouterr()
    with pytest.raises(Exception, match="Concat"):  # past fx2onnx's checks: onnxruntime's own error
        program.run_flat([torch.rand(5, 3), torch.rand(6, 4)])
    assert "[E:onnxruntime" not in capfd.readouterr().err


class KeywordConstants(nn.Module):
    def forward(self, x: torch.Tensor, *, alpha: float = 1.0, mode: str = "add", flag: bool = False, bias=None):
        y = x * alpha
        y = y + 1 if mode == "add" else y - 1
        y = y if bias is None else y + bias
        return -y if flag else y


@pytest.mark.parametrize("dynamic", [False, True])
def test_non_tensor_keyword_arguments_may_be_given_again(tmp_path, dynamic):
    # the former API's contract: program(x, alpha=2.0) works when exported with alpha=2.0
    model, x = KeywordConstants(), torch.rand(3, 4)
    exported = {"alpha": 2.0, "mode": "sub", "flag": True, "bias": None}
    with pytest.warns(UserWarning, match="baked into the ONNX graph"):
        program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, dynamic_shapes=dynamic), **exported)
    assert [v.name for v in program.model.graph.inputs] == ["x"]
    for given in (exported, dict(reversed(exported.items())), {**exported, "alpha": 2}):  # any order, 2 == 2.0
        torch.testing.assert_close(program(x, **given), model(x, **given))
    y = torch.rand(5 if dynamic else 3, 4)
    torch.testing.assert_close(program(y, **exported), model(y, **exported))


@pytest.mark.parametrize(
    ("argument", "given", "advice"),
    [("alpha", 3.0, "or export with a tensor there"), ("mode", "add", "fx2onnx.dynamo_export(..., mode='add')"),
     ("flag", False, "give True again")],
)
def test_a_non_tensor_keyword_argument_with_another_value_is_a_clear_error(tmp_path, argument, given, advice):
    exported = {"alpha": 2.0, "mode": "sub", "flag": True}
    with pytest.warns(UserWarning):
        program = fx2onnx.dynamo_export(KeywordConstants(), torch.rand(3), export_options=make_options(tmp_path), **exported)
    with pytest.raises(fx2onnx.UnsupportedInputError) as caught:
        program(torch.rand(3), **{**exported, argument: given})
    message = str(caught.value)
    assert f"Input '{argument}' was specialized to {exported[argument]!r}" in message
    assert f"but {given!r} was given" in message and "export again with the new value" in message and advice in message
