"""`export_hf(..., fake=True)` of a ~1B-parameter Qwen2.5-VL-style `save_pretrained` folder:
peak memory of the export, and the folder checked against transformers.

Three steps, each in a fresh subprocess so that ru_maxrss is the peak of that step alone:
``write`` builds a real Qwen2.5-VL (text: hidden 1536, 20 layers; vision: hidden 1280, 16
blocks; about 0.94B parameters, 3.8 GB of float32 weights) and saves it with its image
processor; ``export`` runs `fx2onnx.hub.export_hf(folder, out, fake=True)` (a vision model
for images of every size; goal: peak RSS under 1.5 GB); ``verify`` loads the real model and chains the
folder's vision, embedding and decoder models in onnxruntime against `model.generate`
(`fx2onnx.hub.vision_language.folder_verification`), then generates with ONNX Runtime GenAI (`og.Model(folder)`).

    flock /tmp/fx2onnx-heavy.lock python bench/export_hf_vlm_memory.py [--folder /tmp/qwen-vl-1b]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

GiB = 2**30
TEXT = dict(hidden_size=1536, num_hidden_layers=20, intermediate_size=4096, num_attention_heads=12, num_key_value_heads=2,
            vocab_size=32000, max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(depth=16, hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=1536, patch_size=14,
              spatial_merge_size=2, window_size=112, fullatt_block_indexes=[7, 15], temporal_patch_size=2)
TOKENS = dict(image_token_id=31990, video_token_id=31991, vision_start_token_id=31992, vision_end_token_id=31993)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_write(folder: Path) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, **TOKENS)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(folder / "source", max_shard_size="1GB")
    transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256).save_pretrained(folder / "source")
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "weight_bytes": sum(p.numel() * 4 for p in model.parameters())}


def step_export(folder: Path) -> dict:
    from fx2onnx.hub import export_hf
    start = time.perf_counter()
    result = export_hf(folder / "source", folder / "out", fake=True)
    data = sum((folder / "out" / f).stat().st_size for f in result.files if f.endswith("_data"))
    return {"seconds": time.perf_counter() - start, "data_bytes": data}


def step_verify(folder: Path) -> dict:
    import transformers

    from fx2onnx.hub.vision_language import genai_files
    from fx2onnx.hub.shared.verification import tolerance_for
    from fx2onnx.hub.vision_language.folder_verification import verify_image_text_to_text

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder / "source").eval()
    image_processor = transformers.AutoImageProcessor.from_pretrained(folder / "source")
    files = {part: folder / "out" / "onnx" / f"{base}.onnx" for part, base in genai_files.PARTS.items()}
    start = time.perf_counter()
    result = verify_image_text_to_text(files, model, image_processor, 8, tolerance_for(model.dtype))
    import onnxruntime_genai as og

    og.Model(str(folder / "out"))  # the runtime loads the folder as written
    return {"seconds": time.perf_counter() - start, "passed": result.passed, "summary": result.summary(),
            "tokens": result.onnx_tokens}


STEPS = {"write": step_write, "export": step_export, "verify": step_verify}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fx2onnx-qwen-vl-1b"))
    parser.add_argument("--step", choices=STEPS)
    args = parser.parse_args()
    if args.step:  # one step, in this process
        result = STEPS[args.step](args.folder)
        result["peak_rss_gib"] = _peak_rss() / GiB
        print(json.dumps(result))
        return
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    for step in STEPS:
        run = subprocess.run([sys.executable, __file__, "--folder", str(args.folder), "--step", step],
                             capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise SystemExit(f"step {step} failed:\n{run.stderr[-4000:]}")
        print(step, run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
