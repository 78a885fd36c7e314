"""Graph values that answer the questions torchlib functions ask of their inputs."""

from __future__ import annotations

import onnx_ir as ir


class TracedValue(ir.Value):
    """An `ir.Value` that knows whether it stands for a complex tensor.

    Complex tensors are represented as real tensors with a trailing dimension of 2; the
    flag lets the dispatcher and the output adapter tell them apart from real tensors
    that happen to end in 2.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        shape: ir.Shape | None = None,
        type: ir.TypeProtocol | None = None,  # noqa: A002 - mirrors ir.Value
        is_complex: bool = False,
        const_value: ir.TensorProtocol | None = None,
    ) -> None:
        super().__init__(name=name, shape=shape, type=type, const_value=const_value)
        self.is_complex = is_complex

    # Order comparisons and a few more operators inside torchlib bodies record ONNX ops
    # (onnx_ir gives +, -, *, / and unary -); == stays identity so values remain hashable.
    def __lt__(self, other, /):
        return self._get_magic_handler().Less(self, other)

    def __le__(self, other, /):
        return self._get_magic_handler().LessOrEqual(self, other)

    def __gt__(self, other, /):
        return self._get_magic_handler().Greater(self, other)

    def __ge__(self, other, /):
        return self._get_magic_handler().GreaterOrEqual(self, other)

    def __pow__(self, other, /):
        return self._get_magic_handler().Pow(self, other)

    def __and__(self, other, /):
        return self._get_magic_handler().And(self, other)

    def __or__(self, other, /):
        return self._get_magic_handler().Or(self, other)

    def __invert__(self):
        return self._get_magic_handler().Not(self)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def set_type_and_shape(
        self, dtype: ir.DataType | None, shape: ir.Shape | None, is_complex: bool = False
    ) -> None:
        if dtype is not None:
            self.dtype = dtype
        if shape is not None:
            self.shape = shape
        self.is_complex = is_complex
