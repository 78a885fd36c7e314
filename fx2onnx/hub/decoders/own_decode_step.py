"""A decode step whose capture failed, run in eager PyTorch: when the model's own forward
fails on it too, the model's code is the cause, and the error says so instead of the
capture's (whose message points into torch.export)."""

from __future__ import annotations

from fx2onnx.hub.decoders.decode_step import decode_step_inputs
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.program_files import own_forward_failure, quoted_error
from fx2onnx.hub.tasks import UnsupportedTaskError


class DecodeStepError(UnsupportedTaskError):
    """The model's own forward fails on a decode step over its cache (new tokens after
    cached ones), the step a text-generation folder runs: export-hf refuses the model for
    text generation, naming the line of its code that fails."""


def own_decode_step_failure(loaded: LoadedModel) -> DecodeStepError | None:
    """The error to raise when ``loaded``'s forward fails in eager PyTorch on the decode
    step export-hf captures (a fresh prefill's cache, then the new tokens); None when it runs."""
    name = type(loaded.model).__name__
    return own_forward_failure(loaded, decode_step_inputs(loaded), lambda error: DecodeStepError(
        f"{name}'s own forward fails in eager PyTorch on a decode step over its cache "
        f"(new tokens after cached ones), before any export: {quoted_error(error, loaded.model)}. A text-generation "
        "folder runs that step, so export-hf cannot serve this model for text generation as its code is "
        "written; a task of one pass without a cache is not affected. Nothing was written."
    ), run_fake=True)
