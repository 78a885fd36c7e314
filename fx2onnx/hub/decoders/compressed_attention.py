"""DeepSeek-V4's decode step over a cache of tensors only, its counts taken from the past length.

transformers' DeepSeek-V4 cache layers count the windows their compressors have closed in
Python numbers (`entry_count`) and its compressors branch in Python on how many tokens wait
for the next window, which a captured graph would fix (cache_counters.py). Every such count
follows from the number of tokens seen, ``past`` (the mask's length less the step's tokens):
``past // rate`` windows closed, ``past % rate`` tokens waiting, a previous window from
``past >= rate`` on. So export-hf captures its own step (`CompressedAttentionStep`), which
calls the model's modules (projections, norms, rotary, hyper-connections, experts) and
computes transformers' compressed attention with tensor operations where transformers
branches, over these states per layer, under the names Transformers.js feeds (`getCacheNames`
in its `dist/transformers.node.mjs`, model type deepseek_v4):

- ``past_key_values.<i>.key``: the sliding window's keys (= values), as transformers keeps them
  (its last `sliding_window - 1` tokens);
- ``past_key_values.<i>.value`` (compressed layers): the compressed entries, the indexer's
  beside the compressor's on the last dim in a compressed sparse attention layer;
- ``past_compressor.<i>.kv`` / ``.gate`` and, for a compressed sparse attention layer,
  ``past_indexer.<i>.kv`` / ``.gate``: the projected rows of the tokens that wait for their
  window and, for an overlapping compressor, of the last closed window before them (whose
  first series the next window reads).

Each state starts empty (0 rows), as Transformers.js and `--verify` start a cache; the graph
computes the positions from the mask as transformers' generation gives them (a pad's 0).
ONNX Runtime GenAI has no such states: the folder has no `genai_config.json`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

import fx2onnx
from fx2onnx.capture import sizes_kept_apart
from fx2onnx.hub.decoders.graph_files import rename_value, rewrite_graph_file
from fx2onnx.hub.decoders.own_decode_step import own_decode_step_failure
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.dim_roles import TOTAL, own_length
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.hub.shared.program_files import exported, onnx_file, quoted_error, save_program
from fx2onnx.onnx_passes import WeightQuantization

MODEL_TYPES = frozenset({"deepseek_v4"})
NOTE = (
    "{name}'s compressed attention counts its windows in Python numbers: the folder's model is export-hf's own decode "
    "step, which takes the counts from the past length, over the states Transformers.js feeds (past_key_values.<i>.key "
    "and .value, past_compressor.<i>.kv and .gate, past_indexer.<i>.kv and .gate). No genai_config.json: ONNX Runtime "
    "GenAI feeds a decoder keys and values only."
)
_SLIDING, _SPARSE = "sliding_attention", "compressed_sparse_attention"
# the step's inputs beside its states
_FED = ("input_ids", "attention_mask")


def serves(config: Any) -> bool:
    """Whether ``config``'s model takes the decode step of this module (DeepSeek-V4)."""
    return getattr(config, "model_type", None) in MODEL_TYPES


@dataclass(frozen=True)
class State:
    """One state input: its folder name, layer, part (`key`, `entries`, `compressor`,
    `indexer`) and, for a compressor's rows, which (`kv`, `gate`)."""

    name: str
    layer: int
    part: str
    rows: str = ""

    @property
    def present(self) -> str:
        if self.name.startswith("past_key_values."):
            return self.name.replace("past_key_values.", "present.", 1)
        return self.name.replace("past_", "present_", 1)


