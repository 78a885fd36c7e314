"""A folder's precision: the options resolved into a dtype and a weight quantization
(resolution.py) and a pre-quantized checkpoint's own codes (prequantized.py)."""
