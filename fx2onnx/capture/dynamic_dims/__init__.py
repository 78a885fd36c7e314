"""Everything about dynamic dims, in the order an export meets it.

- `spec`: the dynamic-shapes spec given to torch.export, built from
  `ExportOptions.dynamic_shapes` for every way inputs bind to `forward` (positional,
  keyword, `*args`, `**kwargs`, registered pytree classes), and the switches the capture
  runs under (size-oblivious 0/1 dims, symbolic math);
- `size_one`: dims of example size 1 that torch fixed with no line of the model's code
  (a batch of one image): captured again from the example repeated to size 2;
- `check`: after the capture, the dims asked to be dynamic that the model's code fixed,
  reported at the line that fixed them;
- `names`: the names dynamic dims get in the ONNX file.
"""
