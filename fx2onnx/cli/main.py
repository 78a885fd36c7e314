"""Command line: `fx2onnx export FILE.py:Model --input x=2x16:float32` exports a user's
model; `fx2onnx demo` exports the built-in example and checks it; `fx2onnx --version`.

Every argument is checked before any work starts. Exit codes: 0 done, 1 the export (or
its verification) failed, 2 the command line is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from fx2onnx.cli.paths import check_output_paths, check_readable_file
from fx2onnx.cli.specs import UsageError, parse_dynamic_spec, parse_input_spec, parse_model_spec
from fx2onnx import ExportOptions
from fx2onnx.hub import DEFAULT_ALGORITHM, PRECISIONS, QUANTIZATION_ALGORITHMS
from fx2onnx.hub import TASKS as HUB_TASKS
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_EXPORT_EXAMPLES = """\
examples:
  fx2onnx export models/net.py:Net --input x=2x16:float32 --verify
  fx2onnx export mypkg.models:make_model --input ids=1x128:int64:0..30522 --dynamic ids=0:batch,1:seq
  fx2onnx export net.py:Net --inputs-file example_inputs.pt --output net.onnx --report net.sarif

the model: a class (instantiated with no arguments), a function with no required parameter
(a factory, called; it may return the model or (model, args) or (model, args, kwargs)), an
nn.Module instance, or a plain function of tensors (exported as it is).
"""


_EXPORT_HF_EXAMPLES = """\
examples:
  fx2onnx export-hf ./my-llama --output ./my-llama-onnx --verify
  fx2onnx export-hf ./llama-7b --output ./llama-7b-onnx --fake --dtype float16
  fx2onnx export-hf ~/.cache/huggingface/hub/models--org--name --output out --task feature-extraction
  fx2onnx export-hf ./my-sentiment-bert --output ./my-sentiment-onnx --verify   (text-classification)

