"""Which transformers architectures export with their default config (use_cache as the
config has it), and whether the ONNX model matches PyTorch.

Each architecture is built from its config class with small sizes (2 layers, width 32,
vocabulary 100; random weights, nothing downloaded). Decoders are exported twice, as
people export them for generation: a prefill (input_ids, attention_mask) and a decode
step with a past cache from a PyTorch run; encoder-decoders likewise, with the encoder's
output as an input of the decode step. Every output leaf (logits, present caches) is
compared with PyTorch (rtol 1e-3, atol 1e-4) at a second batch / sequence / past length.

The decode step is exported once per spelling of the cache argument: forward's own name
(`cache` from transformers 5.24 on) and, where it was renamed, the deprecated
`past_key_values`, which then lands in forward's **kwargs.

    flock /tmp/fx2onnx-heavy.lock python bench/transformers_default_configs.py [--only gpt2,llama] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import time
import traceback
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

import fx2onnx
from fx2onnx.capture.library_adapters import registered_containers
from fx2onnx.hub.decoders.decode_step import output_cache

VOCAB = 100
SMALL = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, n_embd=32, n_layer=2, n_head=4,
    n_positions=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, encoder_layers=2,
    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    decoder_ffn_dim=64, ffn_dim=64, word_embed_proj_dim=32, num_local_experts=4, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    decoder_start_token_id=0, rotary_dim=4, partial_rotary_factor=0.5, n_inner=64,
)

DECODERS = [
    "gpt2", "gpt_neo", "gptj", "gpt_neox", "opt", "bloom", "falcon", "llama", "mistral", "mixtral",
    "qwen2", "qwen3", "qwen2_moe", "phi", "phi3", "gemma", "gemma2", "starcoder2", "stablelm", "olmo",
    "olmo2", "cohere", "granite", "codegen", "xglm", "gemma3_text", "mpt", "persimmon", "biogpt",
    "glm", "nemotron", "helium", "smollm3",
]
SEQ2SEQ = ["t5", "mt5", "bart", "mbart", "pegasus", "marian", "blenderbot", "m2m_100", "whisper"]


def small_config(model_type: str) -> Any:
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    for key, value in SMALL.items():
        if hasattr(config, key) and not isinstance(getattr(type(config), key, None), property):
            setattr(config, key, value)
    if model_type == "whisper":
        config.num_mel_bins, config.max_source_positions, config.max_target_positions = 8, 16, 32
    if isinstance(getattr(config, "layer_types", None), list) and "layer_types" in vars(config):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    return config


def build(model_type: str) -> torch.nn.Module:
    import transformers

    config = small_config(model_type)
    if model_type in SEQ2SEQ:
        auto = transformers.AutoModelForSpeechSeq2Seq if model_type == "whisper" else transformers.AutoModelForSeq2SeqLM
    else:
        auto = transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    return auto.from_config(config).eval()


def cache_spellings(model: torch.nn.Module) -> list[str]:
    """The names the cache can be passed under: forward's own first, then the deprecated one."""
    if "cache" in inspect.signature(model.forward).parameters:
        return ["cache", "past_key_values"]
    return ["past_key_values"]


def decoder_inputs(model: torch.nn.Module, batch: int, length: int, past: int, seed: int, spelling: str) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, past + length), generator=generator)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = {"input_ids": ids[:, past:], "attention_mask": mask}
    if past:
        with torch.no_grad():
            kwargs[spelling] = output_cache(model(input_ids=ids[:, :past], attention_mask=mask[:, :past]))
    return kwargs


def seq2seq_inputs(model: torch.nn.Module, batch: int, length: int, past: int, seed: int, spelling: str) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    if model.config.model_type == "whisper":
        encoder = {"input_features": torch.randn(batch, 8, 32, generator=generator)}
    else:
        encoder = {"input_ids": torch.randint(3, VOCAB, (batch, length + 3), generator=generator)}
        encoder["attention_mask"] = torch.ones_like(encoder["input_ids"])
    decoder_ids = torch.randint(3, VOCAB, (batch, past + length), generator=generator)
    kwargs = {**encoder, "decoder_input_ids": decoder_ids[:, past:]}
    if past:
        with torch.no_grad():
            first = model(**encoder, decoder_input_ids=decoder_ids[:, :past])
        kwargs.pop("input_ids", None)
        kwargs.pop("input_features", None)
        kwargs[spelling] = output_cache(first)
        kwargs["encoder_outputs"] = (first.encoder_last_hidden_state,)
    return kwargs


