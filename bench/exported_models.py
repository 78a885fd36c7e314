"""Are the exported models the same node for node before and after a change?

A refactoring of the exporter must not change what it writes. This script runs a part of
the test suite (the end-to-end tests by default) with a pytest plugin that records, for
every model an export produces, a canonical text of its graph and functions: every node's
domain, operator, inputs, outputs and attributes, every value's type and shape, every
initializer's name, type and shape (not its data: tests may draw random weights). The
records of two runs are then compared test by test.

    python bench/exported_models.py record /tmp/before            # on the old commit
    python bench/exported_models.py record /tmp/after             # on the new commit
    python bench/exported_models.py compare /tmp/before /tmp/after
    python bench/exported_models.py record /tmp/x -- tests/e2e/test_e2e_models.py -k mlp
    python bench/exported_models.py compare /tmp/before /tmp/x --subset

`compare` exits 1 when a test's models differ or a test exported in one run and not in
the other, and prints the first differing lines of each.

The recording run keeps its temporary folders (``<folder>/tmp``, pytest's ``--basetemp``):
`compare` also compares the folders the tests wrote (export-hf's and the others), file by
file: the same file names, byte-identical configuration files (``.json``, ``.txt``), and
every ``.onnx`` file's canonical text (read without its external data).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_RECORD_DIR_VARIABLE = "FX2ONNX_EXPORTED_MODELS_DIR"
_WRITTEN_FILES = "tmp"  # the recording run's pytest --basetemp, inside the record folder
# files compared byte for byte; others by name (weights are random), .onnx by canonical text
_BYTE_COMPARED = {".json", ".txt", ".jinja", ".model"}
_NOT_COMPARED = {".sarif", ".log", ".pyc"}  # hold times and absolute paths
_NOT_COMPARED_NAMES = ("profile_",)  # onnxruntime's profiles: named after the time they were taken


# -- the canonical text of a model ------------------------------------------------------------
def _value_text(value: Any) -> str:
    if value is None:
        return "<none>"
    shape = "?" if value.shape is None else "[" + ",".join(str(d) for d in value.shape) + "]"
    return f"{value.name}:{value.type}{shape}"


def _attribute_text(attribute: Any) -> str:
    import onnx_ir as ir

    if attribute.type == ir.AttributeType.GRAPH:
        return f"{attribute.name}=graph{{{_graph_text(attribute.value)}}}"
    if attribute.type == ir.AttributeType.GRAPHS:
        return f"{attribute.name}=graphs{{" + "|".join(_graph_text(g) for g in attribute.value) + "}"
    if attribute.type == ir.AttributeType.TENSOR:
        tensor = attribute.value
        return f"{attribute.name}=tensor({tensor.dtype},{list(tensor.shape)},{_tensor_digest(tensor)})"
    if getattr(attribute, "is_ref", lambda: False)():
        return f"{attribute.name}=@{attribute.ref_attr_name}"
    return f"{attribute.name}={attribute.value!r}"


def _tensor_digest(tensor: Any) -> str:
    # Constants inside the graph are part of its structure (small ones): keep their digest.
    try:
        return hashlib.sha1(tensor.tobytes()).hexdigest()[:12]
    except Exception as error:  # a tensor without data (fake weights): say so in the text
        return f"no-data:{type(error).__name__}"


def _graph_text(graph: Any) -> str:
    lines = ["inputs " + " ".join(_value_text(v) for v in graph.inputs)]
    for name, value in sorted(getattr(graph, "initializers", {}).items()):
        lines.append(f"initializer {name}:{value.type}{list(value.shape) if value.shape is not None else '?'}")
    for node in graph:
        attributes = " ".join(_attribute_text(a) for a in node.attributes.values())
        lines.append(
            f"{node.domain}::{node.op_type}({', '.join(_value_text(v) for v in node.inputs)})"
            f" -> {', '.join(_value_text(v) for v in node.outputs)} {attributes}".rstrip()
        )
    lines.append("outputs " + " ".join(_value_text(v) for v in graph.outputs))
    return "\n".join(lines)


def model_text(model: Any) -> str:
    """The canonical text of an onnx_ir model: opsets, graph, then functions by identifier."""
    opsets = " ".join(f"{domain or 'ai.onnx'}:{version}" for domain, version in sorted(model.opset_imports.items()))
    parts = [f"opsets {opsets}", _graph_text(model.graph)]
    for identifier in sorted(model.functions, key=str):
        function = model.functions[identifier]
        parts.append(f"function {identifier} attributes {sorted(function.attributes)}\n{_graph_text(function)}")
    return "\n".join(parts)


# -- the pytest plugin (loaded in the recording run with -p) ----------------------------------
class _Recorder:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.current_test = "<collection>"
        self.records: dict[str, list[str]] = {}

    def pytest_runtest_setup(self, item: Any) -> None:
        self.current_test = item.nodeid

    def record(self, model: Any) -> None:
        try:
            text = model_text(model)
        except Exception as error:  # recorded, never hidden: the comparison shows it
            text = f"<could not describe the model: {type(error).__name__}: {error}>"
        self.records.setdefault(self.current_test, []).append(text)

    def pytest_sessionfinish(self, session: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"models-{os.getpid()}.json"
        path.write_text(json.dumps(self.records, indent=0, sort_keys=True))


def pytest_configure(config: Any) -> None:
    folder = os.environ.get(_RECORD_DIR_VARIABLE)
    if not folder:
        return
    from fx2onnx.program import onnx_program

    recorder = _Recorder(Path(folder))
    original_init = onnx_program.ONNXProgram.__init__

    def recording_init(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, model, *args, **kwargs)
        if model is not None:
            recorder.record(model)

    onnx_program.ONNXProgram.__init__ = recording_init
    config.pluginmanager.register(recorder, "fx2onnx-exported-models")


# -- the command line ---------------------------------------------------------------------------
def _record(folder: Path, pytest_args: list[str]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        _RECORD_DIR_VARIABLE: str(folder),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "exported_models", f"--basetemp={folder / _WRITTEN_FILES}",
        *(pytest_args or ["tests/e2e"]),
    ]
    return subprocess.call(command, cwd=ROOT, env=environment)


def _load(folder: Path) -> dict[str, list[str]]:
    records: dict[str, list[str]] = {}
    for path in sorted(folder.glob("models-*.json")):
        records.update(json.loads(path.read_text()))
    if not records:
        raise SystemExit(f"{folder} holds no records: run `record {folder}` first")
    return records


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The keys whose values differ (or are in one side only), with both values, in order."""
    return [(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def _print_text_difference(label: str, old: str, new: str, context_lines: int) -> None:
    diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0))
    print(f"{label}: {len(diff)} differing line(s)")
    print("\n".join("    " + line for line in diff[: context_lines + 2]))


