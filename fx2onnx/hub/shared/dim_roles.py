"""The names runtimes and Optimum give the dims of a transformers model's inputs, found
from the role of each input (`input_ids` dim 1 is the new tokens, a past key's dim 2
the cached ones) and put on every value of the exported model."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from diagnostics import Diagnostic
from fx2onnx.capture import FIXED_DIM
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.onnx_passes import rename_dims

BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "total_sequence_length"
ENCODER_SEQUENCE = "encoder_sequence_length"


def own_length(name: str) -> str:
    """The name of the length dim of the state ``name`` in a model whose states each have a
    length of their own (DeepSeek-V4's: `past_compressor.1.kv` -> `past_compressor_1_kv_length`):
    compressed_attention names the dims so, and verification finds an empty state's axis by it."""
    return name.replace(".", "_") + "_length"

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


def present_name(past: str) -> str:
    """The output that gives the next step's cache input ``past`` (`past_key_values.*` ->
    `present.*`, ONNX Runtime GenAI Whisper's `past_*` -> `present_*`)."""
    if past.startswith("past_key_values."):
        return past.replace("past_key_values.", "present.", 1)
    return past.replace("past_", "present_", 1)


def _same_dim(model: ir.Model, past: ir.Value, index: int) -> bool:
    """Whether the next step's value of the cache input ``past`` has the same dim ``index``
    (a state of fixed size there, as a convolution's last inputs), rather than one grown by
    the step's tokens; False when the model has no such output."""
    present = next((v for v in model.graph.outputs if v.name == present_name(past.name or "")), None)
    if present is None or present.shape is None or past.shape is None or index >= len(present.shape):
        return False
    return str(present.shape[index]) == str(past.shape[index])


def fixed_size_states(model: ir.Model) -> list[str]:
    """The cache inputs that do not grow with the sequence (a hybrid's convolution and
    recurrent states, RWKV's `past_state.*`): each dim of their next step's value but the batch is theirs.
    Their dims take no past length; an empty cache gives them zeros of their own size."""
    return [
        value.name for value in model.graph.inputs
        if value.name and value.name.startswith(("past_key_values.", "past_state.")) and value.shape is not None
        and len(value.shape) > 1 and all(_same_dim(model, value, index) for index in range(1, len(value.shape)))
    ]


def _fixed_dim_reason(name: str, index: int, export_warnings: Sequence[Diagnostic]) -> str | None:
    """What the export's warnings say fixed dim ``index`` of input ``name`` (their
    structured `FIXED_DIM` property), None when none does."""
    for warning in export_warnings:
        fixed = warning.properties.get(FIXED_DIM)
        if fixed and fixed.get("input") == name and fixed.get("dim") == index:
            return str(fixed["reason"])
    return None


def _static_dim_error(
    name: str, index: int, role: str, dim: object, export_warnings: Sequence[Diagnostic]
) -> ValueError:
    """The error for a role's dim the export left static: with the export's own word on the
    code that fixed it, when it has one (then the model's code is the cause, not fx2onnx,
    and the folder is refused as for a task it does not serve)."""
    said = f"Dim {index} of input '{name}' ({role}) is static ({dim}) in the export"
    why = _fixed_dim_reason(name, index, export_warnings)
    if why is None:
        return ValueError(f"{said}: the runtime needs it dynamic. Report this with the SARIF report of the export.")
    return UnsupportedTaskError(
        f"{said}: {why}, so its model would accept only this {role}. The folder's runtime needs every "
        f"{role}, so export-hf cannot serve this model as it is written; fx2onnx.dynamo_export exports it "
        "for this one size. Nothing was written."
    )


def name_dims_by_role(
    model: ir.Model, extra_roles: dict[str, dict[int, str]] | None = None,
    export_warnings: Sequence[Diagnostic] = (),
) -> dict[str, str]:
    """Rename ``model``'s input dims (and every value's dims built from them) after their
    roles (``extra_roles``: input name -> {dim index: name}, before the common ones);
    returns the renaming. Two roles on one symbol are an error: the runtime would
    be told two different lengths are one. A role's dim left static is an error, citing
    the one of ``export_warnings`` (the export's) that says which code fixed it. A cache
    input's dim that its next step's value keeps (a convolution state's kernel width) is
    no past length: only the dims that grow with the sequence take that role."""
    has_past = any(v.name.startswith("past_key_values.") for v in model.graph.inputs)
    symbols: dict[str, str] = {}
    for value in model.graph.inputs:
        if value.shape is None:
            continue
        roles = (extra_roles or {}).get(value.name or "") or _roles_of(value.name or "", has_past)
        if value.name == "position_ids" and len(value.shape) == 3:  # mRoPE's: [3 axes, batch, tokens]
            roles = {index + 1: role for index, role in roles.items()}
        for index, role in roles.items():
            if index >= len(value.shape) or (role == PAST and _same_dim(model, value, index)):
                continue
            dim = value.shape[index]
            if not isinstance(dim, ir.SymbolicDim) or not dim.value:
                raise _static_dim_error(value.name or "", index, role, dim, export_warnings)
            if symbols.setdefault(dim.value, role) != role:
                raise ValueError(
                    f"The export made {symbols[dim.value]} and {role} one dim ({dim.value}); they must stay apart."
                )
    totals = {f"{SEQUENCE}+{PAST}": TOTAL, f"{PAST}+{SEQUENCE}": TOTAL}
    rename_dims(model, symbols, totals)
    return symbols
