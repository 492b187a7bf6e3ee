"""Tests that kill the mutants ``tools/mutation/run.sh formulas/validation`` found surviving
(see docs/mutation.md): resacct's one check of plain numbers at a public boundary.

What a value must be is Python's and torch's own notion, not a restated rule: a finite number is
what ``math.isfinite`` says, a whole number is one whose ``float.is_integer()`` holds, and a whole
number returned is an ``int`` that ``torch.empty`` takes as a size (torch refuses the float 8.0).
The messages are resacct's API: each is checked whole.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from resacct.errors import ResacctError
from resacct.formulas.validation import positive_number, whole_number

_NOT_NUMBERS = [True, False, "8", None, b"8", 8j, [8], (8,)]
_NOT_POSITIVE = [0, 0.0, -0.0, -1, -1.5, -5e-324, float("-inf")]
_NOT_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", [1, 2, 8, 1.5, 1e-300, 5e-324, 2**53, 1e300, 0.5])
def test_a_finite_number_above_zero_comes_back_as_its_float(value):
    out = positive_number("tokens", value)
    assert type(out) is float and out == float(value) and math.isfinite(out) and out > 0


@pytest.mark.parametrize("value", _NOT_NUMBERS + _NOT_POSITIVE + _NOT_FINITE, ids=repr)
def test_everything_else_is_refused_echoing_the_value(value):
    with pytest.raises(ResacctError) as error:
        positive_number("mfu", value)
    assert str(error.value) == f"mfu is {value!r}; expected a finite number > 0"


def test_bools_are_not_numbers_although_python_counts_them_as_ints():
    assert isinstance(True, int) and True > 0 and math.isfinite(True)  # what the guard has to exclude on purpose
    for value in (True, False):
        with pytest.raises(ResacctError, match=rf"^flag is {value}; expected a finite number > 0$"):
            positive_number("flag", value)
        with pytest.raises(ResacctError, match=rf"^layers is {value}; expected a whole number ≥ 1$"):
            whole_number("layers", value)


def test_the_allowed_wording_is_the_callers():
    with pytest.raises(ResacctError) as error:
        positive_number("goodput", 0, "a fraction in (0, 1]")
    assert str(error.value) == "goodput is 0; expected a fraction in (0, 1]"
    with pytest.raises(ResacctError) as error:
        positive_number("goodput", float("nan"), allowed="a fraction in (0, 1]")
    assert str(error.value) == "goodput is nan; expected a fraction in (0, 1]"


@pytest.mark.parametrize("value", [1, 2, 8, 8.0, 1.0, 96.0, 2.0**40, 10**15])
def test_a_whole_number_comes_back_as_an_int_torch_takes_as_a_size(value):
    out = whole_number("tensor_parallel", value)
    assert type(out) is int and out == value and float(value).is_integer()
    if out <= 4096:
        assert torch.empty(out).numel() == out
    with pytest.raises(TypeError):  # why an int is returned: torch takes no float as a size
        torch.empty(float(value))


@pytest.mark.parametrize("value", [2.5, 0.5, 1.0000001, 7.999999999, 1e-300])
def test_a_fraction_is_refused_with_the_whole_number_wording(value):
    assert not float(value).is_integer()
    with pytest.raises(ResacctError) as error:
        whole_number("layers", value)
    assert str(error.value) == f"layers is {value!r}; expected a whole number ≥ 1"


@pytest.mark.parametrize("value", _NOT_NUMBERS + _NOT_POSITIVE + _NOT_FINITE, ids=repr)
def test_a_whole_number_refuses_what_is_not_a_number_above_zero_with_its_own_wording(value):
    with pytest.raises(ResacctError) as error:
        whole_number("tensor_parallel", value)
    assert str(error.value) == f"tensor_parallel is {value!r}; expected a whole number ≥ 1"


def test_the_wording_names_the_argument():
    with pytest.raises(ResacctError, match=re.escape("pipeline_parallel is 3.5; expected a whole number ≥ 1")):
        whole_number("pipeline_parallel", 3.5)
    with pytest.raises(ResacctError, match=re.escape("peak_flops is -1; expected a finite number > 0")):
        positive_number("peak_flops", -1)


def test_an_integer_beyond_a_float_is_one_line_and_a_large_whole_number_stays_exact():
    """Found by mutation testing: 10**400 raised OverflowError (a traceback through every napkin
    formula), and whole_number rounded 2**53 + 1 through a float."""
    from resacct.errors import ResacctError
    from resacct.formulas.napkin import training_days
    from resacct.formulas.validation import positive_number, whole_number

    with pytest.raises(ResacctError, match=r"tokens is an integer of 401 digits; expected a finite number > 0 \(at most 1.8e\+308\)"):
        positive_number("tokens", 10**400)
    with pytest.raises(ResacctError, match="an integer of 401 digits"):
        training_days(10**400, 8, 1e15, 0.5)
    assert whole_number("n", 2**53 + 1) == 2**53 + 1 and type(whole_number("n", 8.0)) is int
