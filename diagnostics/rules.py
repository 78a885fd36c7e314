"""The catalog of rules fx2onnx reports.

Every rule is a module-level constant; ``ALL`` lists them in id order and ``by_id`` finds
one by its id. Ids and names are stable: users filter SARIF reports by them.
"""

from __future__ import annotations

from diagnostics.levels import Level
from diagnostics.rule import Rule

FX_GRAPH_TO_ONNX = Rule(
    id="FXE0007",
    name="fx-graph-to-onnx",
    short_description="Translates an FX graph into an ONNX graph.",
    full_description=(
        "The exporter walks every node of the FX graph produced by torch.export and "
        "writes the corresponding ONNX nodes. This diagnostic covers the translation of "
        "one whole graph (the main graph or the graph of one nn.Module turned into an "
        "ONNX local function). It is informational; with verbosity logging.DEBUG its "
        "log holds the FX graph and the resulting ONNX graph."
    ),
    message_template="Transforming FX graph {graph_name} to ONNX graph.",
    help_text=(
        "Nothing to do unless it is reported as an error. To see the FX and ONNX graphs "
        "in the report, export with DiagnosticOptions(verbosity_level=logging.DEBUG)."
    ),
    default_level=Level.NONE,
)

FX_NODE_TO_ONNX = Rule(
    id="FXE0008",
    name="fx-node-to-onnx",
    short_description="Translates one FX node into ONNX nodes.",
    full_description=(
        "Each FX node (placeholder, get_attr, call_function, call_module, output) is "
        "translated into zero or more ONNX nodes. The diagnostic points at the line of "
        "the model's source code that created the node, and its log tells which ONNX "
        "function was chosen and why. When the translation fails the level is error and "
        "the log holds the Python traceback."
    ),
    message_template="Transforming FX node {node} to ONNX.",
    help_text=(
        "If this is an error, look at the source line it points to and the traceback in "
        "the log: rewrite that line with operators ONNX supports, or register an ONNX "
        "function for the operator with fx2onnx.OnnxRegistry.register_op(...)."
    ),
    default_level=Level.NONE,
)

FX_PASS = Rule(
    id="FXE0010",
    name="fx-pass",
    short_description="Runs an FX graph transformation before the translation to ONNX.",
    full_description=(
        "Before translation the FX graph goes through passes: decomposition of "
        "operators ONNX cannot express, functionalization, lifting of mutated inputs, "
        "explicit type promotion and modularization. Each run of a pass is one "
        "diagnostic; with verbosity logging.DEBUG its log holds the graph difference."
    ),
    message_template="Running {pass_name} pass.",
    help_text=(
        "Nothing to do unless it is reported as an error. A failing pass is a bug in "
        "fx2onnx or an unusual graph: report it together with this SARIF file."
    ),
    default_level=Level.NONE,
)

NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION = Rule(
    id="FXE0011",
    name="no-symbolic-function-for-call-function",
    short_description="No ONNX function implements the operator of a call_function node.",
    full_description=(
        "The ONNX registry (torchlib's functions plus the ones the user registered) has "
        "no function for the ATen operator, neither for its exact overload nor for its "
        "default overload, and no decomposition removed it. The model cannot be exported "
        "until the operator is supported."
    ),
    message_template="No ONNX function to convert the call_function node {target} to ONNX.",
    help_text=(
        "Register an ONNX Script function for the operator with "
        "fx2onnx.OnnxRegistry.register_op(function, namespace, op_name, overload) and pass "
        "ExportOptions(onnx_registry=registry) to the export, or rewrite the line of the "
        "model that uses the operator with operators ONNX supports."
    ),
    default_level=Level.ERROR,
)

UNSUPPORTED_FX_NODE_ANALYSIS = Rule(
    id="FXE0012",
    name="unsupported-fx-node-analysis",
    short_description="An FX node the exporter cannot translate, found before translation.",
    full_description=(
        "Before translating anything the exporter checks every node of the graph and "
        "reports all the nodes it cannot translate at once, each pointing at the model's "
        "source line, so that all problems can be fixed in one round."
    ),
    message_template="Unsupported FX node {target}: {reason}",
    help_text=(
        "Fix every node listed: register an ONNX function for unsupported operators with "
        "fx2onnx.OnnxRegistry.register_op(...) and ExportOptions(onnx_registry=...), or "
        "change the model's source line so that it uses supported operators."
    ),
    default_level=Level.ERROR,
)

