"""`ExportOptions(precision="int4"|"int8")`: every linear layer of any exported model as
onnxruntime's `MatMulNBits`, with module functions and in one flat graph, in fake mode
with external data; logits within the quantization's bound of the float model."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import fx2onnx
from conftest import inlined, make_options

transformers = pytest.importorskip("transformers")

# int4 in blocks of 32 moves the tests' random-weight logits by 4 to 17% of their largest
# magnitude, int8 by about 1% (the bounds export-hf's precision tests keep)
LOGIT_BOUND = {"int4": 0.25, "int8": 0.05}
LINEARS = 15  # 7 a layer and the LM head


def tiny_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    return transformers.LlamaForCausalLM(config).eval()


def run_file(path, ids: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0])


def saved_graph(path, module_functions: bool) -> onnx.GraphProto:
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path))
    assert bool(saved.functions) == module_functions
    return inlined(saved).graph


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_precision_makes_every_linear_layer_matmulnbits(tmp_path, module_functions, precision):
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 9))
    options = make_options(tmp_path, module_functions=module_functions, precision=precision)
    path = tmp_path / "model.onnx"
    fx2onnx.dynamo_export(model, ids, export_options=options).save(path)
    graph = saved_graph(path, module_functions)
    kinds = collections.Counter(node.op_type for node in graph.node)
    assert kinds["MatMulNBits"] == LINEARS
    bits = {attribute.i for node in graph.node if node.op_type == "MatMulNBits" for attribute in node.attribute
            if attribute.name == "bits"}
    assert bits == {int(precision[3:])}
    # no float linear weight is left in the file: the codes replace it
    stored = {t.name for t in graph.initializer}
    assert not [name for name in stored if name.endswith("proj.weight") or name == "lm_head.weight"]
    with torch.no_grad():
        expected = model(ids).logits
    got = run_file(path, ids)
    assert (got - expected).abs().max() <= LOGIT_BOUND[precision] * expected.abs().max()


def test_precision_in_fake_mode_with_external_data_writes_the_same_codes(tmp_path, module_functions):
    real = tiny_llama()
    ids = torch.randint(0, 128, (1, 7))
    options = make_options(tmp_path, module_functions=module_functions, precision="int4")
    fx2onnx.dynamo_export(real, ids, export_options=options).save(tmp_path / "real.onnx")
    with fx2onnx.enable_fake_mode() as fake_context:
        fake = tiny_llama()
        fake_ids = torch.zeros(1, 7, dtype=torch.long)
    fake_options = make_options(tmp_path, module_functions=module_functions, precision="int4", fake_context=fake_context)
    program = fx2onnx.dynamo_export(fake, fake_ids, export_options=fake_options)
    program.save(tmp_path / "fake.onnx", model_state=real.state_dict(), external_data=True)
    assert (tmp_path / "fake.onnx.data").is_file()
    codes = {}
    for name in ("real", "fake"):
        graph = saved_graph(tmp_path / f"{name}.onnx", module_functions)
        codes[name] = {t.name: onnx.numpy_helper.to_array(t, base_dir=os.fspath(tmp_path)) for t in graph.initializer
                       if t.name.endswith(("_Q4", "_scales"))}
    assert len(codes["real"]) == 2 * LINEARS and codes["real"].keys() == codes["fake"].keys()
    for name, array in codes["real"].items():
        np.testing.assert_array_equal(codes["fake"][name], array, err_msg=name)
    torch.testing.assert_close(run_file(tmp_path / "fake.onnx", ids), run_file(tmp_path / "real.onnx", ids), rtol=0, atol=0)


def test_a_precision_fx2onnx_does_not_know_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"precision takes 'int4', 'int8'"):
        fx2onnx.dynamo_export(torch.nn.Linear(4, 4), torch.randn(2, 4),
                              export_options=fx2onnx.ExportOptions(precision="int2", failure_report_path=None))


def test_a_weight_quantization_chooses_the_embedding_in_a_flat_graph(tmp_path):
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 5))
    config = fx2onnx.WeightQuantization(bits=4, embedding=True)
    flat = fx2onnx.dynamo_export(model, ids, export_options=make_options(tmp_path, module_functions=False, precision=config))
    kinds = collections.Counter(node.op_type for node in flat.model_proto.graph.node)
    assert kinds["GatherBlockQuantized"] == 1 and kinds["MatMulNBits"] == LINEARS
    # with module functions the embedding's Gather is inside its function: refused, saying so
    with pytest.raises(fx2onnx.OnnxExporterError, match="inside a module function"):
        fx2onnx.dynamo_export(model, ids, export_options=make_options(tmp_path, precision=config))
