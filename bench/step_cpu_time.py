"""Thread CPU time of one prefill and one decode step: fx2onnx's causal-LM folders against
ONNX Runtime GenAI's model builder's (`runtime_speed.py`'s LLaMA- and Qwen2-style 4 x 512,
vocab 32000), float32 and int4. This is the acceptance benchmark for step speed.

Each contender's decoder runs in its OWN worker process (one onnxruntime session there,
one intra-op thread), driven in alternation from this one; by default every round starts
new workers. In one process, the session created first runs its one-row products 10-30%
slower than a later session of the same folder, more than the folders differ; a process
per contender gives every session the same standing, so the reading does not depend on
which is created first (``--load-orders given reversed`` starts the workers in both
orders to show it). Where a process's weights land in memory still moves its steps by a
few percent (the int4 decoder's 80 MB are read from the cache every step): new workers
each round make the median over rounds one over many placements (``--same-workers``
keeps one worker per contender for all rounds). ``--self-check`` times a copy of each
fx2onnx folder against the folder, an A/A reading that should be 1.00x: how far it is
from 1.00x is the run's resolution.

Each worker warms every step up (``--warmup`` runs) before timing. Per length
(``--lengths``), a prefill is a prompt of that many tokens over an empty cache, a decode
step one token over a cache of that many positions (random, all held). Rounds alternate
the contenders' order (A B, B A, A B, ...); in its turn a contender runs a step
``--turn-warmup`` times untimed (so that none profits from having run just before, at
the turn of a round), then ``--repeats`` times, the least counting (other jobs only ever
add time). The step's CPU time on the worker's calling thread (``time.thread_time``:
onnxruntime runs there with one intra-op thread) is the main reading, as other jobs on a
shared machine inflate it far less than the wall clock; the wall time is given beside it.
A ratio is the median over rounds of the contender's time over its reference's in that
round (the builder's folder of the same precision, or for an A/A copy its original).

The cache is given as the client gives it (``--cache shared``, the default): both
folders' genai configs say ``past_present_share_buffer``, so ONNX Runtime GenAI binds each
past to a buffer of ``max_length`` positions that is also the step's present, and the
attention kernel writes the new positions in place. ``--cache apart`` gives the past as
tensors of its own length instead, as a plain onnxruntime session does: the kernel then
copies the whole past into a new present every step, a cost that grows with the length,
the same for both folders, and that the client never pays.

    OMP_NUM_THREADS=1 nice -n 10 flock /tmp/fx2onnx-heavy.lock python bench/step_cpu_time.py \\
        [--models llama qwen2] [--contenders fx2onnx-fp32 builder-fp32 ...] [--rounds 9] [--repeats 3] \\
        [--warmup 3] [--turn-warmup 1] [--same-workers] [--phases prefill decode] [--lengths 128 1024] \\
        [--load-orders given reversed] [--cache shared|apart] \\
        [--self-check] [--profile DIR] [--work DIR] [--markdown out.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from int4_decode_profile import _decoder, step_feeds, summarize_profile  # noqa: E402 - bench modules side by side

CONTENDERS = ("fx2onnx-fp32", "builder-fp32", "fx2onnx-int4", "builder-int4")
PHASES = ("prefill", "decode")
COPY_SUFFIX = "-copy"  # an A/A contender: a copy of another contender's folder
Step = tuple[str, int]  # (phase, length)


class _Step:
    """One step's run in a worker: plain feeds (``cache="apart"``: the past given as its own
    tensors, the present returned as new ones, so the kernel copies the past into the
    present every step), or an IO binding as ONNX Runtime GenAI runs a folder whose
    genai_config says ``past_present_share_buffer`` (``cache="shared"``): each past a
    buffer of the configuration's ``max_length`` positions, bound as its present too, so
    the step writes its new positions in place."""

    def __init__(self, session: Any, decoder: dict[str, Any], past: int, new: int, cache: str, max_length: int) -> None:
        self._session = session
        if cache == "apart":
            self._feeds = step_feeds(session, decoder, past, new)
            self.run = lambda: session.run(None, self._feeds)
            return
        import onnxruntime

        if past + new > max_length:
            raise ValueError(f"a step over {past} + {new} positions does not fit the shared buffer of max_length {max_length}")
        feeds = step_feeds(session, decoder, max_length, new)  # every past at the buffer's length
        names = {**decoder.get("inputs", {})}
        mask = names.get("attention_mask", "attention_mask")
        feeds[mask] = feeds[mask][:, : past + new]
        positions = names.get("position_ids", "position_ids")
        if positions in feeds:
            feeds[positions] = np.arange(past, past + new, dtype=feeds[positions].dtype)[None]
        self._binding = session.io_binding()
        self.bound: dict[str, Any] = {}  # each input's array, each past's buffer (its present too)
        for name, value in feeds.items():
            if value.dtype.kind == "f":  # a past key or value: bound as its present too
                self.bound[name] = onnxruntime.OrtValue.ortvalue_from_numpy(value)
                self._binding.bind_ortvalue_input(name, self.bound[name])
                self._binding.bind_ortvalue_output(_present_name(name, decoder), self.bound[name])
            else:
                self._binding.bind_cpu_input(name, value)
                self.bound[name] = value
        self._binding.bind_output(decoder.get("outputs", {}).get("logits", "logits"))
        self.run = lambda: session.run_with_iobinding(self._binding)


def _present_name(past_name: str, decoder: dict[str, Any]) -> str:
    """The present output the genai config pairs with the past input ``past_name``."""
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    for kind in ("key", "value"):
        past_pattern = inputs.get(f"past_{kind}_names", f"past_key_values.%d.{kind}")
        present_pattern = outputs.get(f"present_{kind}_names", f"present.%d.{kind}")
        head, _, tail = past_pattern.partition("%d")
        if past_name.startswith(head) and past_name.endswith(tail):
            layer = int(past_name[len(head):len(past_name) - len(tail)])
            return present_pattern % layer
    raise ValueError(f"{past_name} is not a past input of the genai config")


def cache_given(requested: str, search: dict[str, Any]) -> str:
    """How a step is given its cache: "shared" only where the folder's genai config shares
    past and present (the client keeps the others apart, and so does the benchmark)."""
    return "shared" if requested == "shared" and search.get("past_present_share_buffer") else "apart"


def _serve(connection: Any, folder: str, threads: int, steps: list[Step], warmup: int,
           profile_prefix: str | None = None, cache: str = "shared") -> None:
    """A worker: one session of ``folder``'s decoder; runs the steps it is asked for and
    answers each with its (thread CPU ms, wall ms) per run; at the end, with
    ``profile_prefix``, the path of onnxruntime's profile of the session."""
    import onnxruntime

    path, decoder = _decoder(Path(folder))
    search = json.loads((Path(folder) / "genai_config.json").read_text()).get("search", {})
    cache = cache_given(cache, search)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    runs = {}
    for phase, length in steps:
        past, new = (0, length) if phase == "prefill" else (length, 1)
        runs[phase, length] = _Step(session, decoder, past, new, cache, search.get("max_length", 0))
        for _ in range(warmup):
            runs[phase, length].run()
    connection.send(("ready", os.getpid()))
    while True:
        request = connection.recv()
        if request is None:
            break
        phase, length, repeats = request
        times = []
        for _ in range(repeats):
            started, started_wall = time.thread_time(), time.perf_counter()
            runs[phase, length].run()
            times.append(((time.thread_time() - started) * 1e3, (time.perf_counter() - started_wall) * 1e3))
        connection.send(times)
    connection.send(session.end_profiling() if profile_prefix is not None else None)
    connection.close()


