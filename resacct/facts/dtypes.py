"""Number formats: bits, bytes, layouts (sign/exponent/fraction), ranges and rounding.

Everything here is derived from the bit layout alone, so that the claims in
``resacct/specs/dtypes.claims.yaml`` can compare it with what torch actually stores.

>>> FORMATS["bfloat16"].exponent_bits, FORMATS["bfloat16"].fraction_bits
(8, 7)
>>> largest_normal(FORMATS["float16"])
65504.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, no_type_check

if TYPE_CHECKING:  # torch loads when a torch dtype is asked for: layouts and bytes (napkin math) never need it
    import torch

from resacct.errors import ResacctError, UnknownNameError

__all__ = [
    "FloatFormat",
    "FORMATS",
    "MX_FORMATS",
    "BlockScaledFormat",
    "parse_dtype",
    "dtype_name",
    "dtype_bits",
    "dtype_bytes",
    "largest_normal",
    "smallest_normal",
    "smallest_subnormal",
    "machine_epsilon",
    "decimal_digits",
    "decode_bits",
    "encode_bits",
    "bit_fields",
]

Special = Literal["ieee", "fn", "none"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point layout: 1 sign bit, ``exponent_bits``, ``fraction_bits``.

    ``specials`` says what the all-ones exponent means: ``"ieee"`` (infinities and NaNs, as in
    float32/float16/bfloat16/float8_e5m2), ``"fn"`` (finite: only the all-ones pattern is NaN,
    as in float8_e4m3fn), ``"none"`` (no infinities or NaNs at all, as in fp4 e2m1).
    """

    name: str
    exponent_bits: int
    fraction_bits: int
    specials: Special = "ieee"
    torch_name: str | None = None

    @property
    @no_type_check  # called per element/block (tens of thousands of checked calls in the CI quick tier, docs/suite_time.md)
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.fraction_bits

    @property
    @no_type_check  # called per element/block (tens of thousands of checked calls in the CI quick tier, docs/suite_time.md)
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1


FORMATS: dict[str, FloatFormat] = {
    "float64": FloatFormat("float64", 11, 52, "ieee", "float64"),
    "float32": FloatFormat("float32", 8, 23, "ieee", "float32"),
    "float16": FloatFormat("float16", 5, 10, "ieee", "float16"),
    "bfloat16": FloatFormat("bfloat16", 8, 7, "ieee", "bfloat16"),
    "float8_e4m3fn": FloatFormat("float8_e4m3fn", 4, 3, "fn", "float8_e4m3fn"),
    "float8_e5m2": FloatFormat("float8_e5m2", 5, 2, "ieee", "float8_e5m2"),
    "float4_e2m1": FloatFormat("float4_e2m1", 2, 1, "none", None),
}


@dataclass(frozen=True)
class BlockScaledFormat:
    """A block-scaled ("microscaling") format: blocks of ``block_size`` elements share one scale."""

    name: str
    element: str
    block_size: int
    scale_bits: int
    source: str

    @property
    def bits_per_element(self) -> float:
        return FORMATS[self.element].bits + self.scale_bits / self.block_size


MX_FORMATS: dict[str, BlockScaledFormat] = {
    "mxfp8_e4m3": BlockScaledFormat("mxfp8_e4m3", "float8_e4m3fn", 32, 8, "OCP Microscaling Formats (MX) v1.0, 2023"),
    "mxfp4": BlockScaledFormat("mxfp4", "float4_e2m1", 32, 8, "OCP Microscaling Formats (MX) v1.0, 2023"),
    "nvfp4": BlockScaledFormat("nvfp4", "float4_e2m1", 16, 8, "NVIDIA Blackwell NVFP4: e4m3 scale per 16 values"),
}

_ALIASES = {
    "fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32", "fp16": "float16",
    "half": "float16", "bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2", "fp4": "float4_e2m1", "e2m1": "float4_e2m1",
}


def _torch_dtypes() -> dict[str, torch.dtype]:
    import torch

    names = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8",
             "int16", "int32", "int64", "bool", "complex64", "complex128", "uint16", "uint32", "uint64"]
    return {name: getattr(torch, name) for name in names if isinstance(getattr(torch, name, None), torch.dtype)}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"`` or ``torch.bfloat16`` → ``torch.bfloat16``.

    >>> parse_dtype("bf16")
    torch.bfloat16
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower()).removeprefix("torch.")
    known = _torch_dtypes()
    if key in known:
        return known[key]
    raise UnknownNameError("dtype", name, sorted(known) + sorted(_ALIASES))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_bits(dtype: str | torch.dtype) -> int:
    """Bits per element, from the layout tables (not from torch)."""
    key = _ALIASES.get(str(dtype).lower(), str(dtype).lower()).removeprefix("torch.")
    if key in FORMATS:
        return FORMATS[key].bits
    integer_bits = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32,
                    "int64": 64, "uint64": 64, "complex64": 64, "complex128": 128}
    if key in integer_bits:
        return integer_bits[key]
    raise UnknownNameError("dtype", dtype, sorted(FORMATS) + sorted(integer_bits))


