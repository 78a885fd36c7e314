"""A multimodal checkpoint's language model alone (`export-hf --text-only`): refused without
the option, each refusal naming the command, and that command's folder generating in ONNX
Runtime GenAI the tokens the checkpoint's own class generates for a text prompt."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.cli.main import main
from test_export_hf import genai_greedy

transformers = pytest.importorskip("transformers")

LLAMA = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=120)
CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
IDEFICS_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14)


def tiny_model(family: str) -> torch.nn.Module:
    """Checkpoints of the families export-hf has no image layout for, and Phi-4-multimodal."""
    torch.manual_seed(0)
    if family == "llava":
        return transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(vision_config=CLIP, text_config=LLAMA, image_token_id=119))
    if family == "idefics3":  # the language model under `model.text_model`
        return transformers.Idefics3ForConditionalGeneration(transformers.Idefics3Config(
            vision_config=IDEFICS_VISION, text_config=LLAMA, image_token_id=119, scale_factor=2))
    if family == "qwen2_vl":  # no causal LM class for its text config: runs as Qwen2's
        rope = dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2])
        text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=120, rope_parameters=rope, bos_token_id=1, eos_token_id=2)
        return transformers.Qwen2VLForConditionalGeneration(transformers.Qwen2VLConfig(
            vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2), text_config=text,
            image_token_id=110, video_token_id=111, vision_start_token_id=112))
    if family == "phi4mm":  # transformers loads it as a causal LM, encoders included
        return transformers.Phi4MultimodalForCausalLM(transformers.Phi4MultimodalConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                               patch_size=14, crop_size=56, image_token_id=290),
            audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2, audio_token_id=291,
                              nemo_conv_channels=32, depthwise_seperable_out_channel=32, ext_pw_out_channel=32, kernel_size=3,
                              num_lang=1)))
    raise AssertionError(family)


def export_hf_cli(source, output, *options: str) -> int:
    return main(["export-hf", str(source), "--output", str(output), "--quiet", *options])


@pytest.mark.parametrize(("family", "fake"), [
    ("llava", False), ("idefics3", True), ("qwen2_vl", False), ("phi4mm", False),
])
def test_a_multimodal_model_exports_text_only_when_asked(tmp_path, capsys, family, fake):
    model = tiny_model(family).eval()
    with torch.no_grad():  # weights large enough that greedy decoding does not settle on one token
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "source")
    parts = "a vision encoder and an audio encoder" if family == "phi4mm" else "a vision encoder"
    # refused without --text-only, by default and as text-generation; each refusal names the option
    for task in ([] if family == "phi4mm" else [[]]) + [["--task", "text-generation"]]:
        assert export_hf_cli(tmp_path / "source", tmp_path / "refused", *task) == 1
        error = capsys.readouterr().err
        assert "Nothing was written. Give --text-only to export its language model alone" in error
        assert "Unrecognized configuration class" not in error and not (tmp_path / "refused").exists()
        if task:
            assert f"({model.config.model_type}) has {parts}, which a text-generation folder leaves out" in error
    # the command the refusals name
    assert export_hf_cli(tmp_path / "source", tmp_path / "out", "--text-only", "--verify", *(["--fake"] if fake else [])) == 0
    out = tmp_path / "out"
    onnx.checker.check_model(str(out / "onnx" / "model.onnx"), full_check=True)
    config = json.loads((out / "config.json").read_text())
    assert ("vision_config" in config) == (family == "phi4mm")  # a text config where the checkpoint has one
    prompt = torch.randint(3, 100, (7,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():  # the checkpoint's own class on a text prompt
        expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)[0, len(prompt):].tolist()
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    assert genai_greedy(og.Model(str(out)), prompt, 16) == expected and len(expected) >= 8 and len(set(expected)) > 3


def test_text_only_of_a_text_model_is_an_error(tmp_path):
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})).save_pretrained(
        tmp_path / "source")
    from fx2onnx.hub import export_hf
    with pytest.raises(ValueError, match="has no vision or audio encoder to leave out: drop --text-only"):
        export_hf(tmp_path / "source", tmp_path / "out", text_only=True)
    with pytest.raises(ValueError, match="for text-generation: drop --task image-text-to-text"):
        export_hf(tmp_path / "source", tmp_path / "out", text_only=True, task="image-text-to-text")
    assert not (tmp_path / "out").exists()


def test_a_text_only_git_folder_reads_a_left_padded_batch_as_its_rows_alone(tmp_path):
    """Git widens a 2-D mask by its image's tokens once its cache is not empty; a text-only
    folder's cache holds none: each padded row generates what the row alone generates, which
    transformers' own padded batch does not."""
    from conftest import ATOL, RTOL
    from fx2onnx.hub import export_hf
    from fx2onnx.hub.decoders.verify_lengths import greedy_in_transformers
    from fx2onnx.hub.shared.verification import greedy_in_folder

    torch.manual_seed(0)
    model = transformers.GitForCausalLM(transformers.GitConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                           patch_size=14),
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    with torch.no_grad():  # weights large enough that greedy decoding does not settle on one token (0.3 does here)
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 1.0)
    model.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", text_only=True, verify=True, tokens=4)
    assert result.verification.passed
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    prompts = [torch.randint(3, 100, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 3)]
    ours = greedy_in_folder(path, prompts, 8, pad=0, banned=[2])
    alone = [greedy_in_transformers(model, [prompt], 8, pad=0) for prompt in prompts]
    batch = greedy_in_transformers(model, prompts, 8, pad=0)
    for row, theirs in enumerate(alone):
        assert ours.tokens[row] == theirs.tokens[0] and len(set(ours.tokens[row])) > 2
        for step, logits in enumerate(theirs.logits):
            torch.testing.assert_close(torch.from_numpy(ours.logits[step][row]), torch.from_numpy(logits[0]), rtol=RTOL, atol=ATOL)
    # transformers' padded row after its prefill: the mask's padding shifted by the image tokens
    assert not np.allclose(batch.logits[1][1], alone[1].logits[1][0], rtol=RTOL, atol=ATOL)
