"""A `tokenizer.json` for a SentencePiece tokenizer that transformers has no converter for
(SpeechT5Tokenizer: `spm_char.model`, a character model), built with the `tokenizers`
library from the `.model` file, read with protobuf alone (transformers' copy of
SentencePiece's model proto, or the `sentencepiece` library's where it is installed).

What `SentencePieceProcessor.encode` does with a character model, and the steps written for
it (each a `tokenizers` step that Transformers.js has too):

- the normalizer spec's character map (`precompiled_charsmap`, empty for the `identity`
  rule): a `Precompiled` normalizer where there is one (Transformers.js's applies NFKC and
  its own list of spaces in place of the map);
- `remove_extra_whitespaces`: the spaces (U+0020 only, after the map) at the start removed
  and each run of them made one; `add_dummy_prefix`: a space before a text that is not
  empty; `escape_whitespaces`: each space as the piece "▁"; then the space pieces at the end
  removed (SentencePiece strips them from the escaped text, so a "▁" the text itself ends
  with goes too);
- the model: each character its piece's id, and the unknown piece's for a run of characters
  the vocabulary lacks, one for the run (SentencePiece merges unknown neighbours): a `BPE`
  model without merges (each character alone) with `fuse_unk`, on the whole text.

The tokenizer's added and special tokens (its `tokenizer_config.json`, `added_tokens.json`,
`special_tokens_map.json`) are matched in the text as written before any of this, as
transformers' Python tokenizer splits them out first; the class's special tokens around the
ids (SpeechT5Tokenizer: `</s>` after them) are a `TemplateProcessing`. Not written, refused
with the reason: the unigram and BPE models, user-defined pieces, `treat_whitespace_as_suffix`,
`legacy: false`; SpeechT5Tokenizer's `normalize: true` (numbers spelt out in English) is left
out and said (:func:`steps_left_out`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.json_files import read_json_if_present
from fx2onnx.hub.shared.tokenizer_backend import add_tokens, vocabulary_with, write_backend

__all__ = [
    "SENTENCEPIECE_CLASSES", "SentencePieceClass", "read_sentencepiece_model", "sentencepiece_class",
    "sentencepiece_tokenizer", "source_added_tokens", "steps_left_out", "write_sentencepiece_tokenizer",
]

SPACE = "▁"  # SentencePiece's piece for a space (kSpaceSymbol)
# SentencePiece's piece types and model types (sentencepiece_model.proto)
_UNKNOWN, _USER_DEFINED = 2, 4
_CHAR = 4
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class SentencePieceClass:
    """A transformers tokenizer class of SentencePiece: its model file's name and the special
    token its `build_inputs_with_special_tokens` puts after a text's ids (tokenizer_config.json's
    key for it, and the class's default where the files name none)."""

    model_file: str
    appended: str
    appended_default: str


SENTENCEPIECE_CLASSES = {"SpeechT5Tokenizer": SentencePieceClass("spm_char.model", "eos_token", "</s>")}


def sentencepiece_class(source: Path) -> SentencePieceClass | None:
    """The class of ``source``'s tokenizer (tokenizer_config.json's `tokenizer_class`) when it
    is one of :data:`SENTENCEPIECE_CLASSES` and its model file is there; else None."""
    known = SENTENCEPIECE_CLASSES.get(read_json_if_present(source / "tokenizer_config.json", {}).get("tokenizer_class"))
    return known if known is not None and (source / known.model_file).is_file() else None


def read_sentencepiece_model(path: Path) -> Any:
    """The `ModelProto` of the SentencePiece model file ``path``; ValueError when it is none."""
    from google.protobuf.message import DecodeError
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except DecodeError as error:
        raise ValueError(f"{path.name} is not a SentencePiece model: {error}") from error
    if not proto.pieces:
        raise ValueError(f"{path.name} is not a SentencePiece model: it holds no pieces.")
    return proto


def _content(value: Any) -> str | None:
    """A token as tokenizer_config.json or special_tokens_map.json gives it: its text, or a dict holding it."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


def source_added_tokens(source: Path, proto: Any) -> dict[int, dict[str, Any]]:
    """The tokens ``source``'s tokenizer matches in the text before SentencePiece, by id:
    tokenizer_config.json's `added_tokens_decoder` (transformers' files since 4.34),
    `added_tokens.json` and the special tokens both files name (older files), those in the
    vocabulary with its ids. Each as the `tokenizers` library's `AddedToken` arguments."""
    config = read_json_if_present(source / "tokenizer_config.json", {})
    special_map = read_json_if_present(source / "special_tokens_map.json", {})
    pieces = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    flags: dict[str, dict[str, Any]] = {}  # the token's lstrip, rstrip, single_word as given
    ids: dict[str, int] = {}
    for index, entry in config.get("added_tokens_decoder", {}).items():
        ids[entry["content"]], flags[entry["content"]] = int(index), entry
    for content, index in read_json_if_present(source / "added_tokens.json", {}).items():
        ids.setdefault(content, int(index))
    special = {entry["content"] for entry in config.get("added_tokens_decoder", {}).values() if entry.get("special")}
    for values in (special_map, config):
        named = [values.get(name) for name in _NAMED_TOKENS]
        named += [*values.get("additional_special_tokens", []), *values.get("extra_special_tokens", [])]
        for value in named:
            if (content := _content(value)) is not None:
                special.add(content)
                if isinstance(value, dict):
                    flags.setdefault(content, value)
    for content in special:
        if content not in ids:
            if content not in pieces:
                raise ValueError(f"the special token {content!r} is neither a piece of the model nor an added token with an id.")
            ids[content] = pieces[content]
    return {
        index: {"content": content, "special": content in special, "normalized": False,  # matched in the text as written
                **{key: bool(flags.get(content, {}).get(key, False)) for key in ("lstrip", "rstrip", "single_word")}}
        for content, index in sorted(ids.items(), key=lambda item: item[1])
    }


