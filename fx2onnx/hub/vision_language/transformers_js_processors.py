"""What Transformers.js's own processors read from an image-text-to-text folder beyond what
transformers saves: `processor_config.json` entries its processor class reads (each written
only where the folder's file lacks it) and `preprocessor_config.json` settings its image
processor reads, computed from the model's config so that both clients expand an image into
the same tokens and cut it into the same pixels.

- Idefics3Processor (Idefics3 and SmolVLM) reads `image_seq_len`, the tokens of one crop, from
  `processor_config.json` (released checkpoints have it; an image processor saved alone not).
- PixtralProcessor (Mistral 3 and LightOnOCR) reads `image_token`, `image_break_token`,
  `image_end_token`, `patch_size` and `spatial_merge_size` from `processor_config.json` and
  writes each row of an image's tokens followed by the break token, the last by the end token;
  its PixtralImageProcessor resizes to multiples of `patch_size x spatial_merge_size` of
  `preprocessor_config.json` (a number each), where transformers' image processor resizes to
  multiples of its `patch_size` ({height, width}), given by the processor where it has one.
- Gemma3nProcessor reads `image_seq_length` and `audio_seq_length` from `processor_config.json`
  (the tokens of an image and of a clip), and builds its image processor and its feature
  extractor both from `preprocessor_config.json`, where transformers 5 saves the feature
  extractor's settings inside `processor_config.json` (`feature_extractor`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.json_files import read_json_if_present

__all__ = [
    "TokenText", "added_token_text", "feature_extractor_settings", "gemma3n_entries", "idefics3_entries", "lighton_ocr_entries", "lighton_ocr_image_settings",
    "mistral3_entries", "mistral3_image_settings",
]

# the text of a token id of the folder's tokenizer
TokenText = Callable[[int], str]
# transformers' PixtralProcessor's defaults, which it uses where processor_config.json has none
PIXTRAL_BREAK, PIXTRAL_END = "[IMG_BREAK]", "[IMG_END]"


def added_token_text(source: Path) -> TokenText:
    """The text of an added token of ``source``'s `tokenizer.json` by its id; a clear error
    for an id the tokenizer has not added (an image token always is)."""

    def text(token_id: int) -> str:
        path = source / "tokenizer.json"
        for token in read_json_if_present(path, {}).get("added_tokens", []):
            if token.get("id") == token_id:
                return str(token["content"])
        raise ValueError(f"{source} has no tokenizer.json adding token {token_id}, the config's image token: "
                         "Transformers.js's processor needs the image token's text in processor_config.json.")

    return text


def idefics3_entries(config: Any, token: TokenText) -> dict[str, Any]:
    """Idefics3Processor's `image_seq_len`: the tokens of one crop after the pixel shuffle,
    (side / patch)^2 / scale_factor^2, as the connector gives them."""
    vision = config.vision_config
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
    return {"image_seq_len": patches // int(config.scale_factor) ** 2}


def gemma3n_entries(config: Any, token: TokenText) -> dict[str, Any]:
    """Gemma3nProcessor's token counts: an image's (vision_soft_tokens_per_image) and a clip's
    (audio_soft_tokens_per_image), as the model merges them."""
    return {"image_seq_length": int(config.vision_soft_tokens_per_image),
            "audio_seq_length": int(config.audio_soft_tokens_per_image)}


def feature_extractor_settings(source: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The feature extractor's settings for `preprocessor_config.json` beside the image
    processor's ``settings``: none to add where they name its type already (released checkpoints
    save both in one file), else the `feature_extractor` part of ``source``'s
    `processor_config.json`; None where the source has neither."""
    if "feature_extractor_type" in settings:
        return {}
    nested = read_json_if_present(source / "processor_config.json", {}).get("feature_extractor")
    return dict(nested) if isinstance(nested, dict) and "feature_extractor_type" in nested else None


def _pixtral_sizes(config: Any) -> dict[str, int]:
    return {"patch_size": int(config.vision_config.patch_size), "spatial_merge_size": int(config.spatial_merge_size)}


def mistral3_entries(config: Any, token: TokenText) -> dict[str, Any]:
    """PixtralProcessor's entries for Mistral 3: the config's image token and patch sizes,
    transformers' PixtralProcessor's break and end tokens (what it uses without them)."""
    return {"image_token": token(int(config.image_token_id)), "image_break_token": PIXTRAL_BREAK,
            "image_end_token": PIXTRAL_END, **_pixtral_sizes(config)}


def lighton_ocr_entries(config: Any, token: TokenText) -> dict[str, Any]:
    """PixtralProcessor's entries for LightOnOCR, whose processor writes an image's tokens
    without breaks (LightOnOcrProcessor.replace_image_token: height x width image tokens): empty
    break and end tokens, so that Transformers.js's rows join into that run (transformers'
    LightOnOcrProcessor reads its tokens from the tokenizer and ignores these)."""
    return {"image_token": token(int(config.image_token_id)), "image_break_token": "", "image_end_token": "",
            **_pixtral_sizes(config)}


def _image_patch(patch: int) -> dict[str, int]:
    """PixtralImageProcessor's settings in Transformers.js resizing to multiples of ``patch``
    (its patch_size times its spatial_merge_size): the number transformers' image processor
    reads as {height: patch, width: patch}."""
    return {"patch_size": patch, "spatial_merge_size": 1}


def mistral3_image_settings(config: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Mistral 3's image processor resizes to multiples of the merged patch, which transformers'
    PixtralProcessor gives it (`patch_size x spatial_merge_size`, whatever the saved settings)."""
    return _image_patch(int(config.vision_config.patch_size) * int(config.spatial_merge_size))


def lighton_ocr_image_settings(config: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """LightOnOCR's image processor resizes to multiples of its own `patch_size` (its processor
    gives none): that patch, a square one."""
    patch = settings.get("patch_size", 16)  # transformers' PixtralImageProcessor's default
    if isinstance(patch, dict):
        if patch.get("height") != patch.get("width"):
            raise ValueError(f"preprocessor_config.json's patch_size {patch} is not square: Transformers.js's "
                             "PixtralImageProcessor resizes both sides to multiples of one number.")
        patch = patch["height"]
    return _image_patch(int(patch))
