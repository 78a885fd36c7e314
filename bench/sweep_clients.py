"""The architecture sweep's client columns: Transformers.js and ONNX Runtime GenAI.

For each pair `bench/architecture_sweep.py` exported (its JSON lines), the folder is built
again as the sweep built it (the same tiny model, seed 0, the same shrink level; the sweep
does not keep folders: `--keep DIR` keeps them here) and run

- in Transformers.js (the release the tests pin, `tests/client_versions.py`; Node, `tests/e2e/transformers_js_runner.mjs`, the folder loaded
  as written) when its model type is in Transformers.js's model table for the task (read
  from the installed package's `dist/transformers.node.mjs`): 16 greedy tokens of two
  prompts equal transformers' `generate` with the model's generation config, which
  Transformers.js reads from the folder (`min_new_tokens` 16 on both sides: no early
  end), for text generation and sequence-to-sequence, every output within `CLIENT_ATOL` otherwise;
- in ONNX Runtime GenAI for text generation (every causal-LM folder has a GenAI type: its
  own where the runtime knows the model type, else the generic `decoder`): the same 16
  tokens of each prompt as transformers' plain greedy search (the search
  `genai_config.json` asks for).

Each pair runs in a forked child with a time limit, and records per client: loaded or not
(the client's error's first line), exact or not. The records go to their own JSON lines
file (`bench/sweep_clients.jsonl`); the scoreboard reads them (`client_columns`).

    OMP_NUM_THREADS=1 nice -n 10 python bench/sweep_clients.py [--tasks text-generation] \\
        [--architectures FalconForCausalLM] [--limit 180] [--keep /tmp/folders]
    python bench/architecture_sweep.py --write-docs
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

sys.path.insert(0, str(ROOT / "tests"))

import architecture_sweep as sweep  # noqa: E402
from client_versions import TRANSFORMERS_JS_VERSION, transformers_js_folder  # noqa: E402
from fx2onnx.hub.decoders.client_support import transformers_js_reason  # noqa: E402
from fx2onnx.hub.shared.verification import greedy_in_genai  # noqa: E402

TRANSFORMERS_JS_PREFIX = transformers_js_folder()
# the release a record written before records named theirs was run on
EARLIEST_TRANSFORMERS_JS = "4.3.1"
RUNNER = ROOT / "tests" / "e2e" / "transformers_js_runner.mjs"
RESULTS = BENCH / "sweep_clients.jsonl"
NEW_TOKENS = 16
# a one-pass task's outputs in Transformers.js are exact when every element is within this of transformers'
CLIENT_ATOL = 1e-4

# export-hf's task -> the model tables of Transformers.js whose classes its Auto class for the task reads
TRANSFORMERS_JS_TABLES = {
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
    "text2text-generation": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",),
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    # AutoModel (the runner's class for both) finds the encoders' classes in its encoder-only table
    "feature-extraction": ("MODEL_MAPPING_NAMES_ENCODER_ONLY",),
    "zero-shot-image-classification": ("MODEL_MAPPING_NAMES_ENCODER_ONLY",),
    "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",),
    # the runner's class for segmentation is AutoModelForSemanticSegmentation
    "image-segmentation": ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",),
    "depth-estimation": ("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",),
    "automatic-speech-recognition": ("MODEL_FOR_CTC_MAPPING_NAMES",),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",),
    # Transformers.js has no multiple-choice models
}


def transformers_js_types(prefix: Path = TRANSFORMERS_JS_PREFIX) -> dict[str, frozenset[str]]:
    """Per task, the model types Transformers.js's Auto class for it finds a class for, read
    from the installed package's Node build."""
    source = (prefix / "node_modules" / "@huggingface" / "transformers" / "dist" / "transformers.node.mjs").read_text()
    tables: dict[str, frozenset[str]] = {}
    for task, names in TRANSFORMERS_JS_TABLES.items():
        types: set[str] = set()
        for name in names:
            found = re.search(rf"^var {name} = [^\n]*new Map\(\[(.*?)\]\);", source, re.M | re.S)
            if found is None:
                raise ValueError(f"{name} is not in Transformers.js {TRANSFORMERS_JS_VERSION}'s Node build at {prefix}")
            types |= set(re.findall(r'\[\s*"([^"]+)",\s*"[^"]+"\s*\]', found.group(1)))
        tables[task] = frozenset(types)
    return tables


