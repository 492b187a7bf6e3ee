"""Measuring number formats with torch: finfo, raw bit patterns, rounding."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from resacct.facts.dtypes import (
    FORMATS,
    decode_bits,
    dtype_bits,
    largest_normal,
    machine_epsilon,
    parse_dtype,
    smallest_normal,
    smallest_subnormal,
)
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.harness.strategies import strategy

_RAW_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


@strategy("float16_value")
def _float16_values() -> st.SearchStrategy:
    return st.floats(min_value=-65504, max_value=65504, allow_nan=False, width=16)


@strategy("float32_value")
def _float32_values() -> st.SearchStrategy:
    return st.floats(allow_nan=False, allow_infinity=False, width=32)


@strategy("float32_normal_positive")
def _float32_normals() -> st.SearchStrategy:
    return st.floats(min_value=float(torch.finfo(torch.float32).tiny), max_value=float(torch.finfo(torch.float32).max), width=32)


@strategy("bfloat16_normal_positive")
def _bfloat16_normals() -> st.SearchStrategy:
    return st.floats(min_value=float(torch.finfo(torch.bfloat16).tiny), max_value=float(torch.finfo(torch.bfloat16).max), width=32)


@strategy("float16_underflowing")
def _float16_underflowing() -> st.SearchStrategy:
    half_smallest_subnormal = 2.0**-25
    return st.floats(min_value=0.0, max_value=half_smallest_subnormal, exclude_min=True, exclude_max=True)


def _raw_bits(value: torch.Tensor) -> int:
    """The stored bit pattern of a one-element tensor, as an unsigned integer."""
    bits = torch.finfo(value.dtype).bits
    raw = int(value.reshape(1).view(_RAW_INT[bits]).item())
    return raw % 2**bits


def _stored(value: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float64).to(dtype)


@check("dtypes.bits", evidence="measured")
def bits(dtype: str) -> Outcome:
    """Bits per element: torch.finfo/iinfo(dtype).bits."""
    torch_dtype = parse_dtype(dtype)
    info = torch.finfo(torch_dtype) if torch_dtype.is_floating_point else torch.iinfo(torch_dtype)
    return Outcome(measured=info.bits, predicted=dtype_bits(dtype))


@check("dtypes.element_size", evidence="measured", quantities=("bits",))
def element_size(dtype: str) -> Outcome:
    """Bytes per element of a real tensor (``element_size()``), with the dtype's bits."""
    torch_dtype = parse_dtype(dtype)
    tensor = torch.zeros(1, dtype=torch_dtype)
    measured_bits = tensor.element_size() * 8 if torch_dtype in (torch.bool, torch.complex64, torch.complex128) else (
        torch.finfo(torch_dtype).bits if torch_dtype.is_floating_point else torch.iinfo(torch_dtype).bits
    )
    return Outcome(measured=tensor.element_size(), predicted=dtype_bits(dtype) // 8, quantities={"bits": measured_bits})


@check("dtypes.layout", evidence="measured", quantities=("sign_bits", "exponent_bits", "fraction_bits"))
def layout(dtype: str, field: str) -> Outcome:
    """Sign, exponent and fraction widths, measured from torch's raw bit patterns.

    fraction bits = log2(bits(2.0) − bits(1.0)) (one step of the exponent field);
    sign bits = popcount(bits(−1.0) xor bits(1.0)); exponent bits = the rest.
    """
    torch_dtype = parse_dtype(dtype)
    total = torch.finfo(torch_dtype).bits
    one, two, minus_one = (_raw_bits(_stored(v, torch_dtype)) for v in (1.0, 2.0, -1.0))
    fraction_bits = int(math.log2(two - one))
    sign_bits = bin(one ^ minus_one).count("1")
    measured = {"sign_bits": sign_bits, "fraction_bits": fraction_bits, "exponent_bits": total - sign_bits - fraction_bits}
    fmt = FORMATS[dtype]
    predicted = {"sign_bits": 1, "fraction_bits": fmt.fraction_bits, "exponent_bits": fmt.exponent_bits}
    return Outcome(measured=measured[field], predicted=predicted[field], quantities=measured)


_FINFO_FIELDS = {"max": "max", "smallest_normal": "tiny", "eps": "eps"}


@check("dtypes.finfo", evidence="measured")
def finfo(dtype: str, field: str) -> Outcome:
    """A number from torch.finfo (max, smallest_normal, eps) or the smallest subnormal read from
    the bit pattern 0…01; predicted from the layout."""
    torch_dtype = parse_dtype(dtype)
    fmt = FORMATS[dtype]
    if field == "smallest_subnormal":
        pattern = torch.tensor([1], dtype=_RAW_INT[fmt.bits]).view(torch_dtype)
        measured = float(pattern.to(torch.float64).item())
    else:
        measured = float(getattr(torch.finfo(torch_dtype), _FINFO_FIELDS[field]))
    predicted = {"max": largest_normal, "smallest_normal": smallest_normal, "smallest_subnormal": smallest_subnormal, "eps": machine_epsilon}[field](fmt)
    return Outcome(measured=measured, predicted=predicted)


@check("dtypes.log10_range", evidence="measured")
def log10_range(dtype: str, end: str) -> Outcome:
    """log10 of the largest finite value (end=max) or of the smallest normal (end=min)."""
    info = torch.finfo(parse_dtype(dtype))
    fmt = FORMATS[dtype]
    if end == "max":
        return Outcome(measured=math.log10(float(info.max)), predicted=math.log10(largest_normal(fmt)))
    return Outcome(measured=math.log10(float(info.tiny)), predicted=math.log10(smallest_normal(fmt)))


@check("dtypes.decimal_digits", evidence="measured")
def decimal_digits(dtype: str) -> Outcome:
    """Decimal digits of precision, −log10(eps) from torch.finfo; predicted from the fraction bits."""
    from resacct.facts.dtypes import decimal_digits as predicted_digits

    eps = float(torch.finfo(parse_dtype(dtype)).eps)
    return Outcome(measured=-math.log10(eps), predicted=predicted_digits(FORMATS[dtype]))


@check("dtypes.stored_value", evidence="measured")
def stored_value(value: float, dtype: str) -> Outcome:
    """The value torch stores for ``torch.tensor([value], dtype=dtype)``; predicted by rounding
    in resacct's layout (decode of the nearest pattern)."""
    torch_dtype = parse_dtype(dtype)
    measured = float(torch.tensor([value], dtype=torch_dtype).to(torch.float64).item())
    return Outcome(measured=measured, predicted=_round_to_format(value, dtype))


def _round_to_format(value: float, dtype: str) -> float:
    """Round-to-nearest-even into ``dtype`` using only the layout (no torch arithmetic)."""
    fmt = FORMATS[dtype]
    if value == 0 or math.isinf(value):
        return value
    magnitude = abs(value)
    exponent = max(math.frexp(magnitude)[1] - 1, 1 - fmt.bias)
    quantum = 2.0 ** (exponent - fmt.fraction_bits)
    rounded = round(magnitude / quantum) * quantum  # Python's round() is half-to-even
    if rounded > largest_normal(fmt) and fmt.specials == "ieee":
        return math.copysign(math.inf, value)
    return math.copysign(rounded, value)


@check("dtypes.is_zero_after_cast", evidence="measured")
def is_zero_after_cast(value: float, dtype: str) -> Outcome:
    """Whether ``value`` becomes exactly 0 when stored in ``dtype``."""
    measured = bool(torch.tensor([value], dtype=parse_dtype(dtype)).item() == 0)
    return Outcome(measured=measured, predicted=_round_to_format(value, dtype) == 0)


@check("dtypes.is_inf_after_cast", evidence="measured")
def is_inf_after_cast(value: float, dtype: str) -> Outcome:
    """Whether ``value`` becomes infinite when stored in ``dtype``."""
    measured = bool(torch.isinf(torch.tensor([value], dtype=parse_dtype(dtype))).item())
    return Outcome(measured=measured, predicted=math.isinf(_round_to_format(value, dtype)))


@check("dtypes.decode_with_layout", evidence="measured", quantities=("decoded",))
def decode_with_layout(value: float, dtype: str, exponent_bits: int, fraction_bits: int) -> Outcome:
    """Decode torch's raw bits of ``value`` in ``dtype`` with the claimed layout (quantity
    ``decoded``); measured is the value torch stores. A wrong layout decodes to another number."""
    from resacct.facts.dtypes import FloatFormat

    torch_dtype = parse_dtype(dtype)
    stored = _stored(value, torch_dtype)
    raw = _raw_bits(stored)
    measured = float(stored.to(torch.float64).item())
    claimed = FloatFormat("claimed", exponent_bits, fraction_bits)
    if claimed.bits != torch.finfo(torch_dtype).bits:
        decoded = math.nan
    else:
        decoded = decode_bits(raw, claimed)
    return Outcome(measured=measured, predicted=decode_bits(raw, FORMATS[dtype]), quantities={"decoded": decoded})


@check("dtypes.relative_rounding_error", evidence="measured")
def relative_rounding_error(value: float, dtype: str) -> Outcome:
    """|stored − value| / |value| for a value stored in ``dtype`` (measured with torch)."""
    stored = float(torch.tensor([value], dtype=parse_dtype(dtype)).to(torch.float64).item())
    return Outcome(measured=abs(stored - value) / abs(value))


@check("dtypes.ratio", evidence="measured")
def ratio(dtype: str, other: str, field: str) -> Outcome:
    """torch.finfo(dtype).field / torch.finfo(other).field."""
    mine = float(getattr(torch.finfo(parse_dtype(dtype)), _FINFO_FIELDS[field]))
    theirs = float(getattr(torch.finfo(parse_dtype(other)), _FINFO_FIELDS[field]))
    fmt, other_fmt = FORMATS[dtype], FORMATS[other]
    getter = {"max": largest_normal, "smallest_normal": smallest_normal, "eps": machine_epsilon}[field]
    return Outcome(measured=mine / theirs, predicted=getter(fmt) / getter(other_fmt))


@check("dtypes.default_dtype", evidence="measured")
def default_dtype() -> Outcome:
    """The dtype of ``torch.zeros(4, 8)`` with no dtype given."""
    return Outcome(measured=str(torch.zeros(4, 8).dtype).removeprefix("torch."), predicted="float32")


@check("dtypes.packed_fp4_bits", evidence="measured")
def packed_fp4_bits() -> Outcome:
    """Bits per fp4 value in torch's packed ``float4_e2m1fn_x2`` (two values per byte)."""
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    if packed is None:
        raise NotMeasurable(f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype")
    return Outcome(measured=torch.empty(1, dtype=packed).element_size() * 8 // 2, predicted=FORMATS["float4_e2m1"].bits)
