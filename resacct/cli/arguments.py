"""argparse types that refuse bad values with a message saying what is allowed.

>>> count("15T"), count("1,500,000"), count("1.5k")
(15000000000000.0, 1500000.0, 1500.0)
>>> byte_size("8GiB"), byte_size("8 GB"), byte_size("512MiB"), byte_size("1e6")
(8589934592, 8000000000, 536870912, 1000000)
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = ["count", "positive_float", "positive_int", "fraction", "non_negative_float", "byte_size", "seconds", "gigabytes",
           "reserve_gigabytes", "at_least_one", "parameter_count"]

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


def at_least_one(text: str) -> float:
    """A count of things that are not split (parameters, tokens): at least 1 (``1e-320`` parameters
    is a typo, and its FLOPs underflow)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1; expected a count of at least 1 (70e9, 70B, 15T)")
    return value


def parameter_count(text: str) -> float:
    """A model's parameters, from 1 to :data:`MAX_WHOLE_NUMBER` (2^53, about 9e15: a thousand times
    the largest models; ``1e300`` is a typo)."""
    value = at_least_one(text)
    if value > MAX_WHOLE_NUMBER:
        raise argparse.ArgumentTypeError(f"{text!r} is too large; expected a parameter count up to 2^53 ({MAX_WHOLE_NUMBER:.4g})")
    return value


def fraction(text: str) -> float:
    """A utilisation such as MFU: in (0, 1] (at least :data:`MIN_FRACTION`)."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1], e.g. 0.5 for 50%")
    if value < MIN_FRACTION:
        raise argparse.ArgumentTypeError(f"{text!r} is too small for a utilisation; expected at least {MIN_FRACTION:g} (a millionth)")
    return value


_BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}
_BYTE_SIZE = re.compile(r"\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*")
MAX_BYTES = 2**63 - 1
"""The largest size taken (torch counts bytes in int64)."""


def byte_size(text: str) -> int:
    """A memory size in bytes: ``8GiB`` (2^30), ``8GB`` or ``8G`` (10^9), ``512MiB``, ``1e9`` (bytes)."""
    match = _BYTE_SIZE.fullmatch(text)
    unit = match.group(2).upper() if match else ""
    unit = unit + "B" if unit and not unit.endswith("B") else unit
    if match is None or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size; expected a number and a unit such as 8GiB, 16GB, 512MiB "
                                         "(KiB/MiB/GiB/TiB = 2^10.., kB/MB/GB/TB = 10^3..; no unit: bytes)")
    try:
        value = float(match.group(1)) * _BYTE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size; expected a number such as 8GiB") from None
    if not 1 <= value <= MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte and at most 2^63 − 1 bytes (8 EiB)")
    return int(value)


MAX_GIGABYTES = MAX_BYTES / 1e9
"""The most memory per device taken, in GB: 2^63 − 1 bytes (9.2 billion GB; ``1e300`` is a typo,
and its bytes overflow a float)."""


def _capped_gigabytes(text: str, value: float) -> float:
    if value > MAX_GIGABYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is too large; expected at most {MAX_GIGABYTES:.3g} GB (2^63 − 1 bytes)")
    return value


def gigabytes(text: str) -> float:
    """Memory per device in GB (10^9 bytes): above 0, at most :data:`MAX_GIGABYTES`."""
    return _capped_gigabytes(text, count(text))


def reserve_gigabytes(text: str) -> float:
    """Memory to keep free in GB: 0 or more, at most :data:`MAX_GIGABYTES`."""
    return _capped_gigabytes(text, non_negative_float(text))


MAX_SECONDS = 366 * 86400.0
"""The longest limit taken: a year (a timer beyond it overflows, and no step runs that long)."""


def seconds(text: str) -> float:
    """A duration in seconds, above 0 and at most :data:`MAX_SECONDS`: ``30``, ``1.5``, ``3600``."""
    value = _number(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} must be seconds above 0 and at most a year ({MAX_SECONDS:.0f})")
    return value
