"""A recipe's programs: exported with their dims named by role, saved into the folder under
the file names its clients look for, from example inputs in the load's fake mode when it has one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import onnx_ir as ir
import torch

import fx2onnx
from fx2onnx.capture import failing_line, fake_copy
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.dim_roles import name_dims_by_role
from fx2onnx.hub.shared.value_branch_refusal import ONE_PASS, value_branch_failure
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.onnx_passes import WeightQuantization

_Failure = TypeVar("_Failure", bound=Exception)


def exported(
    model: torch.nn.Module, inputs: dict[str, Any], options: fx2onnx.ExportOptions,
    extra_roles: dict[str, dict[int, str]] | None = None,
) -> fx2onnx.ONNXProgram:
    """The export of ``model`` with its dims named after their roles."""
    program = fx2onnx.dynamo_export(model, **inputs, export_options=options)
    name_dims_by_role(program.model, extra_roles, program.warnings)
    return program


def exported_or_refused(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], options: fx2onnx.ExportOptions,
    extra_roles: dict[str, dict[int, str]] | None = None,
) -> fx2onnx.ONNXProgram:
    """:func:`exported` of the loaded model on ``inputs`` (faked as the load is); when the
    export fails and transformers' own forward fails on the same inputs, the refusal that
    says so (`inputs_refusal`) instead, and when it fails on a Python branch over tensor
    values in the model's code, the error naming that line (`value_branch_failure`)."""
    try:
        return exported(loaded.model, fake_inputs(inputs, loaded), options, extra_roles)
    except fx2onnx.OnnxExporterError as error:
        refusal = inputs_refusal(loaded, inputs) or value_branch_failure(loaded, error, options.failure_report_path, ONE_PASS)
        if refusal is None:
            raise
        raise refusal from error


def own_forward_failure(
    loaded: LoadedModel, inputs: dict[str, Any], failure: Callable[[Exception], _Failure],
    caught: tuple[type[Exception], ...] = (Exception,), run_fake: bool = False, module: torch.nn.Module | None = None,
) -> _Failure | None:
    """After a failed capture: ``failure`` of the error (one of ``caught``) that the loaded
    model's own forward (or ``module``'s, a part export-hf captures around it) raises in eager
    PyTorch on ``inputs``, the cause to name instead of the capture's; None when it runs them
    (the capture's failure is then the cause). A fake model runs in its fake mode with
    ``run_fake``, and is not run (None) without."""
    if loaded.fake_context is not None and not run_fake:
        return None
    mode = eager_forwards(loaded)
    try:
        with mode, torch.no_grad():
            (module or loaded.model)(**inputs)
    except caught as own:  # noqa: BLE001 - the model's own failure is the cause the error names
        return failure(own)
    return None


def quoted_error(own: BaseException, model: torch.nn.Module | None = None) -> str:
    """`Type: the first line of its message`, as an error of the model's own code is quoted;
    with ``model``, followed by the line of its code that raised it, where its traceback has one."""
    said = str(own).strip().splitlines()
    quoted = f"{type(own).__name__}: {said[0].rstrip('.')}" if said else type(own).__name__
    line = failing_line(model, own) if model is not None else None
    return quoted if line is None else f"{quoted} (raised at {line})"


def own_forward_refusal(
    model: torch.nn.Module, model_type: str, runs: str, own: BaseException, todo: str, on: str = "",
) -> UnsupportedTaskError:
    """The refusal of a model whose own forward fails in eager PyTorch on what its folder needs
    it to run (``runs``: "the prefill ..."; ``on``: what it fails on, "them"): its error quoted,
    nothing written, then ``todo``."""
    return UnsupportedTaskError(
        f"{type(model).__name__} ({model_type}) does not run {runs}: transformers' own forward "
        f"fails {f'on {on} ' if on else ''}with {quoted_error(own, model)}. No folder was written. {todo}"
    )


def inputs_refusal(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> UnsupportedTaskError | None:
    """After a failed capture: the refusal when transformers' own forward fails on the
    inputs the task's folder feeds (a layout model without its boxes, a classifier built on
    a vision-language model, patches its image processor cuts), None when it runs them (the
    capture's failure is then the cause) or the model is fake (nothing to run)."""
    return own_forward_failure(loaded, inputs, lambda own: own_forward_refusal(
        loaded.model, loaded.model.config.model_type, f"on the inputs its {loaded.task} folder feeds ({', '.join(inputs)})", own,
        "Export it with fx2onnx.dynamo_export and the inputs its forward needs.", on="them",
    ), caught=(ValueError, TypeError, RuntimeError))


def weights_dtype(loaded: LoadedModel) -> torch.dtype:
    """The dtype of the loaded model's floating-point weights."""
    return next(p.dtype for p in loaded.model.parameters() if p.is_floating_point())


def onnx_file(loaded: LoadedModel, base: str, quantization: WeightQuantization | None = None) -> str:
    """The folder's path of the model ``base`` (folder_layout.py), named for its dtype and bits."""
    return folder_layout.onnx_file(base, weights_dtype(loaded), quantization.bits if quantization is not None else None)


def save_program(
    program: fx2onnx.ONNXProgram, staging: Path, relative: str, loaded: LoadedModel, state: Any = None
) -> list[str]:
    """Save ``program`` at ``relative`` in the folder, its weights in the data file named as
    Transformers.js expects (read from ``state``, default the source folder, in fake mode);
    returns both paths."""
    if loaded.fake_context is None:
        state = None
    elif state is None:
        state = loaded.weights if loaded.weights is not None else loaded.folder
    program.save(staging / relative, model_state=state, external_data=True, data_name=folder_layout.data_file(relative))
    return folder_layout.with_data_file(relative)


def saved_graph(path: Path) -> ir.Model:
    """The model file at ``path`` as saved (its graph files' rewrites included), its weights
    left unread in their data file."""
    return ir.load(path)


def fake_inputs(inputs: dict[str, torch.Tensor], loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """``inputs`` as fake tensors of the load's fake mode, their dims symbolic (unchanged when
    the model is real). The real tensors converted again later (run in the mode) are faked
    with their sizes as numbers, whenever the collector frees these: see `fake_copy`."""
    if loaded.fake_context is None:
        return inputs
    return {k: fake_copy(loaded.fake_context.fake_mode, v) for k, v in inputs.items()}
