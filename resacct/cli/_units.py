"""``--units decimal|binary``: bytes in GB (10^9, as resacct prints by default and datasheets state
HBM) or GiB (2^30, as PyTorch's memory summaries, nvidia-smi and DeepSpeed's estimators print).

>>> gigabytes_text(80e9, "decimal"), gigabytes_text(80e9, "binary")
('80.00 GB', '74.51 GiB')
>>> gigabytes_text(192 * 2**30, "decimal")   # MI300X's "192 GB" is 192 GiB
'206.16 GB'
"""

from __future__ import annotations

import argparse

__all__ = ["UNITS", "add_units_flag", "unit_scale", "gigabytes_text"]

UNITS = {"decimal": (1e9, "GB"), "binary": (float(2**30), "GiB")}


def _units(text: str) -> str:
    if text not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a unit system; choose decimal (GB = 10^9 bytes, the default) or binary (GiB = 2^30 bytes)")
    return text


def add_units_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--units", type=_units, default="decimal", metavar="decimal|binary",
                        help="bytes in the text as GB = 10^9 (decimal, default) or GiB = 2^30 (binary); --json always gives bytes")


def unit_scale(units: str) -> tuple[float, str]:
    """Bytes per printed unit and its name."""
    return UNITS[units]


def gigabytes_text(value_bytes: float, units: str, digits: int = 2) -> str:
    scale, name = UNITS[units]
    return f"{value_bytes / scale:.{digits}f} {name}"
