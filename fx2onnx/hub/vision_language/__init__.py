"""Image-text-to-text models as ONNX Runtime GenAI runs them: the parts cut from the
checkpoint (vlm_parts.py), one module per architecture (vlm_gemma3.py, vlm_qwen3.py,
vlm_mistral3.py), the vision grid computed in the graph (vision_grid.py), the folder's
files and processor configuration (vlm_layout.py) and the verification (vlm_verify.py).
"""