def _error_line(text: str) -> str:
    """The first line of a client's error that says what failed (not a stack frame)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if re.match(r"^(\w*Error|Error)\b|^\w+Error:", line)]
    line = (said or lines or ["no output"])[0]
    return re.sub(r"/tmp/\S+", "<path>", line)[:200]


def _prompts(model_type: str) -> list[list[int]]:
    generator = np.random.default_rng(len(model_type))
    # ids past the special tokens (0-2) and within the tiny vocabulary
    return [[int(t) for t in generator.integers(3, sweep.VOCAB, size=length)] for length in (5, 9)]


def expected_tokens(task: str, model: torch.nn.Module, prompts: list[list[int]], plain: bool) -> list[list[int]]:
    """transformers' 16 greedy tokens after each prompt (no early end): with the model's
    generation config, as Transformers.js reads the folder's `generation_config.json`, or
    with ``plain`` greedy search, as ONNX Runtime GenAI's `genai_config.json` asks."""
    from fx2onnx.hub.shared.verification import plain_greedy

    rows = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad(), (plain_greedy(model) if plain else contextlib.nullcontext()):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, pad_token_id=0)
        # a decoder-only model returns the prompt too; an encoder-decoder its decoder start token
        rows.append(out[0, 1:].tolist() if task == "text2text-generation" else out[0, len(prompt):].tolist())
    return rows


def _node(job: dict[str, Any], scratch: Path, prefix: Path, limit: float) -> tuple[dict[str, Any] | None, str]:
    (scratch / "job.json").write_text(json.dumps(job), encoding="utf-8")
    try:
        done = subprocess.run(["node", str(RUNNER), str(prefix), str(scratch / "job.json"), str(scratch / "result.json")],
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"time limit ({limit:.0f} s) in Node"
    if done.returncode != 0:
        return None, _error_line(done.stderr or done.stdout)
    return json.loads((scratch / "result.json").read_text(encoding="utf-8")), ""


def _tensor_job(inputs: dict[str, torch.Tensor], names: list[str]) -> dict[str, Any]:
    def plain(value: torch.Tensor) -> dict[str, Any]:
        kind = "int64" if value.dtype in (torch.int64, torch.int32, torch.bool) else "float32"
        data = value.to(torch.int64 if kind == "int64" else torch.float32).flatten().tolist()
        return {"type": kind, "dims": list(value.shape), "data": data}

    return {name: plain(inputs[name]) for name in names}


def in_transformers_js(task: str, model: torch.nn.Module, config: Any, folder: Path, prompts: list[list[int]],
                       prefix: Path, limit: float) -> dict[str, Any]:
    """The folder in Transformers.js against transformers: loaded or the error's first line, exact or not."""
    with tempfile.TemporaryDirectory(prefix="fx2onnx-js-") as scratch:
        return _compare_in_transformers_js(task, model, config, folder, prompts, prefix, limit, Path(scratch))


def _compare_in_transformers_js(task: str, model: torch.nn.Module, config: Any, folder: Path, prompts: list[list[int]],
                                prefix: Path, limit: float, scratch: Path) -> dict[str, Any]:
    import onnx

    if task in ("text-generation", "text2text-generation"):
        job = {"folder": str(folder), "task": task, "prompts": prompts, "new_tokens": NEW_TOKENS}
        result, error = _node(job, scratch, prefix, limit)
        if result is None:
            return {"js": "failed", "js_cause": error}
        expected = expected_tokens(task, model, prompts, plain=False)
        return {"js": "loaded", "js_exact": result["generated"] == expected,
                "js_tokens_equal": sum(a == b for got, want in zip(result["generated"], expected) for a, b in zip(got, want))}
    make, names = sweep.task_inputs(task, config, model)
    inputs = make(0)
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False)
    fed = [i.name for i in graph.graph.input if i.name in inputs]
    outputs = [o.name for o in graph.graph.output if o.name in names]
    job = {"folder": str(folder), "task": task, "inputs": _tensor_job(inputs, fed), "outputs": outputs}
    result, error = _node(job, scratch, prefix, limit)
    if result is None:
        return {"js": "failed", "js_cause": error}
    with torch.no_grad():
        expected = model(**{name: inputs[name] for name in fed}, **sweep._without_cache(model))
    worst = 0.0
    for name in outputs:
        got = np.asarray(result["outputs"][name]["data"], dtype=np.float64).reshape(result["outputs"][name]["dims"])
        want = expected[name].double().numpy()
        if got.shape != want.shape:
            return {"js": "loaded", "js_exact": False, "js_cause": f"{name}: shape {list(got.shape)}, transformers' {list(want.shape)}"}
        worst = max(worst, float(np.abs(got - want).max()))
    return {"js": "loaded", "js_exact": worst <= CLIENT_ATOL, "js_difference": worst}


