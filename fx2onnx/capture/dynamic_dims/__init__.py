"""Everything about dynamic dims, in the order an export meets it.

- `spec`: the dynamic-shapes spec given to torch.export, built from
  `ExportOptions.dynamic_shapes` for every way inputs bind to `forward` (positional,
  keyword, `*args`, `**kwargs`, registered pytree classes; `signature`), and the dims
  it asks to be dynamic (`RequestedDims`);
- `switches`: what the capture runs under (size-oblivious 0/1 dims, symbolic math);
- `guards`: after the capture, the guards its ShapeEnv took and where (`SourcePlace`);
- `size_one`: dims of example size 1, which torch would fix wherever code compares them
  (a batch of one image): captured from the example repeated to size 2, kept where no
  line of the model's code compares them;
- `check`: after the capture, the dims asked to be dynamic that the model's code fixed,
  reported at the line that fixed them;
- `branches`: after the capture, the conditions on expressions of the dynamic dims that
  the model's branches assumed and nothing checks, reported at the line that branched;
- `taken_as_one`: after the capture, sizes computed from the dynamic dims that torch's
  broadcasting took as 1;
- `names`: the names dynamic dims get in the ONNX file.
"""
