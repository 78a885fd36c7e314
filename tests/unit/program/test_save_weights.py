"""ONNXProgram.save with weights apart from the graph: model_state, include_initializers,
streamed external data, model_signature, byte-identical files."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import export_program
from fx2onnx.program import model_state as model_state_module


class Stateful(nn.Module):
    """Every kind of lifted input: parameters, persistent and non-persistent buffers, a
    constant tensor, a mutated buffer and a mutated user input."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("offset", torch.arange(4.0), persistent=False)
        self.register_buffer("calls", torch.zeros(1))
        self.table = torch.tensor([1.0, -1.0, 0.5, 0.25])  # a plain tensor attribute: a constant

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        acc.add_(x.sum(0))
        return self.proj(x) * self.scale + self.offset + self.table


def make_model(seed: int = 0) -> Stateful:
    torch.manual_seed(seed)
    return Stateful().eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(3, 4), torch.zeros(4)


@pytest.fixture
def program(tmp_path) -> fx2onnx.ONNXProgram:
    return export_program(make_model(), inputs(), tmp_path=tmp_path)


def test_model_signature_maps_names_both_ways(program, tmp_path):
    signature = program.model_signature
    assert signature.parameters == {"proj.weight": "proj.weight", "proj.bias": "proj.bias"}
    assert set(signature.buffers) == {"scale", "offset", "calls"}
    assert {e.torch_name: e.persistent for e in signature.inputs if e.kind == "buffer"} == {
        "scale": True, "offset": False, "calls": True,
    }
    assert list(signature.constants.values()) == [e.torch_name for e in signature.inputs if e.kind == "constant_tensor"]
    assert len(signature.constants) == 1
    assert signature.user_inputs == ["x", "acc"]
    assert list(signature.mutated_buffers.values()) == ["calls"]
    assert list(signature.mutated_inputs.values()) == ["acc"]
    assert len(signature.user_outputs) == 1
    assert set(signature.state_dict_names()) == set(make_model().state_dict())
    assert signature.torch_name_of(signature.onnx_name_of("calls")) == "calls"
    # every ONNX name the signature gives is in the saved graph, with the same role
    path = tmp_path / "m.onnx"
    program.save(path)
    graph = onnx.load(os.fspath(path)).graph
    assert [i.name for i in graph.input] == signature.user_inputs
    assert {t.name for t in graph.initializer} == {
        *signature.parameters, *signature.buffers, *signature.constants
    }
    assert [o.name for o in graph.output] == [e.onnx_name for e in signature.outputs]


def test_model_state_replaces_the_weights(program, tmp_path):
    other = make_model(seed=7)
    other.offset.fill_(5.0)
    path = tmp_path / "m.onnx"
    state = {**other.state_dict(), "offset": other.offset}
    program.save(path, model_state=state)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    x, acc = inputs()
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    result = session.run(None, {"x": x.numpy(), "acc": acc.numpy()})
    names = [o.name for o in session.get_outputs()]
    user = names.index(program.model_signature.user_outputs[0])
    with torch.no_grad():
        expected = other(x, acc.clone())
    np.testing.assert_allclose(result[user], expected.numpy(), rtol=1e-5, atol=1e-6)


def test_missing_and_unexpected_names_fail_before_writing(program, tmp_path):
    state = dict(make_model().state_dict())
    del state["proj.bias"]
    state["proj.weight_typo"] = torch.zeros(4, 4)
    path = tmp_path / "out" / "m.onnx"
    with pytest.raises(ValueError) as caught:
        program.save(path, model_state=state, external_data=True)
    message = str(caught.value)
    assert "missing 1 tensor(s) the model needs: 'proj.bias'" in message
    assert "1 unexpected name(s) the model does not have: 'proj.weight_typo'" in message
    assert not path.exists() and not path.with_name("m.onnx.data").exists()


def test_a_weight_of_the_wrong_shape_writes_nothing(program, tmp_path):
    state = dict(make_model().state_dict())
    state["proj.weight"] = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"proj.weight.*\(2, 8\).*\(4, 4\)"):
        program.save(tmp_path / "m.onnx", model_state=state, external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".sarif") == []


