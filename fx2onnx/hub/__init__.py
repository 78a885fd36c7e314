"""Stage `hub`: transformers models to deployable folders (`fx2onnx export-hf`).

Takes a `save_pretrained` folder, a Hugging Face cache snapshot or a hub id; gives a
folder that its runtime loads as it is: for causal LMs one `model.onnx` serving prefill
and decode with ONNX Runtime GenAI's `genai_config.json` and the tokenizer; for encoders
and image classifiers one `model.onnx`; for encoder-decoders `encoder_model.onnx` and
`decoder_model.onnx` in Optimum's names. Dims get the names runtimes use (`batch_size`,
`sequence_length`, `past_sequence_length`, `total_sequence_length`). Everything goes
through the public API (`dynamo_export`, `ONNXProgram.save`).
"""

from fx2onnx.hub.export_hf import HubExport, export_hf

__all__ = ["HubExport", "export_hf"]
