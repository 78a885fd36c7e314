"""The names runtimes and Optimum give the dims of a transformers model's inputs, found
from the role of each input (`input_ids` dim 1 is the new tokens, a past key's dim 2
the cached ones) and put on every value of the exported model."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from fx2onnx.onnx_passes import rename_dims

BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "total_sequence_length"
ENCODER_SEQUENCE = "encoder_sequence_length"

# input name (or name prefix) -> {dim index: name}
_ROLES: list[tuple[str, dict[int, str]]] = [
    ("input_ids", {0: BATCH, 1: SEQUENCE}),
    ("inputs_embeds", {0: BATCH, 1: SEQUENCE}),
    ("position_ids", {0: BATCH, 1: SEQUENCE}),
    ("token_type_ids", {0: BATCH, 1: SEQUENCE}),
    ("decoder_input_ids", {0: BATCH, 1: SEQUENCE}),
    ("pixel_values", {0: BATCH}),
    ("input_features", {0: BATCH}),
    ("audio_features", {0: BATCH}),
    ("encoder_hidden_states", {0: BATCH, 1: ENCODER_SEQUENCE}),
    ("encoder_attention_mask", {0: BATCH, 1: ENCODER_SEQUENCE}),
]


def _roles_of(name: str, has_past: bool) -> dict[int, str]:
    if name == "attention_mask":
        return {0: BATCH, 1: TOTAL if has_past else SEQUENCE}
    if name.startswith("past_key_values."):
        # cross-attention caches hold the encoder's length
        return {0: BATCH, 2: ENCODER_SEQUENCE if ".encoder." in name else PAST}
    if name.startswith(("past_key_self_", "past_value_self_", "past_key_cross_", "past_value_cross_")):
        # ONNX Runtime GenAI's Whisper decoder (whisper_genai.py)
        return {0: BATCH, 2: ENCODER_SEQUENCE if "_cross_" in name else PAST}
    return next((dims for key, dims in _ROLES if name == key), {})


def _static_dim_error(name: str, index: int, role: str, dim: object, export_notes: Sequence[str]) -> ValueError:
    """The error for a role's dim the export left static: with the export's own note on the
    code that fixed it, when it has one (then the model's code is the cause, not fx2onnx)."""
    said = f"Dim {index} of input '{name}' ({role}) is static ({dim}) in the export"
    why = next((note for note in export_notes if f"dim {index} of input '{name}' was fixed" in note), None)
    if why is None:
        return ValueError(f"{said}: the runtime needs it dynamic. Report this with the SARIF report of the export.")
    why = why.split(": ", 1)[-1].split(". The exported model", 1)[0]
    return ValueError(
        f"{said}: {why}, so its model would accept only this {role}. The folder's runtime needs every "
        f"{role}, so export-hf cannot serve this model as it is written; fx2onnx.dynamo_export exports it "
        "for this one size. Nothing was written."
    )


def name_dims_by_role(
    model: ir.Model, extra_roles: dict[str, dict[int, str]] | None = None, export_notes: Sequence[str] = (),
) -> dict[str, str]:
    """Rename ``model``'s input dims (and every value's dims built from them) after their
    roles (``extra_roles``: input name -> {dim index: name}, before the common ones);
    returns the renaming. Two roles on one symbol are an error: the runtime would
    be told two different lengths are one. A role's dim left static is an error, citing
    the note of ``export_notes`` (the export's warnings) that says which code fixed it."""
    has_past = any(v.name.startswith("past_key_values.") for v in model.graph.inputs)
    symbols: dict[str, str] = {}
    for value in model.graph.inputs:
        if value.shape is None:
            continue
        roles = (extra_roles or {}).get(value.name or "") or _roles_of(value.name or "", has_past)
        if value.name == "position_ids" and len(value.shape) == 3:  # mRoPE's: [3 axes, batch, tokens]
            roles = {index + 1: role for index, role in roles.items()}
        for index, role in roles.items():
            if index >= len(value.shape):
                continue
            dim = value.shape[index]
            if not isinstance(dim, ir.SymbolicDim) or not dim.value:
                raise _static_dim_error(value.name or "", index, role, dim, export_notes)
            if symbols.setdefault(dim.value, role) != role:
                raise ValueError(
                    f"The export made {symbols[dim.value]} and {role} one dim ({dim.value}); they must stay apart."
                )
    totals = {f"{SEQUENCE}+{PAST}": TOTAL, f"{PAST}+{SEQUENCE}": TOTAL}
    rename_dims(model, symbols, totals)
    return symbols
