"""What export-hf knows of decoders, beside the recipes that write their folders.

The decode step's example inputs and cache (decode_step.py), whose caches must grow with
the sequence (growing_cache.py), the lengths a model's
verification must pass (model_lengths.py, verify_lengths.py), sliding-window layers kept in
the masks (sliding_window.py), a multimodal model's language model alone (text_only.py) and
the clients that cannot load a decoder's folder (client_support.py).
"""
