"""Modules built in fake mode: fake parameters, real buffers, and conversions that work.

Inside `enable_fake_mode()`:
- a module's `__init__` runs outside the fake mode, so that what it computes (rotary
  `inv_freq`, causal masks, position ids, BatchNorm statistics) is real, as
  `accelerate.init_empty_weights()` does; a checkpoint never holds non-persistent
  buffers, so they must come from construction;
- every parameter is turned into a FakeTensor as it is registered (torch's public
  parameter registration hook), so weights never take memory: `torch.empty` reserves
  pages that are never touched, and initialization (`reset_parameters`, transformers'
  `post_init`) runs on the fake parameter;
- each module gets an `_apply` that converts fake parameters in place (`.float()`,
  `.half()`, `.to(dtype)`): torch's own `_apply` swaps FakeTensor parameters with
  `torch.utils.swap_tensors`, which FakeTensors refuse (they carry weak references).

Memory: buffers are as large as in the real model, usually kilobytes (a 7B LLaMA's
`inv_freq` and its copy are 64 floats each).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_REAL_INIT_FLAG = "_fx2onnx_real_init"


def _apply_to_fake_module(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
    """`nn.Module._apply` for a module with FakeTensor parameters: parameters are changed in
    place (`param.data = ...`), so that tied weights and outside references stay the same
    objects, as torch does for real parameters."""
    if recurse:
        for child in module.children():
            child._apply(fn)
    for key, param in module._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is not param:
            if isinstance(param, FakeTensor) and not isinstance(applied, FakeTensor):
                raise TypeError(
                    f"{type(module).__name__}.{key} is a fake parameter (built in fx2onnx.enable_fake_mode()); "
                    "it cannot become a real tensor: build the model outside fake mode to move real weights."
                )
            param.data = applied
        if param.grad is not None:
            with torch.no_grad():
                param.grad.data = fn(param.grad)
    for key, buffer in module._buffers.items():
        if buffer is not None:
            module._buffers[key] = fn(buffer)
    return module


class FakeModuleBuilder:
    """The hooks active inside `enable_fake_mode()` (see the module docstring)."""

    def __init__(self, fake_mode: FakeTensorMode, leave_fake_mode: Callable[[], contextlib.AbstractContextManager]) -> None:
        self._fake_mode = fake_mode
        self._leave_fake_mode = leave_fake_mode
        # the fake parameter made for each real one: a parameter registered twice (tied
        # weights) stays one parameter
        self._fakes: weakref.WeakKeyDictionary[torch.Tensor, nn.Parameter] = weakref.WeakKeyDictionary()
        # each wrapped class's own __init__ and the wrapper put in its place
        self._original_inits: dict[type, tuple[Callable[..., None], Callable[..., None]]] = {}
        self._thread = threading.get_ident()

    def _fake_parameter(self, module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or isinstance(param, FakeTensor) or threading.get_ident() != self._thread:
            return None  # keep it as given
        if param.device.type == "meta":
            return None  # already without data (e.g. built under torch.device("meta"))
        fake = self._fakes.get(param)
        if fake is None:
            # static: a weight's shape is never a symbol
            fake = nn.Parameter(self._fake_mode.from_tensor(param, static_shapes=True), requires_grad=param.requires_grad)
            self._fakes[param] = fake
        return fake

    def _wrap_init(self, cls: type) -> None:
        """Run ``cls.__init__`` outside the fake mode (``cls`` defines its own)."""
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, _REAL_INIT_FLAG, False) or not callable(init):
            return
        leave_fake_mode, thread = self._leave_fake_mode, self._thread
        is_base = cls is nn.Module

        @functools.wraps(init)
        def real_init(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            if threading.get_ident() != thread:
                init(module, *args, **kwargs)
                return
            with leave_fake_mode():
                init(module, *args, **kwargs)
            if is_base:
                # torch's _apply cannot swap fake parameters: this module converts them in place
                object.__setattr__(module, "_apply", types.MethodType(_apply_to_fake_module, module))

        setattr(real_init, _REAL_INIT_FLAG, True)
        cls.__init__ = real_init  # type: ignore[misc]
        self._original_inits[cls] = (init, real_init)

    def _wrap_new_class(self, cls: type, **kwargs: Any) -> None:
        """`nn.Module.__init_subclass__` for the time of the block: module classes defined
        inside (transformers imports its model classes lazily) are wrapped too."""
        super(nn.Module, cls).__init_subclass__(**kwargs)
        self._wrap_init(cls)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Install the hooks for the time of the block; put everything back after."""
        if "__init_subclass__" in nn.Module.__dict__:  # another block (or tool) is active: leave it
            yield
            return
        handle = nn.modules.module.register_module_parameter_registration_hook(self._fake_parameter)
        for cls in _module_classes():
            self._wrap_init(cls)
        nn.Module.__init_subclass__ = classmethod(self._wrap_new_class)  # type: ignore[assignment]
        try:
            yield
        finally:
            handle.remove()
            del nn.Module.__init_subclass__
            for cls, (init, real_init) in self._original_inits.items():
                # a class defined inside whose decorator then wrapped its __init__ (transformers'
                # `@use_experts_implementation`, which sets `self.config`) keeps the decorator's
                # wrapper: putting the bare __init__ back would drop it for every later model
                if cls.__dict__.get("__init__") is real_init:
                    cls.__init__ = init  # type: ignore[misc]
            self._original_inits.clear()


def _module_classes() -> list[type]:
    """`nn.Module` and every subclass defined so far."""
    found: dict[type, None] = {}
    pending: list[type] = [nn.Module]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found[cls] = None
            pending.extend(cls.__subclasses__())
    return list(found)


__all__ = ["FakeModuleBuilder"]
