"""A recurrent state that forward takes and returns as a list of tensors (RWKV's ``state``).

RWKV's forward takes ``state=`` (five tensors of (batch, hidden size, layers): each layer's
last token before its feed-forward and its time mix, and its time mix's numerator,
denominator and running maximum) and returns the next one as ``state``, written into the
tensors it was given. The export names them after the argument (``state.<i>`` in, the
written inputs and the returned list out); the folder's graph takes them as ``past_state.<i>``
and gives their next values as ``present_state.<i>``, the names its fed-back states go by
(dim_roles.present_name: `past_` -> `present_`). Zeros are a valid first state: the numerator
and denominator of zero weigh nothing, whatever the maximum is.

The graph computes a step of one token as it does a prompt (its shift taken from the state,
the time mix's loop a scan: transformers_token_scans.py), which is what transformers' own
single-token branch computes for one sequence; for a batch of several that branch broadcasts
its shift state wrongly (`BATCH_ROWS_ALONE`), so `--verify` compares each row with
transformers' generation of that row alone.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import onnx_ir as ir
import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.decoders.decode_step import STATE_LIST, cache_argument

PAST_STATE, PRESENT_STATE = "past_state", "present_state"
BATCH_ROWS_ALONE = (
    "the batch's rows are compared with transformers' generation of each row alone: transformers' own single-token "
    "step of RWKV broadcasts its (batch, hidden) shift state against the (batch, 1, hidden) token and returns "
    "(batch, batch, vocab) logits for a batch of more than one; RWKV reads no attention mask, so a pad is a token "
    "to it in both"
)
_INPUT = re.compile(r"state\.(\d+)")
# the list forward returns (`state.<i>`, `_<n>` when the name was taken) and its inputs as written (`.mutated`)
_RETURNED = re.compile(r"state\.(\d+)(?:_\d+)?")
_WRITTEN = re.compile(r"state\.(\d+)\.mutated")


def takes_state_list(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes its recurrent state as a list (RWKV's ``state``)."""
    return cache_argument(model) == STATE_LIST


def state_list_options(
    model: torch.nn.Module, inputs: dict[str, Any], options: fx2onnx.ExportOptions,
) -> fx2onnx.ExportOptions:
    """``options`` for the decode step of ``model`` on ``inputs``: a state list's dims dynamic
    along the batch only (`state_list_dynamic_shapes`); as they are for a model with a cache."""
    if not takes_state_list(model):
        return options
    return dataclasses.replace(options, dynamic_shapes=state_list_dynamic_shapes(inputs, STATE_LIST))


def name_states(model: torch.nn.Module, graph_model: ir.Model) -> None:
    """The exported decode step's state list named as the folder's (`name_state_list`:
    ``past_state.<i>`` in, ``present_state.<i>`` out) when ``model`` takes one."""
    if takes_state_list(model):
        name_state_list(graph_model)


def state_list_dynamic_shapes(inputs: dict[str, Any], argument: str) -> dict[str, Any]:
    """Every dim of the tensor inputs dynamic, but the state list's (``argument``) only along
    the batch: its sizes are the model's (its layer count would otherwise stay symbolic, as
    forward only indexes it)."""
    def spec(name: str, value: Any) -> Any:
        if name == argument:
            return [{0: Dim.AUTO} for _ in value]
        return {index: Dim.AUTO for index in range(value.dim())} if isinstance(value, torch.Tensor) else None

    return {name: spec(name, value) for name, value in inputs.items()}


def name_state_list(model: ir.Model) -> list[str]:
    """Rename ``model``'s ``state.<i>`` inputs to ``past_state.<i>`` and the state forward
    returns to ``present_state.<i>``, dropping the inputs' written copies (the same values);
    returns the inputs' new names."""
    graph = model.graph
    inputs = [value for value in graph.inputs if _INPUT.fullmatch(value.name or "")]
    returned: dict[str, ir.Value] = {}
    for value in list(graph.outputs):
        if _WRITTEN.fullmatch(value.name or ""):
            graph.outputs.remove(value)
        elif match := _RETURNED.fullmatch(value.name or ""):
            returned[match.group(1)] = value
    for value in inputs:
        index = _INPUT.fullmatch(value.name or "").group(1)
        if index not in returned:
            raise ValueError(f"the graph takes {value.name} but returns no next value of it")
        value.name = f"{PAST_STATE}.{index}"
        returned.pop(index).name = f"{PRESENT_STATE}.{index}"
    if returned:
        raise ValueError(f"the graph returns state {', '.join(sorted(returned))} without taking it")
    return [value.name for value in inputs]