the ONNX files go under onnx/ (causal LMs: onnx/model.onnx for prefill and decode, with
genai_config.json; encoder-decoders: onnx/encoder_model.onnx and onnx/decoder_model_merged.onnx;
classifiers, detectors, segmenters, CTC and the other pipeline tasks: onnx/model.onnx with the
outputs their pipelines read),
with the tokenizer as transformers loads it: the folder loads as it is in onnxruntime_genai
(og.Model(folder)), Transformers.js (from_pretrained(folder)) and Optimum (subfolder="onnx").
"""


def version_text() -> str:
    import fx2onnx

    versions = []
    for package in ("torch", "onnxscript", "onnx_ir", "onnx", "onnxruntime"):
        try:
            versions.append(f"{package} {metadata.version(package.replace('_', '-'))}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return f"fx2onnx {fx2onnx.__version__} ({', '.join(versions)})"


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so main() returns the code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


_RUNTIME_HELP = ("onnxruntime (default): its own kernels where faster (an LLM's attention over its cache as "
                 "GroupQueryAttention, the cache updated in place); standard: ONNX operators only, for any runtime")
_HUB_RUNTIME_HELP = (f"{_RUNTIME_HELP} (the portable target: OpenVINO, TVM, the browser). "
                     "Whisper: onnxruntime writes ONNX Runtime GenAI's layout, standard Optimum's (which Transformers.js "
                     "loads); image-text-to-text: onnxruntime ONNX Runtime GenAI's, standard Transformers.js's")
_OPSET_HELP = "the ONNX opset of the model, 17 to the newest onnxruntime runs (default: 20)"


def _checked_opset(opset: int | None) -> int | None:
    from fx2onnx.onnx_passes import check_opset_version

    try:
        check_opset_version(opset)
    except ValueError as error:
        raise UsageError(str(error).replace(f"ExportOptions(opset_version={opset!r})", f"--opset {opset}")) from error
    return opset


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fx2onnx", description="Export PyTorch models to ONNX.")
    parser.add_argument("--version", action="store_true", help="print the versions of fx2onnx and its libraries")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    demo = commands.add_parser("demo", help="export the built-in transformer, verify it in onnxruntime")
    demo.add_argument("--output", type=Path, default=Path("demo.onnx"))
    demo.add_argument("--report", type=Path, default=Path("demo.sarif"))
    demo.add_argument("--dynamic", action="store_true", help="export with dynamic batch and sequence dims")
    demo.add_argument("--opset", type=int, help=_OPSET_HELP)

    export = commands.add_parser(
        "export", help="export a model from a Python file or module",
        epilog=_EXPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("model", help="path/to/file.py:Name or package.module:name")
    export.add_argument(
        "--input", action="append", default=[], metavar="[NAME=]SHAPE[:DTYPE[:LOW..HIGH]]",
        help="an example input made from its shape and dtype, e.g. x=2x16:float32 or ids=1x128:int64:0..1000 "
             "(random values; integers drawn from LOW..HIGH, HIGH excluded, default 0..2); repeat per input",
    )
    export.add_argument("--inputs-file", type=Path, help="a .pt file (torch.save) of example inputs: a tuple of args, a dict of kwargs, or {'args': ..., 'kwargs': ...}")
    export.add_argument(
        "--dynamic", action="append", nargs="?", const="", default=[], metavar="NAME=DIM[:DIMNAME],...",
        help="alone: every dim of every input is dynamic; NAME=0:batch,1:seq: these dims of input NAME, named in ONNX (repeatable)",
    )
    export.add_argument("--output", type=Path, help="the ONNX file (default: <model name>.onnx)")
    export.add_argument("--report", type=Path, help="the SARIF report (default: the output's name with .sarif)")
    export.add_argument("--optimize", action=argparse.BooleanOptionalAction, default=None, help="run onnxscript's optimizer (default: ExportOptions' default)")
    export.add_argument("--opset", type=int, help=_OPSET_HELP)
    export.add_argument("--runtime", choices=ExportOptions.RUNTIMES, default="onnxruntime", help=_RUNTIME_HELP)
    export.add_argument("--no-functions", action="store_true", help="one flat graph: no ONNX functions for nn.Module calls")
    export.add_argument(
        "--precision", choices=ExportOptions.PRECISIONS,
        help="every linear layer whose weight is stored as onnxruntime's weight-only MatMulNBits: int4 or int8 codes, "
        "a scale per block of 32 weights along K (ExportOptions(precision=...))",
    )
    export.add_argument(
        "--target", choices=ExportOptions.TARGETS, default="default",
        help="default: as the other options say; portable: one flat graph of ONNX operators for any runtime "
             "(OpenVINO, TVM), batch norm and weight-only nodes folded",
    )
    export.add_argument("--verify", action="store_true", help="run the model in onnxruntime and PyTorch and compare; exit 1 when outside tolerance")
    export.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance of --verify (default 1e-3)")
    export.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of --verify (default 1e-4)")
    export.add_argument("--fake", action="store_true", help="build the model and inputs in fake mode (no weight memory); see --weights")
    export.add_argument("--weights", type=Path, help="with --fake: a checkpoint (state dict) whose weights the saved model gets")
    export.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")
    export.add_argument("--quiet", action="store_true", help="print nothing but errors")

    hub = commands.add_parser(
        "export-hf", help="export a transformers model to a folder its runtime runs (ONNX Runtime GenAI for LLMs)",
        epilog=_EXPORT_HF_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hub.add_argument("model", help="a save_pretrained folder, a Hugging Face cache folder or snapshot, or a hub id")
    hub.add_argument("--output", type=Path, required=True, help="the folder to write (new or empty)")
    hub.add_argument("--task", choices=HUB_TASKS, help="default: from the model's config")
    hub.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="default: the checkpoint's")
    hub.add_argument(
        "--precision", choices=PRECISIONS,
        help="int4/int8: a causal LM's linear layers as weight-only MatMulNBits (quantized as the weights are written, "
        "float32 activations unless --dtype float16); int8 of an encoder (feature-extraction): its linear layers as "
        "MatMulInteger of activations quantized at run time; fp32/fp16/bf16: the same as --dtype",
    )
    hub.add_argument(
        "--block-size", type=int,
        help="int4/int8: weights per scale along K, every layer's and the LM head's (default: 32, the LM head 128)",
    )
    hub.add_argument(
        "--accuracy-level", type=int, choices=range(5), default=4,
        help="int4/int8: MatMulNBits' accuracy_level (default 4: int8 activations, onnxruntime's fast CPU path)",
    )
    hub.add_argument(
        "--float-lm-head", action="store_true", help="int4/int8: keep the LM head float (default: quantized, as the GenAI builder does)"
    )
    hub.add_argument(
        "--quantize-embedding", action="store_true",
        help="int4/int8 of a causal LM: the token embedding as GatherBlockQuantized too (default: float, as the GenAI builder keeps it)",
    )
    hub.add_argument(
        "--text-only", action="store_true",
        help="a model with vision or audio encoders: export its language model alone (text-generation, the encoders left out)",
    )
    hub.add_argument(
        "--without-audio", action="store_true",
        help="Phi-4-multimodal: write its phi4mm folder for images and text, the speech model left out",
    )
    hub.add_argument(
        "--vocoder", metavar="MODEL",
        help="text-to-audio of SpeechT5: its SpeechT5HifiGan checkpoint (folder or hub id), written after the model's "
        "postnet as the folder's vocoder/",
    )
    hub.add_argument(
        "--float32-twin", action="store_true",
        help="with --precision fp16: also write each ONNX file in float32 (onnx/model.onnx beside onnx/model_fp16.onnx), "
        "which Transformers.js loads with dtype 'fp32' on WebGPU adapters without shader-f16",
    )
    hub.add_argument(
        "--quantization", choices=QUANTIZATION_ALGORITHMS, default=DEFAULT_ALGORITHM,
        help="int4/int8 of a causal LM: each block's scale from its extremes (rtn, round-to-nearest) or searched for "
        f"the least squared error of the block (search; same size) (default {DEFAULT_ALGORITHM})",
    )
    hub.add_argument(
        "--mixed-precision", action="store_true",
        help="int4 of a causal LM: 8 bits for the value and down projections of the first and last eighth of the "
        "layers and every third layer between (llama.cpp's Q4_K_M rule)",
    )
    hub.add_argument("--fake", action="store_true", help="build the model in fake mode, stream the weights from the folder")
    hub.add_argument(
        "--verify", action="store_true",
        help="run the folder as its runtime will and compare with transformers (a causal LM past every sliding window "
        "and rope switch point, and as a left-padded batch); exit 1 when an output is outside the tolerance, a greedy "
        "token differs or a run fails (the folder is kept, the failure stated)",
    )
    hub.add_argument("--rtol", type=float, help="relative tolerance of --verify (default: the model dtype's, see docs/guides/export-hf/index.md)")
    hub.add_argument("--atol", type=float, help="absolute tolerance of --verify (default: the model dtype's, see docs/guides/export-hf/index.md)")
    hub.add_argument("--tokens", type=int, default=16, help="greedy tokens --verify generates for an LLM (default 16)")
    hub.add_argument("--opset", type=int, help=_OPSET_HELP.replace("default: 20", "default: 23, fused attention kernels; 20 with --runtime standard"))
    hub.add_argument("--runtime", choices=ExportOptions.RUNTIMES, default="onnxruntime", help=_HUB_RUNTIME_HELP)
    hub.add_argument(
        "--module-functions", action="store_true",
        help="keep each module call as an ONNX function (default: one flat graph, which onnxruntime's quantizers "
        "and optimizers work on)",
    )
    hub.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return parser


def _run_export_hf(args: argparse.Namespace) -> int:
    from fx2onnx.hub import export_hf
    if args.tokens < 1:
        raise UsageError("--tokens must be at least 1.")
    if (args.rtol is not None or args.atol is not None) and not args.verify:
        raise UsageError("--rtol and --atol are the tolerance of --verify: add --verify or drop them.")
    if (args.rtol or 0) < 0 or (args.atol or 0) < 0:
        raise UsageError("--rtol and --atol must not be negative.")
    opset = _checked_opset(args.opset)
    say = _say(args.quiet)
    try:
        result = export_hf(
            args.model, args.output, task=args.task, dtype=args.dtype, fake=args.fake, verify=args.verify,
            opset=opset, tokens=args.tokens, rtol=args.rtol, atol=args.atol, progress=not args.quiet, say=say, runtime=args.runtime,
            module_functions=args.module_functions, precision=args.precision, block_size=args.block_size,
            accuracy_level=args.accuracy_level, quantize_lm_head=not args.float_lm_head,
            quantize_embedding=args.quantize_embedding, text_only=args.text_only, without_audio=args.without_audio, vocoder=args.vocoder, quantization_algorithm=args.quantization,
            mixed_precision=args.mixed_precision, float32_twin=args.float32_twin,
        )
    except FileExistsError as error:
        raise UsageError(str(error)) from error
    except (FileNotFoundError, NotImplementedError, ValueError, RuntimeError, TypeError) as error:
        print(f"fx2onnx: error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_FAILED
    verification = result.verification
    if verification is not None and not verification.passed:
        print(f"fx2onnx: error: verification failed: {verification.summary()}", file=sys.stderr)
        print(f"fx2onnx: the folder {result.folder} is kept as written, to look into; do not ship it", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _export_request(args: argparse.Namespace):  # noqa: ANN202 - cli_export.ExportRequest
    """Check every export argument (syntax, paths, combinations) before anything runs."""
    from fx2onnx.cli.export import ExportRequest

    model = parse_model_spec(args.model)
    inputs = [parse_input_spec(text) for text in args.input]
    dynamic_all = "" in args.dynamic
    dynamic = [parse_dynamic_spec(text) for text in args.dynamic if text]
    if dynamic_all and dynamic:
        raise UsageError("--dynamic alone makes every dim dynamic; do not combine it with --dynamic NAME=...")
    names = [spec.name for spec in inputs if spec.name is not None]
    if len(set(names)) != len(names):
        raise UsageError(f"--input names repeat: {', '.join(sorted({n for n in names if names.count(n) > 1}))}.")
    if inputs and args.inputs_file is not None:
        raise UsageError("give example inputs either with --input or with --inputs-file, not both.")
    if args.inputs_file is not None:
        check_readable_file(args.inputs_file, "--inputs-file")
    if model.is_file:
        check_readable_file(Path(model.source), "model file")
    if args.weights is not None:
        if not args.fake:
            raise UsageError("--weights gives the weights of a model built with --fake; add --fake or drop --weights.")
        check_readable_file(args.weights, "--weights")
    if args.precision is not None and args.verify:
        raise UsageError("--verify compares with PyTorch within --rtol/--atol, and quantized weights move the outputs by "
                         "design: verify an export without --precision.")
    if args.fake and args.verify:
        raise UsageError("--verify needs real weights to run PyTorch; it cannot be used with --fake.")
    if args.rtol < 0 or args.atol < 0:
        raise UsageError("--rtol and --atol must not be negative.")
    output = args.output or Path(f"{model.attribute.split('.')[-1]}.onnx")
    report = args.report or output.with_name(output.name.removesuffix(".onnx") + ".sarif")
    check_output_paths(output, report)
    return ExportRequest(
        model=model, output=output, report=report, inputs=inputs, inputs_file=args.inputs_file,
        dynamic_all=dynamic_all, dynamic=dynamic, optimize=args.optimize, module_functions=not args.no_functions,
        verify=args.verify, rtol=args.rtol, atol=args.atol, fake=args.fake, weights=args.weights, opset=_checked_opset(args.opset), runtime=args.runtime,
        quiet=args.quiet, seed=args.seed, precision=args.precision, target=args.target,
    )


def _say(quiet: bool):  # noqa: ANN202
    return (lambda line: None) if quiet else (lambda line: print(line, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 done, 1 failed, 2 usage error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.version:
            print(version_text())
            return EXIT_OK
        if args.command is None:
            raise UsageError("give a command: export, export-hf or demo (fx2onnx export --help)")
        if args.command == "export-hf":
            return _run_export_hf(args)
        if args.command == "demo":
            check_output_paths(args.output, args.report)
            from fx2onnx.cli.demo import run_demo

            return run_demo(args.output, args.report, args.dynamic, _checked_opset(args.opset))
        request = _export_request(args)
        from fx2onnx.cli.export import run_export
        from fx2onnx.cli.model import ModelBuildError

        try:
            return run_export(request, _say(request.quiet))
        except UsageError:
            raise  # found once the model was built (e.g. inputs that do not fit it): exit 2
        except ModelBuildError as error:
            print(f"fx2onnx: error: {error}", file=sys.stderr)
            return EXIT_FAILED
        except (RuntimeError, ValueError, TypeError) as error:  # e.g. weights that do not fit the model
            print(f"fx2onnx: error: {type(error).__name__}: {error}", file=sys.stderr)
            return EXIT_FAILED
    except UsageError as error:
        print(f"fx2onnx: error: {error}\n(see fx2onnx --help and fx2onnx export --help)", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    except OSError as error:  # writing the model or the report
        print(f"fx2onnx: error: {error}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