class Worker:
    """One contender's session in its own process (spawned: nothing of this process's
    onnxruntime or allocations carries over)."""

    def __init__(self, folder: Path, threads: int, steps: list[Step], warmup: int,
                 profile_prefix: str | None = None, cache: str = "shared") -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, str(folder), threads, steps, warmup, profile_prefix, cache),
                                        daemon=True)
        self._process.start()
        child.close()
        self.pid: int | None = None

    def wait_ready(self) -> int:
        message = self._connection.recv()
        if message[0] != "ready":
            raise RuntimeError(f"the worker for a contender answered {message!r} instead of 'ready'")
        self.pid = message[1]
        return self.pid

    def run(self, phase: str, length: int, repeats: int) -> list[tuple[float, float]]:
        self._connection.send((phase, length, repeats))
        return self._connection.recv()

    def stop(self) -> str | None:
        """Ends the worker; the path of its profile, if it made one."""
        profile = None
        if self._process.is_alive():
            try:
                self._connection.send(None)
                profile = self._connection.recv()
            except (BrokenPipeError, EOFError):  # it ended on its own: its error is in the output
                pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
        return profile


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The contenders' order in each round: as given, reversed, as given, ... (A B, B A,
    ...), so that each is as often before as after every other."""
    return [list(names) if index % 2 == 0 else list(reversed(names)) for index in range(rounds)]


def reference_of(name: str, names: list[str]) -> str:
    """What ``name`` is compared with: for an A/A copy its original, otherwise the builder's
    folder of the same precision (``fx2onnx-int4`` -> ``builder-int4``)."""
    if name.endswith(COPY_SUFFIX):
        return name.removesuffix(COPY_SUFFIX)
    precision = name.split("-")[1]
    reference = f"builder-{precision}"
    return reference if reference in names else name


def _start(folders: dict[str, Path], order: list[str], threads: int, steps: list[Step], warmup: int,
           profile_dir: Path | None, cache: str = "shared") -> dict[str, Worker]:
    """A worker per contender, started in ``order``, each ready (loaded and warmed up)."""
    workers: dict[str, Worker] = {}
    try:
        for name in order:
            workers[name] = Worker(folders[name], threads, steps, warmup,
                                   None if profile_dir is None else str(profile_dir / name), cache)
        for worker in workers.values():
            worker.wait_ready()
    except BaseException:
        for worker in workers.values():
            worker.stop()
        raise
    return workers


def measure(folders: dict[str, Path], steps: list[Step], rounds: int, threads: int = 1, repeats: int = 3,
            warmup: int = 3, start_reversed: bool = False, profile_dir: Path | None = None,
            fresh_workers: bool = True, turn_warmup: int = 1, cache: str = "shared") -> dict[str, Any]:
    """By step: each contender's median thread CPU and wall ms and its median per-round
    ratios to its reference; also each contender's worker pids and the order the runs took
    (``runs``: (round, phase, length, contender)).

    With ``fresh_workers`` every round starts its own workers (new processes, so new
    places in memory for the weights: a median over rounds is not one placement's
    reading); otherwise one worker per contender serves every round. In its turn a
    contender runs ``turn_warmup`` untimed steps first, so that none profits from having
    run just before (the end of one round and the start of the next). With
    ``profile_dir`` (one step only, one worker per contender), each contender's
    onnxruntime profile summed by operator type (``profiles``). ``cache``: how each step
    is given its cache (`_Step`: "shared" as the client runs the folder, or "apart")."""
    names = list(folders)
    if profile_dir is not None and len(steps) != 1:
        raise ValueError(f"profiling sums one step's nodes: give one phase and one length, not {steps}")
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)  # onnxruntime writes a profile only into a folder that exists
    fresh_workers = fresh_workers and profile_dir is None
    starting = list(reversed(names)) if start_reversed else names
    pids: dict[str, list[int]] = collections.defaultdict(list)
    cpu: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
    wall: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
    runs, profiles = [], {}
    workers: dict[str, Worker] = {}
    try:
        for index, order in enumerate(round_orders(names, rounds)):
            if not workers:
                workers = _start(folders, starting, threads, steps, warmup, profile_dir, cache)
                for name in starting:
                    pids[name].append(workers[name].pid)
            for phase, length in steps:
                for name in order:
                    times = workers[name].run(phase, length, turn_warmup + repeats)[turn_warmup:]
                    runs.append((index, phase, length, name))
                    cpu[phase, length, name].append(min(c for c, _ in times))
                    wall[phase, length, name].append(min(w for _, w in times))
            if fresh_workers:
                for worker in workers.values():
                    worker.stop()
                workers = {}
    finally:
        for name, worker in workers.items():
            profiles[name] = worker.stop()
    by_step = {}
    for phase, length in steps:
        entry = {}
        for name in names:
            reference = reference_of(name, names)
            ratios = [a / b for a, b in zip(cpu[phase, length, name], cpu[phase, length, reference])]
            wall_ratios = [a / b for a, b in zip(wall[phase, length, name], wall[phase, length, reference])]
            entry[name] = {"reference": reference, "cpu_ms": statistics.median(cpu[phase, length, name]),
                           "wall_ms": statistics.median(wall[phase, length, name]),
                           "cpu_ratio": statistics.median(ratios), "wall_ratio": statistics.median(wall_ratios),
                           "cpu_ratios": ratios}  # by round
        by_step[f"{phase} {length}"] = entry
    summaries = {}
    for name, path in profiles.items():
        if path is None:
            continue
        events = json.loads(Path(path).read_text())
        summaries[name] = {**summarize_profile(events, warmup_runs=warmup, node_medians=True),
                           "nodes": step_nodes(events, warmup)}
        # beside onnxruntime's profile: the step node by node, to compare two folders' steps
        Path(path).with_suffix(".nodes.md").write_text(nodes_markdown(summaries[name]["nodes"]) + "\n")
    return {"steps": by_step, "pids": dict(pids), "runs": runs, **({"profiles": summaries} if summaries else {})}


def _direct_children(events: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    """The node events run inside ``events[start]`` (sorted by start) and not inside another
    of them: what an `If`'s branch ran itself."""
    end = events[start]["ts"] + events[start]["dur"]
    children: list[dict[str, Any]] = []
    for event in events[start + 1:]:
        if event["ts"] > end:
            break
        if event["ts"] + event["dur"] <= end and not (children and event["ts"] + event["dur"] <= children[-1]["ts"] + children[-1]["dur"]):
            children.append(event)
    return children


