"""export-hf of a pre-quantized checkpoint (compressed-tensors pack-quantized int4, made here,
symmetric and with zero points): MatMulNBits with the checkpoint's own codes, scales and zero
points, whose dequantized weights equal the ones transformers computes from the checkpoint
exactly; ONNX Runtime GenAI generates transformers' greedy tokens; what cannot be read so is
refused with what to do."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch

from compressed_tensors_checkpoint import save_compressed_tensors
from conftest import decoder_stack_nodes, dequantize_matmul_nbits, matmul_nbits_weights
from fx2onnx.hub import export_hf
from test_export_hf import COMMON, PROMPT, generate_with_genai, tokenizer  # noqa: F401 - the fixture is used by name
from test_export_hf_precision import model_file

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module", params=[True, False], ids=["symmetric", "zero-points"])
def checkpoint(request, tmp_path_factory, tokenizer):  # noqa: F811
    root = tmp_path_factory.mktemp("prequantized")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, vocab_size=len(tokenizer), **COMMON,
    )
    torch.manual_seed(0)
    save_compressed_tensors(transformers.LlamaForCausalLM(config).eval(), root / "source", group=32, symmetric=request.param)
    tokenizer.save_pretrained(root / "source")
    # float activations (accuracy level 0): the kernel's product is the float one, so greedy tokens can be compared
    export_hf(root / "source", root / "folder", accuracy_level=0)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        root / "source", quantization_config=transformers.CompressedTensorsConfig(dequantize=True)
    ).eval()
    return root, loaded, request.param


def test_matmul_nbits_weights_are_transformers_weights_exactly(checkpoint):
    root, loaded, symmetric = checkpoint
    path = model_file(root / "folder")
    onnx.checker.check_model(os.fspath(path), full_check=True)
    model = onnx.load(os.fspath(path))
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    state = {name: tensor.detach().numpy() for name, tensor in loaded.state_dict().items()}
    nodes = [node for node in decoder_stack_nodes(model.graph) if node.op_type == "MatMulNBits"]
    assert len(nodes) == 14 - 2 * 2  # 7 a layer, Q, K and V packed; the LM head the checkpoint keeps float stays float
    assert initializers["lm_head.weight"].dtype == np.float32
    weights = matmul_nbits_weights(model.graph)
    assert len(weights) == 14
    for attributes, codes, scales, zero in weights:
        assert (attributes["bits"], attributes["block_size"]) == (4, 32)
        assert (zero is not None) == (not symmetric)
        decoded = dequantize_matmul_nbits(initializers[codes], initializers[scales], None if zero is None else initializers[zero],
                                          4, attributes["K"])
        name = codes.removesuffix("_Q4")
        np.testing.assert_array_equal(decoded.T, state[name], err_msg=name)


def _greedy(model, prompt_ids: list[int]) -> list[int]:
    with torch.no_grad():
        return model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False)[0, len(prompt_ids):].tolist()


def test_genai_generates_transformers_greedy_tokens(checkpoint, tokenizer):  # noqa: F811
    root, loaded, symmetric = checkpoint
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    expected = _greedy(loaded, prompt_ids)
    if symmetric:
        # transformers' default loading too (compressed weights, decompressed on use); with
        # zero points it refuses the packed zero points its own compressor writes
        assert _greedy(transformers.AutoModelForCausalLM.from_pretrained(root / "source").eval(), prompt_ids) == expected
    tokens, _ = generate_with_genai(root / "folder", prompt_ids, 12)
    assert tokens == expected


def test_options_that_would_quantize_again_are_refused(checkpoint, tmp_path):
    root, _, _ = checkpoint
    with pytest.raises(ValueError, match="already quantized to 4 bits"):
        export_hf(root / "source", tmp_path / "int8", precision="int8")
    with pytest.raises(ValueError, match="already quantized"):
        export_hf(root / "source", tmp_path / "search", quantization_algorithm="search")
    with pytest.raises(NotImplementedError, match="without fake mode"):
        export_hf(root / "source", tmp_path / "fake", fake=True)
    assert not any(tmp_path.iterdir())


def test_other_quant_methods_are_refused(tmp_path):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=300, **COMMON)
    config.save_pretrained(tmp_path / "gptq")
    saved = json.loads((tmp_path / "gptq" / "config.json").read_text())
    saved["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    (tmp_path / "gptq" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(NotImplementedError, match="quantized with gptq; fx2onnx reads compressed-tensors"):
        export_hf(tmp_path / "gptq", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_checkpoint_packing_is_compressed_tensors_own():
    """The checkpoint made here packs codes as compressed-tensors' own compressor does."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from compressed_tensors_checkpoint import _pack_int32

    codes = torch.randint(-8, 8, (16, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_pack_int32(codes), pack_to_int32(codes, 4))
    assert torch.equal(_pack_int32(codes.t().contiguous()).t(), pack_to_int32(codes, 4, packed_dim=0))
