"""The safe law evaluator: arithmetic only, bounded, never runs code."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resacct.errors import LawError
from resacct.harness.laws import Law


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("2*m*k*n", {"m": 2, "k": 3, "n": 4}, 48),
        ("6*batch*params", {"batch": 2, "params": 10}, 120),
        ("(2 - 2**-10) * 2**15", {}, 65504.0),
        ("[d1*d2, d2, 1]", {"d1": 3, "d2": 5}, [15, 5, 1]),
        ("-x // 2 + x % 3", {"x": 7}, -4 + 1),
        ("603e6", {}, 603e6),
    ],
)
def test_arithmetic(text, values, expected):
    assert Law.parse(text).evaluate(values) == expected


def test_names_are_collected_statically():
    assert Law.parse("a*b + a/c").names == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("open('x')", "a function call to 'open'"),
        ("x.__class__", "attribute access of '__class__'"),
        ("x[0]", "subscripting"),
        ("a < b", "a comparison"),
        ("a and b", "a boolean operator"),
        ("lambda: 1", "a lambda"),
        ("'text'", "the constant 'text'"),
        ("True", "the constant True"),
        ("__builtins__", "names starting with '_' are not allowed"),
        ("10**10**10", "a power of a power"),
        ("2**1000", "the exponent 1000"),
        ("[x for x in y]", "a comprehension"),
        ("(y := 2)", "an assignment"),
        ("f'{x}'", "an f-string"),
        ("x if y else z", "a conditional expression"),
        ("a @ b", "the operator MatMult"),
        ("", "law is empty"),
        ("1 +", "not valid arithmetic"),
        ("x" * 501, "at most 500 are allowed"),
        ("import os", "not valid arithmetic"),
    ],
)
def test_refused_constructs(text, fragment):
    with pytest.raises(LawError, match=None) as error:
        Law.parse(text)
    assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("text", "values", "fragment"),
    [
        ("a / b", {"a": 1, "b": 0}, "divides by zero for a=1, b=0"),
        ("a ** b", {"a": 10, "b": 10**6}, "raises to the power 1000000"),
        ("(a**100)**100", {"a": 10}, "more than 400 digits"),
        ("a * 2", {"a": "text"}, "not a number"),
        ("missing + 1", {}, "names missing, which no input or measured quantity provides"),
        ("[a] * 2", {"a": 1}, "arithmetic on a list"),
    ],
)
def test_evaluation_errors_are_law_errors(text, values, fragment):
    with pytest.raises(LawError) as error:
        Law.parse(text).evaluate(values)
    assert fragment in str(error.value)


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_law_error_only(text):
    try:
        law = Law.parse(text)
    except LawError:
        return
    try:
        value = law.evaluate({name: 3 for name in law.names})
    except LawError:
        return
    assert isinstance(value, (int, float, list)) and not isinstance(value, bool)


def test_a_spec_law_cannot_execute_code(tmp_path):
    marker = tmp_path / "pwned"
    for text in (f"open({str(marker)!r}, 'w')", f"__import__('pathlib').Path({str(marker)!r}).touch()"):
        with pytest.raises(LawError):
            Law.parse(text).evaluate({})
    assert not marker.exists()
