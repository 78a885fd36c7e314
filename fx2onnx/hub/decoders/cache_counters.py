"""Cache layers that count what they have seen in Python numbers: no decode step to capture.

export-hf's decode step takes a cache's tensors as its inputs and outputs; the Python
numbers a cache layer also holds are fixed in the captured graph (`fx2onnx.capture.frozen_numbers`).
A layer whose numbers change with the tokens it has seen (DeepSeek-V4's compressed
attention counts the windows it has compressed, `entry_count`, and its compressor branches
on how many tokens wait for the next window) would give a graph that is right after a
prefill of the example's length only. Such a model is refused before anything is written,
the layers and numbers named, with the lines of the layer's methods that read each number
(DeepSeek-V4's `store_compression_weights` places the next compressed window's rotary
position at `entry_count * compress_rate`). DeepSeek-V4 itself is served by a step of
export-hf's own that takes those counts from the past length (compressed_attention.py),
before this check.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from fx2onnx.capture import frozen_numbers
from fx2onnx.hub.decoders.decode_step import CACHED_TOKENS, cache_argument, decode_step_inputs
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.tasks import UnsupportedTaskError

# the second prefill's length: a count of windows of up to this many tokens differs from the
# example prefill's (CACHED_TOKENS) one
LONGER_PREFILL = 4 * CACHED_TOKENS + 3
# methods that set a count rather than read it
_SETTERS = frozenset({"__init__", "reset"})


def counted_numbers(loaded: LoadedModel, inputs: dict[str, Any]) -> list[str]:
    """The cache layers' Python numbers ("<layer class>.<attribute>") that differ between the
    decode step's example cache (``inputs``) and the cache of a longer prefill."""
    name = cache_argument(loaded.model)
    example = frozen_numbers(inputs.get(name))
    if not example:
        return []
    try:
        longer_inputs = decode_step_inputs(loaded, cached=LONGER_PREFILL)
    except UnsupportedTaskError:  # the longer prefill does not run (a short context): nothing to compare, the
        return []  # capture goes on from the example's, as for any other cache
    longer = frozen_numbers(longer_inputs.get(name))
    changed = [key for key, value in example.items() if longer.get(key) != value]
    return list(dict.fromkeys(key.split(":", 1)[1] for key in changed))


def number_readers(layer_class: type, attribute: str) -> list[str]:
    """Where the methods of ``layer_class`` (its own and inherited) read ``self.<attribute>``:
    "<class>.<method> (`<first line reading it>`)", the class that defines the method named;
    methods that only set it (`__init__`, `reset`) and methods without a source file left out."""
    reading = re.compile(rf"\bself\.{re.escape(attribute)}\b")
    found = []
    for owner in layer_class.__mro__:
        for method_name, method in vars(owner).items():
            if method_name in _SETTERS or not inspect.isfunction(method) or inspect.getsourcefile(method) is None:
                continue
            lines, _ = inspect.getsourcelines(method)
            line = next((text.strip() for text in lines if reading.search(text)), None)
            if line is not None:
                found.append(f"{owner.__name__}.{method_name} (`{line}`)")
    return found


def _layer_classes(cache: Any) -> dict[str, type]:
    return {type(layer).__name__: type(layer) for layer in getattr(cache, "layers", None) or []}


def _described(counted: list[str], cache: Any) -> str:
    """Each counted number with the lines that read it."""
    classes = _layer_classes(cache)
    described = []
    for key in counted:
        class_name, attribute = key.split(".", 1)
        readers = number_readers(classes[class_name], attribute) if class_name in classes else []
        described.append(f"{key}, read by {'; '.join(readers)}" if readers else key)
    return "; ".join(described)


def counter_refusal(loaded: LoadedModel, inputs: dict[str, Any]) -> UnsupportedTaskError | None:
    """The error when ``loaded``'s cache layers count the tokens they have seen in Python
    numbers (None when they do not): the numbers named, with the lines that read them."""
    counted = counted_numbers(loaded, inputs)
    if not counted:
        return None
    return UnsupportedTaskError(
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) counts what its cache has seen in Python numbers: "
        f"{_described(counted, inputs.get(cache_argument(loaded.model)))} (they differ after prefills of "
        f"{CACHED_TOKENS} and {LONGER_PREFILL} tokens). A decode step takes a cache's tensors as its inputs and "
        "outputs; those numbers, and the model's Python branches on them, would be fixed in the graph at the example "
        "prefill's values, so export-hf has no text-generation folder for it. Nothing was written. A task of one pass "
        "without a cache is not affected: export it with fx2onnx.dynamo_export and use_cache=False."
    )
