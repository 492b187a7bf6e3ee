"""Output helpers shared by commands: ``--json`` (named fields with units in the names) or text.

``--json`` is strict JSON (RFC 8259): a quantity that overflows a float (``inf``) or is undefined
(``nan``) is written as ``null``, never as ``Infinity``/``NaN``, which JSON parsers refuse; the
text output says in words what happened instead.

>>> days_text(143.9)
'143.9 days'
>>> days_text(0.5), days_text(2.3e-7), days_text(2.3e280)
('12 hours', '0.0199 seconds', '2.3e+280 days')
>>> days_text(float("inf")), days_text(0.0)
('more than 1.8e+308 days', 'less than 1e-308 days')
>>> amount_text(float("inf"), "parameters"), count_text(10**300)
('more than 1.8e+308 parameters', '1e+300')
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["add_json_flag", "emit", "user_output_to_stderr", "with_caveat", "days_text", "amount_text", "count_text", "ratio_text", "format_quantity"]

_FLOAT_MAX_TEXT = f"{sys.float_info.max:.2g}"  # 1.8e+308


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with named fields (units in the names); a value beyond a float is null")


def emit(args: argparse.Namespace, fields: dict[str, Any], text: str) -> int:
    """Print ``fields`` as strict JSON when ``--json`` was given, else the human-readable ``text``."""
    from resacct.reporting.documents import strict_json_text

    if getattr(args, "json", False):
        sys.stdout.write(strict_json_text(fields, non_finite="null"))
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return 0


@contextlib.contextmanager
def user_output_to_stderr(active: bool) -> Iterator[None]:
    """While ``active`` (``--json``), whatever the body prints — a user's factory or forward calling
    ``print``, a C extension writing to file descriptor 1 — goes to stderr, so that stdout holds
    the one JSON object alone; restored afterwards."""
    if not active:
        yield
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptor 1 or 2 (a closed stream): Python's print is redirected all the same
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def with_caveat(fields: dict[str, Any], text: str, board: Any) -> str:
    """Where ``board`` (an accelerator, or None) has figures from third-party tables only, add its
    one-line caveat to the JSON ``fields`` (``source_caveat``, else null) and to the ``text``."""
    caveat = getattr(board, "caveat", "") if board is not None else ""
    fields["source_caveat"] = caveat or None
    return f"{text.rstrip()}\n  {caveat}" if caveat else text


def amount_text(value: float, unit: str, digits: int = 4) -> str:
    """``value unit`` with ``digits`` significant digits; words where a float ran out of range."""
    if math.isnan(value):
        return f"an undefined number of {unit} (0/0 or ∞/∞ in the inputs)"
    if math.isinf(value):
        return f"more than {_FLOAT_MAX_TEXT} {unit}" if value > 0 else f"less than -{_FLOAT_MAX_TEXT} {unit}"
    if value == 0:
        return f"less than 1e-308 {unit}"
    return f"{value:.{digits}g} {unit}"


def ratio_text(value: float) -> str:
    """A utilization such as MFU: three decimals where that shows it (0.001 to 1000), else
    scientific; words past a float (``more than 1.8e+308``)."""
    if not math.isfinite(value):
        return amount_text(value, "").rstrip()
    return f"{value:.3f}" if 0.001 <= abs(value) < 1000 else f"{value:.3g}"


def count_text(value: float) -> str:
    """A count such as devices: in full up to 10^15, else scientific (``1e+300``)."""
    if isinstance(value, int) and abs(value) < 10**15:
        return str(value)
    return f"{value:.4g}"


def days_text(days: float) -> str:
    """A duration that never reads ``0.0 days`` or ``inf days``: days (one decimal) from a day up,
    hours below a day, seconds below an hour, scientific notation far from 1, words past a float."""
    if not math.isfinite(days) or days <= 0:
        return amount_text(days, "days")
    if days >= 1e6:
        return f"{days:.3g} days"
    if days >= 1:
        return f"{days:.1f} days"
    if days >= 1 / 24:
        return f"{days * 24:.3g} hours"
    return f"{days * 86400:.3g} seconds"


_SCALES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_quantity(value: float | None, unit: str, units: str = "decimal") -> str:
    """A number for the table: 4 significant digits with an SI prefix for FLOPs and bytes (bytes in
    powers of 2^10 with ``units="binary"``: ``--units binary``).

    >>> format_quantity(874944921600, "FLOPs"), format_quantity(1432915972, "bytes"), format_quantity(16.0002, "B/param")
    ('874.9 GFLOPs', '1.433 GB', '16.0002 B/param')
    >>> format_quantity(1432915972, "bytes", "binary"), format_quantity(512, "bytes", "binary")
    ('1.335 GiB', '512 B')
    >>> format_quantity(6738415616, "parameters")
    '6,738,415,616'
    """
    if value is None:
        return "—"
    if unit == "bytes" and units == "binary":
        for power, prefix in ((5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
            if abs(value) >= 1024**power:
                return f"{value / 1024**power:.4g} {prefix}B"
        return f"{value:.0f} B"
    if unit in ("FLOPs", "bytes", "FLOP/s"):
        short = {"FLOPs": "FLOPs", "bytes": "B", "FLOP/s": "FLOP/s"}[unit]
        for scale, prefix in _SCALES:
            if abs(value) >= scale:
                return f"{value / scale:.4g} {prefix}{short}"
        return f"{value:.0f} {short}"
    if unit == "B/param":
        return f"{value:.6g} B/param"
    if unit in ("parameters", "tensors"):
        return f"{value:,.0f}"
    return f"{value:.4g} {unit}".rstrip()
