"""Image-text-to-text models as ONNX Runtime GenAI runs them: a vision model, an embedding
model and a decoder cut from the checkpoint's modules, with the runtime's configuration
and image processor configuration; and as Transformers.js runs them (transformers_js.py:
which architectures, the embedding without the images; the architectures Transformers.js
alone runs, qwen2_vl.py, llava.py and idefics3.py, are named by its rows there).

- architectures.py: the table, one row per model type (architecture.py says what a row holds);
- one module per architecture, named after its model type (the Qwen ones share
  qwen_images.py): the vision model, the parts' export, the processor configuration,
  the verification's images and prompt;
- parts.py: the shared embedding and decoder wrappers; vision_grid.py: the grid layouts of
  Qwen's and LFM3-VL's towers in the graph; genai_files.py: the folder's files; folder_verification.py: the greedy loop
  over the three models.
"""
