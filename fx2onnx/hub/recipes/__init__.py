"""export-hf's folder kinds, one module each: the one-pass pipeline tasks
(pipeline_task.py), sequence-to-sequence models (seq2seq.py), Whisper for ONNX Runtime
GenAI (whisper_genai.py) and image-text-to-text models (image_text_to_text.py)."""
