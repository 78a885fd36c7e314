"""The text-to-audio recipe: VITS (MMS-TTS) as one `onnx/model.onnx` from `input_ids` and
`attention_mask` to `waveform`, the folder Transformers.js's text-to-audio pipeline loads
(its tokenizer as `tokenizer.json`: `fx2onnx.hub.speech.vits_tokenizer`).

VITS predicts each token's duration and spreads the tokens over as many frames as their
durations add up to: the waveform's length is computed from values. torch.export captures
it as a size it does not know (an unbacked symbol, from `torch.arange(lengths.max())`), and
the graph computes it as the model does, for any text. The graph keeps the model's noise
(`noise_scale`, `noise_scale_duration`: random normal draws), as transformers' model runs,
so two runs differ; the verification compares instead a twin of the model with both scales
0, exported the same way, with transformers' twin: equal lengths and waveforms within the
tolerance, on two texts of different lengths (batches of 2 and 3, one padded), and the
twin's weights equal to the folder's (the written file itself checked).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import torch

from fx2onnx.hub.shared.json_files import read_json_if_present
import fx2onnx
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.float32_io import float32_io
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.program_files import exported, exported_or_refused, onnx_file, save_program
from fx2onnx.hub.shared.peak_scale import PEAK_SCALED_RULE
from fx2onnx.hub.shared.verification import Tolerance, Verification, verify_outputs
from fx2onnx.hub.speech.vits_tokenizer import VITS_TOKENIZER, skipped_steps
from fx2onnx.hub.tasks import UnsupportedArchitectureError
from fx2onnx.onnx_passes import rename_dims

WAVEFORM = "waveform"
NOISE_SCALES = ("noise_scale", "noise_scale_duration")
# the newest opset whose RandomNormalLike onnxruntime runs (1.32 has no kernel of its opset 22 version)
RANDOM_OPSET = 21


def example_inputs(loaded: LoadedModel, model: torch.nn.Module, size: int) -> dict[str, torch.Tensor]:
    """Token ids of ``size`` 0 or 1 (7 or 11 tokens, batches of 2 and 3, the second with a padded row)."""
    return pipeline_tasks.text_inputs(loaded.config, model, size)


def quiet_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its noise scales 0: the same waveform on every run."""
    twin = copy.deepcopy(model)
    for name in NOISE_SCALES:
        setattr(twin, name, 0.0)
        setattr(twin.config, name, 0.0)
    return twin


def reference_of(twin: torch.nn.Module) -> torch.nn.Module:
    """What the quiet twin's ONNX model is compared with: the twin itself, or, for float16
    weights, a copy computing them in float32. transformers' own float16 VITS fails on CPU
    on a padded batch: its flows' rational-quadratic spline overflows float16 there and
    raises ("Discriminant has negative values"), where the ONNX model runs."""
    if next(twin.parameters()).dtype != torch.float16:
        return twin
    return copy.deepcopy(twin).float()


def name_frames(model: ir.Model) -> None:
    """Name the spectrogram's frame count, the size the capture knew no value of (`frames`),
    and the waveform's length, the frames times the vocoder's upsampling (`waveform_length`)."""
    waveform = next(value for value in model.graph.outputs if value.name == WAVEFORM)
    length = waveform.shape[-1] if waveform.shape is not None else None
    if not isinstance(length, ir.SymbolicDim) or not length.value:
        return
    symbols = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", length.value))
    if len(symbols) == 1:
        frames = symbols.pop()
        rename_dims(model, {frames: "frames"}, {length.value.replace(frames, "frames"): "waveform_length"})


def _program(model: torch.nn.Module, inputs: dict[str, torch.Tensor], options: fx2onnx.ExportOptions,
             loaded: LoadedModel | None = None) -> fx2onnx.ONNXProgram:
    program = (exported_or_refused(loaded, inputs, options) if loaded is not None else exported(model, inputs, options))
    pipeline_tasks.keep_task_outputs(program.model, pipeline_tasks.TEXT_TO_AUDIO)
    name_frames(program.model)
    float32_io(program.model)
    return program


