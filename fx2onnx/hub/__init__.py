"""Application `hub`: transformers models to deployable folders (`fx2onnx export-hf`).

Takes a `save_pretrained` folder, a Hugging Face cache snapshot or a hub id; gives a
folder that its clients (ONNX Runtime GenAI, Transformers.js, Optimum-style loaders)
load as it is. Each kind of folder is one recipe (`recipes/`, a `FolderRecipe`: what it
accepts, its export, its verification), looked up by task and runtime in one table
(`recipe_table.py`):

- `recipes/causal_lm.py`: for causal LMs one `onnx/model.onnx` serving prefill and decode
  with ONNX Runtime GenAI's `genai_config.json` (int4/int8 weight-only, pre-quantized
  checkpoints, mixed precision);
- `recipes/encoder.py`: for encoders and image classifiers one `onnx/model.onnx` (an
  encoder's int8 with activations quantized at run time);
- `recipes/pipeline_task.py`: for the tasks a pipeline runs in one pass (classifiers,
  question answering, fill-mask, detection, segmentation, depth, CTC, audio, CLIP-style
  zero-shot; `pipeline_tasks.py`) one `onnx/model.onnx` with the outputs the pipelines read;
- `recipes/seq2seq.py`: for encoder-decoders `onnx/encoder_model.onnx` and
  `onnx/decoder_model_merged.onnx` (Optimum's layout; Whisper too with runtime standard);
- `recipes/whisper_genai.py`: Whisper for ONNX Runtime GenAI (`whisper/`);
- `recipes/image_text_to_text.py`: for image-text-to-text models (Qwen2.5-VL, Qwen3-VL,
  Gemma 3, Mistral 3) ONNX Runtime GenAI's vision, embedding and decoder models and image
  processor configuration (`vision_language/`, one module per architecture);
- `recipes/audio_text_to_text.py`: for audio language models (an audio encoder whose features
  replace the prompt's audio tokens of a decoder-only LM, filed under text2text-generation)
  Transformers.js's `audio_encoder`, `embed_tokens` and `decoder_model_merged`
  (`audio_language/`, from transformers' `get_audio_features`).

`export_hf.py` resolves the request (`request.py`: the options as one value, the
combinations refused for every folder), loads the model (`loading.py`, `tasks.py`), asks
the recipe whether it accepts the request (the precisions it declares:
`precision/folder_precision.py`), and writes the folder under a temporary name, moved in
place when whole. What recipes share is in `shared/` (file names, saving, dims named by
role — `batch_size`, `sequence_length`, `past_sequence_length`, `total_sequence_length` —,
source and tokenizer files, the merged decoder, verification results, weights by the
checkpoint's names, ONNX Runtime GenAI's configuration sections) and `decoders/` (the
decode step, its lengths, sliding-window layers kept in the masks (which the export makes the
windowed GroupQueryAttention where its attention is scaled-dot-product attention), a multimodal model's
language model alone with `--text-only`, the clients that cannot load a decoder).
Everything goes through the public API (`dynamo_export`, `ONNXProgram.save`, and the
public names of the stage packages: see docs/architecture.md, "Applications").
"""

from fx2onnx.hub.export_hf import HubExport, export_hf
from fx2onnx.hub.loading import TASKS
from fx2onnx.hub.precision.resolution import DEFAULT_ALGORITHM, PRECISIONS, QUANTIZATION_ALGORITHMS
from fx2onnx.hub.shared.runtime_check import onnxruntime_only_operators

__all__ = ["DEFAULT_ALGORITHM", "HubExport", "PRECISIONS", "QUANTIZATION_ALGORITHMS", "TASKS", "export_hf", "onnxruntime_only_operators"]