def steps_left_out(source: Path) -> list[str]:
    """What ``source``'s tokenizer does that its `tokenizer.json` cannot (its clients' text must come so prepared)."""
    if read_json_if_present(source / "tokenizer_config.json", {}).get("normalize"):
        return ["numbers spelt out in English (SpeechT5Tokenizer's `normalize: true`): give the clients numbers in words"]
    return []


def _refusal(proto: Any, config: dict[str, Any]) -> str | None:
    """Why the `tokenizer.json` written here would not encode as the model does; None where it would."""
    trainer = proto.trainer_spec
    if trainer.model_type != _CHAR:
        return (f"a SentencePiece {type(trainer).ModelType.Name(trainer.model_type)} model: only character models "
                "(SpeechT5's) are written")
    if any(piece.type == _USER_DEFINED for piece in proto.pieces):
        return "a SentencePiece model with user-defined pieces"
    if trainer.treat_whitespace_as_suffix:
        return "a SentencePiece model that puts spaces after the words (treat_whitespace_as_suffix)"
    if config.get("legacy") is False:
        return "a tokenizer with `legacy: false` (transformers then takes the dummy prefix out)"
    if not 0 <= trainer.unk_id < len(proto.pieces) or proto.pieces[trainer.unk_id].type != _UNKNOWN:
        return f"a SentencePiece model whose unknown piece (id {trainer.unk_id}) is not one"
    return None


def _normalizers(spec: Any) -> list[Any]:
    from tokenizers import Regex, normalizers

    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only (SentencePiece keeps tabs and new lines); \A \z: both clients
        steps += [normalizers.Replace(Regex(r"\A +"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:  # at the start of a text that is not empty (an empty text stays without pieces)
        steps.append(normalizers.Replace(Regex(r"\A(?=[\s\S])"), " "))
    space = " "
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE))
        space = SPACE
    if spec.remove_extra_whitespaces:
        steps.append(normalizers.Replace(Regex(f"{space}+\\z"), ""))
    return steps


def sentencepiece_tokenizer(proto: Any, added: dict[int, dict[str, Any]], appended: str) -> Any:
    """The `tokenizers.Tokenizer` that encodes as SentencePiece's character model ``proto``
    does, with the ``added`` tokens (by id) matched first and the token ``appended`` after
    the ids; ValueError where an added token's id is not its piece's, or ``appended`` has none."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    vocab = vocabulary_with({piece.piece: index for index, piece in enumerate(proto.pieces)}, added)
    unknown = proto.pieces[proto.trainer_spec.unk_id].piece
    tokenizer = Tokenizer(models.BPE(vocab, [], unk_token=unknown, fuse_unk=True))  # no merges: each character alone
    if steps := _normalizers(proto.normalizer_spec):
        tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    add_tokens(tokenizer, added)
    if appended not in vocab:
        raise ValueError(f"the special token {appended!r} after the ids is neither a piece nor an added token.")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {appended}", pair=f"$A $B {appended}", special_tokens=[(appended, vocab[appended])])
    return tokenizer


def write_sentencepiece_tokenizer(source: Path, destination: Path) -> list[str]:
    """Write the `tokenizer.json` of ``source``'s SentencePiece tokenizer (a class of
    :data:`SENTENCEPIECE_CLASSES`) into ``destination``; returns ["tokenizer.json"].
    ValueError, nothing written, for a tokenizer it cannot write."""
    known = sentencepiece_class(source)
    if known is None:
        raise ValueError(f"{source} has no tokenizer of {', '.join(SENTENCEPIECE_CLASSES)} with its model file.")
    config = read_json_if_present(source / "tokenizer_config.json", {})
    proto = read_sentencepiece_model(source / known.model_file)
    if (why := _refusal(proto, config)) is not None:
        raise ValueError(f"no tokenizer.json is written for {why}.")
    named = config.get(known.appended) or read_json_if_present(source / "special_tokens_map.json", {}).get(known.appended)
    appended = _content(named) or known.appended_default
    tokenizer = sentencepiece_tokenizer(proto, source_added_tokens(source, proto), appended)
    return write_backend(tokenizer, destination)
