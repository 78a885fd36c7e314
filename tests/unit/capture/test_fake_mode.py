"""Fake mode: models built under `enable_fake_mode()`, exported without weight data, saved
or run with the real weights afterwards."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import pytest
import safetensors.torch
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import fx2onnx
from fx2onnx.onnx_passes.fake_weights import fake_weights
from conftest import assert_outputs_close, make_options


class Net(nn.Module):
    """Parameters, a persistent buffer, a non-persistent buffer and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.norm = nn.BatchNorm1d(12)
        self.fc2 = nn.Linear(12, 3)
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, 3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) + self.shift


def real_net() -> Net:
    torch.manual_seed(1)
    net = Net().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        net.norm.running_mean.uniform_(-0.5, 0.5)
        net.norm.running_var.uniform_(0.5, 2.0)
    return net


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """state_dict() plus the non-persistent buffers it leaves out."""
    return {**model.state_dict(), **dict(model.named_buffers())}


def fake_export(tmp_path, make_model=Net, shape=(4, 6), **options) -> tuple[fx2onnx.ONNXProgram, nn.Module]:
    with fx2onnx.enable_fake_mode() as fake_context:
        model = make_model().eval()
        x = torch.rand(*shape)
    assert isinstance(model.fc1.weight, FakeTensor) and isinstance(x, FakeTensor)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, fake_context=fake_context, **options))
    return program, model


def run_file(path, *inputs: torch.Tensor) -> list[torch.Tensor]:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(out) for out in session.run(None, feed)]


def test_fake_export_declares_weights_without_data(tmp_path):
    program, _ = fake_export(tmp_path)
    assert not program.has_weight_data
    initializers = program.model.graph.initializers
    assert initializers["fc1.weight"].dtype == onnx.TensorProto.FLOAT
    assert initializers["fc1.weight"].shape.numpy() == (12, 6)
    assert initializers["norm.running_var"].shape.numpy() == (12,)
    # The proto of a fake program: weights are graph inputs named after them, no data.
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert len(proto.graph.initializer) == 0
    inputs = {i.name: i for i in proto.graph.input}
    assert {"x", "fc1.weight", "fc1.bias", "norm.running_mean", "shift"} <= set(inputs)
    dims = [d.dim_value for d in inputs["fc2.weight"].type.tensor_type.shape.dim]
    assert dims == [3, 12]


@pytest.mark.parametrize("source", ["state_dict", "torch_save", "safetensors"])
def test_fake_export_saved_with_real_weights_matches_eager(tmp_path, source):
    program, _ = fake_export(tmp_path)
    real = real_net()
    state = full_state(real)
    if source == "torch_save":
        model_state = tmp_path / "weights.pt"
        torch.save(state, model_state)
    elif source == "safetensors":
        model_state = tmp_path / "weights.safetensors"
        safetensors.torch.save_file(state, model_state)
    else:
        model_state = state
    path = tmp_path / "model.onnx"
    program.save(path, model_state=model_state)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path))
    assert {t.name for t in saved.graph.initializer} == set(program.model.graph.initializers)
    x = torch.rand(4, 6)
    (actual,) = run_file(path, x)
    with torch.no_grad():
        torch.testing.assert_close(actual, real(x))
    # Saving again gives the same file (no duplicated initializers).
    program.save(tmp_path / "again.onnx", model_state=model_state)
    assert (tmp_path / "again.onnx").read_bytes() == path.read_bytes()


