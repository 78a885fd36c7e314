"""The layout holds: no import circles in fx2onnx, dispatcher and diagnostics; imports go
down the layers (fx2onnx -> dispatcher -> diagnostics) and along the stages of fx2onnx
(a stage imports only earlier ones; exporter.py alone knows them all); no module grows
past 600 lines; fx2onnx keeps at most a dozen modules beside its stage packages; no two
modules of fx2onnx share a file name; the applications (cli, hub) import only public names;
export-hf's recipe modules import no other recipe, and every hub module is imported by a test."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fx2onnx", "dispatcher", "diagnostics")
# fx2onnx's stages in the order a model goes through them, then its applications (cli, hub)
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


# Modules under fx2onnx/ that share a file name today, each to be renamed (remove the entry then).
SHARED_FILE_NAMES_TO_RENAME: set[str] = set()


def _modules_sharing_a_file_name() -> dict[str, list[str]]:
    paths: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "fx2onnx").rglob("*.py")):
        if path.name != "__init__.py":
            paths[path.name].append(str(path.relative_to(ROOT)))
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_no_two_modules_of_fx2onnx_share_a_file_name():
    shared = _modules_sharing_a_file_name()
    new = {name: found for name, found in shared.items() if name not in SHARED_FILE_NAMES_TO_RENAME}
    assert not new, f"modules named alike (name each for what it does): {new}"
    assert set(shared) >= SHARED_FILE_NAMES_TO_RENAME, (
        f"{sorted(SHARED_FILE_NAMES_TO_RENAME - set(shared))} no longer shared: remove from SHARED_FILE_NAMES_TO_RENAME")


# -- applications import only public names ---------------------------------------------------
# An application of the public API (the command line, the hub export) imports, from outside
# its own package, only public names: a name is public when the `__all__` of `fx2onnx`, of a
# package's `__init__.py` under it (a stage: `fx2onnx.capture`, ...) or of `dispatcher` or
# `diagnostics` lists it. A module path below a package (`fx2onnx.capture.hints`) is private.
APPLICATIONS = ("fx2onnx.cli", "fx2onnx.hub")


def _declared_all(path: Path) -> set[str] | None:
    """The names of the `__all__ = [...]` of `path`, or None when it declares none."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def _public_names() -> dict[str, set[str]]:
    """package -> its public names, for every package of the three that declares `__all__`."""
    return {name: names for name, path in _modules().items()
            if path.name == "__init__.py" and (names := _declared_all(path)) is not None}


