"""`export-hf --precision int4 --quantization search [--mixed-precision]`: searched block
scales give a folder of round-to-nearest's size whose weights are closer to the float
model's, layer by layer; mixed precision gives 8 bits to the value and down projections
of the layers its rule names and 4 to the rest; the folders run in onnxruntime and ONNX
Runtime GenAI (the same greedy tokens), fake mode writes the same bytes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

import fx2onnx
from conftest import make_options, matmul_nbits_weights
from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.precision.resolution import more_bits_layers
from fx2onnx.hub.shared.verification import greedy_in_onnxruntime
from fx2onnx.options import WeightQuantization
from test_export_hf import COMMON, PROMPT, generate_with_genai, tokenizer  # noqa: F401 - the fixture is used by name
from test_export_hf_precision import _folder_bytes, _initializers, model_file
from conftest import dequantize_matmul_nbits as _dequantize

transformers = pytest.importorskip("transformers")

LAYERS = 3  # the mixed rule's every-third layer: 2 (the first and last eighth are empty)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):  # noqa: F811
    root = tmp_path_factory.mktemp("quantization")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, vocab_size=len(tokenizer), **COMMON,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(root / "source")
    tokenizer.save_pretrained(root / "source")
    results = {
        "rtn": export_hf(root / "source", root / "rtn", precision="int4", quantization_algorithm="rtn"),
        "search": export_hf(root / "source", root / "search", precision="int4", quantization_algorithm="search"),
        "mixed": export_hf(root / "source", root / "mixed", precision="int4", quantization_algorithm="search",
                           mixed_precision=True, verify=True),
    }
    return root, model, results


def _decoded_weights(path) -> dict[str, np.ndarray]:
    """Each MatMulNBits weight decoded from the file's bytes, [N, K] as PyTorch stores it."""
    model = onnx.load(os.fspath(path))
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = {}
    for attributes, codes, scales, zero in matmul_nbits_weights(model.graph):
        name = codes.rsplit("_Q", 1)[0]
        weights[name] = _dequantize(initializers[codes], initializers[scales], None if zero is None else initializers[zero],
                                    attributes["bits"], attributes["K"]).T
    return weights


def test_search_is_closer_to_the_float_weights_at_the_same_size(folders):
    root, model, _ = folders
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    rtn, search = _decoded_weights(model_file(root / "rtn")), _decoded_weights(model_file(root / "search"))
    assert rtn.keys() == search.keys() and len(rtn) == 7 * LAYERS + 1
    errors = {kind: {name: float(np.square(decoded[name] - state[name]).sum()) for name in decoded}
              for kind, decoded in (("rtn", rtn), ("search", search))}
    for name in rtn:
        assert errors["search"][name] < errors["rtn"][name], name
    assert _folder_bytes(root / "search") == _folder_bytes(root / "rtn")
    onnx.checker.check_model(os.fspath(model_file(root / "search")), full_check=True)


def test_mixed_precision_gives_the_rule_s_layers_8_bits(folders, tokenizer):  # noqa: F811
    root, model, results = folders
    path = model_file(root / "mixed")
    onnx.checker.check_model(os.fspath(path), full_check=True)
    eight = {name.removesuffix("_Q8") for name in _initializers(path) if name.endswith("_Q8")}
    assert more_bits_layers(LAYERS) == [2]
    assert eight == {f"model.layers.2.{p}.weight" for p in ("self_attn.v_proj", "mlp.down_proj")}
    # the 8-bit layers are the search's too: closer to the float weights than the 4-bit ones
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    decoded = _decoded_weights(path)
    four = _decoded_weights(model_file(root / "search"))
    for name in eight:
        assert np.square(decoded[name] - state[name]).sum() < 0.05 * np.square(four[name] - state[name]).sum()
    verification = results["mixed"].verification
    # random weights: flat logits, which int4 moves by up to a quarter of their magnitude (the int4 tests' bound)
    assert verification.float_difference < 0.25 * verification.logit_scale
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    tokens, _ = generate_with_genai(root / "mixed", prompt_ids, 8)
    own, _ = greedy_in_onnxruntime(path, prompt_ids, 8)
    assert tokens == own


def test_more_bits_layers_follow_the_stated_rule():
    # the first and last eighth of the layers, and every third layer between them
    assert more_bits_layers(8) == [0, 3, 6, 7]
    assert more_bits_layers(32) == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_command_line_in_fake_mode_writes_the_same_weights(folders, tmp_path):
    root, _, _ = folders
    assert main(["export-hf", os.fspath(root / "source"), "--output", os.fspath(tmp_path / "fake"), "--precision", "int4",
                 "--quantization", "search", "--mixed-precision", "--fake", "--quiet"]) == 0
    real, fake = _initializers(model_file(root / "mixed")), _initializers(model_file(tmp_path / "fake"))
    assert real.keys() == fake.keys()
    for name, array in real.items():
        assert array.dtype == fake[name].dtype and array.tobytes() == fake[name].tobytes(), name


def test_bad_quantization_choices_are_refused(folders, tmp_path):
    root, _, _ = folders
    with pytest.raises(ValueError, match="int4"):
        export_hf(root / "source", tmp_path / "int8", precision="int8", mixed_precision=True)
    with pytest.raises(ValueError, match="one of rtn, search"):
        WeightQuantization(algorithm="gptq")
    assert not (tmp_path / "int8").exists()


def test_int8_layers_in_module_functions_are_refused(tmp_path):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    quantization = WeightQuantization(int8_layers=("*v_proj*",))
    options = make_options(tmp_path, module_functions=True, precision=quantization)
    with pytest.raises(Exception, match="export without module functions for mixed precision") as raised:
        fx2onnx.dynamo_export(model, torch.randint(0, 64, (1, 5)), export_options=options)
    assert isinstance(raised.value, NotImplementedError) or isinstance(raised.value.__cause__, NotImplementedError)
