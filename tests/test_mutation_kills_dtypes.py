"""resacct.facts.dtypes against torch, written to kill the mutants mutmut left alive (docs/mutation.md).

Every expectation comes from torch itself (``element_size``, ``torch.finfo``, the value a raw bit
pattern has after ``Tensor.view(dtype)``) or, for fp4 which torch cannot store, from the OCP
Microscaling spec's e2m1 value table; none restates resacct's formulas.
"""

from __future__ import annotations

import math

import pytest
import torch

from resacct.facts import dtypes
from resacct.facts.dtypes import FORMATS, decode_bits, encode_bits
from resacct.errors import ResacctError, UnknownNameError

TORCH_NAMES = [
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int16",
    "int32", "int64", "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
]
TORCH_DTYPES = {name: getattr(torch, name) for name in TORCH_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}
FLOAT_NAMES = [name for name, fmt in FORMATS.items() if fmt.torch_name]
# The same-width integer type whose bits ``Tensor.view`` reinterprets as the float format.
CARRIER = {64: torch.int64, 32: torch.int32, 16: torch.int16, 8: torch.uint8}


def torch_bits(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size() * 8


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_bits_bytes_and_names_match_torch_for_every_spelling(name):
    dtype = TORCH_DTYPES[name]
    for spelling in (dtype, name, name.upper(), f"torch.{name}", str(dtype)):
        assert dtypes.dtype_bits(spelling) == torch_bits(dtype), spelling
        assert dtypes.dtype_bytes(spelling) == torch.empty(0, dtype=dtype).element_size(), spelling
    for spelling in (dtype, name, f" {name.upper()} ", f"torch.{name}", f"TORCH.{name}"):
        assert dtypes.parse_dtype(spelling) is dtype, spelling
    assert dtypes.dtype_name(dtype) == name
    assert getattr(torch, dtypes.dtype_name(dtype)) is dtype


ALIASES = {  # resacct's short names, resolved by torch's own attribute of the long name
    "fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32", "fp16": "float16",
    "half": "float16", "bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases_name_the_torch_dtype(alias):
    dtype = getattr(torch, ALIASES[alias])
    for spelling in (alias, alias.upper(), f" {alias} "):
        assert dtypes.parse_dtype(spelling) is dtype
    assert dtypes.dtype_bits(alias) == dtypes.dtype_bits(alias.upper()) == torch_bits(dtype)


def test_fp4_has_four_bits_and_half_a_byte():
    """OCP MX v1.0: FP4 (E2M1) elements are 4 bits wide; torch has no such dtype to store."""
    for spelling in ("fp4", "e2m1", "float4_e2m1", "FP4"):
        assert dtypes.dtype_bits(spelling) == 4
        assert dtypes.dtype_bytes(spelling) == 0.5


@pytest.mark.parametrize("bad", ["float13", "tensor", "torch.floaty"])
def test_unknown_names_are_refused_with_the_name_and_suggestions(bad):
    with pytest.raises(UnknownNameError, match=rf"unknown dtype {bad!r}.*known:.*bfloat16"):
        dtypes.dtype_bits(bad)
    with pytest.raises(UnknownNameError, match=rf"unknown dtype {bad!r}") as error:
        dtypes.parse_dtype(bad)
    assert error.value.kind == "dtype" and error.value.name == bad
    assert "bf16" in error.value.known and "float32" in error.value.known  # aliases and torch names
    with pytest.raises(UnknownNameError, match=r"did you mean 'float32'"):
        dtypes.parse_dtype("float31")
    with pytest.raises(UnknownNameError, match=r"did you mean 'float32'"):
        dtypes.dtype_bits("float31")


def _patterns(fmt) -> list[int]:
    """Every bit pattern of an 8-bit format; for wider ones every sign × exponent with edge fractions."""
    if fmt.bits <= 8:
        return list(range(2**fmt.bits))
    top = 2**fmt.fraction_bits - 1
    fractions = sorted({0, 1, 2, 3, top // 2, top - 1, top})
    return [
        (sign << (fmt.bits - 1)) | (exponent << fmt.fraction_bits) | fraction
        for sign in (0, 1)
        for exponent in range(2**fmt.exponent_bits)
        for fraction in fractions
    ]


def _torch_values(patterns: list[int], fmt) -> list[float]:
    carrier = CARRIER[fmt.bits]
    signed = [p - 2**fmt.bits if carrier.is_signed and p >= 2 ** (fmt.bits - 1) else p for p in patterns]
    raw = torch.tensor(signed, dtype=carrier)
    return raw.view(getattr(torch, fmt.torch_name)).to(torch.float64).tolist()


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_decode_and_encode_agree_with_the_bits_torch_stores(name):
    fmt = FORMATS[name]
    patterns = _patterns(fmt)
    for raw, expected in zip(patterns, _torch_values(patterns, fmt)):
        decoded = decode_bits(raw, fmt)
        assert _same(decoded, expected), (name, hex(raw), decoded, expected)
        if not math.isnan(expected):
            assert encode_bits(expected, fmt) == raw, (name, hex(raw), expected)


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_decode_and_encode_agree_with_torch_for_wide_formats(name):
    fmt = FORMATS[name]
    top = 2**fmt.fraction_bits - 1
    patterns = [
        (sign << (fmt.bits - 1)) | (exponent << fmt.fraction_bits) | fraction
        for sign in (0, 1)
        for exponent in (0, 1, 2, fmt.bias - 1, fmt.bias, fmt.bias + 1, 2**fmt.exponent_bits - 2, 2**fmt.exponent_bits - 1)
        for fraction in (0, 1, top // 3, top)
    ]
    for raw, expected in zip(patterns, _torch_values(patterns, fmt)):
        assert _same(decode_bits(raw, fmt), expected), (name, hex(raw))
        if not math.isnan(expected):
            assert encode_bits(expected, fmt) == raw, (name, hex(raw))


def test_fp4_e2m1_values_follow_the_ocp_table():
    """OCP MX v1.0 table: E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (no inf, no NaN); bit 3 is the sign."""
    fmt = FORMATS["float4_e2m1"]
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    for code, value in enumerate(table):
        assert _same(decode_bits(code, fmt), value)
        assert _same(decode_bits(code | 0b1000, fmt), -value)
        assert encode_bits(value, fmt) == code
        assert encode_bits(-value, fmt) == code | 0b1000
    assert dtypes.largest_normal(fmt) == 6.0 and dtypes.smallest_normal(fmt) == 1.0
    assert dtypes.smallest_subnormal(fmt) == 0.5 and dtypes.machine_epsilon(fmt) == 0.5
    for value in (math.inf, -math.inf):
        with pytest.raises(ResacctError, match="float4_e2m1 has no infinity"):
            encode_bits(value, fmt)
    for value in (0.25, 5.0, 7.0, 8.0, 12.0):
        with pytest.raises(ResacctError, match=rf"{value!r} is not exactly representable in float4_e2m1"):
            encode_bits(value, fmt)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e5m2", "float32"])
def test_infinities_encode_to_the_pattern_torch_stores(name):
    fmt = FORMATS[name]
    dtype = getattr(torch, name)
    for value in (math.inf, -math.inf):
        stored = torch.tensor([value], dtype=dtype).view(CARRIER[fmt.bits]).item() % 2**fmt.bits
        assert encode_bits(value, fmt) == stored


def test_encode_refuses_what_the_format_cannot_hold():
    e4m3 = FORMATS["float8_e4m3fn"]
    half = FORMATS["float16"]
    with pytest.raises(ResacctError, match=r"^NaN has many bit patterns; encode_bits takes a number$"):
        encode_bits(math.nan, half)
    with pytest.raises(ResacctError, match="float8_e4m3fn has no infinity"):
        encode_bits(math.inf, e4m3)
    finfo_max = torch.finfo(torch.float16).max
    assert encode_bits(finfo_max, half) == torch.tensor([finfo_max], dtype=torch.float16).view(torch.int16).item()
    for value, fmt in ((1.1, half), (65536.0, half), (2.0**-25, half), (1e6, half), (512.0, e4m3), (0.3, e4m3)):
        with pytest.raises(ResacctError, match=rf"{value!r} is not exactly representable in {fmt.name}"):
            encode_bits(value, fmt)


def test_encode_refuses_e4m3fn_values_beyond_its_max_whose_bits_would_be_nan():
    """480 = 1.875 × 2^8 has e4m3fn's all-ones exponent and fraction: that pattern is NaN, not 480."""
    fmt = FORMATS["float8_e4m3fn"]
    assert torch.tensor([0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn).float().isnan().item()
    with pytest.raises(ResacctError, match=r"480.0 is not exactly representable in float8_e4m3fn"):
        encode_bits(480.0, fmt)
    assert encode_bits(torch.finfo(torch.float8_e4m3fn).max, fmt) == 0x7E


@pytest.mark.parametrize("name", ["float16", "float8_e4m3fn", "float4_e2m1"])
def test_bit_fields_take_exactly_the_patterns_of_the_width(name):
    fmt = FORMATS[name]
    assert dtypes.bit_fields(2**fmt.bits - 1, fmt) == (1, 2**fmt.exponent_bits - 1, 2**fmt.fraction_bits - 1)
    assert dtypes.bit_fields(0, fmt) == (0, 0, 0)
    for raw in (2**fmt.bits, 2**fmt.bits + 1, 3**fmt.bits, -1):
        with pytest.raises(ResacctError, match=rf"bit pattern {raw} does not fit in {fmt.bits} bits of {name}"):
            dtypes.bit_fields(raw, fmt)


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_range_constants_match_torch_finfo(name):
    fmt = FORMATS[name]
    finfo = torch.finfo(getattr(torch, name))
    assert dtypes.largest_normal(fmt) == finfo.max
    assert dtypes.smallest_normal(fmt) == finfo.smallest_normal == finfo.tiny
    assert dtypes.machine_epsilon(fmt) == finfo.eps
    smallest = _torch_values([1], fmt)[0]
    assert dtypes.smallest_subnormal(fmt) == smallest
    # Significant decimal digits of a p-bit significand: -log10 of the unit roundoff eps/2.
    assert dtypes.decimal_digits(fmt) == pytest.approx(-math.log10(finfo.eps / 2))
    assert math.floor(dtypes.decimal_digits(fmt)) >= -math.log10(finfo.resolution) - 1e-9