def _non_public_imports(module: str, source: str, public: dict[str, set[str]]) -> list[str]:
    """What `module`, of an application, takes from outside its application that is not public."""
    application = next(a for a in APPLICATIONS if module == a or module.startswith(a + "."))
    package = module.rsplit(".", 1)[0]
    tree = ast.parse(source)
    wrong: list[str] = []

    def outside(target: str) -> bool:
        return target.split(".")[0] in PACKAGES and target != application and not target.startswith(application + ".")

    def check(source_package: str, names: list[str], line: int) -> None:
        if source_package not in public:
            wrong.append(f"{module}:{line} imports from {source_package}, which is not a package with __all__")
            return
        for name in names:
            if name not in public[source_package] or (name.startswith("_") and not name.startswith("__")):
                wrong.append(f"{module}:{line} imports {source_package}.{name}, not in {source_package}.__all__")

    imported: set[str] = set()  # names bound by `import package`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if outside(base):
                check(base, [alias.name for alias in node.names], node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if outside(alias.name) and alias.name not in public:
                    wrong.append(f"{module}:{node.lineno} imports {alias.name}, which is not a package with __all__")
                if alias.name.split(".")[0] in PACKAGES:
                    imported.add(alias.asname or alias.name.split(".")[0])
    # a name read through an imported package (`fx2onnx.capture.hints.x`) is as private as its import
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts, value = [], node
        while isinstance(value, ast.Attribute):
            parts.insert(0, value.attr)
            value = value.value
        if not (isinstance(value, ast.Name) and value.id in imported):
            continue
        dotted = [value.id, *parts]
        prefix = max((n for n in range(1, len(dotted)) if ".".join(dotted[:n]) in public), default=None)
        if prefix is not None and outside(".".join(dotted[: prefix + 1])):
            check(".".join(dotted[:prefix]), [dotted[prefix]], node.lineno)
    return sorted(set(wrong))


def test_applications_import_only_public_names():
    public = _public_names()
    wrong = [found for name, path in _modules().items() if name.startswith(tuple(a + "." for a in APPLICATIONS)) or name in APPLICATIONS
             for found in _non_public_imports(name, path.read_text(encoding="utf-8"), public)]
    assert not wrong, "an application imports a name that is not public (list it in a package's __all__):\n" + "\n".join(wrong)


def test_the_public_name_rule_finds_a_planted_violation():
    public = _public_names()
    planted = (
        "import fx2onnx\n"
        "from fx2onnx import ExportOptions, dynamo_export\n"
        "from fx2onnx.capture import model_name\n"
        "from fx2onnx.hub.loading import TASKS\n"  # the application's own module
        "from fx2onnx.capture.hints import signature_text\n"  # a module path
        "from fx2onnx.capture import torch_export\n"  # a module not listed
        "from fx2onnx.translate import interpreter\n"  # a package without __all__
        "def f():\n"
        "    fx2onnx.dynamo_export, fx2onnx.ExportOptions.RUNTIMES\n"
        "    return fx2onnx.exporter.dynamo_export\n"  # read through the package
    )
    assert _non_public_imports("fx2onnx.hub.planted", planted, public) == [
        "fx2onnx.hub.planted:10 imports fx2onnx.exporter, not in fx2onnx.__all__",
        "fx2onnx.hub.planted:5 imports from fx2onnx.capture.hints, which is not a package with __all__",
        "fx2onnx.hub.planted:6 imports fx2onnx.capture.torch_export, not in fx2onnx.capture.__all__",
        "fx2onnx.hub.planted:7 imports from fx2onnx.translate, which is not a package with __all__",
    ]
    assert _non_public_imports("fx2onnx.cli.planted", "from fx2onnx.hub.loading import TASKS\n", public) == [
        "fx2onnx.cli.planted:1 imports from fx2onnx.hub.loading, which is not a package with __all__",
    ]


# -- export-hf's recipes ----------------------------------------------------------------------
# A folder kind is one recipe module (fx2onnx/hub/recipes/); what recipes share lives outside
# them (the protocol in folder_recipe.py, the rest in hub/shared/, hub/decoders/, ...).
RECIPE_PROTOCOL = "fx2onnx.hub.recipes.folder_recipe"


def _recipe_imports_of_recipes(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    recipes = {name for name in graph if name.startswith("fx2onnx.hub.recipes.") and name != RECIPE_PROTOCOL}
    found = {name: sorted(graph[name] & (recipes - {name})) for name in sorted(recipes)}
    return {name: targets for name, targets in found.items() if targets}


def test_recipe_modules_do_not_import_one_another():
    assert _recipe_imports_of_recipes(_graph()) == {}


def test_the_recipe_rule_finds_a_planted_import():
    graph = {"fx2onnx.hub.recipes.a": {"fx2onnx.hub.recipes.b", RECIPE_PROTOCOL}, "fx2onnx.hub.recipes.b": {RECIPE_PROTOCOL},
             RECIPE_PROTOCOL: set()}
    assert _recipe_imports_of_recipes(graph) == {"fx2onnx.hub.recipes.a": ["fx2onnx.hub.recipes.b"]}


def _modules_imported_by_tests() -> set[str]:
    known = set(_modules())
    imported: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        imported |= _imports(_module_name(path), path, known)
    return imported


def test_every_hub_module_is_imported_by_a_test():
    hub = {name for name, path in _modules().items() if name.startswith("fx2onnx.hub.") and path.name != "__init__.py"}
    assert sorted(hub - _modules_imported_by_tests()) == []