def step_nodes(events: list[dict[str, Any]], warmup_runs: int) -> list[dict[str, Any]]:
    """Each node a step ran (an `If`'s branches' too), in the order of its first run after
    ``warmup_runs`` runs: its operator, its median µs per run and, for an `If`, its own
    median µs (its time less what its branch's nodes took: the frame onnxruntime builds
    for the branch each run), so that two folders' steps compare node by node."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first = runs[warmup_runs]["ts"] if len(runs) > warmup_runs else 0
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                    and e["ts"] >= first), key=lambda e: e["ts"])
    times: dict[str, list[float]] = collections.defaultdict(list)
    own: dict[str, list[float]] = collections.defaultdict(list)
    operators: dict[str, str] = {}
    for index, event in enumerate(nodes):
        name = event["name"].removesuffix("_kernel_time")
        operators.setdefault(name, event["args"]["op_name"])
        times[name].append(event["dur"])
        if event["args"]["op_name"] == "If":
            own[name].append(event["dur"] - sum(child["dur"] for child in _direct_children(nodes, index)))
    return [{"node": name, "op": operators[name], "us": statistics.median(times[name]),
             **({"own_us": statistics.median(own[name])} if name in own else {})} for name in operators]


def nodes_markdown(nodes: list[dict[str, Any]]) -> str:
    """One contender's `step_nodes` as a table."""
    lines = ["| node | operator | µs (median) | an If's own µs |", "|---|---|---:|---:|"]
    for node in nodes:
        own = f"{node['own_us']:.1f}" if "own_us" in node else ""
        lines.append(f"| {node['node']} | {node['op']} | {node['us']:.1f} | {own} |")
    return "\n".join(lines)