def in_genai(model: torch.nn.Module, folder: Path, prompts: list[list[int]]) -> dict[str, Any]:
    """A causal-LM folder in ONNX Runtime GenAI against transformers; a folder export-hf
    writes without `genai_config.json` (a hybrid decoder's states, which the runtime feeds
    only to its own builder's models) is recorded as such."""
    config = folder / "genai_config.json"
    if not config.is_file():
        return {"genai": "no genai_config.json"}
    kind = json.loads(config.read_text())["model"]["type"]
    try:
        generated = [greedy_in_genai(folder, [prompt], NEW_TOKENS).tokens[0] for prompt in prompts]
    except Exception as error:  # noqa: BLE001 - the client's error is the record
        return {"genai": "failed", "genai_type": kind, "genai_cause": f"{type(error).__name__}: {_error_line(str(error))}"}
    return {"genai": "loaded", "genai_type": kind, "genai_exact": generated == expected_tokens("text-generation", model, prompts, plain=True)}


def candidate_types(model_type: str, class_name: str) -> frozenset[str]:
    """The model types a folder of ``class_name`` may say: the one transformers' mapping
    files it under, and its own config class's (Llama4ForCausalLM: llama4 and llama4_text)."""
    import transformers

    config_class = getattr(getattr(transformers, class_name, None), "config_class", None)
    own = getattr(config_class, "model_type", None)
    return frozenset({model_type, own} - {None, ""})


def run_clients(task: str, model_type: str, class_name: str, js_types: dict[str, frozenset[str]], prefix: Path,
                limit: float, keep: Path | None = None, verify: bool = True, text_only: bool = False) -> dict[str, Any]:
    """One exported pair, in the current process: its folder built again (with `--text-only`
    where the sweep exported it so), run in each client that serves it (and in onnxruntime by
    export-hf's verification when ``verify``)."""
    import transformers

    from fx2onnx.hub import export_hf

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    record: dict[str, Any] = {"task": task, "model_type": model_type, "architecture": class_name}
    if text_only:
        record["option"] = sweep.TEXT_ONLY
    if task != "text-generation" and not js_types.get(task, frozenset()) & candidate_types(model_type, class_name):
        return {**record, "js": "not supported"}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-clients-") as scratch:
        scratch = Path(scratch)
        config, model, _ = sweep.tiny_model(model_type, class_name, lambda c, m: sweep._eager_failure(task, c, m))
        model.save_pretrained(scratch / "source")
        folder = (keep / f"{task}-{class_name}") if keep is not None else scratch / "out"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        # export-hf's own verification (onnxruntime against transformers) tells a client's
        # difference from the folder's, for pairs the sweep has not found exact
        verification = export_hf(scratch / "source", folder, task=task, verify=verify, tokens=NEW_TOKENS,
                                 text_only=text_only).verification
        if verification is not None:
            record["onnxruntime_exact"] = verification.passed
        # the model type the clients read is the folder's (a class's own config class: Llama4ForCausalLM's
        # llama4_text, which transformers also maps from llama4; a text-only folder's text config)
        written = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type", model_type)
        if written != model_type:
            record.update(model_type=written, mapped_from=model_type)
        runs_js = written in js_types.get(task, ())
        if runs_js and task == "text-generation":
            # what export-hf says Transformers.js cannot run in this folder, whatever the folder
            limit_reason = transformers_js_reason(json.loads((folder / "config.json").read_text(encoding="utf-8")))
            if limit_reason is not None:
                record["js_limit"] = limit_reason
        prompts = _prompts(model_type)
        record.update(in_transformers_js(task, model, config, folder, prompts, prefix, limit) if runs_js
                      else {"js": "not supported"})
        if task == "text-generation":
            record.update(in_genai(model, folder, prompts))
    return record


def _child(queue: Any, *args: Any) -> None:
    try:
        queue.put(run_clients(*args))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        queue.put({"task": args[0], "model_type": args[1], "architecture": args[2], "rebuilt": "failed",
                   "cause": sweep._cause(error)})


