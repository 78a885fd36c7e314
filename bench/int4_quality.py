"""How good `export-hf --precision int4` folders are: perplexity on held-out text and
greedy-token agreement with the float PyTorch model, against ONNX Runtime GenAI's model
builder's ``-p int4 -e cpu`` folder of the same weights.

Random weights give flat logits that no int4 comparison can judge, so the benchmark first
trains a small LLaMA-style model (4 layers x 256, vocab 2000, a byte-level BPE tokenizer
trained here) for ``--minutes`` on CPU, on the Python standard library's ``.py`` files
(nothing downloaded); every tenth file is held out for evaluation. Each folder is then run
in onnxruntime with an empty cache on the same held-out windows (teacher forced): its
perplexity, and the share of positions where its argmax equals the PyTorch float model's.
The runner reads each folder's file and input/output names from its genai_config.json.
The int4 folders: fx2onnx's round-to-nearest (``-rtn``, the default: the LM head in blocks
of 128 with zero points; ``-block32`` on request: every layer in symmetric blocks of 32, the
builder's layout), searched block scales
(``-search``, the same size) and with mixed precision (``-search-mixed``, 8 bits for the
value and down projections of llama.cpp's Q4_K_M layers), the builder's default and its
``algo_config=k_quant``. The builder's float folder (``-p fp32``) is the control: how far two float graphs of the
same weights differ, which bounds what a difference between the int4 folders can mean.

    flock /tmp/fx2onnx-heavy.lock python bench/int4_quality.py [--minutes 4 | --steps 600] [--windows 48] \\
        [--markdown out.md] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from precision_folders import export_contender

VOCAB = 2000
WINDOW = 128
# fx2onnx-int4-rtn / -search: export_hf(..., quantization_algorithm=...); -mixed: mixed_precision=True;
# builder-int4-kquant: the builder's algo_config=k_quant
FOLDERS = ("fx2onnx-fp32", "builder-fp32", "fx2onnx-int4-rtn", "fx2onnx-int4-search", "fx2onnx-int4-search-mixed",
           "builder-int4", "builder-int4-kquant")
# on request (--folders): export_hf(..., quantize_embedding=True); block_size=32 (the LM head's too)
OTHER_FOLDERS = ("fx2onnx-int4", "fx2onnx-int4-embedding", "fx2onnx-int4-block32")


def stdlib_texts() -> tuple[str, str]:
    """(training text, held-out text): the standard library's .py files, every tenth held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size < 400_000)
    train, held = [], []
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        (held if i % 10 == 9 else train).append(text)
    return "\n".join(train), "\n".join(held)


def train_tokenizer(text: str) -> Any:
    import tokenizers
    import transformers

    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    model.train_from_iterator(text.split("\n\n"), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def train_model(ids: np.ndarray, minutes: float, say, steps: int | None = None) -> tuple[Any, float, int]:
    """A LLaMA-style model trained on ``ids`` for ``minutes``, or for ``steps`` optimizer
    steps when given (the same model whatever the machine's load): (model, final loss, steps)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    generator = np.random.default_rng(0)
    batch, budget, step, losses = 8, minutes * 60, 0, []
    started = time.monotonic()
    deadline = started + budget
    model.train()
    while (step < steps) if steps else (time.monotonic() < deadline):
        starts = generator.integers(0, len(ids) - WINDOW - 1, batch)
        x = torch.from_numpy(np.stack([ids[s:s + WINDOW] for s in starts]).astype(np.int64))
        # warm up, then decay linearly with the time spent (the budget is in minutes, not steps)
        done = step / steps if steps else (time.monotonic() - started) / budget
        lr = 3e-3 * min(1.0, (step + 1) / 20) * max(0.1, 1 - done)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if step % 50 == 0:
            say(f"step {step}: loss {np.mean(losses[-50:]):.3f}")
    return model.eval(), float(np.mean(losses[-20:])), step


class FolderRunner:
    """Runs a GenAI folder's decoder in onnxruntime with an empty cache; the file and the
    input/output names come from its genai_config.json (they differ between exporters)."""

    def __init__(self, folder: Path):
        import onnxruntime

        decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        self.path = folder / decoder["filename"]
        self.names = {**decoder.get("inputs", {}), **decoder.get("outputs", {})}
        # An empty cache: [batch 1, kv heads, 0 past positions, head size] (declared dims
        # may be symbolic, so the sizes come from the config).
        self.past_shape = (1, decoder["num_key_value_heads"], 0, decoder["head_size"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = onnxruntime.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])

    def model_bytes(self) -> int:
        """The decoder file and its external data files."""
        import onnx

        model = onnx.load(str(self.path), load_external_data=False)
        data = {entry.value for init in model.graph.initializer for entry in init.external_data if entry.key == "location"}
        return self.path.stat().st_size + sum((self.path.parent / name).stat().st_size for name in data)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits [seq, vocab] of one sequence, no cache."""
        seq = ids.shape[0]
        given = {
            self.names.get("input_ids", "input_ids"): ids[None].astype(np.int64),
            self.names.get("attention_mask", "attention_mask"): np.ones((1, seq), np.int64),
            self.names.get("position_ids", "position_ids"): np.arange(seq, dtype=np.int64)[None],
        }
        feeds = {}
        for arg in self.session.get_inputs():
            if arg.name in given:
                feeds[arg.name] = given[arg.name].astype(_numpy_type(arg.type))
            else:  # a past key or value
                feeds[arg.name] = np.zeros(self.past_shape, _numpy_type(arg.type))
        out = self.session.run([self.names.get("logits", "logits")], feeds)[0]
        return out[0].astype(np.float32)


def _numpy_type(onnx_type: str) -> Any:
    return {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
            "tensor(float16)": np.float16}[onnx_type]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def score(logits_of, windows: list[np.ndarray], reference: list[np.ndarray]) -> tuple[float, float]:
    """(perplexity, greedy agreement with ``reference`` argmaxes) over ``windows``."""
    nll, agree, count = 0.0, 0, 0
    for ids, ref in zip(windows, reference):
        logits = logits_of(ids)[:-1]
        nll -= float(log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]].sum())
        agree += int((logits.argmax(-1) == ref).sum())
        count += len(ids) - 1
    return math.exp(nll / count), agree / count


