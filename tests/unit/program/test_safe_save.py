"""Saving never damages what is on disk: symlinks, non-regular files, failures and
interruptions, parent folders, stale data files. Both `save` and `save_diagnostics`."""

from __future__ import annotations

import errno
import os
import stat

import onnx
import pytest
import torch

import fx2onnx
from conftest import MLP, export_program
from diagnostics import files
from fx2onnx.program import model_writer
from sarif_checks import validate_sarif

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> fx2onnx.ONNXProgram:
    return export_program(MLP(), (torch.rand(2, 8),), tmp_path=tmp_path_factory.mktemp("export"))


def save_model(program, path, **kwargs):
    program.save(path, **kwargs)


def save_report(program, path, **kwargs):
    program.save_diagnostics(path)


def load_written(path) -> None:
    """The file is complete: a model loads and checks, a report is valid SARIF."""
    if str(path).endswith(".sarif"):
        validate_sarif(path)
    else:
        onnx.checker.check_model(os.fspath(path), full_check=True)


SAVERS = [pytest.param(save_model, ".onnx", id="save"), pytest.param(save_report, ".sarif", id="save_diagnostics")]


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize(("saver", "suffix"), SAVERS)
def test_symlink_target_is_written_and_link_kept(program, tmp_path, saver, suffix):
    target = tmp_path / "real" / f"target{suffix}"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / f"link{suffix}"
    link.symlink_to(target)
    saver(program, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() != b"old"
    load_written(target)
    assert listing(tmp_path) == ["link" + suffix, "real"]
    assert listing(target.parent) == [target.name]


@pytest.mark.parametrize(("saver", "suffix"), SAVERS)
def test_dangling_symlink_creates_its_target(program, tmp_path, saver, suffix):
    target = tmp_path / f"new{suffix}"
    link = tmp_path / f"link{suffix}"
    link.symlink_to(target)
    saver(program, link)
    assert link.is_symlink()
    load_written(target)


@needs_fifo
@pytest.mark.parametrize(("saver", "suffix"), SAVERS)
def test_fifo_is_refused_and_left_as_it_is(program, tmp_path, saver, suffix):
    fifo = tmp_path / f"pipe{suffix}"
    os.mkfifo(fifo)
    with pytest.raises(files.DestinationError, match=rf"'{fifo}'.*FIFO"):
        saver(program, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert listing(tmp_path) == [fifo.name]


@needs_fifo
def test_symlink_to_a_fifo_is_refused(program, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.onnx"
    link.symlink_to(fifo)
    with pytest.raises(files.DestinationError, match=r"link\.onnx.*symlink.*FIFO"):
        program.save(link)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()


@pytest.mark.parametrize(("saver", "suffix"), SAVERS)
def test_directory_is_refused_and_left_as_it_is(program, tmp_path, saver, suffix):
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(IsADirectoryError, match=rf"'{folder}'.*directory"):
        saver(program, folder)
    assert listing(folder) == ["keep.txt"] and listing(tmp_path) == [folder.name]


def test_data_file_destination_that_is_a_directory_is_refused(program, tmp_path):
    (tmp_path / "m.onnx.data").mkdir()
    with pytest.raises(IsADirectoryError, match="m.onnx.data"):
        program.save(tmp_path / "m.onnx", external_data=True)
    assert listing(tmp_path) == ["m.onnx.data"]


@pytest.mark.parametrize(("saver", "suffix"), SAVERS)
def test_missing_parent_folders_are_created(program, tmp_path, saver, suffix):
    path = tmp_path / "a" / "b" / f"out{suffix}"
    saver(program, path)
    load_written(path)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _os_for_files_module(monkeypatch, **replaced):
    """Replace `os` functions for `diagnostics.files` alone: patching the `os` module itself
    would also reach whatever else runs in the worker meanwhile (finalizers, other threads)."""

    class _Os:
        def __getattr__(self, name):
            return replaced[name] if name in replaced else getattr(os, name)

    monkeypatch.setattr(files, "os", _Os())


@pytest.mark.parametrize("external_data", [False, True])
def test_interrupted_save_leaves_old_files_and_no_temporary(program, tmp_path, monkeypatch, external_data):
    path = tmp_path / "m.onnx"
    program.save(path, external_data=external_data)
    before = {name: (tmp_path / name).read_bytes() for name in listing(tmp_path)}
    monkeypatch.setattr(model_writer, "_write_tensor", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        program.save(path, external_data=external_data)
    assert {name: (tmp_path / name).read_bytes() for name in listing(tmp_path)} == before


def test_interrupted_report_leaves_no_temporary(program, tmp_path, monkeypatch):
    _os_for_files_module(monkeypatch, fsync=_interrupt)
    with pytest.raises(KeyboardInterrupt):
        program.save_diagnostics(tmp_path / "r.sarif")
    assert listing(tmp_path) == []


def test_errors_name_the_users_path_not_a_temporary_one(program, tmp_path, monkeypatch):
    def refuse(source, destination):
        raise PermissionError(errno.EACCES, "Permission denied", os.fspath(source))

    _os_for_files_module(monkeypatch, replace=refuse)
    path = tmp_path / "m.onnx"
    with pytest.raises(PermissionError) as caught:
        program.save(path)
    assert caught.value.filename == os.fspath(path)
    assert "tmp-" not in str(caught.value).replace(str(tmp_path), "")
    assert listing(tmp_path) == []


def test_stale_data_file_of_a_previous_save_is_removed(program, tmp_path):
    path = tmp_path / "m.onnx"
    program.save(path, external_data=True)
    assert listing(tmp_path) == ["m.onnx", "m.onnx.data"]
    program.save(path, external_data=False)
    assert listing(tmp_path) == ["m.onnx"]
    load_written(path)
    # include_initializers=False leaves no data file either
    program.save(path, external_data=True)
    program.save(path, include_initializers=False)
    assert listing(tmp_path) == ["m.onnx"]


def test_data_file_not_written_by_fx2onnx_is_kept(program, tmp_path):
    path = tmp_path / "m.onnx"
    data = tmp_path / "m.onnx.data"
    # a file of the same name beside a model that does not reference it
    program.save(path)
    data.write_bytes(b"user data")
    program.save(path)
    assert data.read_bytes() == b"user data"
    # beside a model that another tool wrote, even if that model references it
    model = onnx.load(os.fspath(path))
    model.producer_name = "other-tool"
    onnx.save(model, os.fspath(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    written_by_other = data.read_bytes()
    program.save(path)
    assert data.read_bytes() == written_by_other
    # beside a file that is not a model at all
    path.write_bytes(b"not a model")
    program.save(path)
    assert data.read_bytes() == written_by_other


def test_leftovers_of_a_killed_save_are_removed(program, tmp_path):
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    dead = tmp_path / f".m.onnx.fx2onnx-tmp-{dead_pid}-0123abcd"
    alive = tmp_path / f".m.onnx.fx2onnx-tmp-{os.getppid()}-0123abcd"  # a running process's file
    other = tmp_path / ".m.onnx.something-else"
    for path in (dead, alive, other):
        path.write_bytes(b"partial")
    program.save(tmp_path / "m.onnx")
    assert not dead.exists()
    assert alive.exists() and other.exists()
