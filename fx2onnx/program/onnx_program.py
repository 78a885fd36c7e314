"""ONNXProgram: the exported model, how to save it, run it, and what the export reported."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import onnx_ir as ir
import torch

from diagnostics import Diagnostic, DiagnosticContext
from dispatcher import torch_dtype_to_onnx
from fx2onnx.capture.library_adapters import checkpoint_renaming, registered_containers
from fx2onnx.program.io_adapter import InputAdapter, OutputAdapter
from fx2onnx.translate.io_slots import MutationOutput
from fx2onnx.program.low_precision import has_bfloat16, widen_bfloat16
from fx2onnx.program.model_signature import BUFFER, CONSTANT_TENSOR, ModelSignature
from fx2onnx.program.model_state import (
    ModelState,
    WeightSource,
    describe_name_mismatch,
    listing,
    match_state_names,
    open_model_state,
)
from fx2onnx.onnx_passes.batch_norm_folding import folded_weights
from fx2onnx.onnx_passes.inlining import inlined_model
from fx2onnx.onnx_passes.serialization import serialize_model
from fx2onnx.onnx_passes.fake_weights import fake_weights, proto_with_weights_as_inputs
from fx2onnx.options import ONNXFakeContext
from fx2onnx.onnx_passes.derived_weights import derived_initializers, initializer_sources
from fx2onnx.onnx_passes.weight_layout import stored_form
from fx2onnx.program.model_writer import WeightGetter, initializer_bytes, program_getters, write_embedded, write_model

# Protobuf cannot hold more than 2 GiB: larger models keep their weights in a data file.
_PROTOBUF_LIMIT = 2**31 - 1


class ONNXProgram:
    """An exported ONNX model with its PyTorch-facing adapters and diagnostics.

    >>> import fx2onnx
    >>> model, x = torch.nn.Linear(4, 2).eval(), torch.randn(3, 4)
    >>> program = fx2onnx.dynamo_export(model, x)
    >>> torch.testing.assert_close(program(x), model(x).detach())  # runs in onnxruntime
    >>> folder = Path(tempfile.mkdtemp())
    >>> program.save(folder / "model.onnx")
    >>> program.save_diagnostics(folder / "report.sarif")
    >>> sorted(path.name for path in folder.iterdir())
    ['model.onnx', 'report.sarif']
    >>> import shutil; shutil.rmtree(folder)
    """

    def __init__(
        self,
        model: ir.Model | None,
        input_adapter: InputAdapter | None,
        output_adapter: OutputAdapter | None,
        diagnostic_context: DiagnosticContext,
        *,
        export_exception: BaseException | None = None,
        stage_seconds: dict[str, float] | None = None,
        mutation_outputs: Sequence[MutationOutput] = (),
        module: torch.nn.Module | None = None,
        model_signature: ModelSignature | None = None,
        fake_context: ONNXFakeContext | None = None,
    ) -> None:
        self._model = model
        self._input_adapter = input_adapter
        self._output_adapter = output_adapter
        self.diagnostic_context = diagnostic_context
        self.export_exception = export_exception
        # How long each export stage took (capture, decomposition, passes, translation, ...).
        self.stage_seconds = dict(stage_seconds or {})
        # Graph outputs holding the new values of mutated user inputs and buffers
        # (named `<target>.mutated`); `__call__(..., write_back=True)` applies them.
        self.mutation_outputs: list[MutationOutput] = list(mutation_outputs)
        # The exported module, whose buffers write_back updates unless another is given.
        self.module = module
        self._model_signature = model_signature
        self.fake_context = fake_context
        # weights given by apply_weights(), used when save/run get no model_state
        self._applied_state: ModelState | None = None
        self._session = None

    @property
    def diagnostics(self) -> list[Diagnostic]:
        """Every diagnostic the export recorded (``d.level``, ``d.rule.id``, ``d.message``,
        ``d.location``); the same content as the SARIF report."""
        return list(self.diagnostic_context.diagnostics)

    @property
    def warnings(self) -> list[Diagnostic]:
        """The warnings of the export (each kind was also emitted as an ExportWarning)."""
        return self.diagnostic_context.warnings()

    # -- the model -----------------------------------------------------------------------
    def _require_model(self) -> ir.Model:
        if self._model is None:
            raise RuntimeError(
                "This ONNXProgram comes from a failed export and holds no model; "
                "see its diagnostics (save_diagnostics) for what failed."
            ) from self.export_exception
        return self._model

    @property
    def model(self) -> ir.Model:
        """The model as onnx_ir."""
        return self._require_model()

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an `onnx.ModelProto` (weights included). A program exported in
        fake mode has no weight data: its weights are graph inputs, as in
        `save(..., include_initializers=False)`."""
        model = self._require_model()
        if fake_weights(model):
            return proto_with_weights_as_inputs(model)
        return serialize_model(model)

    @property
    def model_signature(self) -> ModelSignature | None:
        """torch.export's graph signature in ONNX names: which inputs are user inputs,
        parameters, buffers, constants; which outputs are user outputs and mutated
        buffers or inputs. None when the export failed."""
        return self._model_signature

    @property
    def has_weight_data(self) -> bool:
        """False for a program exported in fake mode (weights declared, without data)."""
        return not fake_weights(self._require_model())

    # -- saving --------------------------------------------------------------------------
    def save(
        self,
        destination: str | os.PathLike | BinaryIO,
        *,
        include_initializers: bool = True,
        model_state: ModelState | None = None,
        external_data: bool | None = None,
        data_name: str | None = None,
        inline_functions: bool = False,
    ) -> None:
        """Write the model to `destination`.

        Args:
            destination: a file path, or a binary stream for a model with embedded weights.
            include_initializers: False writes the graph without weight data: each
                weight becomes a graph input named after it (as the former
                `torch.onnx.dynamo_export` did), to ship the weights apart.
            model_state: the weights to write, by parameter and buffer name: a state
                dict, or the path of a `torch.save` checkpoint (memory-mapped) or of a
                `.safetensors` file (read tensor by tensor). Needed for a program
                exported in fake mode; for another program it replaces its weights.
            external_data: weights in a data file beside the model (`<name>.data`);
                by default only when they are too large for one protobuf (2 GB). They
                are streamed tensor by tensor, never all in memory at once.
            data_name: the data file's name instead of `<name>.data` (Transformers.js
                and onnxruntime-web fetch it as `<name>_data`).
            inline_functions: write the model with its module functions inlined, for
                runtimes that take no ONNX functions (OpenVINO, TVM): the nodes are named
                after their module's place (``layer1.0/conv1/...``, metadata key
                ``pkg.fx2onnx.module``), constants folded across the former functions
                and kept as initializers, batch normalization folded into the layer
                before it and nodes that read only weights folded (unless the weights
                come from ``model_state``). The program is unchanged.

        A symlink is followed to its target; a destination that exists and is not a
        regular file is an error and is left untouched; missing parent folders are
        created. Everything is written under temporary names and moved in place at the
        end, so a failed or interrupted save leaves the destination as it was. Saving
        without external data deletes the `<name>.data` file that a previous save of
        fx2onnx wrote for the model it replaces (and no other file).
        """
        model = self._require_model()
        if inline_functions:
            own_weights = model_state is None and self._applied_state is None and self.has_weight_data
            model = inlined_model(model, fold_weights=own_weights)
        if not include_initializers:
            if model_state is not None:
                raise ValueError(
                    "model_state gives the weights to write, but include_initializers=False writes none: "
                    "drop one of the two."
                )
            if hasattr(destination, "write"):
                destination.write(proto_with_weights_as_inputs(model).SerializeToString(deterministic=True))  # type: ignore[union-attr]
            else:
                write_model(model, destination, None, external_data=False)
            return
        if external_data is None:
            external_data = initializer_bytes(model) >= _PROTOBUF_LIMIT
        if model_state is None:
            model_state = self._applied_state
        if hasattr(destination, "write"):
            if external_data:
                raise ValueError(
                    "'destination' should be provided as a path-like string when saving a model larger than "
                    "2GB or with external_data=True: the weights are written to a data file beside the model."
                )
            with self._weight_getters(model_state, model) as getters:
                write_embedded(model, getters, destination)  # type: ignore[arg-type]
            return
        with self._weight_getters(model_state, model) as getters:
            write_model(model, destination, getters, external_data=external_data, data_name=data_name)

    @contextlib.contextmanager
    def _weight_getters(self, model_state: ModelState | None, written: ir.Model | None = None) -> Iterator[dict[str, WeightGetter]]:
        """Where each initializer's tensor comes from: the program (or the model
        ``written`` in its place, an inlined copy), or ``model_state``."""
        model = self._require_model()
        if model_state is None:
            self._require_weight_data("save it with real weights: program.save(path, model_state=...)")
            yield program_getters(written or model)
            return
        folded = folded_weights(model)
        if folded:
            raise ValueError(
                f"This program computed {len(folded)} initializer(s) ({folded[0]!r}, ...) from its weights at export "
                "(batch normalization folded into the layer before it, nodes that read only weights: the portable "
                "target), which a model_state's weights would not change. Export the model with those weights "
                "loaded instead, or with ExportOptions(target='default')."
            )
        with open_model_state(model_state) as source:
            getters = self._getters_from(source)
            if written is not None:  # an inlined copy: its own constants, the checkpoint's weights
                getters = {**program_getters(written), **{n: g for n, g in getters.items() if n in written.graph.initializers}}
            yield getters

    def apply_weights(self, model_state: ModelState) -> None:
        """Use these weights (state dict or checkpoint path) for every later `save` and
        run that is not given a `model_state` of its own."""
        self._applied_state = model_state
        self._session = None

    def _require_weight_data(self, what_to_do: str) -> None:
        missing = fake_weights(self._require_model())
        if missing:
            raise ValueError(
                f"This program was exported in fake mode: its {len(missing)} weight(s) ({missing[0]!r}, ...) "
                f"have no data. Give the real weights: {what_to_do}, where model_state is a state dict "
                "or the path of a torch.save or .safetensors checkpoint."
            )

    def _getters_from(self, source: WeightSource) -> dict[str, WeightGetter]:
        """Where each initializer's tensor comes from; a source that lacks weights the
        model needs is an error, raised before anything is written.

        Needed: the weights without data (fake mode) and the parameters. Buffers and
        constants the program holds are replaced when the source has them and kept
        otherwise (a checkpoint lacks non-persistent buffers; fake mode computed them).
        """
        model = self._require_model()
        signature = self._model_signature
        by_onnx_name = signature.torch_names() if signature else {}
        derived = derived_initializers(model)
        # a derived initializer (a quantized weight, packed weights) is read as the weights it comes from
        torch_names = {
            name: [by_onnx_name.get(source) or source for source in sources]
            for name, sources in initializer_sources(model).items()
        }
        every_name = {torch_name for names in torch_names.values() for torch_name in names}
        without_data = {torch_name for name in fake_weights(model) for torch_name in torch_names[name]}
        parameters = set(signature.parameters.values()) if signature else every_name
        required = without_data | (parameters & every_name)
        optional = every_name - required
        known = set(signature.weight_names() if signature else ()) | every_name
        aliases = signature.aliases() if signature else {}
        match = match_state_names(required, optional, source.names(), aliases, known, checkpoint_renaming(self.module))
        if match.missing:
            raise ValueError(describe_name_mismatch(match.missing, match.unexpected, self._missing_hint(match.missing)))
        if match.unexpected:
            warnings.warn(
                f"model_state has {len(match.unexpected)} tensor(s) the exported model does not use, "
                f"ignored: {listing(match.unexpected, 10)}.",
                stacklevel=4,
            )
        state_dict_names = set(signature.state_dict_names()) if signature else set()
        persistent_kept = [n for n in match.not_given if n in state_dict_names]
        if persistent_kept:
            warnings.warn(
                f"model_state lacks {len(persistent_kept)} buffer(s) of the model's state dict "
                f"({listing(persistent_kept, 5)}): their values at export are kept (computed when the model was built).",
                stacklevel=4,
            )
        getters = program_getters(model)
        for name, names in torch_names.items():
            if any(torch_name not in match.found for torch_name in names):
                continue
            givens = tuple(match.found[torch_name] for torch_name in names)
            if name in derived:
                tensor = derived[name]
                weights = tensor.group.sources
                getters[name] = lambda givens=givens, tensor=tensor, weights=weights: tensor.from_weights(
                    givens, lambda: [stored_form(weight, source.get(given)) for weight, given in zip(weights, givens)]
                )
            else:
                value, (given,) = model.graph.initializers[name], givens
                getters[name] = lambda given=given, value=value: stored_form(value, source.get(given))
        return getters

    def _missing_hint(self, missing: list[str]) -> str:
        signature = self._model_signature
        if signature is None:
            return ""
        not_in_state_dict = {
            e.torch_name for e in signature.inputs if e.kind == CONSTANT_TENSOR or (e.kind == BUFFER and e.persistent is False)
        }
        if not_in_state_dict & set(missing):
            return (
                " Non-persistent buffers and constants are not in state_dict(): add them, e.g. "
                "{**model.state_dict(), **dict(model.named_buffers())}."
            )
        return ""

    def save_diagnostics(self, destination: str | os.PathLike) -> None:
        """Write the SARIF 2.1.0 report of this export (the path must end with .sarif),
        by the same rules as `save`: symlinks followed, non-regular files refused,
        parent folders created, written atomically."""
        self.diagnostic_context.dump(os.fspath(destination))

    # -- running -------------------------------------------------------------------------
    def adapt_torch_inputs_to_onnx(
        self, *args: Any, model_with_state_dict: torch.nn.Module | None = None, **kwargs: Any
    ) -> list[torch.Tensor]:
        """The flat list of tensors the ONNX graph takes for these PyTorch inputs.

        ``model_with_state_dict`` is accepted for the former API's signature and not
        needed: weights are initializers of the saved model (`save(..., model_state=...)`),
        never inputs to feed, except in `include_initializers=False` files.
        """
        if self._input_adapter is None:
            raise RuntimeError("This ONNXProgram has no input adapter (the export failed).")
        with registered_containers():
            expected = list(self._model.graph.inputs) if self._model is not None else None
            return self._input_adapter.apply(args, kwargs, expected)

    def adapt_torch_outputs_to_onnx(self, model_outputs: Any) -> list[Any]:
        """The flat list of tensors (complex as real pairs) that ONNX gives for these
        PyTorch outputs: compare it with the onnxruntime results."""
        with registered_containers():
            return OutputAdapter.flatten_torch_outputs(model_outputs)

    def _inference_session(self, model_state: ModelState | None = None):  # noqa: ANN202 - onnxruntime.InferenceSession
        """The onnxruntime session; ``model_state`` gives (new) weights for it."""
        if self._session is not None and model_state is None:
            return self._session
        if model_state is None:
            model_state = self._applied_state
        import onnxruntime as ort

        options = ort.SessionOptions()
        # fatal only: an error the run raises is not printed a second time as onnxruntime's log line
        options.log_severity_level = 4
        model = self._require_model()
        if model_state is None:
            self._require_weight_data(
                "program.save(path, model_state=...) and run that file, or program(*inputs, model_state=...)"
            )
        # Decided from the weights, before serializing: a model too large for one
        # protobuf, or weights from a checkpoint, go to a file with external data.
        if model_state is None and initializer_bytes(model) < _PROTOBUF_LIMIT:
            self._session = session_on_cpu(self.model_proto, options)
        else:
            with tempfile.TemporaryDirectory(prefix="fx2onnx-run-") as folder:
                path = Path(folder) / "model.onnx"
                self.save(path, model_state=model_state, external_data=True)
                self._session = session_on_cpu(path, options)
        return self._session

    def run_flat(
        self, onnx_inputs: Sequence[torch.Tensor], *, model_state: ModelState | None = None
    ) -> list[torch.Tensor]:
        """Run onnxruntime on the flat ONNX inputs; returns the flat ONNX outputs."""
        session = self._inference_session(model_state)
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(onnx_inputs):
            raise ValueError(f"The ONNX model takes {len(names)} inputs, {len(onnx_inputs)} were given.")
        tensors = [tensor.detach().cpu().contiguous() for tensor in onnx_inputs]
        widened = getattr(session, "fx2onnx_widened_outputs", None)
        if widened is not None:
            # A bfloat16 model run in float32 (no bfloat16 kernels on this runtime).
            feed = {
                name: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for name, t in zip(names, tensors)
            }
            results = [torch.from_numpy(np.asarray(r)) for r in session.run(None, feed)]
            return [r.to(torch.bfloat16) if bf16 else r for r, bf16 in zip(results, widened)]
        if not _uses_types_without_numpy(session, tensors):
            feed = {name: tensor.numpy() for name, tensor in zip(names, tensors)}
            return [torch.from_numpy(np.asarray(result)) for result in session.run(None, feed)]
        return _run_through_dlpack(session, names, tensors)

    def __call__(
        self,
        *args: Any,
        write_back: bool = False,
        module: torch.nn.Module | None = None,
        model_state: ModelState | None = None,
        model_with_state_dict: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the model in onnxruntime on PyTorch inputs; returns torch tensors in the
        model's own output structure (complex outputs restored).

        With ``write_back=True`` the new values of mutated inputs are copied into the
        given tensors and those of mutated buffers into ``module`` (default: the module
        that was exported), so that running the program has the effect running the
        model has. Buffers are read from the ONNX initializers, i.e. their values at
        export time.

        ``model_state`` (a state dict or checkpoint path, as for `save`) loads weights
        for this run and the following ones; a program exported in fake mode needs it.
        ``model_with_state_dict`` (the former API's way) takes them from a real module:
        its state dict and its non-persistent buffers.
        """
        if model_state is None and model_with_state_dict is not None:
            model_state = {**model_with_state_dict.state_dict(), **dict(model_with_state_dict.named_buffers())}
        with registered_containers():  # cache objects in and out, as at export
            onnx_inputs = self.adapt_torch_inputs_to_onnx(*args, **kwargs)
            outputs = self.run_flat(onnx_inputs, model_state=model_state)
            assert self._output_adapter is not None
            if write_back:
                self.write_back(outputs, args, kwargs, module)
            return self._output_adapter.apply(outputs)

    def write_back(
        self,
        onnx_outputs: Sequence[torch.Tensor],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        module: torch.nn.Module | None = None,
    ) -> None:
        """Copy the mutation outputs of one run into the given inputs and module buffers."""
        assert self._input_adapter is not None
        module = module if module is not None else self.module
        for mutation in self.mutation_outputs:
            new_value = onnx_outputs[mutation.onnx_index]
            if mutation.kind == "user_input":
                destination = self._input_adapter.leaf_named(mutation.target, args, kwargs)
            elif module is None:
                raise ValueError(
                    f"The model mutates buffer '{mutation.target}': pass the module to update, "
                    "program(..., write_back=True, module=model)."
                )
            else:
                destination = module.get_buffer(mutation.target)
            with torch.no_grad():
                destination.copy_(new_value.reshape(destination.shape))

    def release(self) -> None:
        """Drop the onnxruntime session."""
        self._session = None


def session_on_cpu(source: onnx.ModelProto | Path, options: Any, widened_folder: Path | None = None) -> Any:
    """An onnxruntime CPU session on a model in memory or a saved file (with external
    data); a bfloat16 model the CPU provider has no kernels for runs in float32 with casts
    at the boundary (see fx2onnx.program.low_precision). The float32 copy of a saved model
    is written to ``widened_folder`` (default: beside the model, in the caller's temporary
    folder)."""
    import onnxruntime as ort

    def session(model: onnx.ModelProto | Path) -> Any:
        loaded = str(model) if isinstance(model, Path) else model.SerializeToString()
        return ort.InferenceSession(loaded, options, providers=["CPUExecutionProvider"])

    try:
        return session(source)
    except Exception as error:  # onnxruntime raises its own pybind exception types
        if "NOT_IMPLEMENTED" not in str(error):
            raise
        # The types decide; a saved model's weights are read only when it is widened.
        header = onnx.load(str(source), load_external_data=False) if isinstance(source, Path) else source
        if not has_bfloat16(header):
            raise
    model = header
    if isinstance(source, Path):  # the header holds the weights kept in the file itself
        onnx.external_data_helper.load_external_data_for_model(model, str(source.parent))
    widened = widen_bfloat16(model)
    if isinstance(source, Path):
        # A file of its own: weights too large for one protobuf stay in a data file.
        wide_path = (widened_folder or source.parent) / f"{source.stem}.float32.onnx"
        onnx.save(widened, str(wide_path), save_as_external_data=True, location=f"{wide_path.name}.data")
        widened_session = session(wide_path)
    else:
        widened_session = session(widened)
    widened_session.fx2onnx_widened_outputs = [
        output.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 for output in model.graph.output
    ]
    warnings.warn(
        "onnxruntime's CPU provider lacks bfloat16 kernels for this model: it runs in float32 with "
        "inputs and outputs cast at the boundary (results may differ from bfloat16 arithmetic by "
        "bfloat16 rounding). To run it in bfloat16, use a provider that has the kernels "
        "(e.g. onnxruntime-gpu's CUDAExecutionProvider) on the saved model.",
        stacklevel=4,
    )
    return widened_session


# dtypes numpy has no type for: exchanged with onnxruntime through DLPack
_WITHOUT_NUMPY_TYPE = frozenset(
    {torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
)
# the same types as onnxruntime names them (`tensor(float8e4m3fn)`)
_ORT_TYPES_WITHOUT_NUMPY = frozenset(f"tensor({torch_dtype_to_onnx(dtype).name.lower()})" for dtype in _WITHOUT_NUMPY_TYPE)


def _uses_types_without_numpy(session: Any, tensors: Sequence[torch.Tensor]) -> bool:
    return any(t.dtype in _WITHOUT_NUMPY_TYPE for t in tensors) or any(
        output.type in _ORT_TYPES_WITHOUT_NUMPY for output in session.get_outputs()
    )


def _run_through_dlpack(session: Any, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run with tensors exchanged through DLPack: bfloat16 and float8 have no numpy type."""
    import onnxruntime as ort

    if not hasattr(ort.OrtValue, "from_dlpack"):
        raise RuntimeError(
            f"bfloat16 or float8 inputs or outputs need an onnxruntime with DLPack support (this is "
            f"{ort.__version__}): pip install --upgrade onnxruntime"
        )
    feed = {name: ort.OrtValue.from_dlpack(tensor) for name, tensor in zip(names, tensors)}
    results = session.run_with_ort_values(None, feed)
    return [
        torch.from_dlpack(value).clone() if value.data_type() in _ORT_TYPES_WITHOUT_NUMPY else torch.from_numpy(value.numpy())
        for value in results
    ]


__all__ = ["ONNXProgram", "session_on_cpu"]
