"""The one-pass pipeline-task recipe (classifiers, question answering, fill-mask,
detection, segmentation, depth, CTC and audio, CLIP-style zero-shot; pipeline_tasks.py):
one `onnx/model.onnx` with the outputs the task's pipelines read. Its verification
compares every output the folder's model keeps against transformers', on two input sizes
(the second with a padded row; images of another height and width where the folder's model
names them dynamic, which it does only where transformers' model runs them: image_sizes.py).
An audio model reads the mask of a padded batch where its feature extractor returns one
(speech/audio_mask.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import fx2onnx
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.pipeline_tasks import example_inputs, takes_any_image_size
from fx2onnx.hub.precision.float32_io import float32_io
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.image_sizes import image_dims
from fx2onnx.hub.shared.program_files import exported_or_refused, onnx_file, quoted_error, save_program
from fx2onnx.hub.shared.verification import Tolerance, Verification, cpu_session, run_session, verdict_of
from fx2onnx.hub.speech.audio_input import reads_mask
from fx2onnx.hub.speech.audio_mask import frames_mask_rule
from fx2onnx.hub.speech.transformers_js_speech import ctc_client_note


# the settings of RT-DETR's decoder in a config (the denoising queries it trains with, the anchors its query
# selection scores): every detector built on that decoder's code keeps them (RT-DETR, RT-DETR v2, D-FINE,
# DEIMv2, PP-DocLayout v2 to v4), and transformers post-processes each of them with a sigmoid over the
# query-label pairs (RTDetrImageProcessor's use_focal_loss, PP-DocLayout's own image processors), where
# Transformers.js's object-detection pipeline applies DETR's rule to every detector
# (post_process_object_detection, lines 19863-19900 of dist/transformers.node.mjs)
RT_DETR_DECODER_SETTINGS = ("num_denoising", "anchor_image_size")
# the model types Transformers.js's AutoModelForObjectDetection loads (MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES,
# lines 32723-32731 of dist/transformers.node.mjs); another stops with "Unsupported model type"
TRANSFORMERS_JS_DETECTORS = frozenset({"detr", "rt_detr", "rt_detr_v2", "rf_detr", "d_fine", "table-transformer", "yolos"})


def rt_detr_detector(config: dict[str, Any]) -> bool:
    """Whether config.json ``config`` is that of a detector on RT-DETR's decoder (its
    settings, RT_DETR_DECODER_SETTINGS; a ...ForObjectDetection class, not a backbone)."""
    architectures = config.get("architectures") or ()
    return all(name in config for name in RT_DETR_DECODER_SETTINGS) and any(
        str(a).endswith("ForObjectDetection") for a in architectures)


def detection_client_note(config: dict[str, Any]) -> str | None:
    """What export-hf says of the folder of a detector on RT-DETR's decoder (config.json
    ``config``): its outputs are the model's, Transformers.js's pipeline detections are not
    transformers' (and, for a model type it lists no class for, it loads none); None for
    the other models."""
    if not rt_detr_detector(config):
        return None
    model_type = config.get("model_type")
    rule = ("DETR's rule (the softmax of each query's largest logit, the last label dropped as 'no object'; "
            "post_process_object_detection, lines 19863-19900 of dist/transformers.node.mjs), where transformers' "
            "image processor (RTDetrImageProcessor; PP-DocLayout's own) keeps the best query-label pairs scored by a "
            "sigmoid: the folder's logits and pred_boxes are the model's outputs (what --verify compares with "
            "transformers'), the pipeline's scores and labels are not transformers'. For transformers' detections, run the model (AutoModelForObjectDetection) and apply the "
            "sigmoid rule to its outputs.")
    if model_type in TRANSFORMERS_JS_DETECTORS:
        return f"{TRANSFORMERS_JS}'s object-detection pipeline post-processes this {model_type} folder with {rule}"
    return (f"{TRANSFORMERS_JS} has no object-detection class for {model_type} (its AutoModelForObjectDetection stops "
            f"with 'Unsupported model type: {model_type}'; MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES, lines 32723-32731 "
            f"of dist/transformers.node.mjs); this {model_type} folder shares RT-DETR's decoder, which its "
            f"object-detection pipeline post-processes with {rule}")


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


# a detector's outputs per query, (batch, queries, ...): compared query by query once matched
DETECTION_OUTPUTS = ("logits", "pred_boxes")


def matched_queries(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``actual``'s detector outputs with each image's queries in the order of ``expected``'s,
    each paired with the nearest unpaired one (largest difference of its logits and box).
    Detectors that pick their queries by the top k of their encoder's scores (RT-DETR,
    Deformable DETR's two stages) order them by those scores, which float16 rounds: two
    near-equal scores come in either order, and the queries with them; every pipeline
    post-processes the queries as a set. A query only one side picked stays unpaired with
    its match and fails the comparison."""
    if not all(name in actual and name in expected and actual[name].ndim == 3 for name in DETECTION_OUTPUTS):
        return actual
    ours = np.concatenate([actual[name].astype(np.float64) for name in DETECTION_OUTPUTS], axis=-1)
    theirs = np.concatenate([expected[name].astype(np.float64) for name in DETECTION_OUTPUTS], axis=-1)
    if ours.shape != theirs.shape:
        return actual
    order = np.empty(ours.shape[:2], dtype=np.int64)
    for row in range(ours.shape[0]):
        cost = np.abs(theirs[row][:, None, :] - ours[row][None, :, :]).max(axis=-1)  # (expected query, actual query)
        for _ in range(cost.shape[0]):  # the closest pair first
            want, got = np.unravel_index(np.argmin(cost), cost.shape)
            order[row, want] = got
            cost[want, :], cost[:, got] = np.inf, np.inf
    rows = np.arange(ours.shape[0])[:, None]
    return {**actual, **{name: actual[name][rows, order] for name in DETECTION_OUTPUTS}}


