"""Export options."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from diagnostics import DiagnosticOptions
from diagnostics.checked_fields import CheckedFields, at_least, described, one_of
from dispatcher import OnnxRegistry

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

DEFAULT_REPORT_PATH = "report_dynamo_export.sarif"
# "onnxruntime": its own kernels allowed where faster; "standard": ONNX operators only.
RUNTIMES = ("onnxruntime", "standard")
# "default": module functions and fused kernels as the options say; "portable": one flat
# graph of standard operators that every ONNX runtime reads (OpenVINO, TVM, onnxruntime).
TARGETS = ("default", "portable")
# the opset of every export unless one is asked for, torch.onnx.export's default too: GELU
# is one operator there (Gelu, opset 20) instead of five; the model is built at torchlib's
# opset (18) and converted. OpenVINO 2026.4, TVM 0.27 and onnxruntime-web 1.31 implement it.
DEFAULT_OPSET = 20


# ExportOptions.precision's names -> bits of the weights
PRECISIONS = {"int4": 4, "int8": 8}
# WeightQuantization.algorithm: block scales from the extremes, or searched (onnx_passes/block_scales.py)
QUANTIZATION_ALGORITHMS = ("rtn", "search")


@dataclass(frozen=True)
class WeightQuantization:
    """How linear layers' weights are quantized.

    Args:
        bits: 4 or 8.
        block_size: rows of W (along K) sharing a scale; a power of two, at least 16.
            32, as the model builder's CPU default, keeps int4 close to float.
        accuracy_level: MatMulNBits' minimum accuracy of the activations: 4 (int8
            activations, the fast CPU path), 0 or 1 (float activations).
        symmetric: no zero points (the implicit 2 ** (bits - 1)); False stores one per block.
        lm_head: quantize the language-model head too (the builder's default for int4).
        lm_head_block_size: the language-model head's block size (same rules as
            ``block_size``; halved while it does not divide the head's input features,
            down to ``block_size``); None (default): ``block_size``. The head is the
            largest multiply of a decode step, and its kernel runs faster with bigger blocks.
        lm_head_algorithm: the language-model head's ``algorithm``; None (default):
            ``algorithm``.
        lm_head_symmetric: the language-model head's ``symmetric``; None (default):
            ``symmetric``. A tied embedding gathers from the head's codes only when they
            are symmetric.
        embedding: quantize the token embedding too, as ``GatherBlockQuantized`` with the
            same bits and blocks (`embedding_quantization`; the builder's ``int4`` does
            not by default).
        algorithm: how each block's scale (and zero point) is chosen: ``"rtn"``
            (round-to-nearest: from the block's extremes, onnxruntime's quantizer's codes
            byte for byte) or ``"search"`` (the candidate scale with the least squared
            error of the block, never more than round-to-nearest's; same size).
        int8_layers: fnmatch patterns of weight names (``"*layers.0.*down_proj*"``)
            quantized with 8 bits whatever ``bits`` says: mixed precision for the layers
            that suffer most (export-hf's ``--mixed-precision`` gives its rule's patterns).
        codes_of: the codes a pre-quantized checkpoint already holds: for a weight's name,
            None to keep that weight float, or what reads its MatMulNBits inputs (an
            ``onnx_passes.nbits_packing.PackedWeight`` of these bits and blocks) when the
            model is written, used as they are instead of quantizing the weight. None
            (default): every linear weight quantized by ``algorithm``.
        packed_projections: the ``MatMulNBits`` of the main graph that read one input (Q, K
            and V; gate and up) packed into one and a ``Split``
            (`onnx_passes.packed_projections`; a flat graph's layers only). False
            (default): only the Q, K and V of a ``GroupQueryAttention``, which reads them
            packed (no ``Split`` where it runs).
        dynamic_activations: 8 bits only: instead of ``MatMulNBits``, every float32 linear
            layer of the main graph as ``MatMulInteger`` of its input quantized at run time
            (`onnx_passes.dynamic_quantization`; an encoder's int8). The other fields but
            ``bits`` do not apply.
    """

    bits: int = 4
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    lm_head: bool = True
    lm_head_block_size: int | None = None
    lm_head_algorithm: str | None = None
    lm_head_symmetric: bool | None = None
    embedding: bool = False
    algorithm: str = "rtn"
    int8_layers: tuple[str, ...] = ()
    codes_of: "Callable[[str], Callable[[], Any] | None] | None" = None
    packed_projections: bool = False
    dynamic_activations: bool = False

    @staticmethod
    def of(precision: "str | WeightQuantization | None") -> "WeightQuantization | None":
        """The quantization `ExportOptions.precision` asks for: "int4" or "int8" with
        the defaults above, a `WeightQuantization` as it is, None for float weights."""
        if precision is None or isinstance(precision, WeightQuantization):
            return precision
        if precision not in PRECISIONS:
            raise ValueError(f"ExportOptions(precision={precision!r}): precision takes {', '.join(map(repr, PRECISIONS))}, "
                             "a WeightQuantization or None.")
        return WeightQuantization(bits=PRECISIONS[precision])

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"weight quantization has 4 or 8 bits, not {self.bits}.")
        for block_size in (self.block_size, self.lm_head_block_size):
            if block_size is not None and (block_size < 16 or block_size & (block_size - 1)):
                raise ValueError(f"the block size must be a power of two of at least 16 (MatMulNBits); got {block_size}.")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"the accuracy level is 0 to 4 (MatMulNBits); got {self.accuracy_level}.")
        for algorithm in (self.algorithm, self.lm_head_algorithm):
            if algorithm is not None and algorithm not in QUANTIZATION_ALGORITHMS:
                raise ValueError(f"the quantization algorithm is one of {', '.join(QUANTIZATION_ALGORITHMS)}; got {algorithm!r}.")
        if isinstance(self.int8_layers, str):
            raise TypeError("int8_layers is a tuple of name patterns, not one string: give (pattern,).")
        if self.dynamic_activations and (self.bits != 8 or self.packed_projections):
            raise ValueError("dynamic_activations quantizes to 8 bits with MatMulInteger (no MatMulNBits to pack): "
                             "give bits=8 and packed_projections=False.")

    def of_lm_head(self, k: int) -> "WeightQuantization":
        """The quantization of a language-model head of ``k`` input features: its own
        algorithm and zero points, and its own block size halved down to one that divides ``k`` (a padded
        block would add work), but never below `block_size`."""
        block_size = self.lm_head_block_size or self.block_size
        while block_size > self.block_size and k % block_size:
            block_size //= 2
        symmetric = self.symmetric if self.lm_head_symmetric is None else self.lm_head_symmetric
        return dataclasses.replace(self, block_size=block_size, algorithm=self.lm_head_algorithm or self.algorithm,
                                   symmetric=symmetric, lm_head_block_size=None, lm_head_algorithm=None,
                                   lm_head_symmetric=None)

    def bits_of(self, weight_name: str) -> int:
        """The bits of the weight named ``weight_name``: 8 where `int8_layers` matches it."""
        return 8 if any(fnmatch.fnmatchcase(weight_name, pattern) for pattern in self.int8_layers) else self.bits



@dataclass
class ONNXFakeContext:
    """What `enable_fake_mode()` yields; pass it as `ExportOptions(fake_context=...)`.

    Attributes:
        fake_mode: the FakeTensorMode the model and example inputs were created in.
        state_dict_paths: kept for the former API's shape; fx2onnx records no paths, give
            the weights to `ONNXProgram.save(..., model_state=...)` instead.
    """

    fake_mode: FakeTensorMode
    state_dict_paths: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ModuleFunctionOptions(CheckedFields):
    """Which module calls become model-local ONNX functions.

    A pattern is a module class (`torch.nn.Linear`) or a string matched (fnmatch style)
    against the class's qualified name (`transformers.models.gpt2.modeling_gpt2.GPT2Block`),
    its short name (`GPT2Block`) and the attribute path of the call (`transformer.h.*`).
    Calls that are not functions are inlined into the caller's graph.

    Attributes:
        include: None: every module call; otherwise only calls that match one pattern.
        exclude: calls that match one of these patterns are never functions.
        torch_nn_leaves: whether torch.nn modules with no module calls inside (Linear,
            LayerNorm, ReLU...) become functions too.
        share_identical: one definition for functions whose bodies are structurally
            identical (same ops, attributes, types and shapes), called from every site.
    """

    include: tuple[str | type, ...] | None = None
    exclude: tuple[str | type, ...] = ()
    torch_nn_leaves: bool = True
    share_identical: bool = True

    @staticmethod
    def resolve(value: "bool | ModuleFunctionOptions") -> "ModuleFunctionOptions | None":
        """The options in effect for `ExportOptions.module_functions` (None: flat graph)."""
        if isinstance(value, ModuleFunctionOptions):
            return value
        return ModuleFunctionOptions() if value else None


@dataclass
class ExportOptions(CheckedFields):
    """Options of `fx2onnx.dynamo_export`.

    Every field is checked against its type and accepted values when it is given (at
    construction or when set): a wrong one is a TypeError or ValueError that names it,
    the value and what is accepted (`diagnostics.checked_fields`).

    Attributes:
        dynamic_shapes: True makes every input dim dynamic; a `torch.export` dynamic-shapes
            spec (dict or tuple of `torch.export.Dim`) is taken as it is; False/None: static.
        onnx_registry: where operators find their ONNX functions (user registrations win).
        diagnostic_options: verbosity and warnings-as-errors of the SARIF diagnostics.
        failure_report_path: where the SARIF report goes when the export fails
            (None: no file is written).
        optimize: True (default): run onnxscript's optimizer on the result (constant
            folding, dead code, fused ops onnxruntime runs faster); module functions are
            kept. False: the graph as translated.
        module_functions: which `nn.Module` calls become ONNX model-local functions.
            True (default): every module call; False: none, one flat graph; or a
            `ModuleFunctionOptions` to choose modules and the treatment of torch.nn leaves.
        fake_context: what `fx2onnx.enable_fake_mode()` yielded, when the model or its
            example inputs were created in fake mode (weights are then declared without
            data; give them to `ONNXProgram.save(..., model_state=...)`).
        progress: show the export's progress (stages, nodes of translation) as a bar on
            stderr when it is a terminal; None (default): only for exports that last more
            than a few seconds; False: never.
        op_level_debug: after export, run each translated FX node (or module function
            call) in onnxruntime on the values PyTorch computes for the example inputs,
            and report every node that differs (FXE0013 warnings, first divergence named).
        verify: after export, run the model once in onnxruntime on the example inputs
            and compare with eager PyTorch (`verify_rtol`, `verify_atol`); a runtime
            failure or a mismatch fails the export (FXE0024, naming the ONNX node, the FX
            node and the source line). Skipped for fake inputs or weights.
        verify_rtol: the relative tolerance of `verify` (default 1e-3).
        verify_atol: the absolute tolerance of `verify` (default 1e-4).
        opset_version: the ONNX opset of the model, from 17 to the newest the installed
            onnxruntime runs; None (default): 20, as torch.onnx.export writes (GELU is one
            `Gelu` operator from 20 on). The model is built at 18, the opset torchlib's
            functions are written in, and converted, module functions kept.
        fused_kernels: True (default): from opset 23 on, scaled-dot-product attention
            becomes one ONNX `Attention` kernel (fx2onnx/fx_passes/fused_kernels/ says
            when a node stays unfused, and a note says why). False: every node as
            PyTorch decomposes it.
        runtime: what the model is for. "onnxruntime" (default): onnxruntime's own
            kernels (domain `com.microsoft`) where a fused-kernel rule finds them faster;
            "standard": ONNX operators only, for any runtime.
        causal_mask_input: the name of a model input (batch, total length) of ones, and
            zeros for padding, from which every attention mask of the model is built, as
            causal attention over the tokens it holds with the new ones last
            (transformers' decoders; export-hf sets it), or that within a sliding window
            of the last W tokens it holds (``cumsum(mask)[query] - cumsum(mask)[key] < W``,
            export-hf's sliding layers: the kernel's `local_window_size`, the exact form
            where a row has padding after a held token). Attention over a KV cache input
            may then become onnxruntime's `GroupQueryAttention`, which appends the new
            tokens to the cache in place when the runtime gives past and present one
            buffer (exact for every mask: the padding is its attention bias; the standard
            form runs the steps it refuses). None (default): masks are the model's own.
        context_length: the longest sequence (cached and new tokens) the model is made
            for (export-hf: its config's). A `GroupQueryAttention` that rotates its query
            and key itself reads tables of that many positions; a longer step rotates
            outside the kernel, as exactly. None (default): 4096 positions.
        precision: "int4" or "int8": every linear layer whose weight is stored (graph and
            module functions) becomes onnxruntime's weight-only `MatMulNBits`, symmetric
            blocks of 32 weights along K, int8 activations inside the kernel (accuracy
            level 4), as a step of the ONNX passes; the codes and scales are computed
            from each weight when the model is written (from `model_state` in fake
            mode). A `WeightQuantization` chooses the bits, blocks, accuracy level,
            zero points, the language-model head (`logits`) and the token embedding.
            `MatMulNBits` is onnxruntime's operator (domain `com.microsoft`), whatever
            `runtime` says. None (default): float weights.
        target: the kind of file. "default": as the other options say (module calls as
            ONNX functions, which onnxruntime inlines when it loads the file). "portable":
            a file for any ONNX runtime (OpenVINO and TVM take no model-local functions
            and misread some fused kernels): one flat graph whose nodes carry their
            module's path in their names and in the metadata key
            ``pkg.fx2onnx.module`` (``pkg.fx2onnx.module_class``: its class), ONNX
            operators only (``runtime="standard"``) at opset 20 unless
            ``opset_version`` says otherwise, attention, rotary embedding and RMS norm as
            the operators PyTorch decomposes them into (GELU is the one fused kernel),
            batch normalization folded into the convolution or linear layer before it,
            and the nodes that read only weights folded (weights with data only: a
            program whose weights were folded refuses ``save(model_state=...)``). It
            overrides ``module_functions`` and ``runtime``.
    """

    # the accepted values of `runtime` (the command line offers them)
    RUNTIMES: ClassVar[tuple[str, ...]] = RUNTIMES
    # the names `precision` takes (the command line offers them)
    PRECISIONS: ClassVar[tuple[str, ...]] = tuple(PRECISIONS)

    dynamic_shapes: bool | dict | tuple | list | None = None
    onnx_registry: OnnxRegistry | None = None
    diagnostic_options: DiagnosticOptions = field(default_factory=DiagnosticOptions)
    failure_report_path: str | os.PathLike | None = DEFAULT_REPORT_PATH
    optimize: bool = True
    module_functions: bool | ModuleFunctionOptions = True
    fake_context: ONNXFakeContext | None = None
    progress: bool | None = None
    op_level_debug: bool = False
    verify: bool = False
    verify_rtol: float = field(default=1e-3, metadata=at_least(0))
    verify_atol: float = field(default=1e-4, metadata=at_least(0))
    opset_version: int | None = None  # its range depends on the installed onnxruntime: checked by dynamo_export
    fused_kernels: bool = True
    runtime: str = field(default="onnxruntime", metadata=one_of(*RUNTIMES))
    causal_mask_input: str | None = None
    context_length: int | None = field(default=None, metadata=at_least(1))
    precision: str | WeightQuantization | None = field(
        default=None, metadata=described("'int4', 'int8', a WeightQuantization or None"))
    target: str = field(default="default", metadata=one_of(*TARGETS))

    # the accepted values of `target`
    TARGETS: ClassVar[tuple[str, ...]] = TARGETS

    def for_target(self) -> "ExportOptions":
        """The options the export runs with: those that `target` fixes set to its values."""
        if self.target != "portable":
            return self
        return dataclasses.replace(self, module_functions=False, runtime="standard",
                                   opset_version=self.opset_version or DEFAULT_OPSET)

    @property
    def opset(self) -> int:
        """The opset the model is written at: `opset_version`, or `DEFAULT_OPSET`."""
        return self.opset_version or DEFAULT_OPSET