def test_fake_program_with_external_data_matches_eager(tmp_path):
    program, _ = fake_export(tmp_path)
    real = real_net()
    path = tmp_path / "model.onnx"
    program.save(path, model_state=full_state(real), external_data=True)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in saved.graph.initializer)
    expected_bytes = sum(v.const_value.nbytes for v in program.model.graph.initializers.values())
    assert (tmp_path / "model.onnx.data").stat().st_size == expected_bytes
    x = torch.rand(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(run_file(path, x)[0], real(x))


def test_running_a_fake_program_needs_weights(tmp_path):
    program, _ = fake_export(tmp_path)
    real = real_net()
    x = torch.rand(4, 6)
    with pytest.raises(ValueError, match=r"fake mode.*save\(path, model_state=\.\.\.\)"):
        program(x)
    with torch.no_grad():
        assert_outputs_close(program(x, model_state=full_state(real)), real(x))
        # the weights stay loaded for later runs
        assert_outputs_close(program(x + 1), real(x + 1))


def test_saving_a_fake_program_without_weights_is_an_error(tmp_path):
    program, _ = fake_export(tmp_path)
    with pytest.raises(ValueError, match="fake mode.*model_state"):
        program.save(tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


def test_buffers_are_real_and_a_state_dict_is_enough(tmp_path):
    """Buffers are computed at construction (real), parameters are fake: the saved model
    needs only what a checkpoint holds."""
    program, model = fake_export(tmp_path)
    assert not isinstance(model.shift, FakeTensor) and not isinstance(model.norm.running_var, FakeTensor)
    torch.testing.assert_close(model.shift, torch.linspace(-1.0, 1.0, 3))
    assert set(program.model.graph.initializers) - set(fake_weights(program.model)) == {
        "shift", "norm.running_mean", "norm.running_var"
    }
    real = real_net()
    path = tmp_path / "model.onnx"
    program.save(path, model_state=real.state_dict())  # no non-persistent buffer given
    onnx.checker.check_model(os.fspath(path), full_check=True)
    x = torch.rand(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(run_file(path, x)[0], real(x))


def test_missing_non_persistent_buffer_without_data_is_named_with_a_hint(tmp_path):
    """A buffer registered after construction, inside the block, is fake: it must be given."""
    with fx2onnx.enable_fake_mode() as fake_context:
        model = Net().eval()
        del model.shift
        model.register_buffer("shift", torch.linspace(-1.0, 1.0, 3), persistent=False)
        x = torch.rand(4, 6)
    assert isinstance(model.shift, FakeTensor)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, fake_context=fake_context))
    with pytest.raises(ValueError, match=r"missing 1 tensor.*'shift'.*Non-persistent buffers"):
        program.save(tmp_path / "model.onnx", model_state=real_net().state_dict())
    assert not (tmp_path / "model.onnx").exists()


def test_real_model_with_fake_inputs(tmp_path):
    real = real_net()
    with fx2onnx.enable_fake_mode() as fake_context:
        x = torch.rand(4, 6)
    program = fx2onnx.dynamo_export(real, x, export_options=make_options(tmp_path, fake_context=fake_context))
    assert program.has_weight_data  # the weights are the real model's
    x = torch.rand(4, 6)
    with torch.no_grad():
        assert_outputs_close(program(x), real(x))


@pytest.mark.parametrize("case", ["fake_without_context", "real_inputs_with_context", "all_real_with_context"])
def test_fake_mode_misuse_is_a_clear_error(tmp_path, case):
    with fx2onnx.enable_fake_mode() as fake_context:
        fake_model = Net().eval()
        fake_x = torch.rand(4, 6)
    model, x, context = {
        "fake_without_context": (fake_model, fake_x, None),
        "real_inputs_with_context": (fake_model, torch.rand(4, 6), fake_context),
        "all_real_with_context": (real_net(), torch.rand(4, 6), fake_context),
    }[case]
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, fake_context=context))
    assert "enable_fake_mode" in str(caught.value.__cause__)


