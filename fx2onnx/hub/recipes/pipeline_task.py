"""The one-pass pipeline-task recipe (classifiers, question answering, fill-mask,
detection, segmentation, depth, CTC and audio, CLIP-style zero-shot; pipeline_tasks.py):
one `onnx/model.onnx` with the outputs the task's pipelines read. Its verification
compares every output the folder's model keeps against transformers', on two input sizes
(the second with a padded row; a detector's images of another height and width where the
folder's model takes any). An audio model reads the mask of a padded batch where its
feature extractor returns one (speech/audio_mask.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import fx2onnx
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.pipeline_tasks import example_inputs
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.program_files import exported_or_refused, onnx_file, save_program
from fx2onnx.hub.shared.verification import Tolerance, Verification, cpu_session, run_session, verdict_of
from fx2onnx.hub.speech.audio_input import reads_mask
from fx2onnx.hub.speech.audio_mask import frames_mask_rule
from fx2onnx.hub.speech.transformers_js_speech import ctc_client_note


def _torch_output(outputs: Any, name: str) -> torch.Tensor:
    return outputs[name] if isinstance(outputs, dict) else getattr(outputs, name)


def audio_mask(loaded: LoadedModel) -> bool:
    """Whether the folder of an audio task reads the mask of a padded batch."""
    return pipeline_tasks.PIPELINE_TASKS[loaded.task].inputs is pipeline_tasks.InputKind.AUDIO and reads_mask(
        Path(loaded.folder), loaded.model)


def attended_frames(model: torch.nn.Module, inputs: dict[str, torch.Tensor], actual: np.ndarray,
                    expected: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """A CTC model's logits (batch, frames, vocabulary) at the output frames its input mask
    attends (by the model's own rule, audio_mask.frames_mask_rule): a padded clip's other
    frames are no transcription, and their values differ between attention kernels (a query
    row masked whole); other outputs as they are."""
    rule = frames_mask_rule(model) if "attention_mask" in inputs and expected.dim() == 3 else None
    if rule is None:
        return actual, expected
    frames = rule(inputs["attention_mask"], expected.shape[1]).bool()
    return actual[frames.numpy()], expected[frames]


def takes_any_image_size(session: Any) -> bool:
    """Whether the session's ``pixel_values`` (batch, channels, height, width) has its height
    and width dynamic (dims named rather than sizes)."""
    pixels = next((i for i in session.get_inputs() if i.name == "pixel_values"), None)
    shape = pixels.shape if pixels is not None else None
    return shape is not None and len(shape) == 4 and all(isinstance(shape[d], str) for d in (2, 3))


def verify_task_outputs(
    path: Path, model: torch.nn.Module, task: str, config: Any, tolerance: Tolerance, with_mask: bool = False,
) -> Verification:
    """Every output of the folder's model against transformers', on two input sizes (a
    padded clip's logits at its attended frames; a detector's images of two sizes where the
    folder's model takes any)."""
    pairs: list[tuple[np.ndarray, torch.Tensor]] = []
    with cpu_session(path) as session:
        names = [o.name for o in session.get_outputs()]
        # detectors' folders are checked at a second image size too; DPT's depth folder names its
        # sizes dynamic but reshapes to the example's patch grid: another size fails there
        any_size = task == pipeline_tasks.OBJECT_DETECTION and takes_any_image_size(session)
        for size in (0, 1):
            inputs = example_inputs(task, config, model, size, with_mask, any_size)
            actual = run_session(session, {k: v.numpy() for k, v in inputs.items()})
            with torch.no_grad():
                expected = model(**inputs)
            pairs += [attended_frames(model, inputs, actual[name], _torch_output(expected, name)) for name in names]
    return verdict_of(pairs, tolerance)


class PipelineTaskRecipe(RecipeDefaults):
    """The task of pipeline_tasks.PIPELINE_TASKS is the loaded model's (CTC speech
    recognition's is the same name)."""

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        task = loaded.task
        if getattr(loaded.model.config, "use_cache", None):  # one pass: a decoder's cache is no output of the task
            loaded.model.config.use_cache = False
        with_mask = audio_mask(loaded)
        inputs = pipeline_tasks.example_inputs(task, loaded.config, loaded.model, 0, with_mask)
        roles = pipeline_tasks.extra_dim_roles(task, loaded.config, loaded.model, with_mask)
        program = exported_or_refused(loaded, inputs, options, roles)
        pipeline_tasks.keep_task_outputs(program.model, task)
        pipeline_tasks.name_image_dims(program.model)
        return save_program(program, staging, onnx_file(loaded, folder_layout.MODEL), loaded)

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return ctc_client_note(config)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        return verify_task_outputs(folder / onnx_file(loaded, folder_layout.MODEL), model, loaded.task, loaded.config, tolerance,
                                   audio_mask(loaded))


RECIPE = PipelineTaskRecipe()
