"""`export_hf`: a transformers model to a folder its runtime runs (see the package docstring).

The folder is written under a temporary name beside ``output`` and moved in place at the
end: a failed export leaves nothing behind, and an existing folder that is not empty is
refused rather than mixed with.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.fx_passes import FUSED_KERNELS_OPSET
from fx2onnx.hub import causal_lm
from fx2onnx.hub.client_support import client_note
from fx2onnx.hub.dim_roles import TOTAL, name_dims_by_role
from fx2onnx.hub.folder_files import copy_folder_files
from fx2onnx.hub.genai_config import genai_config
from fx2onnx.hub import layout, pipeline_tasks, seq2seq, text_only, tokenizer_files, vision_language, vlm_layout, whisper_genai
from fx2onnx.hub.merged_decoder import merge_decoders
from fx2onnx.hub.prequantized import CheckpointCodes, checkpoint_codes
from fx2onnx.hub.precision import DEFAULT_ALGORITHM, resolve_precision, with_mixed_precision
from fx2onnx.hub.renamed_weights import RenamedCheckpoint
from fx2onnx.hub.sliding_window import causal_within_windows, masks_by_held_tokens
from fx2onnx.hub.loading import (
    FEATURE_EXTRACTION, IMAGE_CLASSIFICATION, IMAGE_TEXT_TO_TEXT, SPEECH_RECOGNITION, TEXT2TEXT, TEXT_GENERATION, LoadedModel,
    is_ctc, load_model, local_folder,
)
from fx2onnx.hub.verify import (
    FolderRunError, Verification, tolerance_for, verify_outputs, verify_quantized_causal_lm, verify_quantized_outputs,
    verify_seq2seq,
)
from fx2onnx.hub.model_lengths import verification_lengths
from fx2onnx.hub.verify_lengths import verify_causal_lm_at_lengths
from fx2onnx.hub.pipeline_verify import verify_task_outputs
from fx2onnx.hub.verify_vlm import verify_image_text_to_text
from fx2onnx.hub.whisper_verify import verify_whisper_genai
from fx2onnx.onnx_passes import WeightQuantization, newest_opset, pack_projections, quantize_linears_dynamically


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


def _options(
    loaded: LoadedModel, opset: int | None, progress: bool, report: Path, runtime: str, module_functions: bool
) -> fx2onnx.ExportOptions:
    # a decoder's attention is causal over `attention_mask`'s tokens: its cache may be updated in place
    causal = loaded.task == TEXT_GENERATION and (
        causal_lm.attends_causally(loaded.config) or causal_within_windows(loaded.config))
    # A folder is flat by default: the tools people run on it (onnxruntime's quantizers and
    # transformers optimizer) do not look inside ONNX functions, and onnxruntime inlines
    # them when it loads the model anyway.
    # "standard" is a folder for any runtime: the portable target (standard operators at
    # opset 20 unless asked, attention decomposed, which OpenVINO, TVM and the browser run)
    portable = runtime == "standard"
    if opset is None and not portable:
        opset = default_opset()
    return fx2onnx.ExportOptions(
        dynamic_shapes=True, fake_context=loaded.fake_context, opset_version=opset,
        progress=progress, failure_report_path=report, causal_mask_input="attention_mask" if causal else None, runtime=runtime,
        module_functions=module_functions, target="portable" if portable else "default",
    )


def _exported(
    model: torch.nn.Module, inputs: dict[str, Any], options: fx2onnx.ExportOptions,
    extra_roles: dict[str, dict[int, str]] | None = None,
) -> fx2onnx.ONNXProgram:
    """The export of ``model`` with its dims named after their roles."""
    program = fx2onnx.dynamo_export(model, **inputs, export_options=options)
    name_dims_by_role(program.model, extra_roles)
    return program


def _weights_dtype(loaded: LoadedModel) -> torch.dtype:
    return next(p.dtype for p in loaded.model.parameters() if p.is_floating_point())


def _onnx_file(loaded: LoadedModel, base: str, quantization: WeightQuantization | None = None) -> str:
    return layout.onnx_file(base, _weights_dtype(loaded), quantization.bits if quantization is not None else None)


def _save(
    program: fx2onnx.ONNXProgram, staging: Path, relative: str, loaded: LoadedModel, state: Any = None
) -> list[str]:
    """Save ``program`` at ``relative`` in the folder, its weights in the data file named as
    Transformers.js expects (read from ``state``, default the source folder, in fake mode);
    returns both paths."""
    if loaded.fake_context is None:
        state = None
    elif state is None:
        state = loaded.weights if loaded.weights is not None else loaded.folder
    program.save(staging / relative, model_state=state, external_data=True, data_name=layout.data_file(relative))
    return layout.with_data_file(relative)


def _encoder_inputs(loaded: LoadedModel, size: int) -> dict[str, torch.Tensor]:
    """Example inputs of an encoder or image classifier; ``size`` 0 or 1 picks one of two shapes."""
    if loaded.task == IMAGE_CLASSIFICATION:
        return pipeline_tasks.image_inputs(loaded.config, 2 + size, size)
    inputs = pipeline_tasks.text_inputs(loaded.config, loaded.model, size)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    return inputs


def _fake(inputs: dict[str, torch.Tensor], loaded: LoadedModel) -> dict[str, torch.Tensor]:
    if loaded.fake_context is None:
        return inputs
    return {k: loaded.fake_context.fake_mode.from_tensor(v) for k, v in inputs.items()}


def _check_growing_cache(program: fx2onnx.ONNXProgram, loaded: LoadedModel) -> None:
    """A cache captured at a fixed length (a layer that keeps a bounded number of tokens,
    other than the sliding windows sliding_window.py puts in the mask) would be exact at
    one fill only, and ONNX Runtime GenAI feeds back caches that grow with the sequence."""
    fixed = [
        f"{value.name} ({value.shape[2]})" for value in program.model.graph.outputs
        if value.name.startswith("present.") and value.shape is not None and str(value.shape[2]) != TOTAL
    ]
    if fixed:
        raise NotImplementedError(
            f"{loaded.config.model_type}'s cache keeps a fixed number of tokens in {len(fixed) // 2} layer(s): its length "
            f"is fixed in the captured graph ({', '.join(fixed[:2])}{', ...' if len(fixed) > 2 else ''}) instead of "
            "growing with the sequence, which export-hf's decoders need. Export the decode step with "
            "fx2onnx.dynamo_export instead; nothing was written."
        )


def _export_causal_lm(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, quantization: WeightQuantization | None = None,
    packed: bool = False,
) -> list[str]:
    inputs = causal_lm.decode_step_inputs(loaded)
    if quantization is not None:
        # a step of the export's ONNX passes; codes and scales are computed as the weights are written
        options = dataclasses.replace(options, precision=quantization)
    with masks_by_held_tokens(loaded.model):
        program = _exported(loaded.model, inputs, options)
    _check_growing_cache(program, loaded)
    if quantization is not None and packed:
        pack_projections(program.model)
    name = _onnx_file(loaded, layout.MODEL, quantization)
    files = _save(program, staging, name, loaded)
    generation = getattr(loaded.model, "generation_config", None)
    config = genai_config(loaded.config, generation, name, program.model)
    (staging / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return [*files, "genai_config.json"]


def _export_single(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, quantization: WeightQuantization | None = None
) -> list[str]:
    if quantization is not None and options.module_functions:
        raise ValueError("precision int8 of an encoder rewrites the linear layers of one flat graph (MatMulInteger of "
                         "activations quantized at run time): drop module_functions.")
    program = _exported(loaded.model, _fake(_encoder_inputs(loaded, 0), loaded), options)
    if quantization is not None:  # an encoder's int8: activations quantized at run time (MatMulInteger)
        quantize_linears_dynamically(program.model)
    return _save(program, staging, _onnx_file(loaded, layout.MODEL, quantization), loaded)


def _prequantized(loaded: LoadedModel, given: CheckpointCodes, precision: str | None, algorithm: str, mixed: bool,
                  accuracy_level: int) -> WeightQuantization:
    """The quantization that writes a pre-quantized checkpoint's own codes; options that
    would quantize otherwise are refused."""
    bits = given.scheme.bits
    if loaded.task != TEXT_GENERATION:
        raise NotImplementedError(f"pre-quantized checkpoints are exported for causal LMs (MatMulNBits); this one is {loaded.task}.")
    if precision not in (None, f"int{bits}") or mixed or algorithm != DEFAULT_ALGORITHM:
        raise ValueError(
            f"the checkpoint is already quantized to {bits} bits and is written with its own codes: give no precision "
            f"(or int{bits}), no mixed_precision and no quantization_algorithm."
        )
    return dataclasses.replace(given.quantization(), accuracy_level=accuracy_level)


def _pipeline_task(loaded: LoadedModel) -> str | None:
    """The task of pipeline_tasks.PIPELINE_TASKS that ``loaded`` is exported for, if any."""
    if is_ctc(loaded.task, loaded.config):
        return pipeline_tasks.CTC_SPEECH_RECOGNITION
    if loaded.task == SPEECH_RECOGNITION:  # an encoder-decoder (Whisper): two models, not one pass
        return None
    return loaded.task if loaded.task in pipeline_tasks.PIPELINE_TASKS else None


def _export_pipeline_task(loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions) -> list[str]:
    """One model.onnx with the outputs the task's pipelines read (pipeline_tasks.py)."""
    task = _pipeline_task(loaded)
    if getattr(loaded.model.config, "use_cache", None):  # one pass: a decoder's cache is no output of the task
        loaded.model.config.use_cache = False
    inputs = pipeline_tasks.example_inputs(task, loaded.config, loaded.model, 0)
    program = _exported(loaded.model, _fake(inputs, loaded), options, pipeline_tasks.extra_dim_roles(task))
    pipeline_tasks.keep_task_outputs(program.model, task)
    pipeline_tasks.name_image_dims(program.model)
    return _save(program, staging, _onnx_file(loaded, layout.MODEL), loaded)


