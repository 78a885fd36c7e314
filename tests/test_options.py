"""Every option is checked where it is given: a wrong type or value is a TypeError or
ValueError naming the option, the value and what is accepted; a module-function pattern
that selects nothing is a warning naming it."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fx2onnx
from conftest import make_options


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: fx2onnx.ExportOptions(module_functions="no"), TypeError,
         "ExportOptions(module_functions='no'): module_functions takes True, False or a ModuleFunctionOptions; got a str 'no'."),
        (lambda: fx2onnx.ExportOptions(diagnostic_options=dict(verbosity_level=10)), TypeError,
         "ExportOptions(diagnostic_options={'verbosity_level': 10}): diagnostic_options takes a DiagnosticOptions; got a dict"),
        (lambda: fx2onnx.DiagnosticOptions(verbosity_level="DEBUG"), TypeError,
         "DiagnosticOptions(verbosity_level='DEBUG'): verbosity_level takes a logging level (an int: logging.DEBUG"),
        (lambda: fx2onnx.DiagnosticOptions(verbosity_level=-1), ValueError,
         "DiagnosticOptions(verbosity_level=-1): verbosity_level takes a logging level"),
        (lambda: fx2onnx.DiagnosticOptions(warnings_as_errors="yes"), TypeError,
         "DiagnosticOptions(warnings_as_errors='yes'): warnings_as_errors takes True or False; got a str 'yes'."),
        (lambda: fx2onnx.ExportOptions(onnx_registry={}), TypeError,
         "ExportOptions(onnx_registry={}): onnx_registry takes an OnnxRegistry or None; got a dict {}."),
        (lambda: fx2onnx.ExportOptions(runtime="ort"), ValueError,
         "ExportOptions(runtime='ort'): runtime takes 'onnxruntime' or 'standard'; got 'ort'."),
        (lambda: fx2onnx.ExportOptions(verify_atol=-1.0), ValueError,
         "ExportOptions(verify_atol=-1.0): verify_atol takes a number of at least 0; got -1.0."),
        (lambda: fx2onnx.ExportOptions(dynamic_shapes="yes"), TypeError,
         "ExportOptions(dynamic_shapes='yes'): dynamic_shapes takes True, False, a dict, a tuple, a list or None"),
        (lambda: fx2onnx.ExportOptions(progress=1), TypeError,
         "ExportOptions(progress=1): progress takes True, False or None; got an int 1."),
        (lambda: fx2onnx.ExportOptions(failure_report_path=3), TypeError,
         "ExportOptions(failure_report_path=3): failure_report_path takes a str, a path or None; got an int 3."),
        (lambda: fx2onnx.ModuleFunctionOptions(include="Linear"), TypeError,
         "ModuleFunctionOptions(include='Linear'): include takes a tuple of str or class, or None; got a str 'Linear'. "
         "A tuple of one item is written ('Linear',)."),
        (lambda: fx2onnx.ModuleFunctionOptions(exclude=("Linear", 3)), TypeError,
         "ModuleFunctionOptions(exclude=('Linear', 3)): exclude takes a tuple of str or class; got a tuple"),
    ],
    ids=["module_functions", "diagnostic_options_dict", "verbosity_name", "verbosity_negative", "warnings_as_errors",
         "registry_dict", "runtime", "tolerance", "dynamic_shapes", "progress", "report_path", "include_str",
         "exclude_item"],
)
def test_wrong_options_are_refused_at_construction(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_options_set_later_are_checked_too():
    options = fx2onnx.ExportOptions()
    with pytest.raises(TypeError, match=re.escape("ExportOptions(verify='yes'): verify takes True or False")):
        options.verify = "yes"
    diagnostic_options = fx2onnx.DiagnosticOptions()
    with pytest.raises(TypeError, match="verbosity_level takes a logging level"):
        diagnostic_options.verbosity_level = "INFO"


def test_right_options_are_taken():
    options = fx2onnx.ExportOptions(
        dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
        onnx_registry=fx2onnx.OnnxRegistry(),
        diagnostic_options=fx2onnx.DiagnosticOptions(verbosity_level=logging.DEBUG, warnings_as_errors=True),
        failure_report_path=Path("report.sarif"),
        module_functions=fx2onnx.ModuleFunctionOptions(include=("Linear", nn.ReLU), exclude=()),
        verify_rtol=0,  # an int is a number
        opset_version=20,
        runtime="standard",
    )
    assert options.runtime == "standard" and options.verify_rtol == 0


def test_export_options_of_another_type_are_refused():
    with pytest.raises(TypeError, match=re.escape(
        "dynamo_export(export_options={'opset_version': 18}): export_options takes an ExportOptions or None; "
        "got a dict {'opset_version': 18}. Give ExportOptions(**{...}) for a dict of its fields."
    )):
        fx2onnx.dynamo_export(nn.Linear(3, 2), torch.randn(1, 3), export_options={"opset_version": 18})


def test_module_function_pattern_that_selects_nothing_warns(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU()).eval()
    functions = fx2onnx.ModuleFunctionOptions(include=("Linaer", "Linear"), exclude=(nn.Conv2d,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.dynamo_export(model, torch.randn(2, 3), export_options=make_options(tmp_path, module_functions=functions))
    found = [d for d in program.diagnostics if d.rule.id == "FXE0027"]
    assert [d.level.name for d in found] == ["WARNING", "WARNING"]
    assert "ModuleFunctionOptions(include=...) pattern 'Linaer' selects nothing" in found[0].message
    assert "Linear, ReLU" in found[0].message
    assert "pattern Conv2d selects nothing" in found[1].message
    texts = [str(w.message) for w in caught if issubclass(w.category, fx2onnx.ExportWarning)]
    assert any("FXE0027" in t and "'Linaer'" in t for t in texts), texts
    assert len(program.model.functions) == 1  # the pattern that matched still works


def test_matching_patterns_do_not_warn(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU()).eval()
    functions = fx2onnx.ModuleFunctionOptions(include=("Linear",), exclude=("1",))
    program = fx2onnx.dynamo_export(model, torch.randn(2, 3), export_options=make_options(tmp_path, module_functions=functions))
    assert not [d for d in program.diagnostics if d.rule.id == "FXE0027"]
