"""The encoder recipe (feature extraction, image classification): one `onnx/model.onnx`
with the model's own outputs (an image classifier's height and width named where its model
runs images of another size, and then verified at one: image_sizes.py); a text encoder's
int8 as `MatMulInteger` of activations quantized at run time
(`fx2onnx.onnx_passes.dynamic_quantization`)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import torch

import fx2onnx
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.decoders.decode_step import declared_output_fields
from fx2onnx.hub.loading import FEATURE_EXTRACTION, IMAGE_CLASSIFICATION, LoadedModel
from fx2onnx.hub.precision.float32_io import float32_io
from fx2onnx.hub.precision.folder_precision import PrecisionSupport, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.hub.shared.image_sizes import image_dims, names_image_dims
from fx2onnx.hub.shared.program_files import exported_or_refused, onnx_file, save_program
from fx2onnx.hub.shared.verification import Tolerance, Verification, verify_outputs, verify_quantized_outputs
from fx2onnx.onnx_passes import WeightQuantization

PRECISION = PrecisionSupport(dynamic_int8_tasks=(FEATURE_EXTRACTION,))
# the output each task's folder is compared on
OUTPUTS = {FEATURE_EXTRACTION: "last_hidden_state", IMAGE_CLASSIFICATION: "logits"}


def example_inputs(loaded: LoadedModel, size: int, any_image_size: bool = False) -> dict[str, torch.Tensor]:
    """Example inputs of an encoder or image classifier; ``size`` 0 or 1 picks one of two
    shapes (``any_image_size``: images of another height and width at 1 too)."""
    if loaded.task == IMAGE_CLASSIFICATION:  # in the model's dtype, as pipeline_tasks.example_inputs gives them
        dtype = next(p.dtype for p in loaded.model.parameters() if p.is_floating_point())
        images = pipeline_tasks.image_inputs(loaded.config, 2 + size, size, grown=any_image_size and size == 1)
        return {name: value.to(dtype) for name, value in images.items()}
    inputs = pipeline_tasks.text_inputs(loaded.config, loaded.model, size)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    return inputs


def _missing_output_refusal(loaded: LoadedModel) -> Refusal | None:
    """A model whose forward declares no output of the name the task's clients read (PPLCNet's
    image classifier returns its class scores as `last_hidden_state`, not `logits`)."""
    output, fields = OUTPUTS[loaded.task], declared_output_fields(loaded.model)
    if fields is None or output in fields:
        return None
    return Refusal(UnsupportedTaskError, (
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) returns no `{output}` (its forward returns "
        f"{', '.join(fields)}), which the clients of its {loaded.task} folder read. Nothing was written. Export it with "
        "fx2onnx.dynamo_export, which names the outputs as the model returns them."
    ))


# inputs of a classifier that takes its image as patches its image processor cuts (Siglip2's
# NaFlex processor: as many patches as fit a budget, at the image's own aspect ratio)
PATCH_INPUTS = ("pixel_attention_mask", "spatial_shapes")


def _patch_inputs_refusal(loaded: LoadedModel) -> Refusal | None:
    """An image classifier whose forward takes patches (flattened, with their mask and grid
    shapes) where the folder's clients feed whole images as `pixel_values`."""
    parameters = inspect.signature(loaded.model.forward).parameters
    if loaded.task != IMAGE_CLASSIFICATION or not all(name in parameters for name in PATCH_INPUTS):
        return None
    return Refusal(UnsupportedTaskError, (
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) takes its image as patches: pixel_values of "
        "shape (batch, patches, channels * patch_size * patch_size) with pixel_attention_mask (batch, patches) and "
        "spatial_shapes (batch, 2), as its image processor cuts them, where the clients of an image-classification "
        "folder feed whole images (pixel_values of shape (batch, channels, height, width)). Nothing was written. "
        "Export it with fx2onnx.dynamo_export(model, pixel_values=..., pixel_attention_mask=..., spatial_shapes=..., "
        "export_options=fx2onnx.ExportOptions(dynamic_shapes=True)) on its image processor's output: the ONNX model "
        "then takes those three inputs, any batch, patch count and grid."
    ))


class EncoderRecipe(RecipeDefaults):
    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        refusal = (_missing_output_refusal(loaded) or _patch_inputs_refusal(loaded)
                   or precision_refusal(loaded, request, PRECISION))
        if refusal is None and request.quantization is not None and request.module_functions:
            return Refusal(ValueError, "precision int8 of an encoder rewrites the linear layers of one flat graph "
                                       "(MatMulInteger of activations quantized at run time): drop module_functions.")
        return refusal

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        if request.quantization is not None:  # an encoder's int8: activations quantized at run time (MatMulInteger)
            precision = WeightQuantization(bits=8, dynamic_activations=True)  # a step of the export's ONNX passes
            options = dataclasses.replace(options, precision=precision)
        program = exported_or_refused(loaded, example_inputs(loaded, 0), options)
        written = image_dims(loaded, program.model, example_inputs(loaded, 1, any_image_size=True), staging, say)
        float32_io(program.model)
        path = onnx_file(loaded, folder_layout.MODEL, request.quantization)
        return [*written, *save_program(program, staging, path, loaded)]

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        path = folder / onnx_file(loaded, folder_layout.MODEL, request.quantization)
        output = OUTPUTS[loaded.task]
        any_size = loaded.task == IMAGE_CLASSIFICATION and names_image_dims(path)  # then checked at a second size

        def inputs(size: int) -> dict[str, torch.Tensor]:
            return example_inputs(loaded, size, any_size)

        if request.quantization is not None:
            return verify_quantized_outputs(path, model, inputs, output, request.atol)
        return verify_outputs(path, model, inputs, output, tolerance)


RECIPE = EncoderRecipe()