def _check_quantizable(loaded: LoadedModel, precision: str | None, quantization: WeightQuantization | None) -> None:
    """int4/int8 are for causal LMs (weight-only MatMulNBits) and int8 for encoders
    (dynamic activations, MatMulInteger); the rest is refused before anything is exported."""
    if quantization is None or loaded.task == TEXT_GENERATION:
        return
    if loaded.task != FEATURE_EXTRACTION:
        raise NotImplementedError(
            f"precision {precision} is written for causal LMs (int4, int8) and text encoders (int8); {loaded.task} "
            "folders are float: give precision fp32, fp16 or bf16."
        )
    if quantization.embedding:
        raise NotImplementedError(
            "quantize_embedding is for causal LMs (GatherBlockQuantized beside MatMulNBits); an encoder's int8 keeps "
            "its embeddings float: drop quantize_embedding."
        )
    plain = WeightQuantization(bits=quantization.bits, embedding=quantization.embedding, algorithm=quantization.algorithm)
    if quantization != plain:
        raise ValueError(
            "block_size, accuracy_level and quantize_lm_head are MatMulNBits' (causal LMs); an encoder's int8 takes "
            "none of them: drop them."
        )
    if quantization.bits != 8:
        raise NotImplementedError(
            f"precision {precision} for an encoder: its int8 quantizes activations at run time (onnxruntime's "
            "MatMulInteger), which has no 4-bit form; give precision int8."
        )
    if _weights_dtype(loaded) != torch.float32:
        raise ValueError(
            f"precision int8 for an encoder computes in float32 (onnxruntime's DynamicQuantizeLinear takes float32 "
            f"only), not {_weights_dtype(loaded)}: give dtype float32 or none."
        )


