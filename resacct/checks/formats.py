"""Checking the number-format table (resacct.facts.number_formats) against torch and published tables.

Where torch has the format, the **measured** values are torch's: ``torch.finfo`` for the largest
value, the smallest normal, eps and the bits, and torch's reading of raw bit patterns (the pattern
1 viewed as the format: the smallest subnormal). tf32 has no torch dtype but is fp32 with the 13 low
mantissa bits unused, so its values are fp32 bit patterns read by torch (0x7F7FE000 is its largest
value). fp6 and fp4 cannot be converted by torch here: their measured side is the figure the OCP MX
specification prints, given in the claim. The **prediction** is the table's row.
"""

from __future__ import annotations

import torch

from resacct.facts.number_formats import format_row
from resacct.harness.registry import NotMeasurable, Outcome, check

_RAW_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _torch_dtype(name: str) -> torch.dtype:
    row = format_row(name)
    dtype = getattr(torch, (row.torch_dtype or "").split(" ")[0], None)
    if not isinstance(dtype, torch.dtype):
        raise NotMeasurable(f"torch {torch.__version__} has no dtype for {row.name}")
    return dtype


def _pattern(raw: int, bits: int, dtype: torch.dtype) -> float:
    """The value torch reads from the raw bit pattern ``raw`` of a ``bits``-bit ``dtype``."""
    if bits == 32 and raw >= 2**31:
        raw -= 2**32
    return float(torch.tensor([raw], dtype=_RAW_INT[bits]).view(dtype).to(torch.float64).item())


def _predicted(name: str) -> list[float]:
    row = format_row(name)
    values = [row.max_value, row.smallest_normal, row.smallest_subnormal, row.eps]
    return [float(v) for v in values if v is not None]


@check("formats.torch_properties", evidence="measured")
def torch_properties(format: str) -> Outcome:
    """[largest value, smallest normal, smallest subnormal, eps] as torch reports them
    (``torch.finfo``; the subnormal from the bit pattern 1), against the table's row. e8m0 has no
    subnormals: three values."""
    dtype = _torch_dtype(format)
    info = torch.finfo(dtype)
    measured = [float(info.max), float(info.smallest_normal)]
    if format_row(format).smallest_subnormal is not None:
        measured.append(_pattern(1, info.bits, dtype))
    measured.append(float(info.eps))
    return Outcome(measured=measured, predicted=_predicted(format))


@check("formats.torch_bits", evidence="measured")
def torch_bits(format: str) -> Outcome:
    """Bits of one value, ``torch.finfo(dtype).bits``, against the table's row."""
    return Outcome(measured=int(torch.finfo(_torch_dtype(format)).bits), predicted=format_row(format).bits)


@check("formats.tf32_patterns", evidence="measured")
def tf32_patterns() -> Outcome:
    """tf32's [largest value, smallest normal, smallest subnormal, eps] read by torch from fp32 bit
    patterns whose 13 low mantissa bits are zero (0x7F7FE000, 0x00800000, 0x00002000, and
    0x3F802000 − 1.0), against the table's tf32 row."""
    read = [_pattern(raw, 32, torch.float32) for raw in (0x7F7FE000, 0x00800000, 0x00002000, 0x3F802000)]
    read[3] -= 1.0
    return Outcome(measured=read, predicted=_predicted("tf32"))


@check("formats.published_properties", evidence="published")
def published_properties(format: str, reported: list[float]) -> Outcome:
    """[largest value, smallest normal, smallest subnormal] as a specification prints them
    (``reported``), for a format torch cannot convert, against the table's row."""
    return Outcome(measured=[float(v) for v in reported], predicted=_predicted(format)[:3])