def run_in_child(task: str, model_type: str, class_name: str, js_types: dict[str, frozenset[str]], prefix: Path,
                 limit: float, keep: Path | None, verify: bool = True, text_only: bool = False) -> dict[str, Any]:
    """One pair's clients in a forked child, killed after ``limit`` seconds."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    arguments = (queue, task, model_type, class_name, js_types, prefix, limit, keep, verify, text_only)
    child = context.Process(target=_child, args=arguments)
    child.start()
    record, why = sweep._next_record(queue, child, time.perf_counter() + limit)
    child.join(0 if why else 5)
    if child.is_alive():
        child.kill()
        child.join()
    if record is None:
        record = {"task": task, "model_type": model_type, "architecture": class_name, "rebuilt": "failed",
                  "cause": why.replace("time limit", f"time limit ({limit:.0f} s)")}
    return record


def exported_pairs(results: Path, tasks: set[str], architectures: set[str] | None) -> list[tuple[str, str, str]]:
    """(task, model type, class) of every pair of ``tasks`` the sweep exported; with
    ``architectures``, the pairs of those classes, whether the sweep ran them or not."""
    if architectures is not None:
        return [(task, model_type, name) for task in TRANSFORMERS_JS_TABLES if task in tasks
                for model_type, name in sweep.pairs_of(task) if name in architectures]
    return [(r["task"], r["model_type"], r["architecture"]) for r in sweep.read_results(results)
            if r["status"] == "exported" and r["task"] in tasks]


def read_clients(results: Path = RESULTS) -> dict[tuple[str, str], dict[str, Any]]:
    """The client records by (task, class), the last one of each pair."""
    return {(r["task"], r["architecture"]): r for r in sweep.read_results(results)}


# ---- the scoreboard's columns -------------------------------------------------------------------------------------


def _js_cell(record: dict[str, Any] | None) -> str:
    if record is None:
        return "-"
    if record.get("rebuilt") == "failed":
        return "not run"
    if record.get("js") == "not supported":
        return "no class"
    if record.get("js_limit") and not record.get("js_exact"):
        return f"Transformers.js's limit: {sweep._escaped(_first_clause(record['js_limit']))}"
    if record.get("js") == "failed":
        return f"fails: {sweep._escaped(record.get('js_cause', ''))}"
    return "exact" if record.get("js_exact") else "differs"


def _first_clause(reason: str) -> str:
    """A limit's reason up to its first bracket or colon: what the cell has room for."""
    return re.split(r" \(|: ", reason, maxsplit=1)[0]


def _genai_cell(record: dict[str, Any] | None) -> str:
    if record is None or "genai" not in record:
        return "-"
    if record["genai"] == "failed":
        return f"fails ({record['genai_type']}): {sweep._escaped(record.get('genai_cause', ''))}"
    if "genai_type" not in record:  # no genai_config.json: a hybrid's states
        return f"not written ({record['genai']})"
    return f"{'exact' if record.get('genai_exact') else 'differs'} ({record['genai_type']})"


def _verified_cell(record: dict[str, Any]) -> str:
    if record.get("rebuilt") == "failed":
        return f"fails: {sweep._escaped(record.get('cause', ''))}"
    if "onnxruntime_exact" not in record:
        return ""
    return "exact" if record["onnxruntime_exact"] else "differs"


def client_columns(record: dict[str, Any], clients: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, str]:
    """The Transformers.js and ONNX Runtime GenAI cells of a sweep record's row."""
    found = clients.get((record["task"], record["architecture"]))
    if record["task"] != "text-generation":
        return _js_cell(found), ""
    return _js_cell(found), _genai_cell(found)