def verify_task_outputs(
    path: Path, model: torch.nn.Module, task: str, config: Any, tolerance: Tolerance, with_mask: bool = False,
) -> Verification:
    """Every output of the folder's model against transformers', on two input sizes (a
    padded clip's logits at its attended frames; images of a second height and width where
    the folder's model names them dynamic)."""
    pairs: list[tuple[np.ndarray, torch.Tensor]] = []
    with cpu_session(path) as session:
        names = [o.name for o in session.get_outputs()]
        any_size = pipeline_tasks.PIPELINE_TASKS[task].inputs in pipeline_tasks.IMAGE_KINDS and takes_any_image_size(session)
        for size in (0, 1):
            inputs = example_inputs(task, config, model, size, with_mask, any_size)
            try:
                with torch.no_grad():
                    expected = model(**inputs)
            except (ValueError, TypeError, RuntimeError) as own:  # a folder that names sizes its model cannot run
                failure = (f"the folder names the height and width of pixel_values dynamic, but transformers' model "
                           f"itself does not run images of {list(inputs['pixel_values'].shape[2:])}: {quoted_error(own)}")
                return Verification.failed(failure, tolerance)
            actual = run_session(session, {k: v.numpy() for k, v in inputs.items()})
            if task == pipeline_tasks.OBJECT_DETECTION:
                actual = matched_queries(actual, {name: _torch_output(expected, name).float().numpy() for name in names})
            for name in names:
                got, want = actual[name], _torch_output(expected, name)
                if tuple(got.shape) != tuple(want.shape):  # a size the graph fixed at the example's
                    failure = (f"the {name} is {list(got.shape)} where transformers' is {list(want.shape)} (the inputs "
                               f"of size {size}: {', '.join(f'{k} {list(v.shape)}' for k, v in inputs.items())})")
                    return Verification.failed(failure, tolerance)
                pairs.append(attended_frames(model, inputs, got, want))
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
        grown = example_inputs(task, loaded.config, loaded.model, 1, with_mask, any_image_size=True)
        written = image_dims(loaded, program.model, grown, staging, say)
        float32_io(program.model)
        return [*written, *save_program(program, staging, onnx_file(loaded, folder_layout.MODEL), loaded)]

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return ctc_client_note(config) or detection_client_note(config)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        return verify_task_outputs(folder / onnx_file(loaded, folder_layout.MODEL), model, loaded.task, loaded.config, tolerance,
                                   audio_mask(loaded))


RECIPE = PipelineTaskRecipe()
