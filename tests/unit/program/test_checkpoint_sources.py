"""model_state as users have it: save_pretrained folders (sharded or not, safetensors or
.bin), Hugging Face cache snapshots, checkpoints of the base model, tied weights, and the
dtype rule."""

from __future__ import annotations

import json
import os

import onnx
import pytest
import safetensors.torch
import torch
from torch import nn

import fx2onnx
from conftest import make_options


class Tied(nn.Module):
    """An embedding tied to the output projection, a norm and a persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((6,), 0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)) * self.scale)


def real_model(seed: int = 3) -> Tied:
    torch.manual_seed(seed)
    model = Tied().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.scale.uniform_(0.5, 1.5)
    return model


def ids() -> torch.Tensor:
    return torch.tensor([[1, 4, 9, 0]])


@pytest.fixture
def program(tmp_path) -> fx2onnx.ONNXProgram:
    with fx2onnx.enable_fake_mode() as fake_context:
        model = Tied().eval()
        example = torch.zeros(1, 4, dtype=torch.int64)
    return fx2onnx.dynamo_export(model, example, export_options=make_options(tmp_path, fake_context=fake_context))


def state_without_ties(model: nn.Module) -> dict[str, torch.Tensor]:
    """What save_pretrained writes: one name per tensor (the first), copies."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict().items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor.clone()
    return state


