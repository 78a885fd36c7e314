"""The task of a checkpoint's architecture, as transformers' auto classes file it.

`export-hf` serves a few tasks (loading.TASKS). Without `--task` the task is the one
transformers files the config's architecture under (`Qwen2_5_VLForConditionalGeneration`:
image-text-to-text); an architecture filed only under tasks the command does not serve
(`VivitForVideoClassification`: video-classification) is an `UnsupportedTaskError`
before anything is written, rather than an export of its base model without its head.
"""

from __future__ import annotations

from typing import Any

# transformers' auto-class mappings of tasks export-hf does not serve -> the pipeline
# task names people know them by (those it serves: pipeline_tasks.PIPELINE_TASKS)
_MAPPING_TASKS = {
    "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES": "video-classification",
    "MODEL_FOR_IMAGE_TO_IMAGE_MAPPING_NAMES": "image-to-image",
    "MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES": "zero-shot-object-detection",
    "MODEL_FOR_MASK_GENERATION_MAPPING_NAMES": "mask-generation",
    "MODEL_FOR_KEYPOINT_DETECTION_MAPPING_NAMES": "keypoint-detection",
    "MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES": "audio-frame-classification",
    "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES": "audio-xvector",
    "MODEL_FOR_DOCUMENT_QUESTION_ANSWERING_MAPPING_NAMES": "document-question-answering",
    "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES": "visual-question-answering",
    "MODEL_FOR_TABLE_QUESTION_ANSWERING_MAPPING_NAMES": "table-question-answering",
    "MODEL_FOR_TIME_SERIES_PREDICTION_MAPPING_NAMES": "time-series-prediction",
}
IMAGE_TEXT_TO_TEXT_MAPPING = "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"
CAUSAL_LM_MAPPING = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
SEQ2SEQ_MAPPING = "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"
SPEECH_SEQ2SEQ_MAPPING = "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"
BASE_MAPPING = "MODEL_MAPPING_NAMES"
# text encoders transformers keeps apart from their model type's whole model (T5's encoder alone)
TEXT_ENCODING_MAPPING = "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES"


class UnsupportedTaskError(ValueError):
    """The checkpoint's architecture is made for a task `export-hf` does not serve."""


class UnsupportedArchitectureError(NotImplementedError):
    """`export-hf` serves the task, but writes no folder of it for the checkpoint's
    architecture (the error names those it does, and what works for this one)."""


def _classes(mapping_name: str) -> set[str]:
    from transformers.models.auto import modeling_auto

    classes: set[str] = set()
    for value in getattr(modeling_auto, mapping_name, {}).values():
        classes.update((value,) if isinstance(value, str) else value)
    return classes


def has_class_for(model_type: str | None, mapping_name: str) -> bool:
    """Whether transformers' auto mapping ``mapping_name`` has a class for ``model_type``."""
    from transformers.models.auto import modeling_auto

    return model_type in getattr(modeling_auto, mapping_name, {})


def is_filed_under(architecture: str, mapping_name: str) -> bool:
    """Whether transformers' auto mapping ``mapping_name`` holds the class ``architecture``."""
    return architecture in _classes(mapping_name)


def other_tasks(architecture: str) -> list[str]:
    """The tasks `export-hf` does not serve that transformers files ``architecture`` under."""
    return sorted({task for mapping, task in _MAPPING_TASKS.items() if is_filed_under(architecture, mapping)})


def unsupported_task_error(config: Any, architecture: str, tasks: list[str], supported: tuple[str, ...]) -> UnsupportedTaskError:
    model_type = getattr(config, "model_type", None)
    return UnsupportedTaskError(
        f"{architecture}{f' ({model_type})' if model_type else ''} is a model for {' / '.join(tasks)}, which export-hf does "
        f"not serve: it exports {', '.join(supported)}. Nothing was written. To export the base model without its head, "
        "give --task feature-extraction; for other tasks, export the model with fx2onnx.dynamo_export."
    )
