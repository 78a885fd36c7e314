"""Load a transformers model for `export_hf`: from a folder, a cache snapshot or a hub id;
for a task (the default read from the config); real, or in fake mode with the weights
left in the folder."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fx2onnx import ONNXFakeContext
from fx2onnx.capture import checkpoint_conversions, experts_fake_tensors_run
from fx2onnx.hub import tasks
from fx2onnx.hub.decoders import text_only as text_only_module
from fx2onnx.hub.precision.prequantized import loading_arguments, quant_method
from fx2onnx.hub.pipeline_tasks import PIPELINE_TASKS, TEXT_TO_AUDIO, auto_class_for, served_task, text_to_audio_refusal
from fx2onnx.program import checkpoint_files, snapshot_folder

TEXT_GENERATION = "text-generation"
TEXT2TEXT = "text2text-generation"
SPEECH_RECOGNITION = "automatic-speech-recognition"
FEATURE_EXTRACTION = "feature-extraction"
IMAGE_CLASSIFICATION = "image-classification"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"
# image-text-to-text model types transformers files (and loads) as causal LMs, encoders included
CAUSAL_LM_IMAGE_TEXT_TO_TEXT = ("phi4_multimodal",)
TASKS = (
    TEXT_GENERATION, TEXT2TEXT, SPEECH_RECOGNITION, FEATURE_EXTRACTION, IMAGE_CLASSIFICATION, IMAGE_TEXT_TO_TEXT,
    *(task for task in PIPELINE_TASKS if task != SPEECH_RECOGNITION),
)

_AUTO_CLASSES = {
    TEXT_GENERATION: "AutoModelForCausalLM",
    TEXT2TEXT: "AutoModelForSeq2SeqLM",
    SPEECH_RECOGNITION: "AutoModelForSpeechSeq2Seq",
    FEATURE_EXTRACTION: "AutoModel",
    IMAGE_CLASSIFICATION: "AutoModelForImageClassification",
    IMAGE_TEXT_TO_TEXT: "AutoModelForImageTextToText",
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# the model types of the (sub-)configs whose model transformers builds with timm (TimmWrapperModel)
TIMM_CONFIG_TYPES = frozenset({"timm_wrapper", "gemma3n_vision"})


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: Any
    folder: Path
    task: str
    fake_context: ONNXFakeContext | None
    # the model is a multimodal checkpoint's language model alone (text_only.py)
    text_only: bool = False
    # in fake mode, the folder's weights under the model's names where they differ (text_only.py)
    weights: Any = None


class eager_forwards(contextlib.AbstractContextManager):  # noqa: N801 - used as a function: `with eager_forwards(loaded):`
    """Where ``loaded``'s model runs outside a capture (the prefill example inputs are made
    from): nothing for a real model; for a fake one its fake mode, with transformers' experts
    in an implementation that fake tensors run (`experts_fake_tensors_run`). The same object
    may be entered again after it exits (a recipe's step runs the model in it twice)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self._loaded = loaded
        self._open: list[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        if self._loaded.fake_context is not None:
            stack.enter_context(self._loaded.fake_context.fake_mode)
            stack.enter_context(experts_fake_tensors_run(self._loaded.model))
        self._open.append(stack)

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._open.pop().__exit__(*exc_info)


def local_folder(source: str | os.PathLike) -> Path:
    """The folder of ``source``: itself (a cache repo folder resolved to its snapshot), or
    the snapshot of a hub id that huggingface_hub downloads (the user's network)."""
    path = Path(os.fspath(source)).expanduser()
    if path.is_dir():
        return snapshot_folder(path)
    if path.exists():
        raise ValueError(f"'{source}' is a file: give the folder save_pretrained wrote (with config.json), or a hub id.")
    text = os.fspath(source)
    if text.count("/") > 1 or text.startswith((".", "/", "~")):
        raise FileNotFoundError(f"The folder '{source}' does not exist.")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(text))


def default_task(config: Any) -> str:
    """The task a config's architecture is made for (``text-generation`` for causal LMs);
    an `UnsupportedTaskError` when it is made for a task export-hf does not serve."""
    architectures = list(getattr(config, "architectures", None) or [])
    served = served_task(architectures)
    if served is not None:
        return served
    if getattr(config, "is_encoder_decoder", False):
        # Moonshine's config has no mel bins (its encoder reads the waveform): its class says it
        speech = getattr(config, "num_mel_bins", None) or any(
            tasks.is_filed_under(a, tasks.SPEECH_SEQ2SEQ_MAPPING) for a in architectures)
        return SPEECH_RECOGNITION if speech else TEXT2TEXT
    if getattr(config, "model_type", None) in CAUSAL_LM_IMAGE_TEXT_TO_TEXT:
        return IMAGE_TEXT_TO_TEXT
    # an audio language model transformers files under sequence-to-sequence alone (not under causal LMs too)
    if any(tasks.is_filed_under(a, tasks.SEQ2SEQ_MAPPING) and not tasks.is_filed_under(a, tasks.CAUSAL_LM_MAPPING)
           for a in architectures):
        return TEXT2TEXT
    # before causal LMs: transformers files some (Gemma 3) under both
    if any(tasks.is_filed_under(a, tasks.IMAGE_TEXT_TO_TEXT_MAPPING) for a in architectures) and not _language_model_alone(
            config, architectures):
        return IMAGE_TEXT_TO_TEXT
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return TEXT_GENERATION
    if any(a.endswith("ForImageClassification") for a in architectures):
        return IMAGE_CLASSIFICATION
    for architecture in architectures:
        needed = tasks.other_tasks(architecture)
        if needed and not tasks.is_filed_under(architecture, tasks.BASE_MAPPING):
            raise tasks.unsupported_task_error(config, architecture, needed, TASKS)
    return FEATURE_EXTRACTION


def _language_model_alone(config: Any, architectures: list[str]) -> bool:
    """Whether the checkpoint is a causal LM with no encoder and no text config, which
    transformers files under image-text-to-text alone (Mistral4ForCausalLM, the language
    model of Mistral's vision checkpoints): it takes text only, a text-generation folder."""
    return (bool(architectures) and all(a.endswith("ForCausalLM") for a in architectures)
            and getattr(config, "text_config", None) is None and not text_only_module.left_out_parts(config))


def is_ctc(task: str, config: Any) -> bool:
    """Whether ``task`` is speech recognition by a CTC model (an encoder, no decoder)."""
    return task == SPEECH_RECOGNITION and not getattr(config, "is_encoder_decoder", False)


def _auto_class(task: str, config: Any) -> str:
    if is_ctc(task, config) or (task in PIPELINE_TASKS and task != SPEECH_RECOGNITION):
        check_head(task, config)
        return auto_class_for(task, config)
    if task == IMAGE_TEXT_TO_TEXT and getattr(config, "model_type", None) in CAUSAL_LM_IMAGE_TEXT_TO_TEXT:
        return _AUTO_CLASSES[TEXT_GENERATION]
    return _AUTO_CLASSES[task]


def _model_class(transformers: Any, task: str, config: Any) -> Any:
    """The task's auto class; the checkpoint's own class where the auto class does not know
    its config class (Emu3's or Mllama's text model: a sub-config of a multimodal type, whose
    model type the auto class maps to the multimodal config), or, for feature extraction,
    where the checkpoint is a text encoder alone (T5EncoderModel: AutoModel would load the
    whole encoder-decoder, its decoder random)."""
    auto = getattr(transformers, _auto_class(task, config))
    architectures = getattr(config, "architectures", None) or []
    encoders = [name for name in architectures if tasks.is_filed_under(name, tasks.TEXT_ENCODING_MAPPING)
                and not tasks.is_filed_under(name, tasks.BASE_MAPPING)]
    if task == FEATURE_EXTRACTION and encoders and getattr(transformers, encoders[0], None) is not None:
        return getattr(transformers, encoders[0])
    if type(config) in auto._model_mapping:  # transformers' own table of the config classes it maps
        return auto
    named = (getattr(transformers, name, None) for name in architectures)
    return next((cls for cls in named if getattr(cls, "config_class", None) is type(config)), auto)


def check_head(task: str, config: Any) -> None:
    """A checkpoint whose architecture has no head for ``task`` is refused: transformers
    would give the head random weights."""
    architectures = list(getattr(config, "architectures", None) or [])
    mappings = PIPELINE_TASKS[task].mappings
    if not architectures or any(tasks.is_filed_under(a, m) for a in architectures for m in mappings):
        return
    try:
        default = default_task(config)
    except tasks.UnsupportedTaskError:
        default = None
    instead = f"its own task is {default} (the default without --task)" if default else "no task export-hf serves"
    raise tasks.UnsupportedTaskError(
        f"{', '.join(architectures)} has no {task} head: its weights would be random in the folder. The checkpoint's "
        f"{instead}; for {task}, give a checkpoint of a model made for it (fine-tuned with its head)."
    )


@contextlib.contextmanager
def _value_free_truncated_normal() -> Iterator[None]:
    """torch's truncated normal init redraws until every value is in range (`mask.any()`
    on the values), which fake tensors cannot answer; a fake weight has no values to
    draw (the checkpoint's are streamed at save), so the init leaves it as it is."""
    from transformers import initialization

    functions = initialization.TORCH_INIT_FUNCTIONS
    kept = functions.get("trunc_normal_")
    if kept is None:
        yield
        return
    functions["trunc_normal_"] = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        functions["trunc_normal_"] = kept


def load_model(
    folder: Path, task: str | None, dtype: str | None, fake: bool, say: Callable[[str], None] = lambda line: None,
    text_only: bool = False,
) -> LoadedModel:
    """The model of ``folder`` for ``task`` (a default one is told to ``say``), in ``dtype``;
    with ``fake`` its parameters are FakeTensors (no memory) and its weights stay in the
    folder until the model is saved. ``text_only``: a multimodal model's language model
    alone, for text-generation (text_only.py); without it a text-generation model with
    encoders is a `text_only.PartsLeftOutError`."""
    import transformers

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"'{folder}' has no config.json: give a folder that save_pretrained wrote, or a hub id.")
    config = transformers.AutoConfig.from_pretrained(folder)
    architecture = ", ".join(getattr(config, "architectures", None) or [config.model_type])
    if text_only:
        return _load_text_only(folder, config, task, dtype, fake, say, architecture)
    if task is None:
        task = default_task(config)
        say(f"task {task} (the default for {architecture}; --task to choose another)")
    if task not in TASKS:
        raise ValueError(f"Unknown task '{task}': one of {', '.join(TASKS)}.")
    if task == TEXT_GENERATION:
        text_only_module.check_parts_kept(config, architecture)
    if task == TEXT_TO_AUDIO and (refusal := text_to_audio_refusal(config)) is not None:
        raise tasks.UnsupportedArchitectureError(refusal)
    model, fake_context = _load(folder, config, task, dtype, fake)
    return LoadedModel(model, config, folder, task, fake_context)


