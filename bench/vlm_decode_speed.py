"""Decode speed of image-text-to-text packages in ONNX Runtime GenAI: Gemma 3 against
Qwen2.5-VL of the same text size, in one run.

Three `export-hf` folders from random `save_pretrained` models whose language models have
the same size (hidden 512, 4 layers, 8 query and 4 key-value heads of 64, MLP 1376; the
tokenizer, image processors and vision towers of tests/e2e/test_export_hf_vision_language.py):

- ``qwen2_5_vl``: Qwen2.5-VL (every layer full attention; its decoder's attention is
  onnxruntime's GroupQueryAttention);
- ``gemma3``: Gemma 3 (3 sliding-window layers of 512 tokens, then a full one), as
  export-hf writes it: text steps through GroupQueryAttention, steps with image tokens
  through the model's own masks (`fx2onnx/hub/vision_language/gemma3.py`);
- ``gemma3-masks``: the same Gemma 3 with every step through the model's own masks (the
  decoder export-hf wrote before the fused text steps).

Each generates 64 greedy tokens after a prompt with one image (256 image tokens in both
families) and a short question, and after the same with 150 repetitions of the question
(about 700 more tokens: a longer cache); the decode time per token is the time from the
first generated token to the last, over the tokens. Rounds are interleaved (every folder once per round, in a rotated
order) and medians reported, with each folder's tokens per second over Qwen2.5-VL's.

    flock /tmp/fx2onnx-heavy.lock python bench/vlm_decode_speed.py [--rounds 5] [--json out.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

TEXT = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
            head_dim=64, max_position_embeddings=2048)
NEW_TOKENS = 64
QWEN_IMAGE_SIZE = (448, 448)  # 16 x 16 merged patches: 256 image tokens, as Gemma 3's
QUESTION = "describe this image"
REPEATS = {"short": 1, "long": 150}  # the question's repetitions in each prompt


def _vlm_tests() -> Any:
    """The image-text-to-text tests' module (its tokenizer and processors)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path[:0] = [str(tests), str(tests / "e2e")]  # its conftest helpers
    spec = importlib.util.spec_from_file_location("vlm_tests", tests / "e2e" / "test_export_hf_vision_language.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def write_qwen(tests: Any, folder: Path) -> None:
    import torch
    import transformers

    tokenizer = tests.trained_tokenizer(tests.QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tests.QWEN_SPECIAL}
    roles = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    text = {key: value for key, value in TEXT.items() if key != "head_dim"}
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(**text, vocab_size=len(tokenizer), rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}, **roles),
        vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=TEXT["hidden_size"],
                           patch_size=14, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1],
                           temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], **roles,
    )
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).eval().save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256).save_pretrained(folder)
    tokenizer.chat_template = tests.QWEN_TEMPLATE
    tokenizer.save_pretrained(folder)


def write_gemma(tests: Any, folder: Path) -> None:
    import torch
    import transformers

    tokenizer = tests.trained_tokenizer(
        tests.GEMMA_SPECIAL, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tests.GEMMA_SPECIAL}
    roles = dict(bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"])
    config = transformers.Gemma3Config(
        text_config=dict(**TEXT, vocab_size=len(tokenizer), sliding_window=512,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"], **roles),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=tests.GEMMA_IMAGE_SIZE[0], patch_size=4, vision_use_head=False),
        mm_tokens_per_image=256, image_token_index=ids["<image_soft_token>"], boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"], **roles,
    )
    torch.manual_seed(0)
    transformers.Gemma3ForConditionalGeneration(config).eval().save_pretrained(folder)
    image_processor = transformers.Gemma3ImageProcessorPil(size=dict(zip(("height", "width"), tests.GEMMA_IMAGE_SIZE)))
    transformers.Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=256).save_pretrained(folder)


def export(source: Path, out: Path, fused_text_steps: bool = True, **options: Any) -> None:
    from fx2onnx.hub import export_hf
    from fx2onnx.hub.vision_language import gemma3
    refusal = "" if fused_text_steps else "every step through the model's own masks (the benchmark's baseline)"
    with mock.patch.object(gemma3, "text_step_refusal", lambda config: refusal):
        export_hf(source, out, **options)


def decode_ms_per_token(model: Any, prompt: str, image: Path) -> tuple[float, list[int]]:
    import onnxruntime_genai as og

    inputs = model.create_multimodal_processor()(prompt, images=og.Images.open(str(image)))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=TEXT["max_position_embeddings"])
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    generator.generate_next_token()  # the prefill
    tokens = [int(generator.get_next_tokens()[0])]
    start = time.perf_counter()
    while not generator.is_done() and len(tokens) < NEW_TOKENS:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return (time.perf_counter() - start) * 1e3 / max(len(tokens) - 1, 1), tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="write the sources and folders here (default: a temporary folder)")
    args = parser.parse_args(argv)
    import onnxruntime_genai as og
    from PIL import Image

    tests = _vlm_tests()
    with tempfile.TemporaryDirectory(prefix="fx2onnx-vlm-speed-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        write_qwen(tests, root / "qwen-source")
        write_gemma(tests, root / "gemma-source")
        export(root / "qwen-source", root / "qwen2_5_vl")
        export(root / "gemma-source", root / "gemma3")
        export(root / "gemma-source", root / "gemma3-masks", fused_text_steps=False)
        image = root / "image.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (*QWEN_IMAGE_SIZE, 3), dtype=np.uint8)).save(image)
        models = {name: og.Model(str(root / name)) for name in ("qwen2_5_vl", "gemma3", "gemma3-masks")}

        def prompt(name: str, length: str) -> str:
            text = tests.qwen_prompt(1) if name == "qwen2_5_vl" else tests.gemma_prompt(1)
            return text.replace(QUESTION, " ".join([QUESTION] * REPEATS[length]))

        runs = [(name, length) for length in REPEATS for name in models]
        for name, length in runs:  # warm-up
            decode_ms_per_token(models[name], prompt(name, length), image)
        samples: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        tokens: dict[tuple[str, str], list[int]] = {}
        for index in range(args.rounds):
            for name, length in runs[index % len(runs):] + runs[:index % len(runs)]:
                milliseconds, tokens[name, length] = decode_ms_per_token(models[name], prompt(name, length), image)
                samples[name, length].append(milliseconds)
    medians = {run: statistics.median(values) for run, values in samples.items()}
    results: dict[str, Any] = {}
    print("| folder | prompt | decode ms/token | tokens/s | over Qwen2.5-VL |\n|---|---|---|---|---|")
    for (name, length), median in medians.items():
        row = {"decode_ms_per_token": median, "tokens_per_s": 1e3 / median,
               "tokens_per_s_over_qwen2_5_vl": medians["qwen2_5_vl", length] / median, "tokens": len(tokens[name, length])}
        if name == "gemma3":
            row["tokens_equal_to_gemma3-masks"] = tokens[name, length] == tokens["gemma3-masks", length]
        results[f"{name} {length}"] = row
        print(f"| {name} | {length} | {median:.2f} | {row['tokens_per_s']:.0f} | {row['tokens_per_s_over_qwen2_5_vl']:.2f}x |")
    for length in REPEATS:
        print(f"{length} prompt: gemma3's tokens equal gemma3-masks': {results[f'gemma3 {length}']['tokens_equal_to_gemma3-masks']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