def max_difference(actual: Any, expected: Any) -> float:
    with registered_containers():
        got, want = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    got = [g for g in got if isinstance(g, torch.Tensor)]
    want = [w for w in want if isinstance(w, torch.Tensor)]
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} output tensors, PyTorch gives {len(want)}")
    worst = 0.0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)
        worst = max(worst, (g - w).abs().max().item() if g.numel() else 0.0)
    return worst


class EagerFailure(Exception):
    """The model fails in PyTorch itself on these inputs: nothing to export or compare."""


def check(model: torch.nn.Module, make_inputs: Any, past: int, spelling: str, opset: int | None = None) -> str:
    example = make_inputs(model, 2, 3, past, seed=0, spelling=spelling)
    try:
        with torch.no_grad():
            model(**copy.deepcopy(example))
    except Exception as error:  # noqa: BLE001 - reported as the model's own failure
        raise EagerFailure(f"eager PyTorch fails: {type(error).__name__}: {error}") from error
    start = time.perf_counter()
    program = fx2onnx.dynamo_export(
        model, **copy.deepcopy(example), export_options=fx2onnx.ExportOptions(dynamic_shapes=True, failure_report_path=None, opset_version=opset)
    )
    seconds = time.perf_counter() - start
    worst = 0.0
    for batch, length, extra in ((2, 3, 0), (3, 5, 2)):
        inputs = make_inputs(model, batch, length, past + extra if past else 0, seed=batch, spelling=spelling)
        with torch.no_grad():
            expected = model(**copy.deepcopy(inputs))
        worst = max(worst, max_difference(program(**copy.deepcopy(inputs)), expected))
    return f"ok ({seconds:.1f}s, max diff {worst:.1e})"


def check_architecture(model_type: str, verbose: bool, opset: int | None = None) -> dict[str, str]:
    """{"prefill": result, "decode cache=": result, ...}: "ok (...)" or "FAIL ..." each."""
    make_inputs = seq2seq_inputs if model_type in SEQ2SEQ else decoder_inputs
    try:
        model = build(model_type)
    except Exception as error:  # noqa: BLE001 - a row of the table
        return {"config": f"FAIL config: {type(error).__name__}: {str(error).splitlines()[0][:120]}"}
    spellings = cache_spellings(model)
    cells: dict[str, str] = {}
    for column, past, spelling in [("prefill", 0, spellings[0])] + [(f"decode {s}=", 3, s) for s in spellings]:
        try:
            cells[column] = check(model, make_inputs, past, spelling, opset)
        except Exception as error:  # noqa: BLE001 - a row of the table
            message = str(error).splitlines()
            detail = next((line for line in message if line.startswith("- [")), message[0] if message else "")
            kind = "FAIL (in PyTorch itself)" if isinstance(error, EagerFailure) else f"FAIL {type(error).__name__}:"
            cells[column] = f"{kind} {detail[:200]}"
            if verbose:
                traceback.print_exc()
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--json", default=None, help="write the rows and counts to this file")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of each failure")
    parser.add_argument("--opset", type=int, default=None, help="ExportOptions(opset_version=...) (default: fx2onnx's)")
    options = parser.parse_args()
    chosen = [m for m in options.only.split(",") if m] or DECODERS + SEQ2SEQ
    warnings.simplefilter("ignore")
    rows: dict[str, dict[str, str]] = {}
    for model_type in chosen:
        rows[model_type] = check_architecture(model_type, options.verbose, options.opset)
        print(f"{model_type:12} " + f"\n{'':12} ".join(f"{k}: {v}" for k, v in rows[model_type].items()), flush=True)
    counts = {}
    for spelling in ("cache", "past_key_values"):
        # a forward that has only `past_key_values` (transformers < 5.24) counts with it for both
        passing = [
            name for name, cells in rows.items()
            if cells.get("prefill", "").startswith("ok")
            and cells.get(f"decode {spelling}=", cells.get("decode past_key_values=", "")).startswith("ok")
        ]
        counts[spelling] = passing
        print(f"\n{len(passing)}/{len(rows)} export and match PyTorch (prefill and decode step, cache passed as {spelling}=): {', '.join(passing)}")
    if options.json:
        import transformers

        with open(options.json, "w", encoding="utf-8") as file:
            json.dump({
                "torch": torch.__version__, "transformers": transformers.__version__, "opset": options.opset, "total": len(rows),
                "passing": {k: len(v) for k, v in counts.items()}, "rows": rows,
            }, file, indent=1)


if __name__ == "__main__":
    main()
