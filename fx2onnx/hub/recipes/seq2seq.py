"""The sequence-to-sequence recipe: encoder-decoders (T5, BART, Whisper, Moonshine...) as Optimum lays them out:
`encoder_model.onnx` (`input_ids`/`attention_mask`, or a speech model's audio input, `input_features`
or `input_values`, as speech/audio_input.py finds it -> `last_hidden_state`) and two
decoders, merged into one file afterwards (merged_decoder.py): the first step
(`input_ids`, `encoder_attention_mask` for text models and for speech models that read
the mask of a padded batch (speech/audio_mask.py), `encoder_hidden_states` ->
`logits`, `present.{i}.decoder/encoder.key/.value`), and the next steps (the same inputs and
`past_key_values.{i}.decoder/encoder.key/.value`). A speech model's folder is verified against
transformers' greedy generate (speech/speech_verify.py), and gets the processor files
Transformers.js reads for it; export-hf says which speech models Transformers.js runs
(speech/transformers_js_speech.py). Two decoders, because the first step
computes the cross-attention cache from the encoder's output and the next ones read it:
a choice the model's code makes in Python, fixed in each captured graph.

Both halves are exported through a small module that holds the whole model, so that
parameter names (and tied weights) are the checkpoint's, as fake mode needs when the
weights are streamed from the folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fx2onnx
from fx2onnx.hub.decoders.decode_step import cache_argument, encoder_output, decoder_sizes, output_cache
from fx2onnx.hub.loading import SPEECH_RECOGNITION, LoadedModel, eager_forwards
from fx2onnx.hub.precision.float32_io import float32_io
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.merged_decoder import merge_decoders
from fx2onnx.hub.shared.program_files import exported, fake_inputs, onnx_file, own_forward_failure, own_forward_refusal, save_program
from fx2onnx.hub.shared.renamed_weights import part_checkpoint
from fx2onnx.hub.shared.value_branch_refusal import SEQ2SEQ, value_branch_failure
from fx2onnx.hub.shared.verification import Tolerance, Verification, verify_seq2seq
from fx2onnx.hub.speech.audio_input import audio_input_name, audio_layout, reads_mask, speech_examples
from fx2onnx.hub.speech.audio_mask import MASK, attended, frames_mask_rule, frames_of, optional_mask
from fx2onnx.hub.speech.speech_verify import verify_speech_seq2seq
from fx2onnx.hub.speech.transformers_js_speech import client_note, write_processor_files
from fx2onnx.hub.tasks import UnsupportedArchitectureError, UnsupportedTaskError
from fx2onnx.hub.vision_language.transformers_js import text_folder_note

BATCH, ENCODER_TOKENS, DECODED, NEW_TOKENS = 2, 6, 4, 3  # sizes no other dim shares
ENCODER_MASK = "encoder_attention_mask"


class EncoderHalf(nn.Module):
    """The encoder, with the whole model's parameter names: text (`input_ids`,
    `attention_mask`) or audio (the model's own audio input, speech/audio_input.py)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                input_features: torch.Tensor | None = None, input_values: torch.Tensor | None = None) -> Any:
        encoder = self.model.get_encoder()
        audio = {"input_features": input_features} if input_features is not None else {"input_values": input_values}
        if input_ids is not None:
            outputs = encoder(input_ids=input_ids, attention_mask=attention_mask)
        elif attention_mask is None:
            outputs = encoder(**audio)
        else:  # a speech encoder's mask where its folder reads one (audio_input.reads_mask): optional
            outputs = encoder(**audio, attention_mask=attended(attention_mask))
        # the decoder reads this alone (a Wav2Vec2 encoder also returns its convolutions' features)
        return {"last_hidden_state": outputs[0]}


class DecoderHalf(nn.Module):
    """A decode step with Optimum's input names. A speech model's ``frames_mask``
    (audio_mask.frames_mask_rule) turns the mask of the encoder's input into its output
    frames' mask, which the model's forward reads from the encoder's output."""

    def __init__(self, model: nn.Module, cache_argument: str, with_mask: bool,
                 frames_mask: Callable[[torch.Tensor, int], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.model = model
        self.cache_argument = cache_argument
        self.with_mask = with_mask
        self.frames_mask = frames_mask

    def encoded(self, hidden_states: torch.Tensor, mask: torch.Tensor | None) -> Any:
        """The encoder's output as the model's forward takes it."""
        if mask is None or self.frames_mask is None:
            return encoder_output(hidden_states)
        return encoder_output(hidden_states, frames_of(self.frames_mask, mask, hidden_states.shape[1]))

    def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor, cache: Any = None,
                encoder_attention_mask: torch.Tensor | None = None) -> Any:
        outputs = self.model(
            decoder_input_ids=input_ids, encoder_outputs=self.encoded(encoder_hidden_states, encoder_attention_mask),
            attention_mask=encoder_attention_mask, use_cache=True, **{self.cache_argument: cache},
        )
        return {"logits": outputs.logits, "present": output_cache(outputs)}


def _speech(loaded: LoadedModel) -> bool:
    return audio_input_name(loaded.model) is not None


def speech_mask(loaded: LoadedModel) -> bool:
    """Whether the speech model's folder reads the mask of a padded batch: its feature
    extractor returns one, its encoder takes one, and its decoder's mask of the encoder's
    frames follows from it by a rule of the model's (audio_mask.py)."""
    return (_speech(loaded) and frames_mask_rule(loaded.model) is not None
            and reads_mask(Path(loaded.folder), loaded.model.get_encoder()))


def encoder_inputs(loaded: LoadedModel, size: int = 0) -> dict[str, torch.Tensor]:
    if _speech(loaded):  # as the folder's feature extractor gives them, clips of two lengths, one padded
        return speech_examples(loaded.folder, loaded.config, loaded.model, size, with_mask=speech_mask(loaded))
    generator = torch.Generator().manual_seed(size)
    batch = BATCH + size
    length = ENCODER_TOKENS + 3 * size  # size 1: a second input length, for verification
    vocab = int(decoder_sizes(loaded.config).vocab_size)
    return {"input_ids": torch.randint(3, vocab, (batch, length), generator=generator),
            "attention_mask": torch.ones(batch, length, dtype=torch.int64)}


def decoder_inputs(loaded: LoadedModel, decoder: DecoderHalf, with_past: bool) -> dict[str, Any]:
    """A decoding step's inputs, fake when the model is: the first step (no cache), or a
    step with a cache of DECODED tokens."""
    model = loaded.model
    mode = eager_forwards(loaded)
    encoder = encoder_inputs(loaded)
    vocab = int(decoder_sizes(loaded.config).vocab_size)
    batch = next(iter(encoder.values())).shape[0]
    ids = torch.randint(3, vocab, (batch, DECODED + NEW_TOKENS), generator=torch.Generator().manual_seed(7))
    with mode, torch.no_grad():
        encoder = {k: v.clone() for k, v in encoder.items()}
        ids = ids.clone()
        hidden = EncoderHalf(model)(**encoder)["last_hidden_state"]
        mask = encoder.get("attention_mask") if decoder.with_mask else None
        inputs: dict[str, Any] = {"input_ids": ids[:, DECODED:] if with_past else ids, "encoder_hidden_states": hidden}
        if with_past:
            first = model(decoder_input_ids=ids[:, :DECODED], encoder_outputs=decoder.encoded(hidden, mask), attention_mask=mask,
                          use_cache=True)
            inputs["cache"] = output_cache(first)
        if mask is not None:
            inputs["encoder_attention_mask"] = mask
    return inputs


def halves(loaded: LoadedModel) -> tuple[EncoderHalf, DecoderHalf]:
    # a text model's decoder reads the encoder's mask; a speech model's where its folder reads one
    frames_mask = frames_mask_rule(loaded.model) if speech_mask(loaded) else None
    decoder = DecoderHalf(loaded.model, cache_argument(loaded.model), not _speech(loaded) or frames_mask is not None, frames_mask)
    return EncoderHalf(loaded.model).eval(), decoder.eval()


def text_encoder_refusal(loaded: LoadedModel) -> Refusal | None:
    """A model transformers files under speech sequence-to-sequence whose encoder reads text
    (Dia: text in, audio codes out) is text-to-speech, not speech recognition."""
    if loaded.task != SPEECH_RECOGNITION or _speech(loaded):
        return None
    reads = getattr(loaded.model.get_encoder(), "main_input_name", None) or loaded.model.main_input_name
    return Refusal(UnsupportedArchitectureError, (
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) cannot be exported for automatic-speech-recognition: "
        f"its encoder reads {reads}, not audio (input_features or input_values): it takes text in and writes audio "
        "(text-to-speech), which export-hf does not serve. Nothing was written. "
        "Speech recognition folders are written for encoder-decoders whose encoder reads audio (Whisper, Moonshine, "
        "Speech2Text, SpeechT5, SeamlessM4T, Canary, Cohere ASR); export this model's modules with fx2onnx.dynamo_export."
    ))


def _step_refusal(loaded: LoadedModel, decoder: DecoderHalf, with_past: bool) -> UnsupportedTaskError | None:
    """After a failed capture of a decoding step: the refusal when the model's own forward
    fails on that step in eager PyTorch too (ProphetNet's decoder asserts one token per step
    over its cache), naming its line; None when it runs the step."""
    step = (f"a decoding step of {NEW_TOKENS} new tokens over its cache of {DECODED}" if with_past
            else f"a first decoding step of {DECODED + NEW_TOKENS} tokens")
    return own_forward_failure(loaded, decoder_inputs(loaded, decoder, with_past), lambda own: own_forward_refusal(
        loaded.model, loaded.config.model_type, f"{step}, which its folder's merged decoder is captured on", own,
        "Export its encoder and decoder with fx2onnx.dynamo_export on the inputs its code takes.",
    ), run_fake=True, module=decoder)


def _exported_half(
    loaded: LoadedModel, half: nn.Module, inputs: dict[str, Any], options: fx2onnx.ExportOptions,
    roles: dict[str, dict[int, str]] | None = None, with_past: bool | None = None,
) -> fx2onnx.ONNXProgram:
    """:func:`exported` of one half; a capture failing on a Python branch over tensor values in
    the model's code (LED's chunked attention) raises the error naming that line instead, and
    a decoding step (``with_past`` given) the model's own forward fails on too, the refusal
    naming the line that fails."""
    try:
        return exported(half, inputs, options, roles)
    except fx2onnx.OnnxExporterError as error:
        failure = (_step_refusal(loaded, half, with_past) if with_past is not None else None) or value_branch_failure(
            loaded, error, options.failure_report_path, SEQ2SEQ)
        if failure is None:
            raise
        raise failure from error


class Seq2SeqRecipe(RecipeDefaults):
    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        return text_encoder_refusal(loaded) or precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        encoder, decoder = halves(loaded)
        # the halves hold the whole model as `model`: in fake mode, its weights by the halves' names
        checkpoint = None
        if loaded.fake_context is not None:
            checkpoint = part_checkpoint(loaded.folder, loaded.model, encoder)

        def save(program: fx2onnx.ONNXProgram, folder: Path, name: str) -> list[str]:
            state = None
            if checkpoint is not None:  # the half's own weights and their tied names (the LM head of the embedding)
                signature = program.model_signature
                needed = set(signature.torch_names().values()) | {n for names in signature.aliases().values() for n in names}
                state = checkpoint.only(needed)
            return save_program(program, folder, name, loaded, state)

        roles = audio_layout(loaded.folder, loaded.config, loaded.model).dim_roles() if _speech(loaded) else None
        program = _exported_half(loaded, encoder, fake_inputs(encoder_inputs(loaded), loaded), options, roles)
        if _speech(loaded):  # the features as Transformers.js's processor makes them, float32 (precision/float32_io.py)
            float32_io(program.model, outputs=False)
        # a speech decoder's mask is the encoder's input's: its time, not the encoder's output frames
        decoder_roles = {ENCODER_MASK: roles[MASK]} if roles and MASK in roles and decoder.with_mask else None
        files = save(program, staging, onnx_file(loaded, folder_layout.ENCODER))
        if decoder.frames_mask is not None:  # a client without the mask (Transformers.js) gets every frame attended
            optional_mask(staging / files[0], MASK, str(audio_input_name(loaded.model)), (0, 1))
        # the first and the next steps, captured apart, then merged into one file
        steps = staging / ".decoder_steps"
        paths = []
        for name, with_past in (("decoder_model.onnx", False), ("decoder_with_past_model.onnx", True)):
            program = _exported_half(loaded, decoder, decoder_inputs(loaded, decoder, with_past), options, decoder_roles,
                                     with_past=with_past)
            save(program, steps, name)
            paths.append(steps / name)
        merged = onnx_file(loaded, folder_layout.MERGED_DECODER)
        merge_decoders(*paths, staging / merged, folder_layout.data_file(merged))
        shutil.rmtree(steps)
        if decoder.frames_mask is not None:  # its default: a row attending nothing, every row's frames attended
            optional_mask(staging / merged, ENCODER_MASK, "encoder_hidden_states", (0,))
        files += folder_layout.with_data_file(merged)
        if _speech(loaded):  # the processor files Transformers.js reads for it
            files += write_processor_files(Path(loaded.folder), staging, loaded.config.model_type)
        return files

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        start = int(getattr(loaded.config, "decoder_start_token_id", None) or 0)
        files = (folder / onnx_file(loaded, folder_layout.ENCODER), folder / onnx_file(loaded, folder_layout.MERGED_DECODER))
        if _speech(loaded):  # against transformers' greedy generate, each example's batch at once
            return Verification.merged([
                verify_speech_seq2seq(*files, model, encoder_inputs(loaded, size), request.tokens, tolerance) for size in (0, 1)
            ])
        return Verification.merged([
            verify_seq2seq(*files, model, encoder_inputs(loaded, size), start, request.tokens, tolerance) for size in (0, 1)
        ])

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return client_note(config) or text_folder_note(config)


RECIPE = Seq2SeqRecipe()
