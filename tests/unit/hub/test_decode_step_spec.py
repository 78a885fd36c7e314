"""The decode step's capture asks every dim dynamic but those of example size 1: its example
has 2 rows, 3 new tokens and 5 cached ones, so a dim of 1 is the model's own size (one
key/value head), captured static at the first attempt instead of after growing it to 2."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.export import Dim

import fx2onnx.capture.capture_strategies as strategies
from conftest import make_options
from fx2onnx.capture import registered_containers
from fx2onnx.hub.decoders.decode_step import cache_argument, decode_step_inputs, decode_step_options
from fx2onnx.hub.loading import LoadedModel

transformers = pytest.importorskip("transformers")


def test_one_key_value_head_is_static_and_captured_at_the_first_attempt(tmp_path: Path, export_and_compare,
                                                                        monkeypatch) -> None:
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = decode_step_inputs(LoadedModel(model, config, tmp_path, "text-generation", None))
    options = decode_step_options(inputs, make_options(tmp_path, dynamic_shapes=True))
    keys = {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO}  # (batch, heads, past, head size): the one head static
    assert options.dynamic_shapes[cache_argument(model)] == [[keys, keys]]  # one layer: its keys and values
    assert options.dynamic_shapes["input_ids"] == {0: Dim.AUTO, 1: Dim.AUTO}
    assert decode_step_options(inputs, make_options(tmp_path)).dynamic_shapes is None  # a spec not asked: as given
    captures = []
    run = strategies.run_torch_export
    monkeypatch.setattr(strategies, "run_torch_export", lambda *args: captures.append(args[4:]) or run(*args))
    # the eager model writes into the cache it is given: each run gets its own copy; the
    # caches compared by their tensors
    with registered_containers():
        export_and_compare(model, kwargs=copy.deepcopy(inputs), options=options,
                           eager=lambda **given: model(**copy.deepcopy(given)))
    assert captures == [(False, False)]  # non-strict, not size-oblivious: the example as given
