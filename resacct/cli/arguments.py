"""argparse types that refuse bad values with a message saying what is allowed.

>>> count("15T"), count("1,500,000"), count("1.5k")
(15000000000000.0, 1500000.0, 1500.0)
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = ["count", "positive_float", "positive_int", "fraction", "non_negative_float"]

_SUFFIXES = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


# Commas only as thousands separators: 1,500,000 or 1,500.5 — never 1,5 (a decimal comma) or 15,00.
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][-+]?\d+)?")


def _number(text: str) -> float:
    cleaned = text.strip().replace("_", "")
    scale = 1.0
    if cleaned and cleaned[-1] in _SUFFIXES:
        scale, cleaned = _SUFFIXES[cleaned[-1]], cleaned[:-1]
    if "," in cleaned:
        if not _THOUSANDS.fullmatch(cleaned):
            raise argparse.ArgumentTypeError(
                f"{text!r}: a comma may only separate groups of three digits (1,500,000); for a fraction write a point, "
                f"e.g. {text.strip().replace(',', '.')!r}")
        cleaned = cleaned.replace(",", "")
    try:
        value = float(cleaned) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (examples: 70e9, 1.5B, 15T)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not finite; a real number is needed")
    return value


def count(text: str) -> float:
    """A positive amount, with optional suffix k/M/B/T/P: ``70e9``, ``70B``, ``15T``."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def positive_float(text: str) -> float:
    return count(text)


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


MAX_WHOLE_NUMBER = 2**53
"""The largest whole number (a size, a device count) taken: beyond it a float cannot hold every
whole number, and nothing a training run counts comes near (``1e300`` devices is a typo)."""

MIN_FRACTION = 1e-6
"""The smallest utilisation taken: below a millionth of the peak, a run's time overflows."""


def positive_int(text: str) -> int:
    value = _number(text)
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number greater than 0")
    if value > MAX_WHOLE_NUMBER:
        raise argparse.ArgumentTypeError(f"{text!r} is too large; expected a whole number up to 2^53 ({MAX_WHOLE_NUMBER:.4g})")
    return int(value)


def fraction(text: str) -> float:
    """A utilisation such as MFU: in (0, 1] (at least :data:`MIN_FRACTION`)."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1], e.g. 0.5 for 50%")
    if value < MIN_FRACTION:
        raise argparse.ArgumentTypeError(f"{text!r} is too small for a utilisation; expected at least {MIN_FRACTION:g} (a millionth)")
    return value
