"""Which transformers architectures export with their default config (use_cache as the
config has it), and whether the ONNX model matches PyTorch.

Each architecture is built from its config class with small sizes (2 layers, width 32,
vocabulary 100; random weights, nothing downloaded). Decoders are exported twice, as
people export them for generation: a prefill (input_ids, attention_mask) and a decode
step with a past cache from a PyTorch run; encoder-decoders likewise, with the encoder's
output as an input of the decode step. Every output leaf (logits, present caches) is
compared with PyTorch (rtol 1e-3, atol 1e-4) at a second batch / sequence / past length.

    flock /tmp/fx2onnx-heavy.lock python bench/transformers_default_configs.py [--only gpt2,llama]
"""

from __future__ import annotations

import argparse
import copy
import time
import traceback
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

import fx2onnx
from fx2onnx.containers import registered_containers

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


def decoder_inputs(model: torch.nn.Module, batch: int, length: int, past: int, seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, past + length), generator=generator)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = {"input_ids": ids[:, past:], "attention_mask": mask}
    if past:
        with torch.no_grad():
            kwargs["past_key_values"] = model(input_ids=ids[:, :past], attention_mask=mask[:, :past]).past_key_values
    return kwargs


def seq2seq_inputs(model: torch.nn.Module, batch: int, length: int, past: int, seed: int) -> dict[str, Any]:
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
        kwargs["past_key_values"] = first.past_key_values
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


def check(model: torch.nn.Module, make_inputs: Any, past: int) -> str:
    example = make_inputs(model, 2, 3, past, seed=0)
    start = time.perf_counter()
    program = fx2onnx.dynamo_export(
        model, **copy.deepcopy(example), export_options=fx2onnx.ExportOptions(dynamic_shapes=True, failure_report_path=None)
    )
    seconds = time.perf_counter() - start
    worst = 0.0
    for batch, length, extra in ((2, 3, 0), (3, 5, 2)):
        inputs = make_inputs(model, batch, length, past + extra if past else 0, seed=batch)
        with torch.no_grad():
            expected = model(**copy.deepcopy(inputs))
        worst = max(worst, max_difference(program(**copy.deepcopy(inputs)), expected))
    return f"ok ({seconds:.1f}s, max diff {worst:.1e})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated model types")
    chosen = [m for m in parser.parse_args().only.split(",") if m] or DECODERS + SEQ2SEQ
    warnings.simplefilter("ignore")
    rows = []
    for model_type in chosen:
        make_inputs = seq2seq_inputs if model_type in SEQ2SEQ else decoder_inputs
        try:
            model = build(model_type)
        except Exception as error:  # noqa: BLE001 - a row of the table
            rows.append((model_type, "-", f"FAIL config: {type(error).__name__}: {str(error).splitlines()[0][:120]}", "-"))
            print(f"{model_type:12} {rows[-1][2]}", flush=True)
            continue
        cells = []
        for past in (0, 3):
            try:
                cells.append(check(model, make_inputs, past))
            except Exception as error:  # noqa: BLE001 - a row of the table
                message = str(error).splitlines()
                detail = next((line for line in message if line.startswith("- [")), message[0] if message else "")
                cells.append(f"FAIL {type(error).__name__}: {detail[:200]}")
                if "--verbose" in __import__("sys").argv:
                    traceback.print_exc()
        rows.append((model_type, str(getattr(model.config, "use_cache", None)), cells[0], cells[1]))
        print(f"{model_type:12} use_cache={rows[-1][1]:5} prefill: {cells[0]}\n{'':12} decode step: {cells[1]}", flush=True)
    both = [r[0] for r in rows if r[2].startswith("ok") and r[3].startswith("ok")]
    print(f"\n{len(both)}/{len(rows)} export and match PyTorch (prefill and decode step): {', '.join(both)}")


if __name__ == "__main__":
    main()
