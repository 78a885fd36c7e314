"""`export_hf`: a transformers model to a folder its runtime runs (see the package docstring).

The request is resolved (request.py), the model loaded (loading.py), and one recipe looked
up by task and runtime (recipe_table.py) writes the folder's models and configuration files
(recipes/). The folder is written under a temporary name beside ``output`` and moved in
place at the end: a failed export leaves nothing behind, and an existing folder that is not
empty is refused rather than mixed with.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

import fx2onnx
from diagnostics import write_atomically
from fx2onnx.fx_passes import FUSED_KERNELS_OPSET
from fx2onnx.hub.decoders.model_lengths import context_length
from fx2onnx.hub.loading import LoadedModel, load_model, local_folder
from fx2onnx.hub.precision import float32_twin as twins
from fx2onnx.hub.precision.folder_precision import folder_quantization
from fx2onnx.hub.precision.resolution import DEFAULT_ALGORITHM
from fx2onnx.hub.recipe_table import recipe_for
from fx2onnx.hub.recipes.folder_recipe import FolderRecipe
from fx2onnx.hub.request import ExportRequest
from fx2onnx.hub.shared import folder_layout, tokenizer_files
from fx2onnx.hub.shared.folder_files import copy_folder_files
from fx2onnx.hub.shared.generation_search import verification_note
from fx2onnx.hub.shared.json_files import read_json
from fx2onnx.hub.shared.program_files import weights_dtype
from fx2onnx.hub.shared.verification import FolderRunError, Verification, tolerance_for
from fx2onnx.onnx_passes import newest_opset


@dataclass
class HubExport:
    """What `export_hf` wrote."""

    folder: Path
    task: str
    files: list[str] = field(default_factory=list)
    verification: Verification | None = None
    seconds: float = 0.0


def _check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        what = "a file" if not output.is_dir() else "a folder that is not empty"
        raise FileExistsError(f"--output '{output}' is {what}: give a new or empty folder; nothing was written.")


# The folders are for onnxruntime: from opset 23 attention, rotary embedding, RMS norm and GELU are
# single kernels (fx2onnx/fx_passes/fused_kernels/); a LLaMA-style model decodes after
# 1024 tokens in 10.9 ms/token against 12.9 at opset 18 in one run (bench/runtime_speed.py).
DEFAULT_OPSET = FUSED_KERNELS_OPSET


def default_opset() -> int | None:
    """The opset of a folder when none is asked for: :data:`DEFAULT_OPSET` where the
    installed onnx, onnxruntime and onnxscript know it, else the exporter's default."""
    return DEFAULT_OPSET if newest_opset() >= DEFAULT_OPSET else None


def _options(request: ExportRequest, loaded: LoadedModel, report: Path) -> fx2onnx.ExportOptions:
    # A folder is flat by default: the tools people run on it (onnxruntime's quantizers and
    # transformers optimizer) do not look inside ONNX functions, and onnxruntime inlines
    # them when it loads the model anyway.
    # "standard" is a folder for any runtime: the portable target (standard operators at
    # opset 20 unless asked, attention decomposed, which OpenVINO, TVM and the browser run)
    portable = request.runtime == "standard"
    opset = request.opset
    if opset is None and not portable:
        opset = default_opset()
    return fx2onnx.ExportOptions(
        dynamic_shapes=True, fake_context=loaded.fake_context, opset_version=opset,
        progress=request.progress, failure_report_path=report, runtime=request.runtime,
        module_functions=request.module_functions, target="portable" if portable else "default",
        # the kernel's rotary tables: as many positions as the folder's text model is made for, no more
        context_length=context_length(loaded.config.get_text_config()),
    )