def test_checkpoint_in_another_precision_is_cast(program, tmp_path):
    state = {k: v.half() if v.is_floating_point() else v for k, v in make_model().state_dict().items()}
    path = tmp_path / "m.onnx"
    program.save(path, model_state=state)
    weight = next(t for t in onnx.load(os.fspath(path)).graph.initializer if t.name == "proj.weight")
    assert weight.data_type == onnx.TensorProto.FLOAT
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), state["proj.weight"].float().numpy())


def test_torch_checkpoints_are_memory_mapped(program, tmp_path, monkeypatch):
    checkpoint = tmp_path / "w.pt"
    torch.save({"state_dict": make_model().state_dict()}, checkpoint)  # wrapped state dicts too
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(model_state_module.torch, "load", spy)
    program.save(tmp_path / "m.onnx", model_state=checkpoint)
    assert calls and calls[0]["mmap"] is True and calls[0]["weights_only"] is True


class _LazyState(Mapping):
    """A state whose tensors are created when read (as a checkpoint reader does), tracking
    how many of them are alive at once."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self._state = dict(state)
        self._alive: list[weakref.ref] = []
        self.most_alive = 0

    def __getitem__(self, name: str) -> torch.Tensor:
        alive = [ref for ref in self._alive if ref() is not None]
        tensor = self._state[name].clone()
        self._alive = [*alive, weakref.ref(tensor)]
        self.most_alive = max(self.most_alive, len(self._alive))
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


@pytest.mark.parametrize("external_data", [False, True])
def test_weights_are_written_one_tensor_at_a_time(program, tmp_path, external_data):
    state = _LazyState({**make_model(seed=2).state_dict(), "offset": torch.arange(4.0)})
    path = tmp_path / "m.onnx"
    program.save(path, model_state=state, external_data=external_data)
    assert state.most_alive == 1
    saved = onnx.load(os.fspath(path))
    for tensor in saved.graph.initializer:
        torch_name = program.model_signature.torch_name_of(tensor.name)
        if torch_name in state:
            np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), state[torch_name].numpy())
    if not external_data:
        return
    saved = onnx.load(os.fspath(path), load_external_data=False)
    offsets = []
    for tensor in saved.graph.initializer:
        info = {e.key: e.value for e in tensor.external_data}
        assert info["location"] == "m.onnx.data"
        offsets.append((int(info["offset"]), int(info["length"])))
    # one data file, tensors packed in initializer order
    assert offsets == sorted(offsets)
    assert sum(length for _, length in offsets) == (tmp_path / "m.onnx.data").stat().st_size
    onnx.checker.check_model(os.fspath(path), full_check=True)


def test_without_initializers_weights_are_graph_inputs(program, tmp_path):
    path = tmp_path / "graph.onnx"
    program.save(path, include_initializers=False)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    graph = onnx.load(os.fspath(path)).graph
    assert len(graph.initializer) == 0
    weights = set(program.model.graph.initializers)
    assert {i.name for i in graph.input} == {"x", "acc"} | weights
    # round trip: feed the weights by name
    model = make_model()
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    (constant,) = program.model_signature.constants  # the `table` attribute
    named[constant] = model.table
    x, acc = inputs()
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy(), "acc": acc.numpy()}
    feed.update({name: named[name].detach().numpy() for name in weights})
    result = session.run(None, feed)
    user = [o.name for o in session.get_outputs()].index(program.model_signature.user_outputs[0])
    with torch.no_grad():
        np.testing.assert_allclose(result[user], model(x, acc.clone()).numpy(), rtol=1e-5, atol=1e-6)


def test_model_state_with_include_initializers_false_is_an_error(program, tmp_path):
    with pytest.raises(ValueError, match="include_initializers=False"):
        program.save(tmp_path / "m.onnx", include_initializers=False, model_state=make_model().state_dict())
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("external_data", [False, True])
def test_same_model_exported_twice_gives_identical_files(tmp_path, external_data):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        program = export_program(make_model(), inputs(), tmp_path=tmp_path)
        program.save(folder / "model.onnx", external_data=external_data)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_save_to_a_binary_stream(program, tmp_path):
    import io

    stream = io.BytesIO()
    program.save(stream)
    path = tmp_path / "m.onnx"
    program.save(path)
    assert stream.getvalue() == path.read_bytes()
    onnx.checker.check_model(onnx.load_from_string(stream.getvalue()), full_check=True)
    with pytest.raises(ValueError, match="path-like"):
        program.save(io.BytesIO(), external_data=True)
