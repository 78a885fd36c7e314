"""SentencePiece character models built here with protobuf (nothing downloaded), laid out as
SpeechT5's `spm_char.model` is: `<s>`, `<pad>`, `</s>` (control pieces), `<unk>`, the space
piece "▁", then one piece per character; and SpeechT5Tokenizer folders saved with them."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_PIECES = (("<s>", 3), ("<pad>", 3), ("</s>", 3), ("<unk>", 2))  # SentencePiece's CONTROL 3, UNKNOWN 2
CHARACTERS = "etaonihsrdlucmfwgy,.'TIH"  # no digits (as SpeechT5's), a few capitals and punctuation
# besides CHECKED_STRINGS: capitals, punctuation, runs of spaces, characters the vocabulary lacks
# (digits, tabs, new lines, accents), spaces alone, the empty text, added and special tokens in
# the text, SentencePiece's space piece in the text
STRINGS = ("Hello, THE fox's tail. It is 3:45!", "   lots   of    spaces   ", "   ", "",
           "a<mask>b <mask> c</s>d<ctc_blank>", "tab\tand\n\nnew lines", "école 🦊 x", "▁lead and tail▁", "a  ▁  b")
# what NFKC and SentencePiece's character map change: full-width letters, its spaces, ligatures, fractions
MAPPED = ("ｆｕｌｌ　ｗｉｄｔｈ ①②", "Hello,\u00a0World\u2003x\ty", "ﬁne ½ \u200b zero")


def char_model(characters: str = CHARACTERS, model_type: int = 4, normalization: str = "identity") -> bytes:
    """A SentencePiece model file of ``characters`` (model type 4: CHAR), spaces escaped as "▁",
    a dummy prefix, extra spaces removed, no character map (the `identity` rule)."""
    from transformers.convert_slow_tokenizer import import_protobuf

    proto_module = import_protobuf()
    model = proto_module.ModelProto()
    for piece, kind in (*SPECIAL_PIECES, *((character, 1) for character in "▁" + characters)):
        added = model.pieces.add()
        added.piece, added.type, added.score = piece, kind, 0.0 if kind != 1 else -float(len(model.pieces))
    trainer = model.trainer_spec
    trainer.model_type, trainer.vocab_size = model_type, len(model.pieces)
    trainer.bos_id, trainer.pad_id, trainer.eos_id, trainer.unk_id = 0, 1, 2, 3
    spec = model.normalizer_spec
    spec.name, spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces = normalization, True, True, True
    return model.SerializeToString()


def speecht5_tokenizer_folder(folder: Path, model: bytes | None = None, old_files: bool = False) -> None:
    """A SpeechT5Tokenizer of ``model`` (:func:`char_model` by default) with `<mask>` and
    `<ctc_blank>` after the pieces, as the released checkpoints have them, saved into
    ``folder`` by transformers (which needs `sentencepiece`); or, ``old_files``, written here
    as transformers 4 wrote them (`added_tokens.json`, `special_tokens_map.json` with a mask
    token that strips the spaces on its left), as the released checkpoints have them."""
    from transformers.convert_slow_tokenizer import import_protobuf

    model = model if model is not None else char_model()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spm_char.model").write_bytes(model)
    pieces = len(import_protobuf().ModelProto.FromString(model).pieces)
    if old_files:
        config = {"tokenizer_class": "SpeechT5Tokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                  "pad_token": "<pad>", "normalize": False, "model_max_length": 600}
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": {
            "content": "<mask>", "lstrip": True, "normalized": True, "rstrip": False, "single_word": False}}
        files = {"tokenizer_config.json": config, "special_tokens_map.json": special,
                 "added_tokens.json": {"<mask>": pieces, "<ctc_blank>": pieces + 1}}
        for name, content in files.items():
            (folder / name).write_text(json.dumps(content), encoding="utf-8")
        return
    import transformers

    tokenizer = transformers.SpeechT5Tokenizer(str(folder / "spm_char.model"), mask_token="<mask>")
    tokenizer.add_tokens(["<ctc_blank>"])
    tokenizer.save_pretrained(folder)


def trained_char_model(normalization: str = "nmt_nfkc") -> bytes:
    """A character model trained here by SentencePiece's own trainer (it needs `sentencepiece`),
    with the character map of the ``normalization`` rule (NFKC and SentencePiece's spaces)."""
    import io

    import sentencepiece

    written = io.BytesIO()
    corpus = ["the quick brown fox jumps over the lazy dog", "Hello, World. It's here!"] * 20
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=written, model_type="char", vocab_size=40, minloglevel=2,
        normalization_rule_name=normalization, bos_id=0, pad_id=1, eos_id=2, unk_id=3)
    return written.getvalue()