def _verify(
    loaded: LoadedModel, folder: Path, recipe: FolderRecipe, request: ExportRequest, say: Callable[[str], None],
) -> Verification:
    """The recipe's verification of ``folder`` against the model with real weights; with
    float32 twins, theirs too (`_verify_twins`), one verdict over both."""
    model = loaded.model
    if loaded.fake_context is not None:  # the real model, built from the folder, to compare with
        model = load_model(loaded.folder, loaded.task, None, fake=False, text_only=loaded.text_only).model
        model.to(next(p.dtype for p in loaded.model.parameters()))
    tolerance = tolerance_for(next(p.dtype for p in model.parameters()), request.rtol, request.atol)
    verification = recipe.verify(loaded, folder, model, request, tolerance, say)
    if not request.float32_twin:
        return verification
    say(f"verification (float16 files): {verification.summary()}")
    twins_verdict = _verify_twins(loaded, folder, recipe, request, model, say)
    say(f"verification (float32 twins): {twins_verdict.summary()}")
    return Verification.merged([verification, twins_verdict])


def _verify_twins(
    loaded: LoadedModel, folder: Path, recipe: FolderRecipe, request: ExportRequest, model: torch.nn.Module,
    say: Callable[[str], None],
) -> Verification:
    """The recipe's verification of the folder's float32 twins: the float16 weights widened and
    computed in float32, as transformers' float16 model after ``.float()`` computes (the
    reference, widened in place: the float16 verdict is given), within float32's tolerance.
    The recipe finds the twins by the loaded model's dtype (`onnx_file`: no `_fp16` suffix)."""
    model.float()
    widened = replace(loaded, model=model, fake_context=None)
    return recipe.verify(widened, folder, model, request, tolerance_for(torch.float32, request.rtol, request.atol), say)