OP_LEVEL_VALIDATION = Rule(
    id="FXE0013",
    name="op-level-validation",
    short_description="An ONNX function disagrees with PyTorch on one operator.",
    full_description=(
        "With ExportOptions(op_level_debug=True), the FX graph is run in PyTorch on the "
        "example inputs, and the ONNX nodes of each FX node (an operator or a module "
        "function call) are run in ONNX Runtime on the values PyTorch computed for that "
        "node's inputs. Each node's outcome is recorded here: at level none when its "
        "ONNX nodes ran and match PyTorch; as a warning when its result differs beyond the "
        "tolerance of its dtype (with the largest difference and the dtypes) or when its "
        "ONNX nodes could not be run (with why). A note names the first node that "
        "diverges. The export itself goes on."
    ),
    message_template=(
        "FX node {node} and its ONNX function {function} disagree in op-level "
        "validation: {reason}"
    ),
    help_text=(
        "Check the exported model's outputs on real inputs. If they differ, register a "
        "corrected ONNX function for the operator with "
        "fx2onnx.OnnxRegistry.register_op(...) and report the mismatch to fx2onnx."
    ),
    default_level=Level.WARNING,
    recorded_at_every_verbosity=True,  # each node's outcome, asked for by op_level_debug
)

FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION = Rule(
    id="FXE0014",
    name="find-opschema-matched-symbolic-function",
    short_description="Chooses the ONNX function whose signature fits the node's arguments.",
    full_description=(
        "An operator can have several ONNX functions (for example a real and a complex "
        "one, or one per input type). The dispatcher scores each candidate's signature "
        "against the node's real argument types. A perfect match is informational; when "
        "none matches perfectly the nearest one is used and reported as a warning, "
        "saying which input or attribute did not fit."
    ),
    message_template="The ONNX function {function} is the {match} match for {target}.",
    help_text=(
        "A nearest (not perfect) match may give wrong results or fail in ONNX Runtime: "
        "cast the inputs in the model to the types the function supports, or register a "
        "function that accepts these types with fx2onnx.OnnxRegistry.register_op(...)."
    ),
    default_level=Level.NONE,
    recorded_at_every_verbosity=True,
)

FX_NODE_INSERT_TYPE_PROMOTION = Rule(
    id="FXE0015",
    name="fx-node-insert-type-promotion",
    short_description="Inserts explicit casts where PyTorch promotes types implicitly.",
    full_description=(
        "PyTorch promotes mixed input types implicitly (int + float gives float) but ONNX "
        "operators need inputs of one type. This pass inserts explicit casts before such "
        "nodes following PyTorch's type promotion rules, so that the ONNX graph computes "
        "in the same types as PyTorch."
    ),
    message_template="Explicit type promotion for node {target}.",
    help_text=(
        "Nothing to do unless it is reported as a warning or an error, which means that "
        "no type promotion rule is known for the operator: cast its inputs to one type "
        "in the model."
    ),
    default_level=Level.NONE,
)

FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY = Rule(
    id="FXE0016",
    name="find-operator-overloads-in-onnx-registry",
    short_description="Looks up the ONNX functions registered for an operator overload.",
    full_description=(
        "The dispatcher looks for ONNX functions registered for the node's exact "
        "operator overload (aten::add.Tensor), then for its default overload "
        "(aten::add). Falling back to the default overload is reported as a warning "
        "because the default overload may not handle the node's arguments."
    ),
    message_template="Looking up ONNX functions for the FX node {node} in the ONNX registry.",
    help_text=(
        "If the default overload was used and the result is wrong, register an ONNX "
        "function for the exact overload with fx2onnx.OnnxRegistry.register_op(function, "
        "namespace, op_name, overload=...)."
    ),
    default_level=Level.NONE,
    recorded_at_every_verbosity=True,
)

CAPTURE_FAILURE = Rule(
    id="FXE0017",
    name="capture-failure",
    short_description="torch.export could not capture the model as an FX graph.",
    full_description=(
        "The exporter captures the model with torch.export (non-strict first, then "
        "strict). Capture fails on Python control flow that depends on tensor values, on "
        "calls torch cannot trace (external libraries, I/O, numpy on tensors) and on "
        "unsupported input or output types. Nothing can be exported until capture works."
    ),
    message_template="torch.export could not capture the model: {reason}",
    help_text=(
        "Follow the hint in the message: it names the cause found (not a model, numpy "
        "inputs, weights on the meta device, inputs that do not fit forward's signature, "
        "a dynamic-shapes spec, an output type, control flow on tensor values) and what to "
        "change. The log holds the full traceback of both capture modes (non-strict "
        "tolerates more Python, strict reports the exact line). Or pass an "
        "ExportedProgram you captured yourself."
    ),
    default_level=Level.ERROR,
)

EXPORT_SUMMARY = Rule(
    id="FXE0018",
    name="export-summary",
    short_description="Summary of one export: what was exported and how it went.",
    full_description=(
        "One diagnostic per export that says which model was exported and sums up the "
        "outcome: number of nodes, local functions, errors and warnings."
    ),
    message_template="Exported {model} to ONNX: {summary}",
    help_text=(
        "Nothing to do. If the export reported errors or warnings, fix those listed in "
        "the other results of this report."
    ),
    default_level=Level.NOTE,
)

