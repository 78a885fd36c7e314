"""Audio language models (an audio encoder whose outputs replace placeholder tokens in the
prompt of a decoder-only language model) as Transformers.js's audio-text-to-text layout
holds them: `onnx/audio_encoder.onnx` (the model's own `get_audio_features`: audio inputs
-> `audio_features`, rows of the language model's width), `onnx/embed_tokens.onnx`
(`input_ids` -> `inputs_embeds`) and `onnx/decoder_model_merged.onnx` (the language model
and its head over `inputs_embeds` and the cache, vision_language/parts.py's decoder).

- hooks.py: what transformers' model offers (`get_audio_features`, the audio token, the
  language model and its head), or a refusal naming what differs; own_features.py: the
  architectures whose model computes the features inline (one module each, qwen2_audio.py);
- audio_inputs.py: the audio encoder's example inputs, of the sizes the encoder takes;
- audio_parts.py: the three programs;
- transformers_js_audio.py: the model types Transformers.js runs, the encoder's input names it feeds;
- audio_verification.py: the greedy loop over the three models against `model.generate`;
- streaming_layouts.py: the architectures whose client streams the audio (VoxtralRealtime:
  voxtral_realtime.py, an encoder run chunk by chunk with its own caches and a decoder with the
  delay fixed; voxtral_realtime_verification.py, the three models chained as the client runs them).
"""
