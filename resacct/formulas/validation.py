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
import sys

from resacct.errors import ResacctError

__all__ = ["positive_number", "whole_number"]

_FLOAT_MAX = sys.float_info.max


def _echo(value: object) -> str:
    """The bad value as the message shows it: an integer too long to read is given by its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def positive_number(name: str, value: object, allowed: str = "a finite number > 0") -> float:
    """``value`` as a float when it is a finite int or float > 0 (bools are not numbers here; an
    integer beyond a float's range is refused, not an OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResacctError(f"{name} is {_echo(value)}; expected {allowed}")
    try:
        number = float(value)
    except OverflowError:
        raise ResacctError(f"{name} is {_echo(value)}; expected {allowed} (at most {_FLOAT_MAX:.3g})") from None
    if not math.isfinite(number) or number <= 0:
        raise ResacctError(f"{name} is {_echo(value)}; expected {allowed}")
    return number


def whole_number(name: str, value: object) -> int:
    """``value`` as an int when it is a whole number ≥ 1 (an integral float such as 8.0 counts; an
    int stays exact, beyond 2**53 too)."""
    number = positive_number(name, value, "a whole number ≥ 1")
    if isinstance(value, int):
        return value
    if number != int(number):
        raise ResacctError(f"{name} is {_echo(value)}; expected a whole number ≥ 1")
    return int(number)