def _options_of(path: Path, request: ExportRequest) -> fx2onnx.ExportOptions:
    """The export options of the folder's model at ``path``: its opset, the request's runtime."""
    written = onnx.load(str(path), load_external_data=False)
    opset = next(o.version for o in written.opset_import if o.domain in ("", "ai.onnx"))
    return fx2onnx.ExportOptions(
        dynamic_shapes=True, opset_version=opset, runtime=request.runtime, module_functions=request.module_functions,
        target="portable" if request.runtime == "standard" else "default",
    )


def tokenizer_steps_left_out(source: Path) -> list[str]:
    """The steps of the source's `VitsTokenizer` (as its tokenizer_config.json sets them) that no tokenizer.json takes."""
    settings = read_json_if_present(source / "tokenizer_config.json", {})
    if settings.get("tokenizer_class") != VITS_TOKENIZER:
        return []
    return skipped_steps(SimpleNamespace(**settings))


def weight_differences(path: Path, twin_path: Path, names: set[str]) -> list[str]:
    """The model's weights (``names``: its state dict's) in the twin (exported from the real
    weights) that the folder's model lacks or holds otherwise: the written file's own weights
    checked, those streamed from the checkpoint in fake mode too. The folder's model may hold
    more (a fake model's zero biases, which the real export folds away, have no values to
    fold); the constants an export computes are named by their nodes, not compared."""
    def weights(model_path: Path) -> dict[str, np.ndarray]:
        return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(model_path)).graph.initializer
                if t.name in names}

    written, twin = weights(path), weights(twin_path)
    return sorted(name for name, value in twin.items()
                  if name not in written or written[name].shape != value.shape or not np.array_equal(written[name], value))


class TextToAudioRecipe(RecipeDefaults):
    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        refusal = pipeline_tasks.text_to_audio_refusal(loaded.config)  # loading refused these already
        if refusal is not None:
            return Refusal(UnsupportedArchitectureError, refusal)
        if request.opset is not None and request.opset > RANDOM_OPSET:
            return Refusal(ValueError, (
                f"opset {request.opset}: VITS draws its noise with RandomNormalLike, whose opset 22 version onnxruntime "
                f"has no kernel for; give --opset {RANDOM_OPSET} or lower (the default for text-to-audio)."
            ))
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        for step in tokenizer_steps_left_out(loaded.folder):
            say(f"WARNING the folder's tokenizer.json leaves out the tokenizer's {step}")
        speakers = int(getattr(loaded.config, "num_speakers", 1) or 1)
        if speakers > 1:
            say(f"WARNING {speakers} speakers: the folder takes no speaker_id, its waveform is the model's without one")
        scales = ", ".join(f"{name} {getattr(loaded.model, name, None)}" for name in NOISE_SCALES)
        say(f"text-to-audio: the graph draws the model's noise ({scales}); the waveform differs from run to run")
        if options.opset_version is not None and options.opset_version > RANDOM_OPSET:  # the default of the runtime
            options = dataclasses.replace(options, opset_version=RANDOM_OPSET)
        program = _program(loaded.model, example_inputs(loaded, loaded.model, 0), options, loaded)
        return save_program(program, staging, onnx_file(loaded, folder_layout.MODEL), loaded)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        path = folder / onnx_file(loaded, folder_layout.MODEL)
        twin = quiet_twin(model)
        say("verification: the model with noise scales 0, exported as the folder's, against transformers' with them 0; "
            f"waveforms {PEAK_SCALED_RULE}")
        with tempfile.TemporaryDirectory(prefix="fx2onnx-quiet-twin-") as scratch:
            twin_path = Path(scratch) / "model.onnx"
            _program(twin, example_inputs(loaded, twin, 0), _options_of(path, request)).save(twin_path, external_data=True)
            reference = reference_of(twin)
            verification = verify_outputs(twin_path, reference, lambda size: example_inputs(loaded, reference, size), WAVEFORM,
                                          tolerance, scaled=True)
            differing = weight_differences(path, twin_path, set(twin.state_dict()))
        if differing and verification.failure is None:
            verification.failure = (f"{len(differing)} weights of the folder's model differ from the model's "
                                    f"(first: {', '.join(differing[:3])})")
            say(f"verification: FAILED, {verification.failure}")
        return verification


RECIPE = TextToAudioRecipe()