def profile_markdown(model: str, profiles: dict[str, Any]) -> str:
    """Per operator type, each contender's µs per step (the sum of its nodes' medians) and
    node count."""
    names = list(profiles)
    ops = sorted({op for p in profiles.values() for op in p["ops"]},
                 key=lambda op: -max(p["ops"].get(op, (0, 0))[0] for p in profiles.values()))
    lines = [f"| {model}: operator | " + " | ".join(f"{n} µs (nodes)" for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    for op in ops:
        cells = [f"{profiles[n]['ops'][op][0]:.0f} ({profiles[n]['ops'][op][1]})" if op in profiles[n]["ops"] else "-"
                 for n in names]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines.append("| step (median model_run) | " + " | ".join(f"{profiles[n]['step_us']:.0f}" for n in names) + " |")
    return "\n".join(lines)


def markdown(all_results: dict[str, dict[str, Any]]) -> str:
    lines = ["| model | step | contender | against | thread CPU ms | ratio (CPU) | wall ms | ratio (wall) |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for model, results in all_results.items():  # model: a model kind, with its start order when several
        for step, entry in results["steps"].items():
            phase, length = step.split()
            label = f"{phase} {'of' if phase == 'prefill' else 'after'} {length}"
            for name, value in entry.items():
                if value["reference"] == name:
                    ratio, wall_ratio = "", ""
                else:
                    ratio, wall_ratio = f"{value['cpu_ratio']:.3f}x", f"{value['wall_ratio']:.3f}x"
                lines.append(f"| {model} | {label} | {name} | {value['reference'] if ratio else ''} | {value['cpu_ms']:.2f} "
                             f"| {ratio} | {value['wall_ms']:.2f} | {wall_ratio} |")
    return "\n".join(lines)


def contender_folders(root: Path, model: str, contenders: list[str], self_check: bool) -> dict[str, Path]:
    """Each contender's folder under ``root/model`` (written when missing), and with
    ``self_check`` a copy of each fx2onnx folder beside it."""
    from precision_folders import export_contender
    from runtime_speed import _llm_config, write_llm_folder

    source = root / model / "source"
    if not (source / "config.json").exists():
        write_llm_folder(_llm_config(model), source)
    folders = {}
    for name in contenders:
        folders[name] = root / model / name
        if not (folders[name] / "genai_config.json").exists():
            export_contender(name, source, folders[name])
    if self_check:
        for name in [n for n in contenders if n.startswith("fx2onnx")]:
            copy = root / model / f"{name}{COPY_SUFFIX}"
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(folders[name], copy)
            folders[f"{name}{COPY_SUFFIX}"] = copy
    return folders


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "qwen2"], choices=["llama", "qwen2"])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=9, help="rounds, the contenders' order alternating (medians)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime's intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="runs of a step per contender and round (the least counts)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each step in each worker first")
    parser.add_argument("--turn-warmup", type=int, default=1, help="untimed runs of a step before a contender's timed ones")
    parser.add_argument("--same-workers", action="store_true",
                        help="one worker per contender for every round (default: new workers each round)")
    parser.add_argument("--work", type=Path, help="keep the source models and folders here (reused when present)")
    parser.add_argument("--load-orders", nargs="+", default=["given"], choices=["given", "reversed"],
                        help="start the workers in the contenders' order, the reverse, or one pass each")
    parser.add_argument("--self-check", action="store_true",
                        help="also time a copy of each fx2onnx folder against it (A/A: should read 1.00x)")
    parser.add_argument("--profile", type=Path,
                        help="profile each worker's session with onnxruntime's profiler into this folder (one step)")
    parser.add_argument("--cache", default="shared", choices=["shared", "apart"],
                        help="shared (default): each past a buffer of the genai config's max_length, bound as its present "
                             "too, as ONNX Runtime GenAI runs a folder whose config shares them; apart: the past as its own "
                             "tensors and a new present each step (the kernel copies the past every step)")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    steps = [(phase, length) for phase in args.phases for length in args.lengths]
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.work or Path(scratch)
        for model in args.models:
            folders = contender_folders(root, model, args.contenders, args.self_check)
            for order in args.load_orders:
                label = model if len(args.load_orders) == 1 else f"{model} (started {order})"
                results[label] = measure(folders, steps, args.rounds, args.threads, args.repeats, args.warmup,
                                         start_reversed=order == "reversed", profile_dir=args.profile,
                                         fresh_workers=not args.same_workers, turn_warmup=args.turn_warmup,
                                         cache=args.cache)
                print(markdown({label: results[label]}), flush=True)
    table = markdown(results)
    for label, result in results.items():
        if "profiles" in result:
            table += "\n\n" + profile_markdown(label, result["profiles"])
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
