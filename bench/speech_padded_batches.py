"""Padded batches of the wav2vec2-style architectures in onnxruntime against transformers:
each architecture of tests/e2e/test_export_hf_padded_audio_architectures.py (tiny, built
from its config class), with its CTC head and its audio-classification head, for each way
its checkpoints are saved: layer norm with an extractor that returns the mask, group norm
with one that returns it (WavLM's, UniSpeechSat's) and group norm with one that returns
none (wav2vec2-base's, HuBERT-base's); Data2VecAudio (layer norm only) with and without the
mask, W2V-BERT and Parakeet CTC with their extractors'. Two clips (1.3 s, 0.55 s) padded together: the
largest difference of each row between the folder's logits and transformers' on the same
inputs (the padded row of a CTC model at the frames the mask attends), that of
transformers' padded row without the mask, and that of transformers' padded row from
transformers on the clip alone (what a mask can reach: group norm normalises over the
padding too). One JSON line each, appended to bench/speech_padded_batches.jsonl.

With --transformers-js: the architectures Transformers.js lists (MODEL_FOR_CTC_MAPPING_NAMES,
MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES of its dist/transformers.node.mjs), layer norm
with the mask, the two clips through its `automatic-speech-recognition` and
`audio-classification` pipelines against transformers' pipelines: whether the texts are
equal, or the labels, and the largest difference of the scores.

With --seq2seq: the speech encoder-decoders whose extractors return the mask (Canary,
SeamlessM4T, SeamlessM4T v2: tests/e2e/test_export_hf_padded_speech_seq2seq.py), a 2.1 s and a
0.9 s clip padded together: the largest difference of the folder's encoder outputs per row at
the frames each clip fills, that of transformers' short row without the mask, and whether the
folder's 12 greedy tokens per row are transformers' `generate`'s on the batch and on each clip alone.

    OMP_NUM_THREADS=1 python bench/speech_padded_batches.py [--kinds hubert,wavlm] [--heads ctc] [--transformers-js]
    OMP_NUM_THREADS=1 python bench/speech_padded_batches.py --seq2seq [--kinds canary]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

_TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(_TESTS / "e2e"), str(_TESTS)]

from fx2onnx.hub import export_hf  # noqa: E402
from fx2onnx.hub.speech.audio_mask import frames_mask_rule  # noqa: E402
from test_export_hf_padded_audio import _features, _logits, clip  # noqa: E402
from test_export_hf_padded_speech_seq2seq import MODELS as SEQ2SEQ, padded_batch  # noqa: E402
from test_export_hf_padded_audio_architectures import ARCHITECTURES, HEADS, padded_rows, save_source, tiny_model  # noqa: E402
from client_versions import transformers_js_folder  # noqa: E402
from test_transformers_js import node_run  # noqa: E402

RESULTS = Path(__file__).with_name("speech_padded_batches.jsonl")
# setting -> (the config's, whether the extractor returns the mask)
SETTINGS = {
    "layer norm, mask": ({}, True),
    "group norm, mask": (dict(feat_extract_norm="group", do_stable_layer_norm=False), True),
    "group norm, no mask": (dict(feat_extract_norm="group", do_stable_layer_norm=False), False),
    "layer norm, no mask": ({}, False),
    "extractor's mask": ({}, True),  # Parakeet's extractor always returns it
}
# the architectures without a feature encoder norm to choose (always layer norm) or an extractor that always masks
# the model types of those Transformers.js lists that are built here, by head
TRANSFORMERS_JS = {"ctc": ("wav2vec2", "wav2vec2-bert", "unispeech", "unispeech-sat", "wavlm", "hubert", "parakeet_ctc"),
                   "classifier": ("wav2vec2", "wav2vec2-bert", "unispeech", "unispeech-sat", "wavlm", "hubert")}
ONE_SETTING = {"data2vec-audio": ("layer norm, mask", "layer norm, no mask"), "wav2vec2-bert": ("layer norm, mask",),
               "parakeet_ctc": ("extractor's mask",)}
# the heads each architecture has (Parakeet: CTC only)
HEADS_OF = {"parakeet_ctc": ("ctc",)}


def alone_row1(out: Path, model: torch.nn.Module) -> float:
    """transformers' padded row (at the frames its clip fills) against transformers on the clip alone."""
    clips = [clip(1.3, 1), clip(0.55, 2)]
    features = _features(out, clips)
    padded = _logits(model, features)[1]
    alone = _logits(model, _features(out, [clips[1]]))[0]
    if padded.ndim == 2:  # CTC: the clip's own frames
        if "attention_mask" in features:
            frames = frames_mask_rule(model)(torch.from_numpy(features["attention_mask"]), padded.shape[0])[1].bool().numpy()
            padded = padded[frames]
        padded = padded[: alone.shape[0]]
        alone = alone[: padded.shape[0]]
    return float(np.abs(padded - alone).max())


