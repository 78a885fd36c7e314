"""Fake mode: build and export models whose weights are never materialized.

Parameters are FakeTensors; buffers are computed for real at construction (see
`fake_modules`), so that a checkpoint, which holds parameters and persistent buffers,
is all the saved model needs.

>>> import torch, fx2onnx
>>> with fx2onnx.enable_fake_mode() as fake_context:
...     model = torch.nn.Linear(16, 4)  # parameters are FakeTensors: no memory for weights
...     x = torch.rand(2, 16)
>>> options = fx2onnx.ExportOptions(fake_context=fake_context, failure_report_path=None)
>>> program = fx2onnx.dynamo_export(model, x, export_options=options)
>>> program.has_weight_data
False
>>> outputs = program(torch.rand(2, 16), model_state=torch.nn.Linear(16, 4).state_dict())
>>> tuple(outputs.shape)
(2, 4)

`program.save("model.onnx", model_state="checkpoint.safetensors")` writes the file.

Only the two ends of the pipeline know about it: capture checks what is fake, and
`ONNXProgram.save` fills the data-less initializers from a state dict or checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fx2onnx.capture.fake_modules import FakeModuleBuilder
from fx2onnx.options import ONNXFakeContext


@contextlib.contextmanager
def enable_fake_mode() -> Iterator[ONNXFakeContext]:
    """Create tensors and modules as FakeTensors (shapes and dtypes, no data) inside it.

    Models built inside take no memory for their weights (their buffers are real and
    computed as usual: kilobytes for a transformer); export them with
    `ExportOptions(fake_context=<the yielded context>)` and write the real weights with
    `ONNXProgram.save(path, model_state=<state dict, checkpoint file or folder>)`.
    """
    already_fake = torch._guards.detect_fake_mode() is not None
    fake_mode = FakeTensorMode(
        # Real tensors created before (e.g. a real model's weights) may mix with fake
        # ones, unless an outer fake mode already decides that.
        allow_non_fake_inputs=not already_fake,
        shape_env=ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False),
    )
    context = ONNXFakeContext(fake_mode=fake_mode)
    with FakeModuleBuilder(fake_mode, outside_fake_mode).active(), fake_mode:
        yield context
    context.state_dict_paths = ()


@contextlib.contextmanager
def outside_fake_mode() -> Iterator[None]:
    """Leave an active fake mode for the time of the block (an export started inside
    `with enable_fake_mode()` builds real constants; torch.export finds the fake mode
    from the fake inputs by itself)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily  # private: reached here only

    with unset_fake_temporarily():
        yield


def fake_copy(fake_mode: FakeTensorMode, tensor: torch.Tensor, static: bool = False) -> torch.Tensor:
    """``tensor`` as a fake tensor of ``fake_mode`` with the dims asked for: symbolic, or its
    sizes as numbers (``static``), whatever the mode made of that tensor before.

    A fake mode remembers the fake it made of each real tensor for as long as that fake
    lives, and gives it again when the tensor is converted another time, whatever dims are
    asked (`from_tensor`, or running ops on the tensor in the mode). An export's fakes live
    until the garbage collector frees their reference cycles, so a second conversion would
    get symbolic or numeric sizes depending on when the collector last ran (on what ran
    before in the process). A copy is converted instead: what the mode remembers is about
    the copy, which dies here."""
    if isinstance(tensor, FakeTensor):
        return fake_mode.from_tensor(tensor, static_shapes=static)
    with outside_fake_mode():  # the copy real, not converted by the active mode on its way
        copy = tensor.clone()
    return fake_mode.from_tensor(copy, static_shapes=static)


def is_fake(value: Any) -> bool:
    """A tensor without data: a FakeTensor or a tensor on the meta device."""
    return isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.device.type == "meta")


def _module_tensors(model: Any) -> list[torch.Tensor]:
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.parameters(), *model.buffers()]


def check_fake_mode_use(
    model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], fake_context: ONNXFakeContext | None
) -> None:
    """Refuse mixes of fake and real tensors that cannot give a sound export, saying what
    to change. Allowed: everything real without a fake context; fake inputs (and a fake or
    real model) with one."""
    inputs = [leaf for leaf in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(leaf, torch.Tensor)]
    weights = _module_tensors(model)
    fake_inputs = [t for t in inputs if is_fake(t)]
    fake_weights = any(is_fake(t) for t in weights)
    if fake_context is None:
        if fake_inputs or fake_weights:
            what = "weights and example inputs" if fake_inputs and fake_weights else "example inputs" if fake_inputs else "weights"
            raise ValueError(
                f"The model's {what} are fake tensors (FakeTensor or meta device: no data) but no fake "
                "context was given. Build the model and inputs inside `with fx2onnx.enable_fake_mode() as "
                "fake_context:` and export with ExportOptions(fake_context=fake_context); load real weights "
                "afterwards with ONNXProgram.save(..., model_state=...)."
            )
        return
    if len(fake_inputs) < len(inputs):
        raise ValueError(
            "ExportOptions(fake_context=...) is set but some example inputs are real tensors: create the "
            "example inputs inside `with fx2onnx.enable_fake_mode()` too (or drop fake_context to export "
            "a real model with real inputs)."
        )
    foreign = [t for t in fake_inputs if isinstance(t, FakeTensor) and t.fake_mode is not fake_context.fake_mode]
    if foreign:
        raise ValueError(
            "Some example inputs are fake tensors of another fake mode than ExportOptions(fake_context=...): "
            "create the model and its inputs inside the same `with fx2onnx.enable_fake_mode()` block."
        )


__all__ = ["ONNXFakeContext", "check_fake_mode_use", "enable_fake_mode", "fake_copy", "is_fake", "outside_fake_mode"]
