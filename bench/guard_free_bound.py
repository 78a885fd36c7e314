"""A causal-LM folder with its attention guards taken out: the bound of what the guards cost.

An fx2onnx decoder runs each `GroupQueryAttention` inside an `If` whose condition (a few
small nodes, computed once a step) checks what the kernel assumes (one sequence or one new
token, every token held, the positions the kernel's own). This writes a copy of a folder
whose top-level `If`s are replaced by their ``then`` branch (the kernel alone) and whose
nodes nothing reads any more are dropped, so that `step_cpu_time.py` can time the step
without the guards beside the folder and the builder's:

    python bench/guard_free_bound.py WORK/llama/fx2onnx-fp32 WORK/llama/fx2onnx-fp32-unguarded
    OMP_NUM_THREADS=1 python bench/step_cpu_time.py --contenders fx2onnx-fp32 fx2onnx-fp32-unguarded \\
        builder-fp32 --phases decode --work WORK ...

The copy is exact only where every guard's condition holds (an unpadded batch at the
kernel's positions): a measuring device, never a folder to ship.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import onnx


def _then_branch(node: onnx.NodeProto) -> onnx.GraphProto:
    return next(attribute.g for attribute in node.attribute if attribute.name == "then_branch")


def inline_then_branches(model: onnx.ModelProto) -> int:
    """Replace every top-level `If` of ``model`` by the nodes of its ``then`` branch (their
    outputs renamed to the `If`'s), then drop the nodes no graph output depends on. Returns
    the number of `If`s replaced."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    replaced = 0
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        branch = _then_branch(node)
        renamed = {inner.name: outer for inner, outer in zip(branch.output, node.output)}
        for inner in branch.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(inner)
            for index, name in enumerate(copy.output):
                copy.output[index] = renamed.get(name, name)
            nodes.append(copy)
        replaced += 1
    needed = {output.name for output in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):  # nodes are in topological order: walk back from the outputs
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            for attribute in node.attribute:  # what a remaining subgraph reads from outside
                if attribute.type == onnx.AttributeProto.GRAPH:
                    needed.update(name for inner in attribute.g.node for name in inner.input if name)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    return replaced


def write_unguarded(folder: Path, out: Path, decoder: str = "onnx/model.onnx") -> int:
    """``folder`` copied to ``out`` with its decoder's guards inlined (`inline_then_branches`);
    the weights file is copied as it is. Returns the number of `If`s replaced."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(folder, out)
    model = onnx.load(str(out / decoder), load_external_data=False)
    replaced = inline_then_branches(model)
    onnx.save(model, str(out / decoder))
    return replaced


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an fx2onnx causal-LM folder")
    parser.add_argument("out", type=Path, help="the copy to write (replaced if it exists)")
    args = parser.parse_args(argv)
    print(f"{write_unguarded(args.folder, args.out)} If nodes replaced by their then branch in {args.out}")


if __name__ == "__main__":
    main()
