"""Stage 3, translation: from the FX graph to an ONNX graph on onnx_ir.

Takes the passes' GraphModule and the dispatcher; gives an `ir.Model`. First every node
that cannot be translated is reported at once (`analysis`, asking what translation
asks). Then the interpreter (`interpreter`) runs one method per FX opcode; ONNX Script
functions run under a tracing evaluator (`tracing_evaluator`) into a graph builder
(`graph_builder`, `values`) whose values carry FakeTensor dtypes and shapes
(`fake_metadata`, `tensor_data`). Inputs and outputs are laid out in `graph_io` (their
slots in `io_slots`, their ONNX names in `io_names`); module calls become model-local
functions with a reuse key (`module_functions`, `body_key`, `translated_body`), and
control flow becomes subgraphs (`control_flow`). The steps run in the order of
`TRANSLATION_STEPS`, the stage's entry `translate` (`translation_steps`).
"""
