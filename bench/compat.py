"""Does fx2onnx work with the pinned versions, and with the newest torch and transformers?

Builds one fresh virtual environment per row, installs fx2onnx with its test extra into it,
runs the test suite and `bench/transformers_default_configs.py` there, and prints one table
(versions, tests passed / failed / skipped, transformers architectures exporting with
each spelling of the cache argument). Not part of the test suite: it downloads packages and
takes about ten minutes per environment.

Rows (`--envs`, in this order by default):
- pinned: `constraints.txt` as it is (what CI runs);
- newest-transformers: the pinned torch, the newest transformers the registry serves;
- newest-torch: the newest torch and the newest transformers (on Linux x86-64 the
  registry's torch is its CUDA build, several GB; it runs on the CPU);
- torch==X.Y.Z (asked for by name): that torch with the newest transformers.

Every row but `pinned` also runs the Transformers.js tests on the newest
`@huggingface/transformers` the npm registry serves (FX2ONNX_TRANSFORMERS_JS_VERSION,
tests/client_versions.py); `pinned` runs them on the release the suite pins.

    flock /tmp/fx2onnx-heavy.lock python bench/compat.py --markdown compat.md --json compat.json
    python bench/compat.py --envs pinned --skip-configs      # the suite alone, pinned
    python bench/compat.py --envs torch==2.14.1               # one more torch release
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
TRANSFORMERS_JS = "@huggingface/transformers"  # an npm package: the tests install it themselves


@dataclass(frozen=True)
class Environment:
    """A row: which pins of constraints.txt to drop, and which packages to take newest."""

    name: str
    unpinned: tuple[str, ...] = ()
    newest: tuple[str, ...] = ()
    torch: str | None = None  # a torch requirement other than the pinned one

    @classmethod
    def parse(cls, name: str) -> Environment:
        """A row by name, or `torch==X.Y.Z`: that torch with the newest transformers."""
        if name in ENVIRONMENTS:
            return ENVIRONMENTS[name]
        if re.fullmatch(r"torch==[\w.+]+", name):
            return cls(name, unpinned=("torch", "transformers"), newest=("transformers", TRANSFORMERS_JS), torch=name)
        raise ValueError(f"unknown environment {name!r}; choose from {', '.join(ENVIRONMENTS)} or torch==VERSION")


ENVIRONMENTS = {
    env.name: env
    for env in (
        Environment("pinned"),
        Environment("newest-transformers", unpinned=("transformers",), newest=("transformers", TRANSFORMERS_JS)),
        Environment("newest-torch", unpinned=("torch", "transformers"), newest=("torch", "transformers", TRANSFORMERS_JS)),
    )
}


@dataclass
class Row:
    environment: str
    versions: dict[str, str] = field(default_factory=dict)
    install: str = "ok"
    tests: dict[str, int] = field(default_factory=dict)
    tests_summary: str = ""
    architectures: dict[str, int] = field(default_factory=dict)
    architectures_total: int = 0
    failing_architectures: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0


def _clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would make a child use another Python's
    packages, with `extra` set."""
    kept = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**kept, **(extra or {})}


def _run(command: list[str], log: Path, timeout: float, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command in the repository, its output appended to `log`; a failing exit code
    is returned, not raised."""
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              env=_clean_environment(extra_env))


def newest_npm_version(package: str) -> str | None:
    """The newest release of an npm package the registry serves, or None where npm cannot say."""
    try:
        done = subprocess.run(["npm", "view", package, "version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"npm view {package}: {error}; its tests run on the pinned release", flush=True)
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def client_environment(env: Environment) -> dict[str, str]:
    """The variables that make the suite's client tests run the releases of `env`."""
    if TRANSFORMERS_JS not in env.newest:
        return {}
    version = newest_npm_version(TRANSFORMERS_JS)
    return {"FX2ONNX_TRANSFORMERS_JS_VERSION": version} if version else {}


def _constraints_without(names: tuple[str, ...], folder: Path) -> Path:
    """constraints.txt less the pins of `names`."""
    lines = [
        line for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines()
        if re.split(r"[=<>!~ ]", line.strip(), maxsplit=1)[0].lower() not in names
    ]
    path = folder / "constraints.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pinned_torch() -> str:
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line.startswith("torch=="):
            return line.strip()
    raise SystemExit("constraints.txt pins no torch version")


def install(env: Environment, folder: Path, log: Path, fresh: bool) -> tuple[Path, str]:
    """A virtual environment for `env` with fx2onnx[test]; its python and "ok" or what failed."""
    python = folder / "bin" / "python"
    if fresh or not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = _constraints_without(env.unpinned, folder)
    torch_spec = env.torch or ("torch" if "torch" in env.newest else _pinned_torch())
    # torch first: the later installs keep the build it chose (see docs/getting-started.md)
    steps = [
        pip + ["--upgrade", "pip"],
        pip + (["--upgrade"] if "torch" in env.newest else []) + [torch_spec],
        pip + ["-e", f"{ROOT}[test]", "-c", str(constraints)],
    ]
    others = [name for name in env.newest if name not in ("torch", TRANSFORMERS_JS)]
    if others:
        steps.append(pip + ["--upgrade", *others, "-c", str(constraints)])
    for step in steps:
        if _run(step, log, timeout=3600).returncode != 0:
            return python, f"install failed: {' '.join(step[3:])} (see {log})"
    return python, "ok"


def versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json\n"
        "names = ['torch', 'transformers', 'onnxscript', 'onnx-ir', 'onnx', 'onnxruntime']\n"
        "print(json.dumps({n: m.version(n) for n in names}))\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


_SUMMARY_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)")


