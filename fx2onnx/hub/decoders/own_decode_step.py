"""A decode step whose capture failed, run in eager PyTorch: when the model's own forward
fails on it too, the model's code is the cause, and the error says so instead of the
capture's (whose message points into torch.export)."""

from __future__ import annotations

import contextlib

import torch

from fx2onnx.hub.decoders.decode_step import decode_step_inputs
from fx2onnx.hub.loading import LoadedModel


class DecodeStepError(RuntimeError):
    """The model's own forward fails on a decode step over its cache (new tokens after
    cached ones), the step a text-generation folder runs: nothing fx2onnx can export."""


def own_decode_step_failure(loaded: LoadedModel) -> DecodeStepError | None:
    """The error to raise when ``loaded``'s forward fails in eager PyTorch on the decode
    step export-hf captures (a fresh prefill's cache, then the new tokens); None when it runs."""
    mode = loaded.fake_context.fake_mode if loaded.fake_context is not None else contextlib.nullcontext()
    inputs = decode_step_inputs(loaded)
    try:
        with mode, torch.no_grad():
            loaded.model(**inputs)
    except Exception as error:  # noqa: BLE001 - the model's own failure is the cause the error names
        return DecodeStepError(
            f"{type(loaded.model).__name__}'s own forward fails in eager PyTorch on a decode step over its cache "
            f"(new tokens after cached ones), before any export: {type(error).__name__}: {error}. A text-generation "
            "folder runs that step, so export-hf cannot serve this model for text generation as its code is "
            "written; a task of one pass without a cache is not affected. Nothing was written."
        )
    return None