class Counter(nn.Module):
    """BatchNorm in training mode: running statistics are mutated buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))


def test_mutated_buffers_under_fake_mode(tmp_path):
    with fx2onnx.enable_fake_mode() as fake_context:
        model = Counter().train()
        x = torch.rand(8, 5)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, fake_context=fake_context))
    mutated = program.model_signature.mutated_buffers
    assert set(mutated.values()) >= {"norm.running_mean", "norm.running_var"}
    torch.manual_seed(3)
    real = Counter().train()
    path = tmp_path / "model.onnx"
    program.save(path, model_state=real.state_dict())
    onnx.checker.check_model(os.fspath(path), full_check=True)
    x = torch.rand(8, 5)
    outputs = run_file(path, x)
    names = [o.name for o in onnx.load(os.fspath(path)).graph.output]
    expected = real(x)  # updates real's running statistics
    torch.testing.assert_close(outputs[names.index(program.model_signature.user_outputs[0])], expected.detach())
    for onnx_name, buffer in mutated.items():
        want = real.get_buffer(buffer)
        torch.testing.assert_close(outputs[names.index(onnx_name)].reshape(want.shape), want)


def test_dynamic_shapes_under_fake_mode(tmp_path):
    program, _ = fake_export(tmp_path, dynamic_shapes=True)
    x_input = next(i for i in program.model_proto.graph.input if i.name == "x")
    assert x_input.type.tensor_type.shape.dim[0].dim_param  # a named symbolic dim
    real = real_net()
    path = tmp_path / "model.onnx"
    program.save(path, model_state=full_state(real))
    for batch in (4, 9):
        x = torch.rand(batch, 6)
        with torch.no_grad():
            torch.testing.assert_close(run_file(path, x)[0], real(x))


def test_module_functions_kept_under_fake_mode(tmp_path):
    program, _ = fake_export(tmp_path)
    path = tmp_path / "model.onnx"
    program.save(path, model_state=full_state(real_net()))
    saved = onnx.load(os.fspath(path))
    function_names = {f.name for f in saved.functions}
    assert any("Linear" in name for name in function_names), function_names
    assert any("BatchNorm" in name for name in function_names), function_names
    assert any(node.domain == saved.functions[0].domain for node in saved.graph.node)


def test_optimized_fake_export_keeps_declared_weights(tmp_path):
    program, _ = fake_export(tmp_path, optimize=True)
    assert not program.has_weight_data
    real = real_net()
    x = torch.rand(4, 6)
    with torch.no_grad():
        assert_outputs_close(program(x, model_state=full_state(real)), real(x))


def test_tiny_llama_in_fake_mode(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64, max_position_embeddings=32, use_cache=False,
    )
    with fx2onnx.enable_fake_mode() as fake_context:
        model = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, 64, (1, 8))
    program = fx2onnx.dynamo_export(model, ids, export_options=make_options(tmp_path, fake_context=fake_context))
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM(config).eval()
    checkpoint = tmp_path / "model.safetensors"
    # safetensors refuses tensors that share memory (tied embeddings): store copies
    safetensors.torch.save_file({k: v.clone() for k, v in full_state(real).items()}, checkpoint)
    path = tmp_path / "llama.onnx"
    program.save(path, model_state=checkpoint)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        expected = real(ids).logits
    torch.testing.assert_close(run_file(path, ids)[0], expected, rtol=1e-4, atol=1e-4)


def test_weights_from_a_real_module_or_apply_weights(tmp_path):
    program, _ = fake_export(tmp_path)
    real = real_net()
    x = torch.rand(4, 6)
    with torch.no_grad():
        expected = real(x)
    assert_outputs_close(program(x, model_with_state_dict=real), expected)
    again, _ = fake_export(tmp_path)
    again.apply_weights(full_state(real))
    assert_outputs_close(again(x), expected)
    path = tmp_path / "applied.onnx"
    again.save(path)
    torch.testing.assert_close(run_file(path, x)[0], expected)


def test_export_inside_the_fake_mode_block(tmp_path):
    """dynamo_export called inside `with enable_fake_mode()`, with dynamic shapes and a
    constant built in forward (torch.arange) that must stay real."""

    class WithConstant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.gelu(self.fc(x)) * 2.5 + torch.arange(8.0)

    with fx2onnx.enable_fake_mode() as fake_context:
        model = WithConstant().eval()
        program = fx2onnx.dynamo_export(
            model, torch.rand(3, 4), export_options=make_options(tmp_path, fake_context=fake_context, dynamic_shapes=True)
        )
    real = WithConstant().eval()
    x = torch.rand(5, 4)
    with torch.no_grad():
        assert_outputs_close(program(x, model_state=real.state_dict()), real(x))


def test_private_fake_mode_helper_is_where_it_was():
    """outside_fake_mode reaches torch's private unset_fake_temporarily: fail loudly if it moves."""
    from fx2onnx.capture.fake_mode import outside_fake_mode

    with fx2onnx.enable_fake_mode():
        with outside_fake_mode():
            assert not isinstance(torch.ones(1), FakeTensor)
        assert isinstance(torch.ones(1), FakeTensor)


def test_fake_export_twice_gives_identical_files(tmp_path):
    state = full_state(real_net())
    files = []
    for name in ("a", "b"):
        program, _ = fake_export(tmp_path, dynamic_shapes=True)
        program.save(tmp_path / name / "model.onnx", model_state=state, external_data=True)
        files.append([(tmp_path / name / f).read_bytes() for f in ("model.onnx", "model.onnx.data")])
    assert files[0] == files[1]


def test_a_tensor_faked_again_gets_the_dims_asked_whatever_fakes_of_it_live():
    """A fake mode gives a real tensor's earlier fake again while that fake lives (until the
    collector frees an export's reference cycles): fake_copy's dims are the ones asked for,
    and running the mode on the tensor afterwards gives its sizes as numbers, either order."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    from fx2onnx.capture.fake_mode import fake_copy

    real = torch.rand(2, 3, 32, 32)
    with fx2onnx.enable_fake_mode() as fake_context:
        pass
    mode = fake_context.fake_mode
    symbolic = fake_copy(mode, real)  # held, as an uncollected export holds its inputs
    assert all(isinstance(size, torch.SymInt) for size in symbolic.shape)
    with mode:
        ran = real.clone()
    assert ran.shape == (2, 3, 32, 32) and not free_symbols(ran)
    assert not free_symbols(fake_copy(mode, real, static=True))
    assert free_symbols(fake_copy(mode, real)) and not free_symbols(ran)  # the run's fake is not given back either


def test_a_class_defined_inside_keeps_the_init_its_decorator_wraps():
    # transformers imports a model's module lazily, inside the block, and decorates some classes after their
    # definition (`@use_experts_implementation` wraps __init__ to set `self.config`): later real models keep it
    def setting_config(cls):
        own = cls.__init__

        def __init__(self, *args, **kwargs):
            own(self, *args, **kwargs)
            self.config = "set"

        cls.__init__ = __init__
        return cls

    with fx2onnx.enable_fake_mode():
        @setting_config
        class Experts(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = nn.Parameter(torch.ones(2))

        inside = Experts()
    assert isinstance(inside.weight, FakeTensor) and inside.config == "set"
    outside = Experts()
    assert not isinstance(outside.weight, FakeTensor) and outside.config == "set"
