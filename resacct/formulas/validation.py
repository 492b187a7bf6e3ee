"""Checking plain numbers at a public boundary, once, with one wording.

A bad value is a :class:`~resacct.errors.ResacctError` that echoes it and says what is allowed:

>>> positive_number("tokens", 1.5e12)
1500000000000.0
>>> positive_number("mfu", float("nan"))
Traceback (most recent call last):
...
resacct.errors.ResacctError: mfu is nan; expected a finite number > 0
>>> whole_number("tensor_parallel", 8.0)
8
>>> whole_number("layers", 2.5)
Traceback (most recent call last):
...
resacct.errors.ResacctError: layers is 2.5; expected a whole number ≥ 1
"""

from __future__ import annotations

import math

from resacct.errors import ResacctError

__all__ = ["positive_number", "whole_number"]


def positive_number(name: str, value: object, allowed: str = "a finite number > 0") -> float:
    """``value`` as a float when it is a finite int or float > 0 (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ResacctError(f"{name} is {value!r}; expected {allowed}")
    return float(value)


def whole_number(name: str, value: object) -> int:
    """``value`` as an int when it is a whole number ≥ 1 (an integral float such as 8.0 counts)."""
    number = positive_number(name, value, "a whole number ≥ 1")
    if number != int(number):
        raise ResacctError(f"{name} is {value!r}; expected a whole number ≥ 1")
    return int(number)