def versions() -> str:
    import onnxruntime
    import onnxruntime_genai
    import torch
    import transformers

    return (f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}")


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Trained {results['steps']} steps ({results['minutes']} min), final training loss "
             f"{results['loss']:.3f}; {results['windows']} held-out windows of {WINDOW} tokens. {results['versions']}.", "",
             "| folder | size (MB) | size / builder-int4 | perplexity | greedy agreement with float PyTorch |",
             "|---|---:|---:|---:|---:|"]
    lines.append(f"| PyTorch float | - | - | {results['torch']['perplexity']:.4f} | 1.0000 |")
    builder = results["folders"].get("builder-int4", {}).get("bytes")
    for name in results["folders"]:
        row = results["folders"][name]
        ratio = f"{row['bytes'] / builder:.3f}x" if builder else "-"
        lines.append(f"| {name} | {row['bytes'] / 1e6:.2f} | {ratio} | {row['perplexity']:.4f} | {row['agreement']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="training time on CPU")
    parser.add_argument("--steps", type=int, help="train this many steps instead (a loaded machine gets the same model)")
    parser.add_argument("--windows", type=int, default=48, help="held-out windows of 128 tokens")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--folders", nargs="+", default=list(FOLDERS), choices=FOLDERS + OTHER_FOLDERS)
    parser.add_argument("--keep", type=Path, help="write the trained model and the folders here (default: a temporary folder)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    train_text, held_text = stdlib_texts()
    tokenizer = train_tokenizer(train_text)
    train_ids = np.array(tokenizer(train_text)["input_ids"], np.int64)
    held_ids = np.array(tokenizer(held_text)["input_ids"], np.int64)
    say(f"{len(train_ids)} training tokens, {len(held_ids)} held out")
    model, loss, steps = train_model(train_ids, args.minutes, say, args.steps)

    stride = max(WINDOW, (len(held_ids) - WINDOW) // args.windows)
    windows = [held_ids[s:s + WINDOW] for s in range(0, len(held_ids) - WINDOW, stride)][:args.windows]

    def torch_logits(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=torch.from_numpy(ids)[None]).logits[0].float().numpy()

    reference = [torch_logits(ids)[:-1].argmax(-1) for ids in windows]
    perplexity, _ = score(torch_logits, windows, reference)
    results: dict[str, Any] = {"steps": steps, "minutes": "-" if args.steps else args.minutes, "loss": loss, "windows": len(windows),
                               "versions": versions(), "torch": {"perplexity": perplexity}, "folders": {}}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        source = Path(tmp) / "source"
        model.save_pretrained(source)
        tokenizer.save_pretrained(source)
        for name in args.folders:
            out = Path(tmp) / name
            export_contender(name, source, out)
            runner = FolderRunner(out)
            perplexity, agreement = score(runner.logits, windows, reference)
            results["folders"][name] = {"perplexity": perplexity, "agreement": agreement, "bytes": runner.model_bytes()}
            say(f"{name}: {results['folders'][name]}")
    table = markdown(results)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
