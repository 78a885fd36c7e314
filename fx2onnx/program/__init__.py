"""Stage 5, the program: what the user gets back.

`ONNXProgram` (`onnx_program`) holds the model and runs it; PyTorch inputs and outputs are
adapted to the flat ONNX ones (`io_adapter`, `model_signature`); weights come from the
model or a checkpoint (`model_state`) and are written tensor by tensor (`model_writer`);
bfloat16 runs widened (`low_precision`); optional checks against PyTorch: op by op
(`op_level_debug`) and the whole model in onnxruntime (`runtime_verification`). The
export builds the program through `PROGRAM_STEPS`, the entry `build_program`
(`program_steps`).
"""

from fx2onnx.program.checkpoint_folders import checkpoint_files, snapshot_folder
from fx2onnx.program.onnx_program import session_on_cpu
from fx2onnx.program.runtime_verification import compare_outputs

__all__ = ["checkpoint_files", "compare_outputs", "session_on_cpu", "snapshot_folder"]
