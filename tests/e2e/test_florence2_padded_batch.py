"""Florence-2's Transformers.js folder (`--runtime standard`) on a left-padded batch: two
task prompts of different lengths with two images, padded on the left by transformers'
processor. In onnxruntime, the folder's four models fed as transformers merges the image
(the image tokens' rows replaced by the features, after the padding) give transformers'
16 greedy tokens per row (BART's forced end of text at the last step left out: the
folder's greedy search is the plain one), logits within 1e-4. The folder is one flat
graph per model (`--runtime standard` takes no module functions).

Transformers.js pads a batch on its tokenizer's `padding_side` (tokenizer_config.json,
right for Florence-2's BART tokenizer; the right-padded batch is
test_transformers_js.py's) and puts the image features before the whole padded prompt
(Florence2ForConditionalGeneration._merge_input_ids_with_image_features): a left-padded
row then has its padding between the image and the prompt, at other positions than
transformers' (BART's learned positions count the padding), so its tokens are not
transformers'. Given that batch, Transformers.js generates what the folder generates in
onnxruntime with its merge: the difference is the client's."""

from __future__ import annotations

import os

import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.verification import end_tokens
from fx2onnx.hub.vision_language.florence2 import FILES
from fx2onnx.hub.vision_language.florence2_verify import decoder_start, greedy_in_folder, random_image, transformers_js_inputs
from test_transformers_js import run_in_transformers_js, save_florence2, tensor_specs, transformers_js  # noqa: F401

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("florence2")
    model, processor = save_florence2(root / "source")
    export_hf(root / "source", root / "out", task="image-text-to-text", runtime="standard")
    files = dict(zip(("vision", "embedding", "encoder", "decoder"), (root / "out" / "onnx" / f"{name}.onnx" for name in FILES)))
    for path in files.values():
        onnx.checker.check_model(os.fspath(path), full_check=True)
    return root, model, processor, files


def generated(model, batch: dict[str, torch.Tensor], steps: int = NEW_TOKENS):
    """transformers' greedy tokens and logits, without BART's forced end of text at the last step."""
    with torch.no_grad():
        return model.generate(**batch, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, forced_eos_token_id=None,
                              output_logits=True, return_dict_in_generate=True)


def left_padded(processor) -> dict[str, torch.Tensor]:
    """Captioning and detection prompts (the processor expands them to sentences of their own
    lengths) with two images, padded on the left."""
    processor.tokenizer.padding_side = "left"
    try:
        batch = dict(processor(text=["<CAPTION>", "<OD>"], images=[random_image(50, 70, 0), random_image(90, 40, 1)],
                               padding=True, return_tensors="pt"))
    finally:
        processor.tokenizer.padding_side = "right"
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][1].all()  # the caption's prompt is padded
    return batch


def test_a_left_padded_batch_in_onnxruntime(exported):
    root, model, processor, files = exported
    batch = left_padded(processor)
    out = generated(model, batch)
    expected = out.sequences[:, 1:].tolist()
    image = int(model.config.image_token_id)
    inputs = {name: value.numpy() for name, value in batch.items()}
    tokens, logits = greedy_in_folder(files, inputs, decoder_start(model), NEW_TOKENS, end_tokens(model), image_token=image)
    assert tokens == expected and expected[0] != expected[1]
    assert max(float(abs(a - b.numpy()).max()) for a, b in zip(logits, out.logits)) < 1e-4


def test_transformers_js_merges_a_left_padded_batch_its_own_way(exported, tmp_path, transformers_js):  # noqa: F811
    root, model, processor, files = exported
    batch = left_padded(processor)
    image = int(model.config.image_token_id)
    given = transformers_js_inputs(batch, image)  # the prompts left-padded, without their image tokens
    tokens, logits = greedy_in_folder(files, given, decoder_start(model), NEW_TOKENS, end_tokens(model))
    job = {"folder": str(root / "out"), "task": "image-text-to-text", "image_text": {
        "prompts": [{"inputs": tensor_specs({k: torch.from_numpy(v) for k, v in given.items()})}], "new_tokens": NEW_TOKENS + 1}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"][0]
    # its 17 tokens (the last the forced end of text of the folder's generation config): the first 16 the folder's
    assert [row[:NEW_TOKENS] for row in result["generated_rows"]] == tokens
    out = generated(model, batch)
    assert tokens[1] == out.sequences[1, 1:].tolist()  # the row without padding: the two merges are one
    # the padded row: its padding between the image and the prompt moves the image's positions
    assert float(abs(logits[0][0] - out.logits[0][0].numpy()).max()) > 1e-3