def write_sharded_safetensors(folder, state: dict[str, torch.Tensor], shards: int = 3) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: state[name] for name in names[index::shards]}
        safetensors.torch.save_file(part, folder / file)
        weight_map.update({name: file for name in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def saved_bytes(program, tmp_path, model_state, name: str) -> bytes:
    path = tmp_path / f"{name}.onnx"
    program.save(path, model_state=model_state)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    return path.read_bytes()


def expected_bytes(program, tmp_path) -> bytes:
    return saved_bytes(program, tmp_path, state_without_ties(real_model()), "expected")


def test_sharded_safetensors_folder(program, tmp_path):
    write_sharded_safetensors(tmp_path / "ckpt", state_without_ties(real_model()))
    assert saved_bytes(program, tmp_path, tmp_path / "ckpt", "sharded") == expected_bytes(program, tmp_path)
    with torch.no_grad():
        expected = real_model()(ids())
    torch.testing.assert_close(program(ids(), model_state=tmp_path / "ckpt"), expected)


def test_single_safetensors_and_pytorch_model_bin_folders(program, tmp_path):
    state = state_without_ties(real_model())
    (tmp_path / "st").mkdir()
    safetensors.torch.save_file(state, tmp_path / "st" / "model.safetensors")
    (tmp_path / "bin").mkdir()
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    sharded_bin = tmp_path / "bin_sharded"
    sharded_bin.mkdir()
    names = list(state)
    torch.save({n: state[n] for n in names[:2]}, sharded_bin / "pytorch_model-00001-of-00002.bin")
    torch.save({n: state[n] for n in names[2:]}, sharded_bin / "pytorch_model-00002-of-00002.bin")
    weight_map = {n: f"pytorch_model-0000{1 if i < 2 else 2}-of-00002.bin" for i, n in enumerate(names)}
    (sharded_bin / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expected = expected_bytes(program, tmp_path)
    for folder in ("st", "bin", "bin_sharded"):
        assert saved_bytes(program, tmp_path, tmp_path / folder, folder) == expected, folder


def hub_cache(tmp_path, state: dict[str, torch.Tensor], revisions: list[str], refs_main: bool = True):
    """A Hugging Face cache folder: files in blobs/, linked from snapshots/<revision>/."""
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    safetensors.torch.save_file(state, repo / "blobs" / "abc123")
    for revision in revisions:
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (snapshot / "model.safetensors").symlink_to(os.path.relpath(repo / "blobs" / "abc123", snapshot))
    if refs_main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revisions[-1])
    return repo


def test_hugging_face_cache_snapshot_and_repo_folder(program, tmp_path):
    repo = hub_cache(tmp_path, state_without_ties(real_model()), ["0a1b", "9f8e"])
    expected = expected_bytes(program, tmp_path)
    assert saved_bytes(program, tmp_path, repo / "snapshots" / "0a1b", "snapshot") == expected
    assert saved_bytes(program, tmp_path, repo, "repo") == expected  # through refs/main


def test_cache_folder_with_several_snapshots_and_no_ref_is_an_error(program, tmp_path):
    repo = hub_cache(tmp_path, state_without_ties(real_model()), ["0a1b", "9f8e"], refs_main=False)
    with pytest.raises(ValueError, match=r"2 snapshots \(0a1b, 9f8e\).*snapshots/<revision>"):
        program.save(tmp_path / "m.onnx", model_state=repo)
    assert not (tmp_path / "m.onnx").exists()


def test_missing_shard_and_empty_folder_are_errors(program, tmp_path):
    write_sharded_safetensors(tmp_path / "ckpt", state_without_ties(real_model()))
    (tmp_path / "ckpt" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"names 1 shard file\(s\) that are not in the folder: model-00002-of-00003"):
        program.save(tmp_path / "m.onnx", model_state=tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no weights: expected model.safetensors"):
        program.save(tmp_path / "m.onnx", model_state=tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"does not exist: give a .safetensors"):
        program.save(tmp_path / "m.onnx", model_state=tmp_path / "nowhere")
    assert not (tmp_path / "m.onnx").exists()


def test_checkpoint_with_or_without_a_prefix(program, tmp_path):
    state = state_without_ties(real_model())
    expected = expected_bytes(program, tmp_path)
    prefixed = {f"model.{name}": tensor for name, tensor in state.items()}
    assert saved_bytes(program, tmp_path, prefixed, "prefixed") == expected


def test_tied_weight_under_its_other_name(program, tmp_path):
    state = state_without_ties(real_model())
    state["head.weight"] = state.pop("embed.weight")  # the checkpoint kept the head's name
    assert saved_bytes(program, tmp_path, state, "tied") == expected_bytes(program, tmp_path)


def test_unexpected_names_warn_and_missing_buffers_are_kept(program, tmp_path):
    state = state_without_ties(real_model())
    state["old.attn.masked_bias"] = torch.tensor(-1e4)
    with pytest.warns(UserWarning, match=r"1 tensor\(s\) the exported model does not use, ignored: 'old.attn.masked_bias'"):
        program.save(tmp_path / "extra.onnx", model_state=state)
    del state["old.attn.masked_bias"], state["scale"]
    with pytest.warns(UserWarning, match=r"lacks 1 buffer\(s\).*'scale'.*values at export are kept"):
        program.save(tmp_path / "kept.onnx", model_state=state)
    saved = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(os.fspath(tmp_path / "kept.onnx")).graph.initializer}
    torch.testing.assert_close(torch.from_numpy(saved["scale"]), torch.full((6,), 0.5))  # computed at construction


def test_dtype_rule_converts_floats_and_refuses_the_rest(program, tmp_path):
    state = {k: v.to(torch.bfloat16) for k, v in state_without_ties(real_model()).items()}
    path = tmp_path / "m.onnx"
    with pytest.warns(UserWarning, match="torch.bfloat16 tensors where the exported model has torch.float32"):
        program.save(path, model_state=state)
    saved = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(os.fspath(path)).graph.initializer}
    assert saved["norm.weight"].dtype.name == "float32"
    torch.testing.assert_close(torch.from_numpy(saved["norm.weight"]), state["norm.weight"].float())
    state["norm.weight"] = state["norm.weight"].to(torch.int32)
    with pytest.raises(TypeError, match=r"model_state\['norm.weight'\] is torch.int32.*Only floating-point precisions"):
        program.save(tmp_path / "bad.onnx", model_state=state)
    assert not (tmp_path / "bad.onnx").exists()


def test_shard_files_are_read_tensor_by_tensor(program, tmp_path, monkeypatch):
    """Each tensor is read from its own shard (named by the index), the file opened for it
    and closed after: no shard's memory map outlives the tensor being written."""
    write_sharded_safetensors(tmp_path / "ckpt", state_without_ties(real_model()), shards=3)
    import safetensors as safetensors_module

    opened, open_now = [], []
    real_open = safetensors_module.safe_open

    class Spy:
        def __init__(self, path, *args, **kwargs):
            self.handle = real_open(path, *args, **kwargs)
            opened.append(os.path.basename(path))

        def __enter__(self):
            open_now.append(1)
            return self.handle.__enter__()

        def __exit__(self, *exc):
            open_now.pop()
            return self.handle.__exit__(*exc)

    monkeypatch.setattr(safetensors_module, "safe_open", Spy)
    program.save(tmp_path / "m.onnx", model_state=tmp_path / "ckpt")
    weight_map = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(opened) == set(weight_map.values())  # every shard, each for the tensors it holds
    assert len(opened) > len(set(opened))  # opened per tensor, not kept open
    assert open_now == []


def test_transformers_checkpoint_renaming_is_where_it_was():
    """transformers_checkpoints reads transformers' renaming table: fail loudly if it moves."""
    transformers = pytest.importorskip("transformers")
    from fx2onnx.capture.libraries.transformers_checkpoints import checkpoint_renaming

    config = transformers.GPTNeoXConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32)
    rename = checkpoint_renaming(transformers.GPTNeoXForCausalLM(config))
    assert rename is not None and rename("embed_out.weight") == "lm_head.weight"
    assert checkpoint_renaming(Tied()) is None
