"""Where an `export-hf` folder puts its files, so that every client loads it as written.

- The ONNX files are under `onnx/`, where Transformers.js looks (its `subfolder`
  default), named as it asks for them: `model.onnx` (causal LMs, encoders, image
  classifiers), or `encoder_model.onnx` and `decoder_model_merged.onnx`; `_fp16` before
  `.onnx` for float16 weights, `_q4`/`_q4f16`/`_quantized` for int4/int8 ones (its dtype
  suffixes). ONNX Runtime GenAI's Whisper is `encoder.onnx` and `decoder.onnx`.
- Each file's weights are in `<file>_data` beside it (`model.onnx_data`): the name
  Transformers.js fetches and the one the graph's external-data locations give, which
  is where onnxruntime-web looks for them in a browser.
- `config.json` says so under `"transformers.js_config"` (`use_external_data_format`,
  and the dtype, so that a browser, whose default is 8-bit, loads these files).
- ONNX Runtime GenAI's `genai_config.json` names the same files by their path in the
  folder (`onnx/model.onnx`); Optimum-style loaders take `subfolder="onnx"`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fx2onnx.hub.decoders.client_support import transformers_js_entries
from fx2onnx.hub.shared.json_files import edit_json_file

ONNX_FOLDER = "onnx"
MODEL, ENCODER, MERGED_DECODER = "model", "encoder_model", "decoder_model_merged"
# ONNX Runtime GenAI's Whisper (whisper_genai.py): names apart from Optimum's, whose inputs differ
GENAI_ENCODER, GENAI_DECODER = "encoder", "decoder"

# Transformers.js's dtype names and the file suffixes it derives from them
_TRANSFORMERS_JS_DTYPES = {torch.float16: ("fp16", "_fp16")}
# weight-only quantized files (MatMulNBits): (bits, float16 activations) -> the same
_TRANSFORMERS_JS_QUANTIZED = {
    (4, False): ("q4", "_q4"), (4, True): ("q4f16", "_q4f16"), (8, False): ("q8", "_quantized"), (8, True): ("q8", "_quantized"),
}


def _transformers_js_name(dtype: torch.dtype, bits: int | None) -> tuple[str, str]:
    if bits is not None:
        return _TRANSFORMERS_JS_QUANTIZED[(bits, dtype == torch.float16)]
    return _TRANSFORMERS_JS_DTYPES.get(dtype, ("fp32", ""))


def transformers_js_dtype(dtype: torch.dtype, bits: int | None = None) -> str:
    """Transformers.js's name for weights of ``dtype`` (float32 and others: fp32), or for
    weights quantized to ``bits`` with activations of ``dtype``."""
    return _transformers_js_name(dtype, bits)[0]


def onnx_file(base: str, dtype: torch.dtype, bits: int | None = None) -> str:
    """The folder-relative path of the ONNX file ``base`` (`model`, `encoder_model`, ...)."""
    return f"{ONNX_FOLDER}/{base}{_transformers_js_name(dtype, bits)[1]}.onnx"


def client_graph_file(relative: str, role: str) -> str:
    """The folder path of a client's own graph derived from the folder's graph at
    ``relative``, beside it so that both read the same data file:
    `onnx/model.onnx` -> `onnx/model_<role>.onnx`."""
    path = Path(relative)
    return path.with_name(f"{path.stem}_{role}{path.suffix}").as_posix()


def data_file(onnx_path: str) -> str:
    """The name of an ONNX file's external data, beside it (as written in the graph)."""
    return Path(onnx_path).name + "_data"


def with_data_file(onnx_path: str) -> list[str]:
    """An ONNX file and its external data, both relative to the folder."""
    return [onnx_path, f"{Path(onnx_path).parent.as_posix()}/{data_file(onnx_path)}"]


def mark_for_transformers_js(config_path: Path, dtype: torch.dtype, bits: int | None = None) -> None:
    """Tell Transformers.js, in the folder's `config.json`, that the weights are external
    data files and which dtype (file suffix) to load, and the sizes it reads under other
    names than transformers writes (EXAONE's `num_layers`); other entries are kept."""
    def mark(config: dict) -> bool:
        config.update(transformers_js_entries(config))
        settings = dict(config.get("transformers.js_config") or {})
        settings.update(use_external_data_format=True, dtype=transformers_js_dtype(dtype, bits))
        config["transformers.js_config"] = settings
        return True

    edit_json_file(config_path, mark)