def state_layout(config: Any) -> list[State]:
    """The state inputs of the step, in order, for ``config``'s layers."""
    states = []
    for layer, kind in enumerate(config.layer_types):
        states.append(State(f"past_key_values.{layer}.key", layer, "key"))
        if kind == _SLIDING:
            continue
        states.append(State(f"past_key_values.{layer}.value", layer, "entries"))
        parts = ("compressor", "indexer") if kind == _SPARSE else ("compressor",)
        states += [State(f"past_{part}.{layer}.{rows}", layer, part, rows) for part in parts for rows in ("kv", "gate")]
    return states


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' interleaved rope (`apply_rotary_pos_emb`) on the trailing slice of ``x``,
    its pairs put back by an explicit shape: a reshape that infers a dim fails in onnxruntime
    on 0 entries, as the compressed entries of a step that closes no window are."""
    pairs = (*cos.shape[:-1], 2 * cos.shape[-1])
    cos = torch.stack((cos, cos), dim=-1).reshape(pairs).unsqueeze(1)
    sin = torch.stack((sin, sin), dim=-1).reshape(pairs).unsqueeze(1)
    width = cos.shape[-1]
    nope, part = x[..., :-width], x[..., -width:]
    turned = torch.stack((-part[..., 1::2], part[..., 0::2]), dim=-1).reshape(part.shape)
    return torch.cat([nope, (part.float() * cos + turned.float() * sin).to(x.dtype)], dim=-1)  # in float32, as transformers


def _at_least(past: Any, count: int) -> torch.Tensor:
    """``past >= count`` as a boolean tensor (a Python branch on it would be fixed in the graph)."""
    return (torch.arange(count) < past).all()


def _compress(module: torch.nn.Module, hidden: torch.Tensor, kv_rows: torch.Tensor, gate_rows: torch.Tensor,
              past: Any, head_dim: int, overlap: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The entries of the windows this step's tokens close (transformers' compressor and
    indexer compression), and the rows to keep for the next step."""
    batch, rate = hidden.shape[0], module.compress_rate
    new_kv, new_gate = module.kv_proj(hidden), module.gate_proj(hidden)
    width = new_kv.shape[-1]
    waiting = past % rate
    seen_kv, seen_gate = torch.cat([kv_rows, new_kv], 1), torch.cat([gate_rows, new_gate], 1)
    if overlap:  # the rows start with the last closed window once there is one: zeros before it
        pad = kv_rows.new_zeros(batch, rate, width)
        held_kv, held_gate = torch.cat([pad, kv_rows], 1), torch.cat([pad, gate_rows], 1)
    else:
        held_kv, held_gate = kv_rows, gate_rows
    end = held_kv.shape[1]
    buffered_kv = torch.cat([held_kv[:, end - waiting:], new_kv], 1)
    buffered_gate = torch.cat([held_gate[:, end - waiting:], new_gate], 1)
    windows = buffered_kv.shape[1] // rate
    usable = windows * rate
    chunk_kv = buffered_kv[:, :usable].reshape(batch, windows, rate, width)
    chunk_gate = buffered_gate[:, :usable].reshape(batch, windows, rate, width) + module.position_bias
    if overlap:  # window w also reads the first series of window w - 1 (none before the first window)
        prior_kv = held_kv[:, end - waiting - rate:end - waiting, :head_dim]
        prior_gate = held_gate[:, end - waiting - rate:end - waiting, :head_dim] + module.position_bias[:, :head_dim]
        prior_gate = torch.where(_at_least(past, rate), prior_gate, torch.full_like(prior_gate, float("-inf")))
        firsts_kv = torch.cat([prior_kv, chunk_kv[..., :head_dim].reshape(batch, usable, head_dim)], 1)
        firsts_gate = torch.cat([prior_gate, chunk_gate[..., :head_dim].reshape(batch, usable, head_dim)], 1)
        kv = torch.cat([firsts_kv[:, :usable].reshape(batch, windows, rate, head_dim), chunk_kv[..., head_dim:]], 2)
        gate = torch.cat([firsts_gate[:, :usable].reshape(batch, windows, rate, head_dim), chunk_gate[..., head_dim:]], 2)
    else:
        kv, gate = chunk_kv, chunk_gate
    compressed = module.kv_norm((kv * gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)).sum(dim=2))
    positions = (torch.arange(windows) * rate + (past - waiting)).unsqueeze(0).expand(batch, -1)
    cos, sin = module.rotary_emb(compressed, position_ids=positions, layer_type=module.rope_layer_type)
    compressed = _rope(compressed.unsqueeze(1), cos, sin).squeeze(1)
    kept = (past + hidden.shape[1]) % rate + (rate if overlap else 0)
    start = torch.sym_max(0, seen_kv.shape[1] - kept)
    return compressed, seen_kv[:, start:], seen_gate[:, start:]