GRAPH_BUILDING = Rule(
    id="FXE0019",
    name="onnx-graph-building",
    short_description="An ONNX function failed while being traced into the ONNX graph.",
    full_description=(
        "The chosen ONNX Script function (usually from torchlib) is run on symbolic "
        "values to emit its ONNX nodes into the graph. It failed: the function does not "
        "handle the inputs' types, shapes or attribute values, or it has a bug."
    ),
    message_template="The ONNX function {function} failed for the FX node {node}: {reason}",
    help_text=(
        "Read the traceback in the log. Register a fixed ONNX function for the operator "
        "with fx2onnx.OnnxRegistry.register_op(...), or change the model's source line "
        "so that the operator gets different inputs (e.g. cast them), and report the "
        "failure with this SARIF file."
    ),
    default_level=Level.ERROR,
)

TYPE_LEGALIZATION = Rule(
    id="FXE0021",
    name="type-legalization",
    short_description="An ONNX op is computed in a dtype it accepts and its result cast back.",
    full_description=(
        "After translation every node of the default ONNX domain is checked against its "
        "op schema for the opset in use. When the op does not accept an input's dtype "
        "(Floor or Conv on int64, TopK on bool, ...), its inputs are cast to the nearest "
        "accepted dtype and its results cast back, so that the model keeps PyTorch's "
        "dtypes. Integers computed in a floating dtype are exact only up to that dtype's "
        "mantissa range, which the message states."
    ),
    message_template="{op_type} computed in {target} instead of {source}.",
    help_text=(
        "Nothing to do unless the values can exceed the stated exact range; then cast "
        "the operator's inputs in the model to a dtype the ONNX op accepts."
    ),
    default_level=Level.NOTE,
)

MODEL_VALIDATION = Rule(
    id="FXE0022",
    name="onnx-model-validation",
    short_description="The exported ONNX model fails ONNX's checker or strict type inference.",
    full_description=(
        "Before an export succeeds the model (its functions included) goes through "
        "ONNX's strict type and shape inference and the model checker. A node whose "
        "input types its op does not accept, or whose shapes are inconsistent, would make "
        "an invalid model that ONNX Runtime refuses; the export fails instead, pointing "
        "at the node, its op and the model's source line."
    ),
    message_template="The exported ONNX model is invalid at node {node} ({op_type}): {reason}",
    help_text=(
        "Look at the source line: the inputs of that operator may have dtypes PyTorch "
        "itself rejects, or the ONNX function chosen for it does not handle them. Cast "
        "the inputs, or register a fixed ONNX function with OnnxRegistry.register_op, "
        "and report the problem with this SARIF file."
    ),
    default_level=Level.ERROR,
)

INVALID_MODEL_IO = Rule(
    id="FXE0023",
    name="invalid-model-inputs-or-outputs",
    short_description="The example inputs or the model's outputs cannot make an ONNX model.",
    full_description=(
        "The captured graph is checked before translation: the model must return at "
        "least one tensor, and operators whose inputs mix dtypes are run once on small "
        "CPU tensors, because torch.export's meta kernels accept dtypes that PyTorch's "
        "real kernels reject (nn.Linear on int64 inputs)."
    ),
    message_template="The model cannot be exported with these inputs: {reason}",
    help_text=(
        "Give example inputs of the dtypes the model expects (the model must run on them "
        "in eager PyTorch), and return at least one tensor from forward."
    ),
    default_level=Level.ERROR,
)

RUNTIME_VERIFICATION = Rule(
    id="FXE0024",
    name="runtime-verification",
    short_description="The exported model fails in ONNX Runtime or differs from PyTorch on the example inputs.",
    full_description=(
        "With ExportOptions(verify=True) the finished model runs once in ONNX Runtime on "
        "the example inputs and its outputs are compared with eager PyTorch's. A model "
        "that ONNX's checker accepts can still be one whose kernels ONNX Runtime refuses "
        "(their own checks on shapes and attributes) or one that computes something else; "
        "the export then fails, naming the ONNX node, its op, the FX node and the model's "
        "source line (for a mismatch, the first node that differs on its own)."
    ),
    message_template="The exported model fails verification at node {node} ({op_type}): {reason}",
    help_text=(
        "Look at the source line and the operator: the ONNX function chosen for it builds "
        "something the runtime does not accept or computes differently. Register a fixed "
        "ONNX function with OnnxRegistry.register_op, and report the problem with this "
        "SARIF file."
    ),
    default_level=Level.ERROR,
)