def dtype_bytes(dtype: str | torch.dtype) -> float:
    """Bytes per element: bits / 8 (0.5 for fp4)."""
    return dtype_bits(dtype) / 8


def _max_exponent_field(fmt: FloatFormat) -> int:
    all_ones = 2**fmt.exponent_bits - 1
    return all_ones - 1 if fmt.specials == "ieee" else all_ones


def largest_normal(fmt: FloatFormat) -> float:
    """The largest finite value the layout can hold."""
    exponent = _max_exponent_field(fmt) - fmt.bias
    fraction_units = 2**fmt.fraction_bits - 1
    if fmt.specials == "fn":
        fraction_units -= 1  # all-ones exponent and fraction is the one NaN
    return (1 + fraction_units / 2**fmt.fraction_bits) * 2.0**exponent


def smallest_normal(fmt: FloatFormat) -> float:
    return 2.0 ** (1 - fmt.bias)


def smallest_subnormal(fmt: FloatFormat) -> float:
    return 2.0 ** (1 - fmt.bias - fmt.fraction_bits)


def machine_epsilon(fmt: FloatFormat) -> float:
    """Gap between 1.0 and the next representable value."""
    return 2.0**-fmt.fraction_bits


def decimal_digits(fmt: FloatFormat) -> float:
    """Significant decimal digits the fraction carries: log10(2^(fraction_bits + 1))."""
    return (fmt.fraction_bits + 1) * math.log10(2)


def bit_fields(raw: int, fmt: FloatFormat) -> tuple[int, int, int]:
    """(sign, exponent field, fraction field) of a raw bit pattern."""
    if not 0 <= raw < 2**fmt.bits:
        raise ResacctError(f"bit pattern {raw} does not fit in {fmt.bits} bits of {fmt.name}")
    fraction = raw & (2**fmt.fraction_bits - 1)
    exponent = (raw >> fmt.fraction_bits) & (2**fmt.exponent_bits - 1)
    sign = raw >> (fmt.bits - 1)
    return sign, exponent, fraction


def decode_bits(raw: int, fmt: FloatFormat) -> float:
    """The value a raw bit pattern stands for in ``fmt``."""
    sign, exponent, fraction = bit_fields(raw, fmt)
    scale = -1.0 if sign else 1.0
    all_ones = 2**fmt.exponent_bits - 1
    if fmt.specials == "ieee" and exponent == all_ones:
        return scale * math.inf if fraction == 0 else math.nan
    if fmt.specials == "fn" and exponent == all_ones and fraction == 2**fmt.fraction_bits - 1:
        return math.nan
    if exponent == 0:
        return scale * fraction * smallest_subnormal(fmt)
    return scale * (1 + fraction / 2**fmt.fraction_bits) * 2.0 ** (exponent - fmt.bias)


def encode_bits(value: float, fmt: FloatFormat) -> int:
    """The raw bit pattern of the representable ``value`` (it must be exactly representable)."""
    if math.isnan(value):
        raise ResacctError("NaN has many bit patterns; encode_bits takes a number")
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if math.isinf(magnitude):
        if fmt.specials != "ieee":
            raise ResacctError(f"{fmt.name} has no infinity")
        return (sign << (fmt.bits - 1)) | ((2**fmt.exponent_bits - 1) << fmt.fraction_bits)
    if magnitude < smallest_normal(fmt):
        exponent, fraction = 0, magnitude / smallest_subnormal(fmt)
    else:
        mantissa, power = math.frexp(magnitude)  # magnitude = mantissa * 2**power, mantissa in [0.5, 1)
        exponent = power - 1 + fmt.bias
        fraction = (mantissa * 2 - 1) * 2**fmt.fraction_bits
    # Beyond the largest finite value: a too-large exponent, or (e4m3fn) the all-ones pattern that is NaN.
    if fraction != int(fraction) or exponent > _max_exponent_field(fmt) or magnitude > largest_normal(fmt):
        raise ResacctError(f"{value!r} is not exactly representable in {fmt.name}")
    return (sign << (fmt.bits - 1)) | (exponent << fmt.fraction_bits) | int(fraction)
