"""RT-DETR-style detectors' `len` during a capture
(capture/libraries/transformers_query_selection.py, listed in library_adapters.CAPTURE_REWRITES):
eager values as the originals give them, a module global shadowing `len` only while the
rewrites are in place, and a batch read with `len` kept dynamic in the export."""

from __future__ import annotations

import builtins
import importlib
import warnings

import pytest
import torch

import fx2onnx
from fx2onnx.capture.libraries.transformers_query_selection import QUERY_SELECTION_FAMILIES, first_dim_as_is
from fx2onnx.capture.library_adapters import CAPTURE_REWRITES, rewritten_library_functions

transformers = pytest.importorskip("transformers")


def test_len_is_the_builtins_on_eager_values() -> None:
    tensor_len = first_dim_as_is(builtins.len)
    for value in (torch.zeros(3, 5), torch.zeros(0, 2), [1, 2], "abcd", {"a": 1}):
        assert tensor_len(value) == len(value) and type(tensor_len(value)) is int
    with pytest.raises(TypeError, match="0-d"):
        tensor_len(torch.tensor(1.0))


def test_each_family_module_gets_len_only_during_the_capture() -> None:
    modules = [importlib.import_module(f"transformers.models.{name}.modeling_{name}") for name in QUERY_SELECTION_FAMILIES]
    originals = [module.torch_int for module in modules]
    assert not any("len" in vars(module) for module in modules)
    with rewritten_library_functions():
        for module, original in zip(modules, originals):
            assert vars(module)["len"].__wrapped__ is builtins.len
            assert module.torch_int.__wrapped__ is original
    assert not any("len" in vars(module) for module in modules)
    assert [module.torch_int for module in modules] == originals
    shadowing = [r for r in CAPTURE_REWRITES if r.shadows_builtin and r.attribute == "len"]
    # and DepthPro's, which counts its patches with len (test_depth_pro_patch_counts.py)
    depth_pro = "transformers.models.depth_pro.modeling_depth_pro"
    assert {r.module for r in shadowing} == {module.__name__ for module in modules} | {depth_pro}


def test_a_batch_read_with_len_stays_dynamic(export_and_compare) -> None:
    """A function in RT-DETR's file that repeats a weight for each of `len(x)` rows (as RT-DETR
    tiles its learned initial queries): exported on a batch of 2, it gives the eager output for 5."""
    rt_detr = importlib.import_module("transformers.models.rt_detr.modeling_rt_detr")
    namespace: dict = {}
    # compiled with the module's globals: the code reads `len` there, as RT-DETR's forward does
    exec(compile("def tiled(x, w):\n    return x.sum(-1, keepdim=True) + w.expand(len(x), 3)\n",
                 rt_detr.__file__, "exec"), rt_detr.__dict__, namespace)

    class Tiled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(1, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return namespace["tiled"](x, self.weight)

    options = fx2onnx.ExportOptions(dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}})
    with warnings.catch_warnings():
        # the non-strict capture itself (without the rewrite, `len` fixes the batch there and
        # the strict capture's TorchDynamo, which reads `len` symbolically, takes over)
        warnings.filterwarnings("error", message="Non-strict torch.export failed")
        program = export_and_compare(Tiled().eval(), (torch.randn(2, 3),), options=options,
                                     second_inputs=((torch.randn(5, 3),), {}))
    (output,) = program.model.graph.outputs
    assert isinstance(output.shape[0].value, str)
