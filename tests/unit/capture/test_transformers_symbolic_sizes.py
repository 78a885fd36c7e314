"""transformers' `torch_int` during a capture (capture/libraries/transformers_symbolic_sizes.py,
listed in library_adapters.CAPTURE_REWRITES for every transformers module that imports it):
eager values as the original gives them, every loaded module's `torch_int` rewritten during
the capture only, and a patch grid computed as DPT computes it (`torch_int(n ** 0.5)`) kept
dynamic in the export, exact at perfect squares far from the example's."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import fx2onnx
from fx2onnx.capture.libraries.transformers_symbolic_sizes import symbolic_size_as_is
from fx2onnx.capture.library_adapters import rewritten_library_functions

transformers = pytest.importorskip("transformers")


def test_torch_int_is_transformers_on_eager_values() -> None:
    from transformers.utils import torch_int

    rewritten = symbolic_size_as_is(torch_int)
    for value in (7, 7.9, 48**0.5, 49**0.5, torch.tensor(3)):
        assert rewritten(value) == torch_int(value) and type(rewritten(value)) is int


def test_every_loaded_module_that_imports_torch_int_gets_it_during_the_capture_only() -> None:
    names = ("dpt", "vit", "rt_detr", "dinov2")
    modules = [importlib.import_module(f"transformers.models.{name}.modeling_{name}") for name in names]
    originals = [module.torch_int for module in modules]
    with rewritten_library_functions():
        for module, original in zip(modules, originals):
            assert module.torch_int is not original and module.torch_int.__wrapped__ is original
    assert [module.torch_int for module in modules] == originals


def test_a_square_patch_grid_stays_dynamic(export_and_compare, tmp_path) -> None:
    """A function in DPT's file that reshapes its tokens to a square grid of side
    `torch_int(n ** 0.5)` (as DPT's neck does without a backbone): exported on 16 tokens, it
    gives the eager grid for 49 and for 4096 tokens (the square root computed from the input,
    not the example's 4)."""
    dpt = importlib.import_module("transformers.models.dpt.modeling_dpt")
    namespace: dict = {}
    # compiled with the module's globals: the code reads `torch_int` there, as DPT's does
    exec(compile("def grid(x):\n    b, n, c = x.shape\n    size = torch_int(n ** 0.5)\n"
                 "    return x.reshape(b, size, size, c).permute(0, 3, 1, 2).cumsum(-1)\n",
                 dpt.__file__, "exec"), dpt.__dict__, namespace)

    class Grid(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return namespace["grid"](x)

    options = fx2onnx.ExportOptions(dynamic_shapes={"x": {1: torch.export.Dim.DYNAMIC}})
    program = export_and_compare(Grid().eval(), (torch.randn(2, 16, 3),), options=options,
                                 second_inputs=((torch.randn(2, 49, 3),), {}))
    (output,) = program.model.graph.outputs
    assert isinstance(output.shape[2].value, str) and isinstance(output.shape[3].value, str)
    tokens = torch.randn(2, 4096, 3)
    got = np.asarray(program(tokens))  # the program's one output
    assert got.shape == (2, 3, 64, 64)
    np.testing.assert_allclose(got, Grid()(tokens).numpy(), rtol=1e-5, atol=1e-5)


def test_depth_anything_gets_int_during_the_capture_only() -> None:
    module = importlib.import_module("transformers.models.depth_anything.modeling_depth_anything")
    assert "int" not in vars(module)
    with rewritten_library_functions():
        rewritten = vars(module)["int"]
        assert rewritten.__wrapped__ is int and rewritten(7.9) == 7 and type(rewritten(7.9)) is int
    assert "int" not in vars(module)
