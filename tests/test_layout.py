"""The layout holds: no import circles in fx2onnx, dispatcher and diagnostics; imports go
down the layers (fx2onnx -> dispatcher -> diagnostics) and along the stages of fx2onnx
(a stage imports only earlier ones; exporter.py alone knows them all); no module grows
past 600 lines; fx2onnx keeps at most a dozen modules beside its stage packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fx2onnx", "dispatcher", "diagnostics")
# fx2onnx's stages in the order a model goes through them
STAGES = ("capture", "fx_passes", "translate", "onnx_passes", "program", "hub", "cli")
# top-level modules every stage may use (no stage knowledge of their own)
SHARED = {"fx2onnx", "fx2onnx.errors", "fx2onnx.options", "fx2onnx.progress", "fx2onnx.private_ops",
          "fx2onnx.stage_timer", "fx2onnx.steps", "fx2onnx.collection_scope", "fx2onnx.user_warnings", "fx2onnx.version"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the three packages that `name` imports (any depth, TYPE_CHECKING too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import module` imports the module; `from module import name` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # importing a.b.c runs a/__init__ and a/b/__init__ first: edges of their own, which
    # are not a module's choice, so packages' own imports count for the package only
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circles():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _stage(name: str) -> int | None:
    parts = name.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[0] == "fx2onnx" and parts[1] in STAGES else None


def test_imports_go_down_the_layers_and_along_the_stages():
    wrong = []
    for module, targets in _graph().items():
        for target in targets:
            top, target_top = module.split(".")[0], target.split(".")[0]
            if PACKAGES.index(target_top) < PACKAGES.index(top):
                wrong.append(f"{module} imports {target} (a higher layer)")
            stage, target_stage = _stage(module), _stage(target)
            if module.startswith("fx2onnx") and target.startswith("fx2onnx."):
                if stage is None and module not in ("fx2onnx", "fx2onnx.exporter", "fx2onnx.__main__") and target not in SHARED:
                    wrong.append(f"{module} (shared) imports the stage module {target}")
                if stage is not None and target_stage is not None and target_stage > stage:
                    wrong.append(f"{module} ({STAGES[stage]}) imports {target} of a later stage ({STAGES[target_stage]})")
                if stage is not None and target == "fx2onnx.exporter":
                    wrong.append(f"{module} imports the exporter, which knows every stage")
    assert not wrong, "\n".join(sorted(wrong))


def test_diagnostics_imports_neither_torch_nor_onnx():
    for name, path in _modules().items():
        if name.startswith("diagnostics"):
            imported = {t.split(".")[0] for t in _raw_imports(path)}
            assert not imported & {"torch", "onnx", "onnxscript", "onnx_ir"}, name


def _raw_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_600_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_fx2onnx_keeps_a_dozen_modules_beside_its_stages():
    own = sorted(p.name for p in (ROOT / "fx2onnx").glob("*.py"))
    assert len(own) <= 12, own
    assert {p.name for p in (ROOT / "fx2onnx").iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(STAGES)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
