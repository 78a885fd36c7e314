"""Location and Stack: parsing FX stack traces and Python tracebacks."""

from __future__ import annotations

import dataclasses

import pytest

from diagnostics import Location, Stack

# What torch.fx.Node.stack_trace holds for a node created two modules deep (3.11 format,
# with torch's own frames in between and caret markers under some source lines).
FX_STACK_TRACE = """\
  File "/home/ada/project/train.py", line 88, in <module>
    program = fx2onnx.dynamo_export(model, x)
  File "/home/ada/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1775, in _call_impl
    return forward_call(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ada/project/models/net.py", line 42, in forward
    x = self.block(x)
  File "/home/ada/project/models/block.py", line 17, in forward
    return torch.ops.aten.frobnicate(x) + 1
           ~~~~~~~~~~~~~~~~~~~~~~~~~^^^
  File "/home/ada/.venv/lib/python3.11/site-packages/fx2onnx/capture.py", line 5, in wrapped
    return fn(*args)
"""


def test_parses_every_frame_with_function_and_snippet_in_traceback_order() -> None:
    stack = Stack.from_python_traceback(FX_STACK_TRACE)
    assert [(f.path.rsplit("/", 1)[-1], f.line, f.function) for f in stack.frames] == [
        ("train.py", 88, "<module>"),
        ("module.py", 1775, "_call_impl"),
        ("net.py", 42, "forward"),
        ("block.py", 17, "forward"),
        ("capture.py", 5, "wrapped"),
    ]
    assert stack.frames[3] == Location(
        path="/home/ada/project/models/block.py",
        line=17,
        snippet="return torch.ops.aten.frobnicate(x) + 1",
        function="forward",
    )
    assert stack.frames[1].snippet == "return forward_call(*args, **kwargs)"
    assert stack.message is None


def test_innermost_skips_excluded_paths() -> None:
    stack = Stack.from_python_traceback(FX_STACK_TRACE)
    assert stack.innermost().path.endswith("/fx2onnx/capture.py")
    user = stack.innermost(exclude=("/site-packages/torch/", "/fx2onnx/"))
    assert (user.path, user.line) == ("/home/ada/project/models/block.py", 17)
    assert stack.innermost(exclude=("/home/ada/",)) is None


@pytest.mark.parametrize("text", [None, "", "no frames here\njust text"])
def test_empty_or_frameless_text_gives_an_empty_stack(text: str | None) -> None:
    stack = Stack.from_python_traceback(text)
    assert stack.frames == () and not stack
    assert stack.innermost() is None


def test_full_traceback_text_and_frames_without_snippets() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "<eval_with_key>.3", line 6, in forward\n'
        '  File "/srv/app/run.py", line 3, in main\n'
        "    raise ValueError('bad')\n"
        "ValueError: bad\n"
    )
    stack = Stack.from_python_traceback(text)
    assert [(f.path, f.line, f.snippet) for f in stack.frames] == [
        ("<eval_with_key>.3", 6, None),
        ("/srv/app/run.py", 3, "raise ValueError('bad')"),
    ]


def test_windows_paths_parse() -> None:
    text = '  File "C:\\Users\\ada\\net.py", line 9, in forward\n    return x\n'
    (frame,) = Stack.from_python_traceback(text).frames
    assert (frame.path, frame.line, frame.snippet) == ("C:\\Users\\ada\\net.py", 9, "return x")


def _fails() -> None:
    ée = 0; 1 / ée  # noqa: E702  (a 2-byte character before the failing expression)


def test_from_exception_gives_one_based_code_point_columns() -> None:
    try:
        _fails()
    except ZeroDivisionError as exc:
        stack = Stack.from_exception(exc)
    inner = stack.frames[-1]
    assert inner.function == "_fails" and inner.path == __file__
    assert inner.snippet.startswith("ée = 0; 1 / ée")
    # CPython gives the 0-based UTF-8 byte offset of "1 / ée": 13, as 'é' is 2 bytes.
    # SARIF wants 1-based code points: 12 characters come before it, so column 13.
    assert inner.column == 13
    assert stack.message == "ZeroDivisionError: division by zero"


def test_location_and_stack_are_frozen() -> None:
    location = Location("/a.py", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        location.line = 2  # type: ignore[misc]
    assert str(location) == "/a.py:1"
    assert (location.column, location.snippet, location.function) == (None, None, None)
