"""The task of a checkpoint's architecture, as transformers' auto classes file it.

`export-hf` serves a few tasks (loading.TASKS). Without `--task` the task is the one
transformers files the config's architecture under (`Qwen2_5_VLForConditionalGeneration`:
image-text-to-text); an architecture filed only under tasks the command does not serve
(`BertForSequenceClassification`: text-classification) is an `UnsupportedTaskError`
before anything is written, rather than an export of its base model without its head.
"""

from __future__ import annotations

from typing import Any

# transformers' auto-class mappings -> the pipeline task names people know them by
_MAPPING_TASKS = {
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "text-classification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "token-classification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "question-answering",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "fill-mask",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "multiple-choice",
    "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES": "object-detection",
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES": "image-segmentation",
    "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES": "image-segmentation",
    "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES": "depth-estimation",
    "MODEL_FOR_CTC_MAPPING_NAMES": "automatic-speech-recognition (CTC)",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": "audio-classification",
    "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES": "zero-shot-image-classification",
    "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES": "text-to-audio",
    "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES": "text-to-audio",
    "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES": "video-classification",
    "MODEL_FOR_IMAGE_TO_IMAGE_MAPPING_NAMES": "image-to-image",
}
IMAGE_TEXT_TO_TEXT_MAPPING = "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"
BASE_MAPPING = "MODEL_MAPPING_NAMES"


class UnsupportedTaskError(ValueError):
    """The checkpoint's architecture is made for a task `export-hf` does not serve."""


def _classes(mapping_name: str) -> set[str]:
    from transformers.models.auto import modeling_auto

    classes: set[str] = set()
    for value in getattr(modeling_auto, mapping_name, {}).values():
        classes.update((value,) if isinstance(value, str) else value)
    return classes


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
