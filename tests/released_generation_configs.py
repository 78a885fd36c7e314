"""`generation_config.json` as released checkpoints ship it, for the folder kinds' tests.

Each entry is the file of one released checkpoint (its token ids the checkpoint's own),
written from the file as the Hub shows it (the pages the docs corpus holds):

- bart: facebook/bart-large-cnn (the same values in its config.json and the transformers
  docs' summarization example: beams 4, length_penalty 2, no_repeat_ngram_size 3, forced
  bos 0 and eos 2, min_length 56, max_length 142).
- marian: Helsinki-NLP/opus-mt-de-en (huggingface.co/Nextcloud-AI/opus-mt-de-en's copy of the
  file the HF staff added to every opus-mt checkpoint: the pad token as a bad word,
  forced eos 0, beams 4, max_length 512).
- mbart: facebook/mbart-large-50-many-to-many-mmt (refs/pr/7 generation_config.json: beams 5,
  forced eos 2, early_stopping, max_length 200).
- m2m100: facebook/m2m100_418M (its config.json as fine-tunes copy it: beams 5,
  early_stopping, max_length 200; the target language's forced bos is given to generate).
- t5: google-t5/t5-small (ids only; its beams live in config.json's task_specific_params,
  which generate does not read).
- florence2: microsoft/Florence-2-large's, as the Florence2ForConditionalGeneration
  fine-tunes save it (huggingface.co/yuairchen/Flo1, ljnlonoljpiljm/florence-2-base-interleaved:
  beams 3, no_repeat_ngram_size 3, forced bos 0 and eos 2, early_stopping).
- qwen2_vl: Qwen/Qwen2-VL-2B-Instruct's (huggingface.co/unsloth/Qwen2-VL-2B: sampling
  with top_k 1, top_p 0.001, temperature 0.1, repetition_penalty 1.05, two eos ids); Qwen2.5-VL
  ships the same values.
- gemma3: google/gemma-3-4b-it (huggingface.co/tylee4/gemma_trl and the tiny test
  checkpoint's history: sampling with top_k 64, top_p 0.95, eos 1 and 106).
- voxtral_realtime: mistralai/Voxtral-Mini-4B-Realtime-2602 (its ONNX copy,
  onnx-community/Voxtral-Mini-4B-Realtime-2602-ONNX: ids only, greedy).
"""

from __future__ import annotations

from typing import Any

RELEASED: dict[str, dict[str, Any]] = {
    "bart": {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2,
             "forced_bos_token_id": 0, "forced_eos_token_id": 2, "length_penalty": 2.0, "max_length": 142, "min_length": 56,
             "no_repeat_ngram_size": 3, "num_beams": 4, "pad_token_id": 1},
    "marian": {"bad_words_ids": [[58100]], "bos_token_id": 0, "decoder_start_token_id": 58100, "eos_token_id": 0,
               "forced_eos_token_id": 0, "max_length": 512, "num_beams": 4, "pad_token_id": 58100},
    "mbart": {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2,
              "forced_eos_token_id": 2, "max_length": 200, "num_beams": 5, "pad_token_id": 1},
    "m2m100": {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2, "max_length": 200,
               "num_beams": 5, "pad_token_id": 1},
    "t5": {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0},
    "florence2": {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2,
                  "forced_bos_token_id": 0, "forced_eos_token_id": 2, "no_repeat_ngram_size": 3, "num_beams": 3,
                  "pad_token_id": 1},
    "qwen2_vl": {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "max_length": 32768,
                 "pad_token_id": 151654, "repetition_penalty": 1.05, "temperature": 0.1, "top_k": 1, "top_p": 0.001},
    "gemma3": {"bos_token_id": 2, "cache_implementation": "hybrid", "do_sample": True, "eos_token_id": [1, 106],
               "pad_token_id": 0, "top_k": 64, "top_p": 0.95},
    "voxtral_realtime": {"bos_token_id": 1, "eos_token_id": 2, "output_attentions": False, "output_hidden_states": False,
                         "pad_token_id": 11, "use_cache": True},
}
_TOKEN_FIELDS = ("bos_token_id", "decoder_start_token_id", "eos_token_id", "forced_bos_token_id", "forced_eos_token_id",
                 "pad_token_id")


def released(family: str, ids: dict[int, int]) -> dict[str, Any]:
    """``family``'s released generation config with each token id the checkpoint's tokenizer
    gives a role mapped by ``ids`` to the tiny model's id of that role (its other values as
    released)."""
    config = dict(RELEASED[family])
    for field in _TOKEN_FIELDS:
        if isinstance(config.get(field), list):
            config[field] = [ids[token] for token in config[field]]
        elif field in config:
            config[field] = ids[config[field]]
    if "bad_words_ids" in config:
        config["bad_words_ids"] = [[ids[token] for token in word] for word in config["bad_words_ids"]]
    return config
