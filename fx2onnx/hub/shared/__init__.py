"""Pieces every export-hf recipe shares: the folder's file names (folder_layout.py), dims
named by role (dim_roles.py), programs exported and saved under those names
(program_files.py), files copied from the source (folder_files.py,
tokenizer_files.py), the folder's JSON files read and written (json_files.py), the
`tokenizer.json` built for a tokenizer without one (tokenizer_backend.py), the merged
decoder (merged_decoder.py), verification results and tolerances (verification.py), a
part exported under the checkpoint's names (renamed_weights.py), ONNX Runtime GenAI's
configuration (genai_config.py) and the operators only onnxruntime runs (runtime_check.py).
"""
