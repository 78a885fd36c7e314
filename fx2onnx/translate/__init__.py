"""Stage 3, translation: from the FX graph to an ONNX graph on onnx_ir.

Takes the passes' GraphModule and the dispatcher; gives an `ir.Model`. The interpreter
(`interpreter`) runs one method per FX opcode; ONNX Script functions run under a tracing
evaluator (`tracing_evaluator`) into a graph builder (`graph_builder`, `values`) whose
values carry FakeTensor dtypes and shapes (`fake_metadata`); inputs and outputs
(`graph_io`), module calls as model-local functions with their reuse key
(`module_functions`, `body_key`), control flow as subgraphs (`control_flow`).
"""