def _compare(before_folder: Path, after_folder: Path, context_lines: int, subset: bool) -> int:
    before, after = _load(before_folder), _load(after_folder)
    if subset:  # the second run ran part of the tests: compare those only
        before = {test: models for test, models in before.items() if test in after}
    differing = _changed(before, after)
    for test, old, new in differing:
        if old is None or new is None:
            print(f"{test}: exported only in the {'second' if old is None else 'first'} run")
            continue
        if len(old) != len(new):
            print(f"{test}: {len(old)} model(s) before, {len(new)} after")
        for index, (a, b) in enumerate(zip(old, new)):
            if a != b:
                _print_text_difference(f"{test} [model {index}]", a, b, context_lines)
    total = len(set(before) | set(after))
    models = sum(len(v) for v in after.values())
    print(f"{total} tests with exports, {models} models after; {len(differing)} test(s) differ")
    return 1 if differing else 0


def _written_files(folder: Path) -> dict[str, str]:
    """Every file the recorded tests wrote, by path under the run's temporary folder: its
    digest (configuration files), its canonical text (ONNX models) or nothing (the rest)."""
    import onnx_ir as ir

    root = folder / _WRITTEN_FILES
    files: dict[str, str] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if path.suffix in _NOT_COMPARED or path.name.startswith(_NOT_COMPARED_NAMES) or "__pycache__" in relative:
            continue
        if path.suffix == ".onnx":
            try:
                files[relative] = model_text(ir.load(path))  # external data stays unread
            except Exception as error:  # shown by the comparison, never hidden
                files[relative] = f"<could not read the model: {type(error).__name__}: {error}>"
        elif path.suffix in _BYTE_COMPARED:
            # a file that names the record's own folder (a client's job file) is compared without it
            data = path.read_bytes().replace(str(folder.resolve()).encode(), b"<record>")
            files[relative] = hashlib.sha1(data).hexdigest()
        else:
            files[relative] = ""
    return files


def _compare_written(before_folder: Path, after_folder: Path, context_lines: int, subset: bool) -> int:
    if not (before_folder / _WRITTEN_FILES).is_dir() or not (after_folder / _WRITTEN_FILES).is_dir():
        print("written files not compared: a record has no temporary folder (recorded before it kept one)")
        return 0
    before, after = _written_files(before_folder), _written_files(after_folder)
    if subset:  # the second run ran part of the tests: compare the folders it wrote
        tops = {name.split("/", 1)[0] for name in after}
        before = {name: text for name, text in before.items() if name.split("/", 1)[0] in tops}
    differing = _changed(before, after)
    for name, old, new in differing:
        if old is None or new is None:
            print(f"{name}: written only in the {'second' if old is None else 'first'} run")
        elif name.endswith(".onnx"):
            _print_text_difference(name, old, new, context_lines)
        else:
            print(f"{name}: different bytes")
    models = sum(name.endswith(".onnx") for name in after)
    configs = sum(bool(text) and not name.endswith(".onnx") for name, text in after.items())
    print(f"{len(after)} files written after ({models} ONNX models, {configs} configuration files); {len(differing)} differ")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="run tests and record every exported model's text")
    record.add_argument("folder", type=Path)
    record.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default tests/e2e)")
    compare = commands.add_parser("compare", help="compare the records of two runs")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    compare.add_argument("--lines", type=int, default=12, help="differing lines shown per model")
    compare.add_argument("--subset", action="store_true", help="the second run ran part of the tests: compare only its tests")
    arguments = parser.parse_args()
    if arguments.command == "record":
        return _record(arguments.folder, arguments.pytest_args)
    exported = _compare(arguments.before, arguments.after, arguments.lines, arguments.subset)
    written = _compare_written(arguments.before, arguments.after, arguments.lines, arguments.subset)
    return exported or written


if __name__ == "__main__":
    sys.exit(main())