class CompressedAttentionStep(torch.nn.Module):
    """DeepSeek-V4's decode step (see the module's docstring): ``input_ids`` of the step,
    ``attention_mask`` of the whole sequence, ``states`` as `state_layout` orders them;
    returns the logits and the next states in the same order."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        # the causal LM's own modules under its own names: the folder's weights are named as the checkpoint's
        self.model, self.lm_head, self.config = model.model, model.lm_head, model.config
        self.layout = state_layout(model.config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        inner = self.model
        seq = input_ids.shape[1]
        past = attention_mask.shape[1] - seq
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)[:, past:]
        by_layer: dict[int, dict[str, Any]] = {}
        for state, value in zip(self.layout, states):
            by_layer.setdefault(state.layer, {})[f"{state.part}.{state.rows}"] = value
        embeds = inner.embed_tokens(input_ids)
        hidden = embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()
        rotary = {kind: inner.rotary_emb(embeds, position_ids=positions, layer_type=kind) for kind in ("main", "compress")}
        new: dict[int, dict[str, torch.Tensor]] = {}
        for index, layer in enumerate(inner.layers):
            # the hyper-connections' weights (float32) in the streams' dtype, as transformers' decoder layer mixes them
            dtype = hidden.dtype
            post, comb, collapsed = layer.attn_hc(hidden)
            out, new[index] = self._attention(layer.self_attn, layer.input_layernorm(collapsed), rotary, positions,
                                              attention_mask, by_layer[index], past)
            hidden = post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), hidden)
            post, comb, collapsed = layer.ffn_hc(hidden)
            out = layer.mlp(layer.post_attention_layernorm(collapsed), input_ids=input_ids)
            hidden = post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), hidden)
        logits = self.lm_head(inner.norm(inner.hc_head(hidden)))
        return (logits, *[new[state.layer][f"{state.part}.{state.rows}"] for state in self.layout])

    def _attention(self, attention: torch.nn.Module, hidden: torch.Tensor, rotary: dict[str, Any],
                   positions: torch.Tensor, mask: torch.Tensor, state: dict[str, torch.Tensor], past: Any,
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling

        batch, seq, _ = hidden.shape
        head_dim, window = attention.head_dim, attention.sliding_window
        cos, sin = rotary[attention.rope_layer_type]
        q_residual = attention.q_a_norm(attention.q_a_proj(hidden))
        query = attention.q_b_norm(attention.q_b_proj(q_residual).view(batch, seq, -1, head_dim).transpose(1, 2))
        query = _rope(query, cos, sin)
        key = attention.kv_norm(attention.kv_proj(hidden)).view(batch, seq, -1, head_dim).transpose(1, 2)
        key = _rope(key, cos, sin)
        kept = state["key."].shape[2]
        keys = torch.cat([state["key."], key], 2)
        new = {"key.": keys[:, :, torch.sym_max(0, keys.shape[2] - (window - 1)):]}
        # the window's causal mask over absolute indices and the padding (transformers' eager mask)
        key_at = torch.arange(kept + seq) + (past - kept)
        query_at = torch.arange(seq) + past
        seen = (key_at <= query_at[:, None]) & (key_at > query_at[:, None] - window)
        seen = seen & _mask_columns(mask, past - kept)[:, None, :]
        bias = torch.where(seen, 0.0, torch.finfo(query.dtype).min)[:, None].to(query.dtype)
        compressor = attention.compressor
        if compressor is not None:
            sparse = isinstance(compressor, modeling.DeepseekV4CSACompressor)
            entries = state["entries."].squeeze(1)
            index_dim = compressor.indexer.head_dim if sparse else 0
            compressed, new["compressor.kv"], new["compressor.gate"] = _compress(
                compressor, hidden, state["compressor.kv"], state["compressor.gate"], past, head_dim, sparse)
            ours = torch.cat([entries[..., :head_dim], compressed], 1)
            count = ours.shape[1]
            if sparse:
                indexer = compressor.indexer
                index_compressed, new["indexer.kv"], new["indexer.gate"] = _compress(
                    indexer, hidden, state["indexer.kv"], state["indexer.gate"], past, index_dim, True)
                index_entries = torch.cat([entries[..., head_dim:], index_compressed], 1)
                picks = _indexer_picks(indexer, hidden, q_residual, positions, index_entries)
                safe = torch.where(picks >= 0, picks, count)
                block = torch.full((batch, 1, seq, count + 1), float("-inf"), dtype=query.dtype)
                block = block.scatter(-1, safe.unsqueeze(1), 0.0)[..., :count]
                new["entries."] = torch.cat([ours, index_entries], -1).unsqueeze(1)
            else:
                threshold = ((positions + 1) // compressor.compress_rate)[:, None, :, None]
                block = torch.where(torch.arange(count) >= threshold, float("-inf"), 0.0).to(query.dtype)
                # transformers' one-token step sees every entry
                block = torch.where(_at_least(1, seq), 0.0, block.expand(batch, 1, seq, count))
                new["entries."] = ours.unsqueeze(1)
            keys = torch.cat([keys, ours.unsqueeze(1)], 2)
            bias = torch.cat([bias, block], -1)
        out, _ = modeling.eager_attention_forward(attention, query, keys, keys, bias, scaling=attention.scaling)
        out = _rope(out.transpose(1, 2), cos, -sin).transpose(1, 2)
        grouped = attention.o_a_proj(out.reshape(batch, seq, attention.config.o_groups, -1)).flatten(2)
        return attention.o_b_proj(grouped), new


def _mask_columns(mask: torch.Tensor, start: Any) -> torch.Tensor:
    """The mask's columns from ``start`` on, as booleans (the keys the step attends to)."""
    return mask[:, start:].bool()