def with_client_columns(rows: list[str], task_records: list[dict[str, Any]],
                        clients: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """A task's pair table (its heading, its rule, then one row per record in the order of
    their architectures) with the Transformers.js column, and ONNX Runtime GenAI's for text
    generation."""
    ordered = sorted(task_records, key=lambda r: r["architecture"])
    generation = bool(ordered) and ordered[0]["task"] == "text-generation"
    out = [rows[0] + (" Transformers.js | ONNX Runtime GenAI |" if generation else " Transformers.js |"),
           rows[1] + ("---|---|" if generation else "---|")]
    for row, record in zip(rows[2:], ordered):
        js, genai = client_columns(record, clients)
        out.append(f"{row} {js} | {genai} |" if generation else f"{row} {js} |")
    return out


def _count_row(task: str, mine: list[dict[str, Any]]) -> str:
    classed = [r for r in mine if r.get("js") not in (None, "not supported") and r.get("rebuilt") != "failed"]
    # a folder without genai_config.json (export-hf says why: a hybrid's states, unequal head sizes) has no GenAI type
    genai = [r for r in mine if "genai_type" in r]
    untyped = sum("genai" in r and "genai_type" not in r for r in mine)
    without = f" ({untyped} more without `genai_config.json`)" if untyped else ""
    in_genai = (f"{sum(r['genai'] == 'loaded' for r in genai)} of {len(genai)}{without} | "
                f"{sum(bool(r.get('genai_exact')) for r in genai)} |" if genai or untyped else "- | - |")
    limited = sum(bool(r.get("js_limit")) and not r.get("js_exact") for r in classed)
    return (f"| {task} | {len(mine)} | {len(classed)} | {sum(r['js'] == 'loaded' for r in classed)} | "
            f"{sum(bool(r.get('js_exact')) for r in classed)} | {limited} | {in_genai}")


def _why_not(record: dict[str, Any], client: str) -> str:
    if client == "js" and record.get("js_limit"):
        return f"Transformers.js's limit: {_first_clause(record['js_limit'])}"[:110]
    return "differs" if record[client] == "loaded" else record.get(f"{client}_cause", "")[:110]


def _families(records: list[dict[str, Any]], client: str) -> list[str]:
    """Per task, the model types a client ran exactly, and those it failed or differed on (with the first cause)."""
    lines = []
    for task in TRANSFORMERS_JS_TABLES:
        mine = [r for r in records if r["task"] == task and r.get(client) in ("loaded", "failed")]
        if not mine:
            continue
        exact = sorted({r["model_type"] for r in mine if r.get(f"{client}_exact")})
        other = sorted({f"{r['model_type']} ({_why_not(r, client)})" for r in mine if not r.get(f"{client}_exact")})
        line = f"- {task}: exact {', '.join(f'`{t}`' for t in exact) or 'none'}"
        lines.append(line + (f"; not: {sweep._escaped('; '.join(other))}" if other else ""))
    return lines


def _js_releases(records: list[dict[str, Any]]) -> str:
    """The Transformers.js releases the records ran on, the most used first, with their counts
    where there are several."""
    counts = collections.Counter(r.get("transformers_js", EARLIEST_TRANSFORMERS_JS) for r in records if "js" in r)
    if len(counts) <= 1:
        return f"Transformers.js {next(iter(counts), TRANSFORMERS_JS_VERSION)}"
    return "Transformers.js " + " and ".join(f"{release} ({n} pair{'s' * (n != 1)})" for release, n in counts.most_common())


def client_summary(clients: dict[tuple[str, str], dict[str, Any]], swept: set[tuple[str, str]]) -> list[str]:
    """The scoreboard's section on the clients: per task, pairs run, loaded and exact in
    each; the model types each client runs; the pairs run in the clients beyond ``swept``
    (the sweep's pairs), which the task tables below do not list."""
    records = [r for r in clients.values() if r.get("rebuilt") != "failed"]
    rows = ["| task | pairs run | Transformers.js has a class | loaded in Transformers.js | exact in Transformers.js | "
            "not exact by Transformers.js's own limit | loaded in ONNX Runtime GenAI | exact in ONNX Runtime GenAI |",
            "|---|---|---|---|---|---|---|---|"]
    rows += [_count_row(task, mine) for task in TRANSFORMERS_JS_TABLES if (mine := [r for r in records if r["task"] == task])]
    out = [
        "## Clients", "",
        f"Each exported pair's folder, built again, loaded as written in {_js_releases(records)} "
        "(Node) where its model table for the task has the model type, and, for text generation, in ONNX Runtime "
        f"GenAI (its type in brackets: the generic `decoder` where it has none of its own): {NEW_TOKENS} greedy tokens "
        "of two prompts equal transformers' `generate` (Transformers.js: with the generation config it reads from the "
        "folder; ONNX Runtime GenAI: plain greedy search, as `genai_config.json` asks; no early end on either), or, "
        f"for one pass, every output within {CLIENT_ATOL:g}. *no class*: Transformers.js has no class for the model "
        "type and task. *Transformers.js's limit*: export-hf says Transformers.js cannot run the architecture, "
        "whatever the folder (`fx2onnx/hub/decoders/client_support.py`). Run with `OMP_NUM_THREADS=1 nice -n 10 python bench/sweep_clients.py` (results in "
        "`bench/sweep_clients.jsonl`; `--architectures` runs named classes, whether the sweep ran them or not). "
        "The counts take the sweep's exported pairs and the pairs run beyond them (listed last) together; a pair "
        "whose folder could not be built again is left out of them.", "",
    ] + rows
    out += ["", f"Model types by client ({_js_releases(records)}; why one does not load, whatever "
            "the folder, and what export-hf writes for it instead: "
            "[Clients per architecture](guides/export-hf/clients.md)):", ""] + _families(records, "js")
    out += ["", "ONNX Runtime GenAI:", ""] + _families(records, "genai")
    beyond = sorted((r for r in clients.values() if (r["task"], r["architecture"]) not in swept),
                    key=lambda r: (r["task"], r["architecture"]))
    if beyond:
        out += ["", "Pairs run in the clients that the sweep's results do not hold yet:", "",
                "| task | architecture (model type) | export-hf's verification in onnxruntime | Transformers.js | ONNX Runtime GenAI |",
                "|---|---|---|---|---|"]
        out += [f"| {r['task']} | {r['architecture']} ({r.get('model_type', '?')}) | {_verified_cell(r)} | {_js_cell(r)} | "
                f"{_genai_cell(r) if 'genai' in r else ''} |" for r in beyond]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TRANSFORMERS_JS_TABLES), help="comma-separated tasks")
    parser.add_argument("--architectures", default=None, help="comma-separated classes: only their pairs")
    parser.add_argument("--sweep-results", type=Path, default=BENCH / "architecture_sweep.jsonl")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--limit", type=float, default=180.0, help="seconds per pair (default 180)")
    parser.add_argument("--budget", type=float, default=None, help="stop starting pairs after these many seconds")
    parser.add_argument("--keep", type=Path, default=None, help="keep each pair's folder under this folder")
    parser.add_argument("--rerun", action="store_true", help="run pairs already in --results again")
    parser.add_argument("--verify-all", action="store_true",
                        help="verify every folder in onnxruntime, also those the sweep found exact")
    args = parser.parse_args()
    tasks = {t for t in args.tasks.split(",") if t}
    unknown = tasks - set(TRANSFORMERS_JS_TABLES)
    if unknown:
        parser.error(f"unknown task(s) {', '.join(sorted(unknown))}: one of {', '.join(TRANSFORMERS_JS_TABLES)}")
    if not (TRANSFORMERS_JS_PREFIX / "node_modules" / "@huggingface" / "transformers").is_dir():
        parser.error(f"Transformers.js {TRANSFORMERS_JS_VERSION} is not installed in {TRANSFORMERS_JS_PREFIX}: "
                     "run tests/e2e/test_transformers_js.py once, which installs it there")
    torch.set_num_threads(1)
    architectures = None if args.architectures is None else {a for a in args.architectures.split(",") if a}
    js_types = transformers_js_types()
    done = set() if args.rerun or architectures else set(read_clients(args.results))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    # a pair the sweep found exact in onnxruntime is not verified again (--verify-all does)
    exact = set() if args.verify_all else {(r["task"], r["architecture"]) for r in sweep.read_results(args.sweep_results)
                                            if r.get("exact")}
    text_only = {(r["task"], r["architecture"]) for r in sweep.read_results(args.sweep_results)
                 if r.get("option") == sweep.TEXT_ONLY}
    started = time.perf_counter()
    for task, model_type, class_name in exported_pairs(args.sweep_results, tasks, architectures):
        if (task, class_name) in done:
            continue
        if args.budget is not None and time.perf_counter() - started > args.budget:
            print(f"budget of {args.budget:.0f} s spent: stopping (rerun to continue)", flush=True)
            break
        record = {**run_in_child(task, model_type, class_name, js_types, TRANSFORMERS_JS_PREFIX, args.limit, args.keep,
                                 verify=(task, class_name) not in exact, text_only=(task, class_name) in text_only),
                  "transformers_js": TRANSFORMERS_JS_VERSION, "commit": sweep._commit()}
        with args.results.open("a") as file:
            file.write(json.dumps(record) + "\n")
        print(f"{task:24} {class_name:40} js={_js_cell(record)[:70]:40} genai={_genai_cell(record)[:60]}", flush=True)


if __name__ == "__main__":
    main()
