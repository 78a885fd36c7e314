"""Application `hub`: transformers models to deployable folders (`fx2onnx export-hf`).

Takes a `save_pretrained` folder, a Hugging Face cache snapshot or a hub id; gives a
folder that its clients (ONNX Runtime GenAI, Transformers.js, Optimum-style loaders)
load as it is (layout.py; a client that cannot run the architecture is named when the folder
is written: client_support.py): for causal LMs one `onnx/model.onnx` serving prefill and
decode with ONNX Runtime GenAI's `genai_config.json`; for encoders and image classifiers
one `onnx/model.onnx`; for the other tasks a pipeline runs in one pass (classifiers,
question answering, fill-mask, detection, segmentation, depth, CTC, audio, CLIP-style
zero-shot) one `onnx/model.onnx` with the outputs the pipelines read (pipeline_tasks.py);
for encoder-decoders `onnx/encoder_model.onnx` and
`onnx/decoder_model_merged.onnx`; for image-text-to-text models (Qwen2.5-VL, Qwen3-VL, Gemma 3, Mistral 3) ONNX Runtime GenAI's
vision, embedding and decoder models and image processor configuration (vision_language.py,
vision_grid.py, vlm_gemma3.py, vlm_qwen3.py, vlm_mistral3.py, vlm_layout.py); a multimodal model's language
model alone with `--text-only` (text_only.py); the tokenizer as transformers loads it. A decoder with sliding-window
layers keeps every token in its cache and the window in its masks (sliding_window.py), which the
export makes the windowed GroupQueryAttention where its attention is scaled-dot-product attention. Dims get the names runtimes use (`batch_size`,
`sequence_length`, `past_sequence_length`, `total_sequence_length`). Everything goes
through the public API (`dynamo_export`, `ONNXProgram.save`, and the public names of the
stage packages: see docs/architecture.md, "Applications").
"""

from fx2onnx.hub.export_hf import HubExport, export_hf
from fx2onnx.hub.loading import TASKS
from fx2onnx.hub.precision import DEFAULT_ALGORITHM, PRECISIONS, QUANTIZATION_ALGORITHMS
from fx2onnx.hub.runtime_check import onnxruntime_only_operators

__all__ = ["DEFAULT_ALGORITHM", "HubExport", "PRECISIONS", "QUANTIZATION_ALGORITHMS", "TASKS", "export_hf", "onnxruntime_only_operators"]