def _export_seq2seq(loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions) -> list[str]:
    encoder, decoder = seq2seq.halves(loaded)
    # the halves hold the whole model as `model`: in fake mode, its weights under that prefix
    checkpoint = None
    if loaded.fake_context is not None:
        checkpoint = RenamedCheckpoint(loaded.folder, loaded.model).prefixed(seq2seq.WHOLE_MODEL_PREFIX)

    def save(program: fx2onnx.ONNXProgram, folder: Path, name: str) -> list[str]:
        state = None
        if checkpoint is not None:  # the half's own weights and their tied names (the LM head of the embedding)
            signature = program.model_signature
            needed = set(signature.torch_names().values()) | {n for names in signature.aliases().values() for n in names}
            state = checkpoint.only(needed)
        return _save(program, folder, name, loaded, state)

    program = _exported(encoder, _fake(seq2seq.encoder_inputs(loaded), loaded), options)
    files = save(program, staging, _onnx_file(loaded, layout.ENCODER))
    # the first and the next steps, captured apart, then merged into one file
    steps = staging / ".decoder_steps"
    paths = []
    for name, with_past in (("decoder_model.onnx", False), ("decoder_with_past_model.onnx", True)):
        program = _exported(decoder, seq2seq.decoder_inputs(loaded, decoder, with_past), options)
        save(program, steps, name)
        paths.append(steps / name)
    merged = _onnx_file(loaded, layout.MERGED_DECODER)
    merge_decoders(*paths, staging / merged, layout.data_file(merged))
    shutil.rmtree(steps)
    return [*files, *layout.with_data_file(merged)]