def check_timm(config: Any) -> None:
    """A clear error, before the model is built, for a model with a timm tower (Gemma 3n's
    MobileNetV5) where timm cannot be imported (it is not installed, or its torchvision does
    not load with this torch)."""
    configs = [config, *(getattr(config, name, None) for name in getattr(config, "sub_configs", {}))]
    towers = [c for c in configs if getattr(c, "model_type", None) in TIMM_CONFIG_TYPES]
    if not towers:
        return
    try:
        import timm  # noqa: F401 (whether it imports)
    except ImportError as error:
        architecture = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise ImportError(
            f"{architecture}'s vision tower is timm's {getattr(towers[0], 'architecture', 'model')} (transformers builds "
            f"it with TimmWrapperModel), and timm cannot be imported here ({error}). Install the vision extra, "
            "`pip install \"fx2onnx[vision]\"` (timm and torchvision: torchvision of your torch's release, see "
            "docs/guides/vision.md). Nothing was written."
        ) from error


def _load(folder: Path, config: Any, task: str, dtype: str | None, fake: bool) -> tuple[torch.nn.Module, ONNXFakeContext | None]:
    import transformers

    from fx2onnx import enable_fake_mode

    check_timm(config)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"Unknown dtype '{dtype}': one of {', '.join(DTYPES)}.")
    auto = _model_class(transformers, task, config)
    torch_dtype = DTYPES[dtype] if dtype else None
    if fake and quant_method(config) is not None:
        raise NotImplementedError(
            f"the checkpoint is quantized ({quant_method(config)}): its weights are not stored as floats for fake mode to "
            "stream; export it without fake mode."
        )
    if fake:
        with enable_fake_mode() as fake_context, _value_free_truncated_normal():
            model = auto.from_config(config)
        if (folder / "generation_config.json").is_file():  # from_pretrained reads it, from_config does not
            model.generation_config = transformers.GenerationConfig.from_pretrained(folder)
        if torch_dtype is not None:
            model.to(torch_dtype)
        _check_streamable(folder, model)
        return model.eval(), fake_context
    # a pre-quantized checkpoint loads as the float weights its codes stand for
    arguments = loading_arguments(config)
    model = auto.from_pretrained(folder, dtype=torch_dtype, **arguments) if torch_dtype else auto.from_pretrained(folder, **arguments)
    return model.eval(), None


