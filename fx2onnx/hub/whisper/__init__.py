"""Whisper as ONNX Runtime GenAI runs it: its configuration files (whisper_config.py), the
token lists its decoder suppresses (whisper_suppress.py) and its verification
(whisper_verify.py); the recipe that writes the folder is recipes/whisper_genai.py.
"""