def run_tests(python: Path, log: Path, timeout: float, clients: dict[str, str]) -> tuple[dict[str, int], str]:
    """pytest's counts and its closing line, the client tests on the releases `clients` names."""
    start = log.stat().st_size
    try:
        _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], log, timeout, extra_env=clients)
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout:.0f} s"
    with log.open(encoding="utf-8") as out:
        out.seek(start)
        text = out.read()
    closing = next((line for line in reversed(text.splitlines()) if _SUMMARY_COUNT.search(line)), "no summary line")
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in _SUMMARY_COUNT.findall(closing)}
    return counts, closing.strip("= ")


def run_configs(python: Path, log: Path, folder: Path, timeout: float) -> tuple[dict[str, int], int, dict[str, list[str]]]:
    """Architectures exporting and matching per cache spelling, the total, and the failing ones."""
    result_path = folder / "transformers_default_configs.json"
    result_path.unlink(missing_ok=True)
    try:
        _run([str(python), str(ROOT / "bench" / "transformers_default_configs.py"), "--json", str(result_path)], log, timeout)
    except subprocess.TimeoutExpired:
        return {}, 0, {}
    if not result_path.exists():
        return {}, 0, {}
    result = json.loads(result_path.read_text(encoding="utf-8"))
    failing = {
        name: [f"{column}: {cell}" for column, cell in cells.items() if not cell.startswith("ok")]
        for name, cells in result["rows"].items()
        if any(not cell.startswith("ok") for cell in cells.values())
    }
    return result["passing"], result["total"], failing


def markdown(rows: list[Row]) -> str:
    lines = [
        "| environment | torch | transformers | onnxscript | onnxruntime | Transformers.js | tests passed | failed | skipped "
        "| architectures (cache=) | architectures (past_key_values=) | minutes |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        v = row.versions
        if row.install != "ok":
            lines.append(f"| {row.environment} | {v.get('torch', '?')} | {v.get('transformers', '?')} | | | | {row.install} | | | | | |")
            continue
        t = row.tests
        arch = (lambda key: f"{row.architectures[key]}/{row.architectures_total}" if key in row.architectures else "-")
        lines.append(
            f"| {row.environment} | {v.get('torch', '?')} | {v.get('transformers', '?')} | {v.get('onnxscript', '?')} "
            f"| {v.get('onnxruntime', '?')} | {v.get('transformers.js', '-')} | {t.get('passed', 0)} | {t.get('failed', 0) + t.get('error', 0)} "
            f"| {t.get('skipped', 0)} | {arch('cache')} | {arch('past_key_values')} | {row.seconds / 60:.0f} |"
        )
    for row in rows:
        for name, cells in row.failing_architectures.items():
            lines.append(f"\n- {row.environment}, {name}: " + "; ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--envs", default=",".join(ENVIRONMENTS),
        help=f"comma-separated, from {', '.join(ENVIRONMENTS)}, or torch==VERSION (with the newest transformers)",
    )
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "fx2onnx-compat"), help="where the environments are made")
    parser.add_argument("--fresh", action="store_true", help="remake environments that exist")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-configs", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for each of the suite and the benchmark")
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    try:
        environments = [Environment.parse(name) for name in options.envs.split(",") if name]
    except ValueError as error:
        parser.error(str(error))
    rows = []
    for env in environments:
        name = env.name
        start = time.perf_counter()
        folder = Path(options.root) / re.sub(r"[^\w.+-]+", "-", name)
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "compat.log"
        log.write_text("", encoding="utf-8")
        row = Row(name)
        python, row.install = install(env, folder, log, options.fresh)
        row.versions = versions(python)
        print(f"{name}: {row.install}; {row.versions}", flush=True)
        if row.install == "ok":
            if not options.skip_tests:
                clients = client_environment(env)
                row.versions["transformers.js"] = clients.get("FX2ONNX_TRANSFORMERS_JS_VERSION", "pinned")
                row.tests, row.tests_summary = run_tests(python, log, options.timeout, clients)
                print(f"{name}: tests: {row.tests_summary}", flush=True)
            if not options.skip_configs:
                row.architectures, row.architectures_total, row.failing_architectures = run_configs(python, log, folder, options.timeout)
                print(f"{name}: architectures: {row.architectures} of {row.architectures_total}", flush=True)
        row.seconds = time.perf_counter() - start
        rows.append(row)
    table = markdown(rows)
    print("\n" + table)
    if options.markdown:
        Path(options.markdown).write_text(table + "\n", encoding="utf-8")
    if options.json:
        Path(options.json).write_text(json.dumps([asdict(row) for row in rows], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