def _check_streamable(folder: Path, model: torch.nn.Module) -> None:
    """Refuse a fake-mode export whose checkpoint stores tensors that transformers converts when it
    loads them (experts one by one, stacked into one tensor of the model): fake mode streams each
    of the model's weights from the tensor of its name, and would fail only once the graph is built."""
    files = checkpoint_files(folder)
    if files.weight_map is not None:
        names = list(files.weight_map)
    else:
        from safetensors import safe_open

        names = []
        for path in (p for p in files.files if p.suffix == ".safetensors"):
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                names += list(handle.keys())
    converted = checkpoint_conversions(model, names)
    if converted:
        name, target = next(iter(converted.items()))
        raise NotImplementedError(
            f"{type(model).__name__}'s checkpoint stores {len(converted)} tensors that transformers converts when it "
            f"loads them, rather than renames (its WeightConverters: '{name}' goes into the model's '{target}'): fake "
            "mode streams each weight of the model from the checkpoint's tensor of that name and does not convert "
            "them. Export it without fake mode, or from a checkpoint saved under the model's own names."
        )


def _load_text_only(
    folder: Path, config: Any, task: str | None, dtype: str | None, fake: bool, say: Callable[[str], None], architecture: str,
) -> LoadedModel:
    from fx2onnx.hub.shared.renamed_weights import part_checkpoint

    if task not in (None, TEXT_GENERATION):
        raise ValueError(f"--text-only exports a language model alone, for {TEXT_GENERATION}: drop --task {task}.")
    parts = text_only_module.left_out_parts(config)
    if not parts:
        raise ValueError(f"{architecture} has no vision or audio encoder to leave out: drop --text-only.")
    if not text_only_module.can_export_text_only(config):
        raise NotImplementedError(f"{architecture}: {text_only_module.command_hint(config)}")
    say(f"text only: {architecture}'s {' and '.join(parts)} left out; the folder takes text prompts only")
    if getattr(config, "text_config", None) is None:  # transformers' causal LM of the config itself
        model, fake_context = _load(folder, config, TEXT_GENERATION, dtype, fake)
        return LoadedModel(model, config, folder, TEXT_GENERATION, fake_context, text_only=True)
    full, fake_context = _load(folder, config, IMAGE_TEXT_TO_TEXT, dtype, fake)
    causal = text_only_module.language_model(full, config)
    weights = None
    if fake_context is not None:
        weights = part_checkpoint(folder, full, causal)
    return LoadedModel(causal, causal.config, folder, TEXT_GENERATION, fake_context, text_only=True, weights=weights)
