"""ONNXProgram: the exported model, how to save it, run it, and what the export reported."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from diagnostics import DiagnosticContext
from fx2onnx.io_adapter import InputAdapter, MutationOutput, OutputAdapter

# Protobuf cannot hold more than 2 GiB: larger models keep their weights in a data file.
_PROTOBUF_LIMIT = 2**31 - 1


def _initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


class ONNXProgram:
    """An exported ONNX model with its PyTorch-facing adapters and diagnostics.

    >>> program = fx2onnx.dynamo_export(model, x)  # doctest: +SKIP
    >>> program.save("model.onnx")  # doctest: +SKIP
    >>> program(x)            # runs in onnxruntime, returns torch tensors  # doctest: +SKIP
    >>> program.save_diagnostics("report.sarif")  # doctest: +SKIP
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
        self._session = None

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
        """The model as an `onnx.ModelProto` (weights included)."""
        return ir.serde.serialize_model(self._require_model())

    # -- saving --------------------------------------------------------------------------
    def save(self, destination: str | os.PathLike, *, external_data: bool | None = None) -> None:
        """Write the model to `destination`.

        Weights go to a data file beside it (`<name>.data`) when `external_data` is True,
        or, by default, when they are too large for one protobuf (2 GB). The files are
        written under temporary names and moved in place at the end, so a failed save
        never leaves a half-written model.
        """
        model = self._require_model()
        destination = Path(destination)
        if destination.is_dir():
            raise IsADirectoryError(f"'{destination}' is a directory; give a file path such as model.onnx")
        if external_data is None:
            external_data = _initializer_bytes(model) >= _PROTOBUF_LIMIT
        destination.parent.mkdir(parents=True, exist_ok=True)
        data_name = destination.name + ".data" if external_data else None
        with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".fx2onnx-save-") as staging:
            staged = Path(staging) / destination.name
            ir.save(model, staged, external_data=data_name)
            if data_name is not None:
                os.replace(Path(staging) / data_name, destination.parent / data_name)
            os.replace(staged, destination)

    def save_diagnostics(self, destination: str | os.PathLike) -> None:
        """Write the SARIF 2.1.0 report of this export (the path must end with .sarif)."""
        self.diagnostic_context.dump(os.fspath(destination))

    # -- running -------------------------------------------------------------------------
    def adapt_torch_inputs_to_onnx(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The flat list of tensors the ONNX graph takes for these PyTorch inputs."""
        if self._input_adapter is None:
            raise RuntimeError("This ONNXProgram has no input adapter (the export failed).")
        return self._input_adapter.apply(args, kwargs)

    def adapt_torch_outputs_to_onnx(self, model_outputs: Any) -> list[Any]:
        """The flat list of tensors (complex as real pairs) that ONNX gives for these
        PyTorch outputs: compare it with the onnxruntime results."""
        return OutputAdapter.flatten_torch_outputs(model_outputs)

    def _inference_session(self):  # noqa: ANN202 - onnxruntime.InferenceSession
        if self._session is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            # Decided from the weights, before serializing: a model too large for one
            # protobuf is never copied into one, it goes to a file with external data.
            if _initializer_bytes(self._require_model()) < _PROTOBUF_LIMIT:
                self._session = ort.InferenceSession(
                    self.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
                )
            else:
                with tempfile.TemporaryDirectory() as folder:
                    path = Path(folder) / "model.onnx"
                    self.save(path, external_data=True)
                    self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return self._session

    def run_flat(self, onnx_inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run onnxruntime on the flat ONNX inputs; returns the flat ONNX outputs."""
        session = self._inference_session()
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(onnx_inputs):
            raise ValueError(f"The ONNX model takes {len(names)} inputs, {len(onnx_inputs)} were given.")
        tensors = [tensor.detach().cpu().contiguous() for tensor in onnx_inputs]
        if not _uses_bfloat16(session, tensors):
            feed = {name: tensor.numpy() for name, tensor in zip(names, tensors)}
            return [torch.from_numpy(np.asarray(result)) for result in session.run(None, feed)]
        return _run_through_dlpack(session, names, tensors)

    def __call__(
        self, *args: Any, write_back: bool = False, module: torch.nn.Module | None = None, **kwargs: Any
    ) -> Any:
        """Run the model in onnxruntime on PyTorch inputs; returns torch tensors in the
        model's own output structure (complex outputs restored).

        With ``write_back=True`` the new values of mutated inputs are copied into the
        given tensors and those of mutated buffers into ``module`` (default: the module
        that was exported), so that running the program has the effect running the
        model has. Buffers are read from the ONNX initializers, i.e. their values at
        export time.
        """
        onnx_inputs = self.adapt_torch_inputs_to_onnx(*args, **kwargs)
        outputs = self.run_flat(onnx_inputs)
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


def _uses_bfloat16(session: Any, tensors: Sequence[torch.Tensor]) -> bool:
    return any(t.dtype == torch.bfloat16 for t in tensors) or any(
        output.type == "tensor(bfloat16)" for output in session.get_outputs()
    )


def _run_through_dlpack(session: Any, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run with tensors exchanged through DLPack: bfloat16 has no numpy type."""
    import onnxruntime as ort

    if not hasattr(ort.OrtValue, "from_dlpack"):
        raise RuntimeError(
            f"bfloat16 inputs or outputs need an onnxruntime with DLPack support (this is "
            f"{ort.__version__}): pip install --upgrade onnxruntime"
        )
    feed = {name: ort.OrtValue.from_dlpack(tensor) for name, tensor in zip(names, tensors)}
    results = session.run_with_ort_values(None, feed)
    return [
        torch.from_dlpack(value).clone() if value.data_type() == "tensor(bfloat16)" else torch.from_numpy(value.numpy())
        for value in results
    ]


__all__ = ["ONNXProgram"]
