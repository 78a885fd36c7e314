"""`export_hf(..., verify=True)` of a pipeline task's folder (pipeline_tasks.py): every
output the folder's model keeps against transformers', on two input sizes (the second
with a padded row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.pipeline_tasks import example_inputs
from fx2onnx.hub.shared.verification import Tolerance, Verification, cpu_session, run_session, verdict_of


def _torch_output(outputs: Any, name: str) -> torch.Tensor:
    return outputs[name] if isinstance(outputs, dict) else getattr(outputs, name)


def verify_task_outputs(
    path: Path, model: torch.nn.Module, task: str, config: Any, tolerance: Tolerance
) -> Verification:
    """Every output of the folder's model against transformers', on two input sizes."""
    pairs: list[tuple[np.ndarray, torch.Tensor]] = []
    with cpu_session(path) as session:
        names = [o.name for o in session.get_outputs()]
        for size in (0, 1):
            inputs = example_inputs(task, config, model, size)
            actual = run_session(session, {k: v.numpy() for k, v in inputs.items()})
            with torch.no_grad():
                expected = model(**inputs)
            pairs += [(actual[name], _torch_output(expected, name)) for name in names]
    return verdict_of(pairs, tolerance)