def measure(kind: str, head: str, setting: str) -> dict:
    settings, mask = SETTINGS[setting]
    record = {"kind": kind, "head": head, "setting": setting}
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = tiny_model(kind, head, **settings)
            save_source(Path(scratch) / "source", model, mask)
            result = export_hf(Path(scratch) / "source", Path(scratch) / "out", verify=True)
            record["verified"] = result.verification.passed
            record.update(padded_rows(Path(scratch) / "out", model))
            record["alone_row1"] = alone_row1(Path(scratch) / "out", model)
    except Exception as error:  # noqa: BLE001 - recorded: the sweep goes on
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def measure_seq2seq(kind: str) -> dict:
    """A speech encoder-decoder's folder on the padded batch of padded_batch against transformers."""
    record: dict = {"kind": kind, "head": "seq2seq", "setting": "extractor's mask"}
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = SEQ2SEQ[kind](Path(scratch) / "source")
            result = export_hf(Path(scratch) / "source", Path(scratch) / "out", verify=True, tokens=8)
            record["verified"] = result.verification.passed
            found = padded_batch(Path(scratch) / "out", model)
    except Exception as error:  # noqa: BLE001 - recorded: the sweep goes on
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    else:
        record.update(reads_mask="attention_mask" in found["encoder_inputs"], frames=found["frames"],
                      row0=found["encoder_rows"][0], row1=found["encoder_rows"][1], unmasked_row1=found["unmasked_row1"],
                      tokens_equal_batch=found["tokens"] == found["batch_tokens"],
                      tokens_equal_alone=found["tokens"] == found["alone_tokens"],
                      distinct_tokens=len({token for row in found["tokens"] for token in row}))
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def in_transformers_js(kind: str, head: str) -> dict:
    """The two clips through Transformers.js's pipeline for ``head`` and transformers'."""
    import transformers

    record = {"kind": kind, "head": head, "client": "transformers.js"}
    clips = [clip(1.3, 1), clip(0.55, 2)]
    task = "automatic-speech-recognition" if head == "ctc" else "audio-classification"
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scratch = Path(scratch)
        save_source(scratch / "source", tiny_model(kind, head))
        export_hf(scratch / "source", scratch / "out")
        job = {"folder": str(scratch / "out"), "task": task, "pipeline": {"clips": [c.tolist() for c in clips]}}
        done = node_run(transformers_js_folder(), scratch, job)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if re.match(r"\s*\w*Error: ", line)]
            record["error"] = (lines[0] if lines else done.stderr[-300:]).strip()[:300]
            return record
        got = json.loads((scratch / "result.json").read_text(encoding="utf-8"))["pipeline"]
        expected = transformers.pipeline(task, model=str(scratch / "source"))(clips)
    if head == "ctc":
        record.update(texts=[row["text"] for row in got], expected=[row["text"] for row in expected])
        record["equal"] = record["texts"] == record["expected"]
    else:
        record["equal"] = [[i["label"] for i in row] for row in got] == [[i["label"] for i in row] for row in expected]
        record["scores"] = float(np.abs(np.array([[i["score"] for i in row] for row in got])
                                        - np.array([[i["score"] for i in row] for row in expected])).max())
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", help="model types (default: every one of the mode's)")
    parser.add_argument("--heads", default=",".join(HEADS))
    parser.add_argument("--transformers-js", action="store_true")
    parser.add_argument("--seq2seq", action="store_true", help="the speech encoder-decoders (--kinds of their own)")
    args = parser.parse_args()
    import transformers

    if args.seq2seq:
        for kind in (args.kinds or ",".join(SEQ2SEQ)).split(","):
            record = {**measure_seq2seq(kind), "transformers": transformers.__version__}
            print(json.dumps(record), flush=True)
            with RESULTS.open("a", encoding="utf-8") as results:
                results.write(json.dumps(record) + "\n")
        return

    args.kinds = args.kinds or ",".join([*ARCHITECTURES, "wav2vec2-bert"])
    if args.transformers_js:
        for head, kinds in TRANSFORMERS_JS.items():
            for kind in kinds:
                if kind in args.kinds.split(",") and head in args.heads.split(","):
                    record = {**in_transformers_js(kind, head), "transformers": transformers.__version__}
                    print(json.dumps(record), flush=True)
                    with RESULTS.open("a", encoding="utf-8") as results:
                        results.write(json.dumps(record) + "\n")
        return

    for kind in args.kinds.split(","):
        for head in [head for head in args.heads.split(",") if head in HEADS_OF.get(kind, HEADS)]:
            for setting in ONE_SETTING.get(kind, tuple(SETTINGS)[:3]):
                record = {**measure(kind, head, setting), "transformers": transformers.__version__}
                print(json.dumps(record), flush=True)
                with RESULTS.open("a", encoding="utf-8") as results:
                    results.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
