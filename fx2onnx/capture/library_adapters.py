"""Library adapters: the one entry through which fx2onnx uses what it knows of
third-party libraries (that knowledge lives in :mod:`fx2onnx.capture.libraries`, one
module per library).

Two kinds of adapters are active only while fx2onnx captures a model and undone
afterwards, so that the user's libraries behave as they always do outside an export:

- **containers**: transformers' cache classes as pytrees
  (:mod:`fx2onnx.capture.libraries.transformers_caches`; also active while an exported
  program runs, which takes and returns caches);
- **rewrites**: library functions whose Python code branches on a size that depends
  on the data (or loops over a data-dependent set: Switch Transformers', LongCat-Flash's and DBRX's experts, run
  densely, :mod:`fx2onnx.capture.libraries.transformers_experts`) (``if boxes.numel() == 0: return empty``), which torch.export cannot
  decide. Each is replaced by a function that computes the same result and decides
  such a branch with ``guard_or_false`` (torch's own way of saying "take the general
  path when the size is unknown"): eager calls (real sizes) take the original's branch,
  a capture (unknown sizes) the general one, which gives the same result for every
  size. :data:`CAPTURE_REWRITES` lists them; tests check each against the original
  on empty and non-empty inputs. Two rewrite torch.nn's own code: a mask's check by value
  in its Transformer layers, and ``module.to(...)`` called in forward when it would
  change nothing (returned as it is: the capture's parameters cannot be swapped). Mamba's
  and Falcon-Mamba's mixers take the padding mask's positions of their own tokens
  (:mod:`fx2onnx.capture.libraries.transformers_recurrent_masks`), since a decoder with a
  cache is given the mask of the past tokens too;
- **sizes kept symbolic**: RT-DETR-style detectors read their batch with Python's ``len``
  of a tensor, which makes a symbolic size an int fixed to the example's; their modules get
  a ``len`` that gives it as it is (:mod:`fx2onnx.capture.libraries.transformers_query_selection`);
  so does DepthPro's, which counts each scale's patches (the batch times a number per
  image) with ``len``. Every transformers module that imports ``torch_int`` (``int()`` of
  an image's size or of the square root of its patch count) gets one that keeps a symbolic
  value symbolic (:mod:`fx2onnx.capture.libraries.transformers_symbolic_sizes`);
- **model state**: transformers' dynamic rotary embeddings, which keep frequencies from
  call to call, compute them from each step's positions instead
  (:mod:`fx2onnx.capture.libraries.transformers_rope`);
- **dims kept static**: a transformers model that the table of models keeping the
  example's image size leaves to the capture (shifted-window models such as Swin; DepthPro),
  asked to keep every dim dynamic, keeps its images' height and width static
  (:mod:`fx2onnx.capture.libraries.transformers_image_sizes`, whose table export-hf's image
  folders read too);
- **model choices**: a transformers model that asks for its experts' "eager" routing loop
  runs transformers' grouped implementation during a capture
  (:func:`fx2onnx.capture.libraries.transformers_experts.experts_without_routing_loops`).

A rewrite applies only when its module is already imported (a model that uses
torchvision has imported it): fx2onnx never imports a library for it.

The other stages and the capture's other steps take from here, by name, what a library
adds after the capture: plain weights for tensor subclasses (torchao), the cache classes
(transformers' inputs and outputs), a library's own hint for a failed capture and the
names its checkpoints give weights.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.capture.libraries import torchvision_rewrites
from fx2onnx.capture.libraries.torchao_tensors import TensorSubclassError, without_tensor_subclasses
from fx2onnx.capture.libraries.transformers_audio_chunks import chunks_padded_always
from fx2onnx.capture.libraries.transformers_caches import (
    CacheOutsideLayersError,
    frozen_numbers,
    is_cache_type,
    is_encoder_decoder_cache_type,
    registered_containers,
    tensors_outside_layers,
    uncounted_sliding_caches,
)
from fx2onnx.capture.libraries.transformers_checkpoints import checkpoint_conversions, checkpoint_renaming
from fx2onnx.capture.libraries.transformers_chunked_scans import MAMBA2_SCAN_FAMILIES, scan_with_symbolic_chunks
from fx2onnx.capture.libraries.transformers_delta_rule_scans import (
    GATED_DELTA_RULE_FAMILIES, GATED_DELTA_RULE_FUNCTION, KIMI_DELTA_RULE_FAMILIES, KIMI_DELTA_RULE_FUNCTION, default_chunk,
    delta_rule_with_symbolic_chunks, kimi_rule_with_symbolic_chunks,
)
from fx2onnx.capture.libraries.transformers_experts import (
    every_expert_and_identity_weighted,
    every_expert_weighted,
    every_stacked_glu_expert_weighted,
    experts_fake_tensors_run,
    experts_without_routing_loops,
)
from fx2onnx.capture.libraries.transformers_hints import transformers_hint, transformers_version
from fx2onnx.capture.libraries.transformers_query_selection import QUERY_SELECTION_FAMILIES, first_dim_as_is
from fx2onnx.capture.libraries.transformers_recurrent_masks import mask_of_the_new_tokens
from fx2onnx.capture.libraries.transformers_rope import rope_of_the_sequence_length
from fx2onnx.capture.libraries.transformers_selective_scans import (
    SELECTIVE_SCAN_FUNCTION, SELECTIVE_SCAN_MIXERS, mixer_handing_its_state, scan_over_symbolic_length,
)
from fx2onnx.capture.libraries.transformers_token_scans import linear_recurrence_scan, wkv_scan
from fx2onnx.capture.libraries.transformers_sparsity import quantile_as_a_constant
from fx2onnx.capture.libraries.transformers_symbolic_sizes import INT_SIZED_FAMILIES, symbolic_size_as_is
from fx2onnx.capture.libraries.transformers_image_sizes import (
    SQUARE_IMAGES_REASON,
    STATIC_IMAGE_SIZES,
    KeptBy,
    StaticImageSizes,
    static_image_size_reason,
    static_image_sizes_at_capture,
)

__all__ = [
    "CAPTURE_REWRITES", "LIBRARY_HINTS", "SQUARE_IMAGES_REASON", "STATIC_IMAGE_SIZES", "CacheOutsideLayersError", "CaptureRewrite",
    "KeptBy", "StaticImageSizes", "TensorSubclassError", "checkpoint_conversions", "checkpoint_renaming", "default_scan_chunks",
    "experts_fake_tensors_run", "frozen_numbers", "is_cache_type", "is_encoder_decoder_cache_type", "library_adapters_at_capture",
    "library_hint", "registered_containers", "rewrite_site", "rewritten_library_functions", "static_image_size_reason", "static_image_sizes_at_capture",
    "tensors_outside_layers", "transformers_version", "without_tensor_subclasses",
]

# each library's hint for a capture that failed in its code: (model, error) -> a sentence or None
LIBRARY_HINTS: tuple[Callable[[Any, BaseException], str | None], ...] = (transformers_hint,)


@dataclass(frozen=True)
class CaptureRewrite:
    """``module.attribute`` replaced, during a capture, by ``replacement(original)``; so
    is the same name in ``also_in``, the modules that import the function by name (the
    library's own callers read it there). With ``shadows_builtin``, ``attribute`` names a
    Python builtin the module's code calls (``len``): the module gets a global of that
    name, ``replacement(the builtin)``, removed afterwards."""

    module: str
    attribute: str
    replacement: Callable[[Any], Any]
    why: str
    also_in: tuple[str, ...] = ()
    shadows_builtin: bool = False
    # ``module`` names a package: every module of it loaded at the capture that has a function
    # ``attribute`` of its own (the library's modules that import the function by name)
    every_module_under: bool = False

    @property
    def modules(self) -> tuple[str, ...]:
        if not self.every_module_under:
            return (self.module, *self.also_in)
        prefix = f"{self.module}."
        # read in the module's own globals: a lazy package's getattr would import its parts
        return tuple(name for name, module in list(sys.modules.items())
                     if name.startswith(prefix) and getattr(vars(module).get(self.attribute), "__name__", None)
                     == self.attribute)


def mask_is_causal_only_when_said(original: Callable[..., bool]) -> Callable[..., bool]:
    """torch.nn's Transformer layers ask whether a mask given without ``is_causal`` is
    the causal one by comparing its values (``torch.equal``), which a capture cannot
    decide; the answer only picks a kernel, as both apply the same mask. During a capture
    a mask is causal when the caller says so."""

    def detect_is_causal_mask(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
        if is_causal is None and mask is not None:
            return False
        return original(mask, is_causal, size)

    return detect_is_causal_mask


def _already(tensor: torch.Tensor, dtype: torch.dtype | None, device: torch.device | None) -> bool:
    # Module.to converts only floating-point and complex tensors to another dtype
    converted = tensor.is_floating_point() or tensor.is_complex()
    same_dtype = dtype is None or not converted or tensor.dtype == dtype
    return same_dtype and (device is None or tensor.device == device)


def module_to_unchanged_as_is(original: Callable[..., Any]) -> Callable[..., Any]:
    """``module.to(dtype)`` or ``.to(device)`` called in forward (a router that casts its
    layer to the model's dtype at every call) swaps every parameter for itself, which the
    parameters of a capture refuse (`Couldn't swap Linear.weight`). During a capture, a
    call that would change no tensor returns the module as it is; any other is the original."""

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        dtype = kwargs.get("dtype")
        device = kwargs.get("device")
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, (str, torch.device)):
                device = arg
            else:  # a tensor to take both from, or an argument not read here
                return original(self, *args, **kwargs)
        if set(kwargs) - {"dtype", "device", "non_blocking"} or (dtype is None and device is None):
            return original(self, *args, **kwargs)
        device = None if device is None else torch.device(device)
        if device is not None and device.index is None and device.type != "cpu":
            return original(self, *args, **kwargs)  # "cuda" names the current device: let torch decide
        tensors = [*self.parameters(), *self.buffers()]
        if all(_already(tensor, dtype, device) for tensor in tensors):
            return self
        return original(self, *args, **kwargs)

    return to


CAPTURE_REWRITES: tuple[CaptureRewrite, ...] = (
    CaptureRewrite(
        "torch.nn.modules.transformer", "_detect_is_causal_mask", mask_is_causal_only_when_said,
        "`torch.equal(mask, causal_mask)` on a mask given without is_causal",
    ),
    CaptureRewrite(
        "torch.nn.modules.module", "Module.to", module_to_unchanged_as_is,
        "`module.to(dtype)` in forward, whose parameters a capture cannot swap, even for themselves",
    ),
    CaptureRewrite(
        "transformers.models.switch_transformers.modeling_switch_transformers", "SwitchTransformersExperts.forward",
        every_expert_weighted,
        "a loop over the experts some token was routed to (`nonzero()`), each gathering its tokens",
    ),
    CaptureRewrite(
        "transformers.models.longcat_flash.modeling_longcat_flash", "LongcatFlashExperts.forward",
        every_expert_and_identity_weighted,
        "a loop over the experts some token was routed to (`nonzero()`), identity experts among them",
    ),
    CaptureRewrite(
        "transformers.models.dbrx.modeling_dbrx", "DbrxExperts.forward", every_stacked_glu_expert_weighted,
        "a loop over the experts some token was routed to (`nonzero()`), each gathering its tokens",
    ),
    CaptureRewrite(
        "transformers.models.gemma3n.modeling_gemma3n", "Gemma3nTextMLP._gaussian_topk", quantile_as_a_constant,
        "a constant normal quantile computed by torch.distributions, whose argument checks do not decompose",
    ),
    CaptureRewrite(
        "transformers.models.gemma3n.modeling_gemma3n", "Gemma3nAudioAttention._convert_to_block", chunks_padded_always,
        "queries padded to whole chunks only where the clip's frames do not fill them already (a branch on its length)",
    ),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", "apply_mask_to_padding_states", mask_of_the_new_tokens,
        "a padding mask multiplied with the hidden states of this forward's tokens, as long as they are only",
    ) for name in ("mamba", "falcon_mamba", "jamba")),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", "mamba2_chunk_scan", scan_with_symbolic_chunks,
        "a prompt padded to whole chunks and reshaped with an inferred number of chunks, fixed at the example's",
    ) for name in MAMBA2_SCAN_FAMILIES),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", SELECTIVE_SCAN_FUNCTION, scan_over_symbolic_length,
        "a Python loop over the tokens, unrolled for the example's length, from zeros rather than the cache's state",
    ) for name in SELECTIVE_SCAN_MIXERS),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", f"{mixer}.forward", mixer_handing_its_state,
        "a scan that starts from zeros whatever the cache holds, and reads the state only on one-token steps",
    ) for name, mixer in SELECTIVE_SCAN_MIXERS.items()),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", GATED_DELTA_RULE_FUNCTION, delta_rule_with_symbolic_chunks,
        "a prompt padded to chunks of a default argument, and a Python loop over them unrolled for the example's",
    ) for name in GATED_DELTA_RULE_FAMILIES),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", KIMI_DELTA_RULE_FUNCTION, kimi_rule_with_symbolic_chunks,
        "a prompt padded to chunks of a default argument, and a Python loop over them unrolled for the example's",
    ) for name in KIMI_DELTA_RULE_FAMILIES),
    CaptureRewrite(
        "transformers.models.recurrent_gemma.modeling_recurrent_gemma", "RecurrentGemmaRglru._rnn_scan",
        linear_recurrence_scan, "a Python loop over the tokens, unrolled for the example's",
    ),
    CaptureRewrite(
        "transformers.models.rwkv.modeling_rwkv", "rwkv_linear_attention_cpu", wkv_scan,
        "a Python loop over the tokens, unrolled for the example's",
    ),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", "len", first_dim_as_is,
        "`len(source_flatten)`, which Python makes an int: the batch fixed to the example's", shadows_builtin=True,
    ) for name in QUERY_SELECTION_FAMILIES),
    CaptureRewrite(
        "transformers.models.depth_pro.modeling_depth_pro", "len", first_dim_as_is,
        "`len()` of each scale's patches (the batch times a number per image), which Python makes an int: the batch "
        "fixed to the example's", shadows_builtin=True,
    ),
    CaptureRewrite(
        "transformers.models", "torch_int", symbolic_size_as_is,
        "`torch_int(height)`, `torch_int(sequence_length**0.5)` of an image's size or patch grid, `int()` outside "
        "TorchScript: the image's size fixed to the example's", every_module_under=True,
    ),
    *(CaptureRewrite(
        f"transformers.models.{name}.modeling_{name}", "int", symbolic_size_as_is,
        "`int(patch_height * patch_size)` of the depth map's size: the image's size fixed", shadows_builtin=True,
    ) for name in INT_SIZED_FAMILIES),
    CaptureRewrite(
        "torchvision.ops.boxes", "batched_nms", torchvision_rewrites.batched_nms,
        "`if boxes.numel() == 0` and the choice between per-class and offset NMS by the number of boxes",
        also_in=("torchvision.ops",),
    ),
    CaptureRewrite(
        "torchvision.ops.poolers", "_multiscale_roi_align", torchvision_rewrites.multiscale_roi_align,
        "`len(rois)` of a data-dependent number of boxes",
    ),
    CaptureRewrite(
        "torchvision.models.detection.roi_heads", "paste_masks_in_image", torchvision_rewrites.paste_masks_in_image,
        "a loop over a data-dependent number of boxes, each resized to a size read from its box",
        also_in=("torchvision.models.detection.transform",),
    ),
    CaptureRewrite(
        "torchvision.models.detection.roi_heads", "heatmaps_to_keypoints", torchvision_rewrites.heatmaps_to_keypoints,
        "a loop over a data-dependent number of boxes, each heatmap resized to a size read from its box",
    ),
    CaptureRewrite(
        "torchvision.models.detection.transform", "_resize_image_and_masks", torchvision_rewrites.resize_image_and_masks,
        "Python's `min` of the image's sides, which fixes a dynamic image size to the example's",
    ),
    CaptureRewrite(
        "torchvision.models.detection.transform", "GeneralizedRCNNTransform.batch_images", torchvision_rewrites.batch_images,
        "`int(math.ceil(size / stride) * stride)`, which fixes a dynamic image size to the example's",
    ),
)


_NONE = object()  # a module without a global of a rewrite's name (one shadowing a builtin)


def rewrite_site(module: Any, dotted: str) -> tuple[Any, str]:
    """(owner, name) of ``module.dotted``, a function (``name``) or a class's method
    (``Class.name``); the owner is None when the module has no such class."""
    *path, attribute = dotted.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
    return owner, attribute


def default_scan_chunks(module_name: str) -> list[int]:
    """The chunk lengths (a ``chunk_size`` argument's default, which no config names) of the
    chunked scans :data:`CAPTURE_REWRITES` rewrites in module ``module_name``; none when
    the module cannot be imported or rewrites nothing."""
    rewritten = [rewrite.attribute for rewrite in CAPTURE_REWRITES if module_name in rewrite.modules]
    if not rewritten:
        return []
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    sites = [rewrite_site(module, name) for name in rewritten]
    chunks = [default_chunk(function) for owner, name in sites if (function := getattr(owner, name, None)) is not None]
    return sorted({chunk for chunk in chunks if chunk is not None})


@contextlib.contextmanager
def rewritten_library_functions(rewrites: tuple[CaptureRewrite, ...] = CAPTURE_REWRITES) -> Iterator[None]:
    """Replace the functions of ``rewrites`` whose module is imported; restore them on
    exit, even when the block raises."""
    replaced: list[tuple[Any, str, Any]] = []  # (owner, name, its own value; _NONE: it had none)
    try:
        for rewrite in rewrites:
            for name in rewrite.modules:
                if name not in sys.modules:
                    continue
                # already loaded: no import cost
                owner, attribute = rewrite_site(importlib.import_module(name), rewrite.attribute)
                own = getattr(owner, attribute, _NONE) if owner is not None else _NONE
                original = getattr(builtins, attribute) if rewrite.shadows_builtin and own is _NONE else own
                if original is _NONE or original is None:  # another version of the library: nothing to rewrite
                    continue
                setattr(owner, attribute, rewrite.replacement(original))
                replaced.append((owner, attribute, own))
        yield
    finally:
        for module, attribute, own in reversed(replaced):
            if own is _NONE:
                delattr(module, attribute)
            else:
                setattr(module, attribute, own)


@contextlib.contextmanager
def library_adapters_at_capture(model: Any = None) -> Iterator[None]:
    """Every library adapter, for the duration of one capture of ``model``."""
    with registered_containers(), rewritten_library_functions(), rope_of_the_sequence_length(model), \
            experts_without_routing_loops(model):
        yield


def library_input_notes(args: Any, kwargs: Any) -> list[str]:
    """What a library's objects among the example inputs keep the exported model from
    computing at every size (notes warned after the capture)."""
    return uncounted_sliding_caches([*args, *dict(kwargs).values()])


def library_hint(model: Any, error: BaseException) -> str | None:
    """What to change, in the words of the library `model` comes from, or None."""
    for hint in LIBRARY_HINTS:
        if (text := hint(model, error)) is not None:
            return text
    return None