def _indexer_picks(indexer: torch.nn.Module, hidden: torch.Tensor, q_residual: torch.Tensor, positions: torch.Tensor,
                   entries: torch.Tensor) -> torch.Tensor:
    """transformers' Lightning Indexer's picks over ``entries`` (-1: none), top-k of a
    size the entries bound, as a tensor operation."""
    batch, seq, _ = hidden.shape
    cos, sin = indexer.rotary_emb(hidden, position_ids=positions, layer_type=indexer.rope_layer_type)
    query = indexer.q_b_proj(q_residual).view(batch, seq, -1, indexer.head_dim).transpose(1, 2)
    query = _rope(query, cos, sin).transpose(1, 2)
    scores = indexer.scorer(query, entries, hidden)
    count = entries.shape[1]
    threshold = ((positions + 1) // indexer.compress_rate).unsqueeze(-1)
    scores = scores.masked_fill(torch.arange(count) >= threshold, float("-inf"))
    picks = scores.topk(torch.sym_min(indexer.index_topk, count), dim=-1).indices
    return torch.where(picks >= threshold, -1, picks)


def empty_states(model: torch.nn.Module, batch: int) -> list[torch.Tensor]:
    """Every state with 0 rows, as a client starts them."""
    config, dtype = model.config, model.lm_head.weight.dtype
    states = []
    for state in state_layout(config):
        attention = model.model.layers[state.layer].self_attn
        if state.part == "key":
            states.append(torch.zeros(batch, 1, 0, config.head_dim, dtype=dtype))
        elif state.part == "entries":
            extra = config.index_head_dim if config.layer_types[state.layer] == _SPARSE else 0
            states.append(torch.zeros(batch, 1, 0, config.head_dim + extra, dtype=dtype))
        else:
            module = attention.compressor if state.part == "compressor" else attention.compressor.indexer
            states.append(torch.zeros(batch, 0, module.kv_proj.out_features, dtype=dtype))
    return states


def step_inputs(loaded: LoadedModel, batch: int = 2) -> dict[str, Any]:
    """Example inputs of the step (fake when the model is): states after a prefill that
    leaves every count at 2 or more (windows closed, tokens waiting) and a step that closes 2
    or more windows of each rate, so that no size of the capture is 0 or 1 (which it would fix)."""
    model, config = loaded.model, loaded.config
    rate = max(config.compress_rates.values())
    past, seq = 2 * rate + 2, 2 * rate + 1
    vocab = int(config.vocab_size)
    ids = torch.randint(min(3, vocab - 1), vocab, (batch, past + seq), generator=torch.Generator().manual_seed(0))
    mode = eager_forwards(loaded)
    with mode, torch.no_grad():
        ids = ids.clone()  # fake when the model is
        mask = torch.ones(batch, past + seq, dtype=torch.int64)
        _, *states = CompressedAttentionStep(model)(ids[:, :past], mask[:, :past], empty_states(model, batch))
    return {"input_ids": ids[:, past:], "attention_mask": mask, "states": list(states)}


def dynamic_shapes(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The batch and lengths dynamic; the head (1) and widths static."""
    auto = torch.export.Dim.AUTO
    sizes = [{0: auto, 2: auto} if value.dim() == 4 else {0: auto, 1: auto} for value in inputs["states"]]
    return {"input_ids": {0: auto, 1: auto}, "attention_mask": {0: auto, 1: auto}, "states": sizes}


def name_folder_values(graph: onnx.GraphProto, config: Any) -> None:
    """The exported graph's state inputs and outputs under the names Transformers.js feeds
    (`state_layout`), its first output `logits`, and each dim's name: `batch_size` and one
    length of its own per state (`past_*`)."""
    layout = state_layout(config)
    inputs = [value for value in graph.input if value.name not in _FED]
    outputs = list(graph.output)
    if len(inputs) != len(layout) or len(outputs) != len(layout) + 1:
        raise ValueError(f"the step's graph has {len(inputs)} state inputs and {len(outputs)} outputs for "
                         f"{len(layout)} states")
    renames = [(value.name, state.name) for value, state in zip(inputs, layout)]
    renames += [(outputs[0].name, "logits")]
    renames += [(value.name, state.present) for value, state in zip(outputs[1:], layout)]
    for old, new in renames:
        rename_value(graph, old, new)
        for value in [*graph.input, *graph.output]:
            if value.name == old:
                value.name = new
    lengths = {name: own_length(name) for state in layout for name in (state.name, state.present)}
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        dims[0].dim_param = "batch_size"
        if value.name in lengths:
            dims[2 if len(dims) == 4 else 1].dim_param = lengths[value.name]
        elif value.name == "attention_mask":
            dims[1].dim_param = TOTAL


def _kept_float32(model: torch.nn.Module) -> list[str]:
    """The float32 weights of a float16 model that its class keeps in float32 (transformers'
    non-strict `_keep_in_fp32_modules`: DeepSeek-V4's compressors' projections, which its
    forward then feeds float16 values); none for a model of another dtype."""
    if model.lm_head.weight.dtype != torch.float16:
        return []
    kept = getattr(type(model), "_keep_in_fp32_modules", None) or []
    return [name for name, parameter in model.named_parameters()
            if parameter.dtype == torch.float32 and any(module in name for module in kept)]


def export_compressed_attention(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, quantization: WeightQuantization | None,
) -> list[str]:
    """The folder's `onnx/model.onnx` of DeepSeek-V4's step (`CompressedAttentionStep`); its files."""
    if loaded.model.lm_head.weight.dtype == torch.bfloat16:
        # transformers runs bfloat16 experts through torch's grouped product, which no translation takes with
        # its offsets; onnxruntime's MoE kernel, which replaces it elsewhere, routes by a softmax's top k
        raise UnsupportedTaskError(
            f"{type(loaded.model).__name__} in bfloat16: its routed experts run torch's bfloat16 grouped product "
            "(_grouped_mm with offsets), which has no ONNX translation, and its routing is not the softmax top k of "
            "onnxruntime's MoE kernel. No folder was written. Export it in float32 (the default; --precision int4 or "
            "int8 keep float32 activations)."
        )
    step = CompressedAttentionStep(loaded.model)
    try:
        inputs = step_inputs(loaded)
    except RuntimeError as error:
        kept = _kept_float32(loaded.model)
        if kept:
            raise UnsupportedTaskError(
                f"{type(loaded.model).__name__} does not run in float16: transformers keeps {len(kept)} of its weights in "
                f"float32 (its class's _keep_in_fp32_modules: {', '.join(kept[:2])}{' ...' if len(kept) > 2 else ''}), "
                f"and its own forward fails on the float16 values they take ({quoted_error(error)}). No folder was "
                "written. Export it in float32 (the default; --precision int4 or int8 keep float32 activations)."
            ) from error
        # transformers' own forward failing too is the cause to name
        own = own_decode_step_failure(loaded)
        if own is None:
            raise
        raise own from error
    options = dataclasses.replace(options, dynamic_shapes=dynamic_shapes(inputs))
    with sizes_kept_apart():  # the states' lengths are of different layers and rates
        program = exported(step, inputs, options)
    name = onnx_file(loaded, folder_layout.MODEL, quantization)
    files = save_program(program, staging, name, loaded)
    rewrite_graph_file(staging / name, lambda graph: name_folder_values(graph, loaded.config) or True)
    return files