ALIASED_EXAMPLE_INPUTS = Rule(
    id="FXE0025",
    name="aliased-example-inputs",
    short_description="Example inputs share storage: the export takes them as independent inputs.",
    full_description=(
        "Example inputs that share storage (the same tensor given twice, views of one "
        "tensor, or an input that is a parameter or buffer of the model) are one value "
        "to torch.export, which would export a model that reads one of them for both. The "
        "inputs of an ONNX model never share memory, so the model is captured from "
        "independent copies of them (the given tensors are not changed) and computes what "
        "the model does on independent tensors; a note says so. When the model updates one "
        "of them in place, PyTorch sees the update through the others and the ONNX model "
        "cannot: that is a warning."
    ),
    message_template="Example inputs {inputs} share storage (the same tensor, or views of one): {consequence}",
    help_text=(
        "Nothing to do for a note. For a warning: export from independent example inputs "
        "(`.clone()` one of them) if a call with separate tensors is what you mean; if the "
        "model relies on the aliasing, pass one tensor and derive the other inside the model."
    ),
    default_level=Level.NOTE,
)

TRAINING_MODE = Rule(
    id="FXE0026",
    name="training-mode-export",
    short_description="The model was exported in training mode (dropout, batch statistics).",
    full_description=(
        "The exporter takes the model as it is. A module in training mode exports its "
        "training behaviour: dropout drops random elements on every run, and batch norm "
        "normalizes with the statistics of each batch (and updates its running "
        "statistics) instead of the running ones. Inference is almost always meant."
    ),
    message_template=(
        "{model} was exported in training mode, and the ONNX model does what it does: {what}. To export for "
        "inference, call model.eval() before exporting."
    ),
    help_text=(
        "To export for inference, call model.eval() before dynamo_export (and model.train() "
        "after, to go on training). Keep the model in training mode only to export its "
        "training behaviour."
    ),
    default_level=Level.NOTE,
)

OPTION_WITHOUT_EFFECT = Rule(
    id="FXE0027",
    name="option-without-effect",
    short_description="An export option selects nothing in this model.",
    full_description=(
        "An option that names parts of the model (a module-function include or exclude "
        "pattern) matched none of them: usually a misspelt name or a pattern written for "
        "another model. The export goes on as if the pattern were not given."
    ),
    message_template="{option} selects nothing: {reason}",
    help_text=(
        "Check the spelling against the names the message lists; a pattern is matched "
        "(fnmatch style) against a module's class name, its qualified class name and the "
        "attribute path of its call (`layers.*`)."
    ),
    default_level=Level.WARNING,
)

CACHE_OUTSIDE_LAYERS = Rule(
    id="FXE0028",
    name="cache-outside-layers",
    short_description="A cache among the inputs keeps tensors outside its layers.",
    full_description=(
        "A transformers cache given as an input (past_key_values) is taken apart into its "
        "layers' tensors, which become the model's inputs and outputs. A cache class that "
        "keeps tensors of its own besides its layers (MiniMax's linear-attention states) "
        "cannot be taken apart so: those tensors would be frozen into the model as "
        "constants. The export stops instead."
    ),
    message_template="{cache} keeps tensors outside its layers: {reason}",
    help_text=(
        "Export the model without its cache (use_cache=False, no past_key_values), or "
        "give it a cache whose every state is in its layers (transformers' DynamicCache "
        "layers); for a transformers model, report the cache class to fx2onnx with this "
        "SARIF file."
    ),
    default_level=Level.ERROR,
)

ALL: tuple[Rule, ...] = (
    FX_GRAPH_TO_ONNX,
    FX_NODE_TO_ONNX,
    FX_PASS,
    NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
    UNSUPPORTED_FX_NODE_ANALYSIS,
    OP_LEVEL_VALIDATION,
    FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
    FX_NODE_INSERT_TYPE_PROMOTION,
    FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY,
    CAPTURE_FAILURE,
    EXPORT_SUMMARY,
    GRAPH_BUILDING,
    TYPE_LEGALIZATION,
    MODEL_VALIDATION,
    INVALID_MODEL_IO,
    RUNTIME_VERIFICATION,
    ALIASED_EXAMPLE_INPUTS,
    TRAINING_MODE,
    OPTION_WITHOUT_EFFECT,
    CACHE_OUTSIDE_LAYERS,
)

_BY_ID: dict[str, Rule] = {rule.id: rule for rule in ALL}


def by_id(rule_id: str) -> Rule:
    """The rule with id ``rule_id`` (e.g. "FXE0011"); KeyError if there is none."""
    try:
        return _BY_ID[rule_id]
    except KeyError:
        raise KeyError(f"No rule with id {rule_id!r}; known ids: {', '.join(_BY_ID)}") from None
