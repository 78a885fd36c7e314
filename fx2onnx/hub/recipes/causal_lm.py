"""The causal-LM recipe: one `onnx/model.onnx` serving prefill and decode (the decode step
captured after a prefill, decoders/decode_step.py) with ONNX Runtime GenAI's
`genai_config.json` (none for a hybrid decoder, whose convolution or recurrent states GenAI
feeds only to its own builder's models); int4/int8 as weight-only `MatMulNBits`, pre-quantized checkpoints
and mixed precision."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.decoders import cache_counters, compressed_attention, decode_step, recomputed, text_only
from fx2onnx.hub.decoders.client_support import client_note
from fx2onnx.hub.decoders.combined_cache import reads_combined_cache, write_combined_cache_graph
from fx2onnx.hub.decoders.growing_cache import check_growing_cache
from fx2onnx.hub.decoders.indexer_cache import write_joined_indexer_keys
from fx2onnx.hub.decoders.mask_positions import write_positions_from_mask
from fx2onnx.hub.decoders.model_lengths import VerificationLengths, verification_lengths
from fx2onnx.hub.decoders.own_decode_step import own_decode_step_failure
from fx2onnx.hub.decoders.per_layer_inputs import EMBEDDING, write_embedded_decoder, writes_embedded_decoder
from fx2onnx.hub.decoders.sliding_window import causal_within_windows, masks_by_held_tokens
from fx2onnx.hub.decoders.state_list import name_states, state_list_options
from fx2onnx.hub.decoders.state_names import write_transformers_js_states
from fx2onnx.hub.decoders.strided_cache import UNJOINED_NOTE, cache_stride, write_strided_cache
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.value_branch_refusal import value_branch_failure
from fx2onnx.hub.decoders.verify_lengths import batch_reference, verify_causal_lm_at_lengths, verify_steps_against_one_pass
from fx2onnx.hub.decoders.windowed_cache import write_windowed_decoder
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision import float32_twin as twins
from fx2onnx.hub.precision.folder_precision import PrecisionSupport, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.tasks import UnsupportedTaskError, is_filed_under
from fx2onnx.hub.shared.dim_roles import fixed_size_states
from fx2onnx.hub.shared.genai_config import (
    GENAI_CONFIG, genai_config, genai_decoder_file, genai_state_note, shared_cache_note, unequal_head_sizes_note,
)
from fx2onnx.hub.shared.program_files import exported, onnx_file, save_program, saved_graph
from fx2onnx.hub.shared.verification import QUANTIZED_ACTIVATION_ERROR, Tolerance, Verification, verify_quantized_causal_lm

PRECISION = PrecisionSupport(weight_only=True)
MASKED_LM_MAPPING = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"


def _stateless_refusal(loaded: LoadedModel) -> Refusal | None:
    """A model filed under causal LMs whose forward returns no cache gets a folder that
    recomputes the sequence (decoders/recomputed.py), unless its generation feeds forward
    more than the sequence (XLM's appended mask token): that one has no text-generation folder."""
    if not decode_step.returns_no_cache(loaded.model):
        return None
    fed = recomputed.generation_inputs_refusal(loaded.model)
    if fed is None:
        return None
    name = type(loaded.model).__name__
    fill_mask = "--task fill-mask (its logits at every position), or " if is_filed_under(name, MASKED_LM_MAPPING) else ""
    return Refusal(UnsupportedTaskError, (
        f"{name} ({loaded.config.model_type}) returns no key/value cache, and transformers' generation feeds its forward "
        f"{fed} (its prepare_inputs_for_generation), which no loader that feeds the sequence reproduces: it has no "
        f"text-generation folder. Nothing was written. Export it with {fill_mask}fx2onnx.dynamo_export."
    ))


def _with_precision(options: fx2onnx.ExportOptions, request: ExportRequest) -> fx2onnx.ExportOptions:
    if request.quantization is None:
        return options
    # steps of the export's ONNX passes (with the packing of the projections that read
    # one input, when asked); codes and scales are computed as the weights are written
    precision = dataclasses.replace(request.quantization, packed_projections=request.pack_projections)
    return dataclasses.replace(options, precision=precision)


def _assistant_refusal(loaded: LoadedModel) -> Refusal | None:
    """A model whose every layer reuses another model's keys and values (Gemma 4's assistants,
    drafters for speculative decoding, given their target's `shared_kv_states` and embeddings)
    has no cache of its own, so no decode step to write alone."""
    text = decode_step.decoder_sizes(loaded.config)
    shared, layers = getattr(text, "num_kv_shared_layers", None), getattr(text, "num_hidden_layers", None)
    if not isinstance(shared, int) or not shared or shared != layers:
        return None
    name = type(loaded.model).__name__
    return Refusal(UnsupportedTaskError, (
        f"{name} ({loaded.config.model_type}) reuses another model's keys and values in each of its {layers} layers "
        "(an assistant for speculative decoding, given its target model's shared_kv_states and embeddings), so it has "
        "no cache and no decode step of its own for a text-generation folder. Nothing was written. Export its target "
        "model, or export it with fx2onnx.dynamo_export on the inputs its target gives it."
    ))


def _codebooks_refusal(loaded: LoadedModel) -> Refusal | None:
    """A decoder of audio codebooks (Musicgen's) reads `input_ids` of batch x codebooks rows
    against a mask and cache of batch rows, and transformers' generation delays each codebook
    by one more step: no causal-LM loader feeds it, and greedy tokens from its logits are not
    transformers' tokens."""
    count = decode_step.codebooks(loaded.config)
    if count is None:
        return None
    name = type(loaded.model).__name__
    return Refusal(UnsupportedTaskError, (
        f"{name} ({loaded.config.model_type}) decodes {count} audio codebooks: its input_ids rows must be a multiple of "
        f"num_codebooks={count} (batch x codebooks, against an attention mask and cache of batch rows) and transformers' "
        "generation applies a codebook delay pattern mask to every step, which no text-generation loader (ONNX Runtime "
        "GenAI, Transformers.js) reproduces: it has no text-generation folder. Nothing was written. Export it with "
        "fx2onnx.dynamo_export on input_ids of (batch x num_codebooks, sequence) rows."
    ))


class CausalLMRecipe(RecipeDefaults):
    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        return (_codebooks_refusal(loaded) or _stateless_refusal(loaded) or _assistant_refusal(loaded)
                or precision_refusal(loaded, request, PRECISION))

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        quantization = request.quantization
        if decode_step.returns_no_cache(loaded.model):
            return recomputed.export_recomputed(loaded, staging, _with_precision(options, request), quantization, say)
        if decode_step.attends_causally(loaded.config) or causal_within_windows(loaded.config):
            # its attention is causal over `attention_mask`'s tokens (within each layer's window):
            # its cache may be updated in place
            options = dataclasses.replace(options, causal_mask_input="attention_mask")
        options = _with_precision(options, request)
        if compressed_attention.serves(loaded.config):
            # DeepSeek-V4: export-hf's own step, the compressors' counts taken from the past length
            say(compressed_attention.NOTE.format(name=type(loaded.model).__name__))
            return compressed_attention.export_compressed_attention(loaded, staging, options, quantization)
        inputs = decode_step.decode_step_inputs(loaded)
        counted = cache_counters.counter_refusal(loaded, inputs)
        if counted is not None:
            raise counted
        step_options = state_list_options(loaded.model, inputs, decode_step.decode_step_options(inputs, options))
        # a text-only folder's cache holds no image tokens for the mask to be widened by
        no_image = text_only.no_cached_image_tokens(loaded.model) if loaded.text_only else contextlib.nullcontext()
        with masks_by_held_tokens(loaded.model), no_image:
            try:
                program = exported(loaded.model, inputs, step_options)
            except fx2onnx.OnnxExporterError as error:
                # the model's own forward failing on the step too is the cause to name
                failure = own_decode_step_failure(loaded) or value_branch_failure(
                    loaded, error, options.failure_report_path)
                if failure is None:
                    raise
                raise failure from error
        name_states(loaded.model, program.model)  # RWKV's list: past_state.<i> in, present_state.<i> out
        check_growing_cache(program, loaded.config)
        name = onnx_file(loaded, folder_layout.MODEL, quantization)
        files = save_program(program, staging, name, loaded)
        if writes_embedded_decoder(loaded.config):
            # Transformers.js's class for the model type loads an embedding and a decoder, not this model
            files += write_embedded_decoder(loaded, staging, options, quantization)
        # indexer keys carried in the key cache, which Transformers.js feeds with the values
        write_joined_indexer_keys(staging, name, loaded.config.to_dict())
        # positions the graph counts from the mask, where Transformers.js would feed others
        write_positions_from_mask(staging, name, loaded.config.to_dict())
        states = fixed_size_states(program.model)
        if states:
            say(genai_state_note(loaded.config, states))
            # no GenAI graph to keep: the one graph takes the states as Transformers.js feeds them
            write_transformers_js_states(staging, name, loaded.config.to_dict())
            # layers fed in groups, where Transformers.js names a cache only every few layers
            config = loaded.config.to_dict()
            if cache_stride(config) > 1 and not write_strided_cache(staging, name, config):
                say(UNJOINED_NOTE.format(model_type=config.get("model_type"), stride=cache_stride(config)))
            return files
        no_genai = unequal_head_sizes_note(loaded.config, program.model)
        if no_genai is not None:
            say(no_genai)
            return files
        # layers reading an earlier layer's present: GenAI feeds past and present apart
        apart = shared_cache_note(loaded.config, program.model)
        if apart is not None:
            say(apart)
        if reads_combined_cache(loaded.config.to_dict()):
            # Transformers.js feeds this config one key_value input per layer; ONNX Runtime
            # GenAI feeds a key and a value: a graph for each, over the same weights
            name = write_combined_cache_graph(staging, name)
            files.append(name)
        generation = getattr(loaded.model, "generation_config", None)
        # the inputs of the graph file as saved, after the rewrites for Transformers.js's feeds
        config = genai_config(loaded.config, generation, name, saved_graph(staging / name))
        if apart is not None:
            # the folder's model as it is, its cache growing: no window-sized buffer either
            config["search"]["past_present_share_buffer"] = False
            return [*files, write_json_file(staging, GENAI_CONFIG, config)]
        windowed = write_windowed_decoder(staging, name, config)  # ONNX Runtime GenAI's own, where layers slide
        if windowed is not None:
            config, files = windowed, [*files, windowed["model"]["decoder"]["filename"]]
        return [*files, write_json_file(staging, GENAI_CONFIG, config)]

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        lengths = verification_lengths(loaded.config, request.tokens)
        # a quantized folder's tokens are not transformers': compared in one pass, then its decode steps against it
        reached = "" if request.quantization is None else " (quantized: the prompt and its decode steps, not the batch)"
        say(f"verification lengths: {lengths.describe()}{reached}")
        relative = onnx_file(loaded, folder_layout.MODEL, request.quantization)
        # the folder's model, then the one ONNX Runtime GenAI reads where it has its own (a
        # separate cache, a windowed one: fed as onnxruntime's other clients feed a cache, its
        # exact form first, then its kernels once a sliding layer's buffer holds the window)
        # (not in the verification of float32 twins, export_hf._verify_twins: the GenAI file then is the
        # float16 file, verified as the folder's model before)
        paths = [relative, *[path for path in [genai_decoder_file(folder)]
                             if path not in (None, relative, twins.float16_file(relative))]]
        prompt = None
        if request.quantization is not None:
            vocab = int(decode_step.decoder_sizes(loaded.config).vocab_size)
            prompt = torch.randint(min(3, vocab - 1), vocab, (lengths.prompt,), generator=torch.Generator().manual_seed(1))
        first = None
        reference, why = batch_reference(model, loaded.text_only)
        if why is not None:
            say(why)
        for path in paths:
            if path != relative:
                say(f"verifying {path} (ONNX Runtime GenAI's decoder) too")
            if prompt is not None:
                verdict = verify_quantized_causal_lm(folder / path, model, loaded.config, prompt.tolist(), request.tokens,
                                                     request.atol, quantization=request.quantization)
                verdict = _also_at_lengths(verdict, folder / path, model, loaded.config, lengths, say)
            else:
                verdict = verify_causal_lm_at_lengths(folder / path, model, loaded.config, lengths, tolerance,
                                                      reference=reference)
            if not verdict.passed:
                return verdict if path == relative else dataclasses.replace(
                    verdict, failure=f"{path}: {verdict.failure or 'logits beyond the tolerance'}")
            first = first or verdict
        if writes_embedded_decoder(loaded.config):
            # Transformers.js's embedding and decoder, fed as it feeds them: each step's ids embedded first
            embedding, decoder = (onnx_file(loaded, base, request.quantization)
                                  for base in (EMBEDDING, folder_layout.MERGED_DECODER))
            say(f"verifying {embedding} and {decoder} (Transformers.js's models) too")
            if prompt is not None:
                verdict = verify_quantized_causal_lm(folder / decoder, model, loaded.config, prompt.tolist(), request.tokens,
                                                     request.atol, embedding=folder / embedding,
                                                     quantization=request.quantization)
                verdict = _also_at_lengths(verdict, folder / decoder, model, loaded.config, lengths, say, folder / embedding)
            else:
                verdict = verify_causal_lm_at_lengths(folder / decoder, model, loaded.config, lengths, tolerance,
                                                      reference=reference, embedding=folder / embedding)
            if not verdict.passed:
                return dataclasses.replace(verdict, failure=f"{decoder}: {verdict.failure or 'logits beyond the tolerance'}")
        return first  # every graph passed: the folder's model's verdict, with its lengths

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return client_note(config, genai_config)


def _also_at_lengths(
    one_pass: Verification, path: Path, model: torch.nn.Module, config: Any, lengths: VerificationLengths, say: Say,
    embedding: Path | None = None,
) -> Verification:
    """A quantized folder that passed its verification (one pass over the prompt and the
    generated tokens) at ``lengths`` too: its decode steps against that one pass
    (`verify_steps_against_one_pass`), within what int8 activations move the logits by. The
    one pass's verdict when they agree, theirs when not."""
    if not one_pass.passed:
        return one_pass
    steps = verify_steps_against_one_pass(path, model, config, lengths, QUANTIZED_ACTIVATION_ERROR, embedding=embedding)
    say(f"verification of the decode steps: {steps.summary()}")
    return one_pass if steps.passed else steps


RECIPE = CausalLMRecipe()