def _genai_whisper(loaded: LoadedModel, runtime: str) -> bool:
    """Whether the folder is ONNX Runtime GenAI's Whisper (--runtime onnxruntime) rather
    than Optimum's encoder and merged decoder (--runtime standard)."""
    return runtime == "onnxruntime" and getattr(loaded.config, "model_type", None) == "whisper"


def _export_speech(loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions) -> list[str]:
    if is_ctc(loaded.task, loaded.config):
        return _export_pipeline_task(loaded, staging, options)
    if _genai_whisper(loaded, options.runtime):
        return whisper_genai.export_whisper_genai(loaded, staging, options, _save)
    return _export_seq2seq(loaded, staging, options)


def _export_image_text_to_text(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, say: Callable[[str], None] = lambda line: None,
) -> list[str]:
    from transformers import AutoImageProcessor

    image_processor = AutoImageProcessor.from_pretrained(loaded.folder)
    programs = vision_language.export_parts(loaded, options, image_processor)
    say(vlm_layout.image_sizes_note(loaded.config.model_type, image_processor))
    files, paths = [], {}
    # the parts are modules of the model, not the model: their weights by the model's names
    # (every name of a tied weight reads the one the checkpoint holds: a tied LM head is `lm_head.weight` in the decoder)
    state = None
    if loaded.fake_context is not None:
        state = RenamedCheckpoint(loaded.folder, loaded.model).renamed(text_only.source_names(loaded.model, loaded.model))
    for part, base in vlm_layout.PARTS.items():
        if part != "vision":  # its dims are the image's, no role the runtime names
            name_dims_by_role(programs[part].model)
        paths[part] = _onnx_file(loaded, base)
        needed = set(programs[part].model.graph.initializers)
        files += _save(programs[part], staging, paths[part], loaded, state.only(needed) if state is not None else None)
    generation = getattr(loaded.model, "generation_config", None)
    genai_type = vision_language.GENAI_VLM_TYPES[loaded.config.model_type]
    config = vlm_layout.genai_vlm_config(loaded.config, generation, paths, programs["decoder"].model, genai_type)
    merge = getattr(loaded.config, "spatial_merge_size", None)  # Mistral 3's, beside its vision config
    processor = vlm_layout.processor_config(genai_type, image_processor, loaded.config.vision_config, merge)
    for name, content in (("genai_config.json", config), (vlm_layout.PROCESSOR_CONFIG, processor)):
        (staging / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        files.append(name)
    return files


_EXPORTERS: dict[str, Callable[[LoadedModel, Path, fx2onnx.ExportOptions], list[str]]] = {
    TEXT_GENERATION: _export_causal_lm,
    TEXT2TEXT: _export_seq2seq,
    SPEECH_RECOGNITION: _export_speech,
    FEATURE_EXTRACTION: _export_single,
    IMAGE_CLASSIFICATION: _export_single,
    IMAGE_TEXT_TO_TEXT: _export_image_text_to_text,
    **{task: _export_pipeline_task for task in pipeline_tasks.PIPELINE_TASKS if task != SPEECH_RECOGNITION},
}


def _verify(
    loaded: LoadedModel, folder: Path, tokens: int, rtol: float | None, atol: float | None,
    quantization: WeightQuantization | None, runtime: str, say: Callable[[str], None] = lambda line: None,
) -> Verification:
    model = loaded.model
    if loaded.fake_context is not None:  # the real model, built from the folder, to compare with
        model = load_model(loaded.folder, loaded.task, None, fake=False, text_only=loaded.text_only).model
        model.to(next(p.dtype for p in loaded.model.parameters()))
    tolerance = tolerance_for(next(p.dtype for p in model.parameters()), rtol, atol)
    if _genai_whisper(loaded, runtime):
        files = (folder / _onnx_file(loaded, layout.GENAI_ENCODER), folder / _onnx_file(loaded, layout.GENAI_DECODER))
        return verify_whisper_genai(folder, *files, model, loaded.folder, tokens, tolerance)
    if _pipeline_task(loaded) is not None:
        path = folder / _onnx_file(loaded, layout.MODEL)
        return verify_task_outputs(path, model, _pipeline_task(loaded), loaded.config, tolerance)
    if loaded.task in (TEXT2TEXT, SPEECH_RECOGNITION):
        start = int(getattr(loaded.config, "decoder_start_token_id", None) or 0)
        files = (folder / _onnx_file(loaded, layout.ENCODER), folder / _onnx_file(loaded, layout.MERGED_DECODER))
        return Verification.merged(
            [verify_seq2seq(*files, model, seq2seq.encoder_inputs(loaded, size), start, tokens, tolerance) for size in (0, 1)]
        )
    if loaded.task == IMAGE_TEXT_TO_TEXT:
        from transformers import AutoImageProcessor

        image_processor = AutoImageProcessor.from_pretrained(loaded.folder)
        files = {part: folder / _onnx_file(loaded, base) for part, base in vlm_layout.PARTS.items()}
        return verify_image_text_to_text(files, model, image_processor, tokens, tolerance)
    if loaded.task == TEXT_GENERATION:
        lengths = verification_lengths(loaded.config, tokens)
        say(f"verification lengths: {lengths.describe()}")
        path = folder / _onnx_file(loaded, layout.MODEL, quantization)
        if quantization is not None:
            vocab = int(loaded.config.vocab_size)
            prompt = torch.randint(min(3, vocab - 1), vocab, (lengths.prompt,), generator=torch.Generator().manual_seed(1))
            return verify_quantized_causal_lm(path, model, loaded.config, prompt.tolist(), tokens, atol)
        return verify_causal_lm_at_lengths(path, model, loaded.config, lengths, tolerance)
    output = "logits" if loaded.task == IMAGE_CLASSIFICATION else "last_hidden_state"
    path = folder / _onnx_file(loaded, layout.MODEL, quantization)
    if quantization is not None:
        return verify_quantized_outputs(path, model, lambda size: _encoder_inputs(loaded, size), output, atol)
    return verify_outputs(path, model, lambda size: _encoder_inputs(loaded, size), output, tolerance
    )


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
    block_size: int = 32,
    accuracy_level: int = 4,
    quantize_lm_head: bool = True,
    quantize_embedding: bool = False,
    quantization_algorithm: str = DEFAULT_ALGORITHM,
    mixed_precision: bool = False,
    pack_projections: bool = False,
    text_only: bool = False,
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
            as a left-padded batch: `fx2onnx.hub.model_lengths`); the result's
            ``verification.passed`` says whether every output is within the tolerance (and
            a decoder's greedy tokens equal, and every run succeeded). The folder is written
            either way: a failed one is kept, whole, with the failure stated.
        opset: the ONNX opset (default: 23, where attention and the rotary embedding
            are single kernels, when the installed tools know it; 20 for runtime "standard").
        tokens: greedy tokens generated by the verification of a causal LM.
        rtol, atol: the verification's tolerance, ``|onnx - torch| <= atol + rtol * |torch|``
            (default: the model's dtype's, `fx2onnx.hub.verify.DEFAULT_TOLERANCES`).
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
            Whisper in Optimum's layout, as T5 and BART. Both give transformers' answer
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
            defaults: int8 activations in the kernel).
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
            (llama.cpp's Q4_K_M rule, `fx2onnx.hub.precision.more_bits_layers`).
        pack_projections: int4/int8 run the layers that read one input (Q, K and V; gate
            and up) as one MatMulNBits and a Split. Off by default: on onnxruntime
            1.32's CPU it was not faster (bench/precision_folders.py; the Split copies).
        text_only: export a multimodal model's language model alone as text-generation,
            its vision and audio encoders left out (`fx2onnx.hub.text_only`); without it a
            text-generation export of a model with encoders is refused.
    """
    started = time.perf_counter()
    output = Path(os.fspath(output)).expanduser()
    _check_output(output)
    dtype, quantization = resolve_precision(
        precision, dtype, block_size=block_size, accuracy_level=accuracy_level, quantize_lm_head=quantize_lm_head,
        quantize_embedding=quantize_embedding, algorithm=quantization_algorithm,
    )
    if quantize_embedding and module_functions:
        raise ValueError("quantize_embedding quantizes the token embedding's Gather in one flat graph (with module "
                         "functions it is inside the embedding's function): drop module_functions.")
    if pack_projections and module_functions:
        raise ValueError("pack_projections packs the MatMulNBits of one flat graph (the projections of a layer are "
                         "separate module functions otherwise): drop module_functions.")
    if runtime == "standard" and module_functions:
        raise ValueError("runtime standard writes one flat graph (OpenVINO and TVM take no ONNX functions): drop module_functions.")
    if mixed_precision and precision != "int4":
        raise ValueError(f"mixed_precision gives some layers of an int4 folder 8 bits; precision is {precision}: give int4.")
    if mixed_precision and module_functions:
        raise ValueError("mixed_precision chooses layers of one flat graph by their names: drop module_functions.")
    folder = local_folder(model)
    loaded = load_model(folder, task, dtype, fake, say, text_only=text_only)
    if loaded.task == IMAGE_TEXT_TO_TEXT:
        vision_language.check_supported(loaded.config)
    _check_quantizable(loaded, precision, quantization)
    given = checkpoint_codes(folder, loaded.config)
    if given is not None:
        quantization = _prequantized(loaded, given, precision, quantization_algorithm, mixed_precision, accuracy_level)
    if mixed_precision:
        if loaded.task != TEXT_GENERATION:
            raise NotImplementedError(f"mixed_precision is for causal LMs' MatMulNBits; {loaded.task} has none: drop it.")
        assert quantization is not None
        quantization = with_mixed_precision(quantization, int(loaded.config.num_hidden_layers))
    say(f"{type(loaded.model).__name__} ({loaded.task}{', fake mode' if fake else ''}) from {folder}")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        options = _options(loaded, opset, progress, output.with_name(f"{output.name}.failure.sarif"), runtime, module_functions)
        exporter = _EXPORTERS[loaded.task]
        if loaded.task == IMAGE_TEXT_TO_TEXT:
            exporter = functools.partial(_export_image_text_to_text, say=say)
        if quantization is not None and loaded.task == TEXT_GENERATION:
            exporter = functools.partial(_export_causal_lm, quantization=quantization, packed=pack_projections)
        elif quantization is not None:
            exporter = functools.partial(_export_single, quantization=quantization)
        files = exporter(loaded, staging, options)
        files += copy_folder_files(folder, staging)
        if loaded.text_only:  # the language model's config: the folder holds no encoder
            (staging / "config.json").write_text(loaded.model.config.to_json_string(), encoding="utf-8")
        bits = quantization.bits if quantization is not None else None
        layout.mark_for_transformers_js(staging / "config.json", _weights_dtype(loaded), bits)
        if loaded.task == TEXT_GENERATION:  # told from config.json as written: what the clients read
            note = client_note(json.loads((staging / "config.json").read_text(encoding="utf-8")))
            if note is not None:
                say(note)
        # Whisper's decoder prompt carries its special tokens, the runtime's tokenizer adds none
        files += tokenizer_files.write_folder_tokenizer(
            folder, staging, (staging / "genai_config.json").is_file(), say, special_tokens=not _genai_whisper(loaded, runtime)
        )
        files = [f for f in dict.fromkeys(files) if (staging / f).exists()]
        result = HubExport(output, loaded.task, files)
        if verify:
            try:
                result.verification = _verify(loaded, staging, tokens, rtol, atol, quantization, runtime, say)
            except FolderRunError as error:  # the folder is whole: kept, with the failure stated
                result.verification = Verification.failed_run(error, tolerance_for(_weights_dtype(loaded), rtol, atol))
            say(f"verification: {result.verification.summary()}")
        if output.exists():
            output.rmdir()  # empty, checked above
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.seconds = time.perf_counter() - started
    say(f"wrote {output}: {', '.join(result.files)} in {result.seconds:.1f} s")
    return result
