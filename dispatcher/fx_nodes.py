"""FX-graph helpers that every layer above uses and that know nothing of dispatch: where in
the user's code a node comes from (read from ``node.stack_trace``), the value a node
computes (``meta["val"]``), and the walk over a graph and the graphs it calls."""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig
from collections.abc import Iterable, Iterator
from typing import Any

import torch.fx
from diagnostics import Location, Stack


# -- values -------------------------------------------------------------------------------


def node_value(arg: Any) -> Any:
    """What an FX node computes (its ``meta["val"]``: a FakeTensor, a SymInt...); None
    for an argument that is not a node, or a node without the metadata."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def argument_value(arg: Any) -> Any:
    """An FX argument as the operator sees it: a node's ``meta["val"]``, a constant as
    it is."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def node_values(args: Iterable[Any]) -> Iterator[Any]:
    """``meta["val"]`` of every FX node among ``args``, looking inside lists, tuples and
    dicts."""
    for arg in args:
        if isinstance(arg, torch.fx.Node):
            yield arg.meta.get("val")
        elif isinstance(arg, (list, tuple)):
            yield from node_values(arg)
        elif isinstance(arg, dict):
            yield from node_values(arg.values())


# -- graphs -------------------------------------------------------------------------------


def walk_graph_modules(graph_module: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.GraphModule, torch.fx.Node]]:
    """Every node of ``graph_module`` and of the GraphModules it reaches through
    ``get_attr`` or ``call_module`` (module calls, control-flow branches and bodies), with
    the GraphModule that holds it. A reached GraphModule's nodes come right after the node
    that reaches it (source order); each GraphModule is walked once."""
    seen: set[int] = set()

    def walk(module: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.GraphModule, torch.fx.Node]]:
        seen.add(id(module))
        for node in module.graph.nodes:
            yield module, node
            if node.op in ("call_module", "get_attr") and isinstance(node.target, str):
                try:
                    sub = module.get_submodule(node.target)
                except AttributeError:  # a get_attr of a tensor, not a module
                    continue
                if isinstance(sub, torch.fx.GraphModule) and id(sub) not in seen:
                    yield from walk(sub)

    return walk(graph_module)


def placeholder_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's inputs, in order."""
    return [node for node in graph_module.graph.nodes if node.op == "placeholder"]


def fetch_attr(module: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node's dotted ``target`` names in ``module``."""
    item: Any = module
    for part in target.split("."):
        item = getattr(item, part)
    return item


def graph_modules(graph_module: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """``graph_module`` and every GraphModule its nodes reach (branches, bodies, module
    calls), each once, in source order."""
    return list(dict.fromkeys(module for module, _ in walk_graph_modules(graph_module)))


# -- locations ----------------------------------------------------------------------------

# Packages whose frames are never the user's line: the exporter's own packages and the
# libraries it drives. They are matched by where they are installed, so a user project
# that happens to live in a folder named "torch" or "fx2onnx" is still the user's code.
_TOOL_PACKAGES = ("torch", "onnxscript", "onnx_ir", "onnx", "fx2onnx", "dispatcher", "diagnostics")
# Fallback for paths that are not absolute or not where the packages are installed now
# (e.g. a stack trace recorded on another machine).
_NOT_USER_CODE = (
    "/site-packages/torch/",
    "/dist-packages/torch/",
    "/site-packages/onnxscript/",
    "/site-packages/onnx_ir/",
    "/site-packages/onnx/",
)
_INSTALLED_PACKAGES = ("/site-packages/", "/dist-packages/")


def node_stack(node: torch.fx.Node) -> Stack:
    """The Python stack recorded for the node (innermost frame last); empty if none."""
    text = node.meta.get("stack_trace") or getattr(node, "stack_trace", None)
    return Stack.from_python_traceback(text)


def node_location(node: torch.fx.Node) -> Location | None:
    """The user's source line that created the node.

    The innermost frame outside torch and the exporter; frames of installed packages
    (e.g. transformers) are passed over when the user's own code is on the stack, and
    used otherwise (a model defined by a library is still located in that library).
    """
    return stack_location(node_stack(node))


def stack_location(stack: Stack) -> Location | None:
    """The user's frame of ``stack`` (see :func:`node_location`); None when every frame
    is in torch or the exporter."""
    own_code = _innermost(stack, _NOT_USER_CODE + _INSTALLED_PACKAGES)
    if own_code is not None:
        return own_code
    return _innermost(stack, _NOT_USER_CODE)


def _innermost(stack: Stack, exclude: tuple[str, ...]) -> Location | None:
    for frame in reversed(stack.frames):
        if not is_tool_frame(frame.path) and not _contains(frame.path, exclude):
            return frame
    return None


def is_tool_frame(path: str) -> bool:
    """Whether a frame's file belongs to torch, the exporter, or the Python standard
    library (or is a pseudo-file such as ``<frozen ...>`` or ``<eval_with_key>.3``)."""
    if not path or path.startswith("<"):
        return True
    if _contains(path, _NOT_USER_CODE):
        return True
    if not os.path.isabs(path):
        # "torch/fx/passes/x.py": relative to a sys.path entry.
        return path.replace("\\", "/").split("/", 1)[0] in _TOOL_PACKAGES
    path = os.path.normcase(os.path.normpath(path))
    if any(path.startswith(root) for root in _tool_roots()):
        return True
    stdlib = _stdlib_root()
    return path.startswith(stdlib) and not _contains(path, _INSTALLED_PACKAGES)


def _contains(path: str, parts: tuple[str, ...]) -> bool:
    # Relative paths ("torch/fx/...") and Windows separators match like absolute ones.
    normalized = "/" + path.replace("\\", "/")
    return any(part in normalized for part in parts)


@functools.cache
def _tool_roots() -> tuple[str, ...]:
    roots = []
    for name in _TOOL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.append(os.path.normcase(os.path.normpath(location)) + os.sep)
    return tuple(roots)


@functools.cache
def _stdlib_root() -> str:
    return os.path.normcase(os.path.normpath(sysconfig.get_paths()["stdlib"])) + os.sep