def export_hf(
    model: str | os.PathLike,
    output: str | os.PathLike,
    *,
    task: str | None = None,
    dtype: str | None = None,
    fake: bool = False,
    verify: bool = False,
    opset: int | None = None,
    tokens: int = 16,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool = False,
    say: Callable[[str], None] = lambda line: None,
    runtime: str = "onnxruntime",
    module_functions: bool = False,
    precision: str | None = None,
    block_size: int | None = None,
    accuracy_level: int = 4,
    quantize_lm_head: bool = True,
    quantize_embedding: bool = False,
    quantization_algorithm: str = DEFAULT_ALGORITHM,
    mixed_precision: bool = False,
    pack_projections: bool = False,
    text_only: bool = False,
    without_audio: bool = False,
    float32_twin: bool = False,
    vocoder: str | os.PathLike | None = None,
) -> HubExport:
    """Export the transformers model ``model`` (a save_pretrained folder, a cache snapshot,
    or a hub id) to the folder ``output``, ready for its runtime.

    Args:
        task: text-generation, text2text-generation, automatic-speech-recognition,
            feature-extraction, image-classification or image-text-to-text (default: the
            task transformers files the config's architecture under, told to ``say``; an
            architecture made for another task is an `UnsupportedTaskError`).
        dtype: float32, float16 or bfloat16 (default: the checkpoint's).
        fake: build the model in fake mode and stream the weights from the folder
            (a 7B model without its 28 GB in memory).
        verify: run the folder as its runtime will and compare with transformers (a causal
            LM past every sliding window, attention chunk and rope switch point, alone and
            as a left-padded batch: `fx2onnx.hub.decoders.model_lengths`); the result's
            ``verification.passed`` says whether every output is within the tolerance (and
            a decoder's greedy tokens equal, and every run succeeded). The folder is written
            either way: a failed one is kept, whole, with the failure stated.
        opset: the ONNX opset (default: 23, where attention and the rotary embedding
            are single kernels, when the installed tools know it; 20 for runtime "standard").
        tokens: greedy tokens generated by the verification of a causal LM.
        rtol, atol: the verification's tolerance, ``|onnx - torch| <= atol + rtol * |torch|``
            (default: the model's dtype's, `fx2onnx.hub.shared.verification.DEFAULT_TOLERANCES`).
        runtime: "onnxruntime" (default): its own kernels where faster. A causal LM's
            attention over its cache becomes `GroupQueryAttention`, which appends to the
            cache in place (the genai config then says `past_present_share_buffer: true`),
            with the padding of any mask as its attention bias (left out at run time when
            no sequence is padded); the steps onnxruntime's
            kernel refuses (several new tokens over a cache at batch > 1) take the
            standard form. Whisper is written for ONNX Runtime GenAI (whisper_genai.py:
            an encoder with the cross-attention caches, one decoder, genai_config.json,
            audio_processor_config.json). "standard": a folder for any ONNX runtime
            (onnxruntime, OpenVINO, TVM, onnxruntime-web): the portable target of
            `fx2onnx.ExportOptions` (one flat graph of ONNX operators, attention and
            rotary embedding decomposed, opset 20 unless ``opset`` says otherwise);
            Whisper in Optimum's layout, as T5 and BART (Transformers.js loads it); an
            image-text-to-text model in Transformers.js's layout
            (`fx2onnx.hub.vision_language.transformers_js`). Both give transformers' answer
            for any batch, padding and lengths.
        module_functions: keep each module call as an ONNX function (default: one flat
            graph, which onnxruntime's quantizers and optimizers can work on). Such
            folders generate in ONNX Runtime GenAI and Transformers.js what flat ones
            generate, int4 and int8 causal LMs included; ``pack_projections``,
            ``quantize_embedding`` and an encoder's int8 rewrite the flat graph and are
            refused with it.
        precision: fp32, fp16 or bf16 (the same as ``dtype``), or int4 or int8: a causal
            LM's linear layers as onnxruntime's weight-only ``MatMulNBits`` (float32
            activations unless ``dtype`` is float16), quantized as the weights are
            written (with ``fake`` too). ``verify`` then reports the logit error and the
            greedy-token agreement with the float model instead of demanding equality.
            int8 of an encoder (feature-extraction): its linear layers as ``MatMulInteger``
            of activations quantized at run time (`fx2onnx.onnx_passes.dynamic_quantization`),
            in float32; ``verify`` reports the output error.
        block_size, accuracy_level: of int4/int8 (defaults 32 and 4, the runtime's CPU
            defaults: int8 activations in the kernel). Without ``block_size`` the LM head
            gets blocks of 128 with zero points (the largest multiply of a decode step
            runs faster; `fx2onnx.hub.precision.resolution.DEFAULT_LM_HEAD_BLOCK_SIZE`);
            a given one is every layer's, the head's too.
        quantize_lm_head: int4/int8 quantize the language-model head too (default, as
            ONNX Runtime GenAI's model builder does); False keeps it float.
        quantize_embedding: int4/int8 of a causal LM quantize the token embedding too, as
            onnxruntime's ``GatherBlockQuantized`` with the linear layers' bits and blocks
            (default False: float, as the builder keeps it); an embedding tied to a
            quantized LM head gathers from the head's codes and scales.
        quantization_algorithm: int4/int8 of a causal LM: how each block's scale is
            chosen, "rtn" (round-to-nearest, onnxruntime's quantizer's codes) or
            "search" (the scale with the least squared error of the block; same size).
        mixed_precision: int4 of a causal LM: 8 bits for the value and down projections
            of the first and last eighth of the layers and every third layer between
            (llama.cpp's Q4_K_M rule, `fx2onnx.hub.precision.resolution.more_bits_layers`).
        pack_projections: int4/int8 run every group of layers that read one input (Q, K
            and V; gate and up) as one MatMulNBits and a Split. Without it, Q, K and V
            alone are packed where GroupQueryAttention reads them (it reads the packed
            tensor itself where it runs, so no Split runs there); gate and up, which
            would need a Split every step, stay apart.
        text_only: export a multimodal model's language model alone as text-generation,
            its vision and audio encoders left out (`fx2onnx.hub.decoders.text_only`); without it a
            text-generation export of a model with encoders is refused.
        without_audio: Phi-4-multimodal's `phi4mm` folder for images and text, its speech
            model left out; without it the folder also runs audio.
        float32_twin: a float16 folder also gets each `<file>_fp16.onnx` in float32, as
            `<file>.onnx` (`fx2onnx.hub.precision.float32_twin`): the file Transformers.js
            loads with dtype "fp32", for WebGPU adapters without `shader-f16`, where it
            refuses "fp16". Refused for other weights.
        vocoder: text-to-audio of SpeechT5: the `SpeechT5HifiGan` checkpoint (a folder or a
            hub id) written, after the model's postnet, as the folder's `vocoder/` (the model
            Transformers.js's `generate_speech` runs on the spectrogram). Refused for other models.
    """
    started = time.perf_counter()
    output = Path(os.fspath(output)).expanduser()
    _check_output(output)
    request = ExportRequest.resolve(
        task=task, dtype=dtype, fake=fake, verify=verify, opset=opset, tokens=tokens, rtol=rtol, atol=atol,
        progress=progress, runtime=runtime, module_functions=module_functions, precision=precision,
        block_size=block_size, accuracy_level=accuracy_level, quantize_lm_head=quantize_lm_head,
        quantize_embedding=quantize_embedding, quantization_algorithm=quantization_algorithm,
        mixed_precision=mixed_precision, pack_projections=pack_projections, text_only=text_only, without_audio=without_audio,
        float32_twin=float32_twin, vocoder=None if vocoder is None else os.fspath(vocoder),
    )
    folder = local_folder(model)
    loaded = load_model(folder, request.task, request.dtype, fake, say, text_only=text_only)
    recipe = recipe_for(loaded.task, loaded.config, runtime)
    if request.vocoder is not None and not getattr(recipe, "takes_vocoder", False):
        raise ValueError(f"--vocoder is SpeechT5's text-to-audio vocoder; {loaded.config.model_type} ({loaded.task}) "
                         "takes none: drop it. Nothing was written.")
    refusal = recipe.accepts(loaded, request)
    if refusal is not None:
        raise refusal.error()
    request = replace(request, quantization=folder_quantization(loaded, request))
    if request.float32_twin and (why := twins.refusal(weights_dtype(loaded), request.quantization is not None)):
        raise ValueError(why)
    say(f"{type(loaded.model).__name__} ({loaded.task}{', fake mode' if fake else ''}) from {folder}")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        options = _options(request, loaded, output.with_name(f"{output.name}.failure.sarif"))
        files = recipe.export(loaded, staging, options, request, say)
        if request.float32_twin:
            files += twins.write_float32_twins(staging, files)
        files += copy_folder_files(folder, staging)
        if loaded.text_only:  # the language model's config: the folder holds no encoder
            write_atomically(staging / "config.json", loaded.model.config.to_json_string())
        bits = request.quantization.bits if request.quantization is not None else None
        folder_layout.mark_for_transformers_js(staging / "config.json", weights_dtype(loaded), bits)
        # told from config.json as written: what the clients read
        note = recipe.client_note(read_json(staging / "config.json"),
                                  (staging / "genai_config.json").is_file())
        if note is not None:
            say(note)
        for line in recipe.generation_notes(staging):
            say(line)
        files += tokenizer_files.write_folder_tokenizer(
            folder, staging, (staging / "genai_config.json").is_file(), say, special_tokens=recipe.special_tokens
        )
        files = [f for f in dict.fromkeys(files) if (staging / f).exists()]
        result = HubExport(output, loaded.task, files)
        if verify:
            try:
                result.verification = _verify(loaded, staging, recipe, request, say)
            except FolderRunError as error:  # the folder is whole: kept, with the failure stated
                result.verification = Verification.failed_run(error, tolerance_for(weights_dtype(loaded), rtol, atol))
            say(f"verification: {result.verification.summary()}")
            if (unsearched := verification_note(staging)) is not None:
                say(unsearched)
        if output.exists():
            output.rmdir()  # empty, checked above
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.seconds = time.perf_counter() - started
    say(f"wrote {output}: {', '.join(result.files)} in {result.seconds:.1f} s")
    return result
