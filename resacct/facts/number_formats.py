"""Number formats of training, one row each: bits, exponent and mantissa bits, bias, the largest
value, the smallest normal and subnormal, machine epsilon, infinities and NaNs, and where the
layout is defined — fp64, fp32, tf32, bf16, fp16, fp8 (e4m3, e5m2), fp6 (e2m3, e3m2), fp4 (e2m1),
the e8m0 block scale, and the block-scaled ("MX") formats built from them.

Every value is derived from the bit layout (resacct.facts.dtypes); the claims in
``resacct/specs/formats.claims.yaml`` compare it with ``torch.finfo`` and with torch's reading
of bit patterns where torch has the format, and with the published tables where it has not.

>>> row = format_row("e4m3")
>>> row.name, row.bits, row.max_value, row.smallest_normal, row.smallest_subnormal, row.eps
('fp8_e4m3', 8, 448.0, 0.015625, 0.001953125, 0.125)
>>> format_row("tf32").max_value == (2 - 2**-10) * 2**127
True
>>> len(number_formats()) >= 8
True
"""

from __future__ import annotations

from dataclasses import dataclass

from resacct.errors import UnknownNameError
from resacct.facts.dtypes import FORMATS, MX_FORMATS, FloatFormat, largest_normal, machine_epsilon, smallest_normal, smallest_subnormal

__all__ = ["FormatRow", "BlockFormatRow", "number_formats", "block_formats", "format_row", "format_names"]

_IEEE = "IEEE 754-2008 (binary64, binary32, binary16)"
_OFP8 = "OCP 8-bit Floating Point Specification (OFP8) v1.0, 2023; Micikevicius et al. 2022, arXiv:2209.05433, Table 1"
_MX = "OCP Microscaling Formats (MX) Specification v1.0, 2023: element data types and the E8M0 scale"

#: (row name, layout, aliases, source, storage bits)
_LAYOUTS: tuple[tuple[str, FloatFormat, tuple[str, ...], str, int], ...] = (
    ("fp64", FORMATS["float64"], ("float64", "double"), _IEEE, 64),
    ("fp32", FORMATS["float32"], ("float32", "float"), _IEEE, 32),
    ("tf32", FloatFormat("tfloat32", 8, 10, "ieee", None), ("tensorfloat32",),
     "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): TF32 has fp32's 8-bit exponent and fp16's 10-bit mantissa; "
     "tensor cores read fp32 operands and use 19 of their 32 bits. Its smallest subnormal here is fp32's with the 13 low "
     "mantissa bits dropped; the whitepaper does not say whether tensor cores keep subnormal inputs", 32),
    ("bf16", FORMATS["bfloat16"], ("bfloat16",), "Google Brain bfloat16 (Wang & Kanwar 2019); Intel BF16 specification 2018: fp32's exponent, 7 mantissa bits", 16),
    ("fp16", FORMATS["float16"], ("float16", "half"), _IEEE, 16),
    ("fp8_e4m3", FORMATS["float8_e4m3fn"], ("e4m3", "float8_e4m3fn", "fp8"), _OFP8 + " (E4M3: no infinities, one NaN pattern per sign)", 8),
    ("fp8_e5m2", FORMATS["float8_e5m2"], ("e5m2", "float8_e5m2"), _OFP8 + " (E5M2: IEEE-style infinities and NaNs)", 8),
    ("fp6_e2m3", FloatFormat("float6_e2m3", 2, 3, "none", None), ("e2m3",), _MX + ": no infinities or NaNs", 6),
    ("fp6_e3m2", FloatFormat("float6_e3m2", 3, 2, "none", None), ("e3m2",), _MX + ": no infinities or NaNs", 6),
    ("fp4_e2m1", FORMATS["float4_e2m1"], ("e2m1", "fp4", "float4_e2m1"), _MX + ": no infinities or NaNs", 4),
)

_TORCH_NAMES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8_e4m3": "float8_e4m3fn",
                "fp8_e5m2": "float8_e5m2", "fp4_e2m1": "float4_e2m1fn_x2 (two per byte; no conversions)", "e8m0": "float8_e8m0fnu"}


@dataclass(frozen=True)
class FormatRow:
    """One number format's properties. ``smallest_subnormal`` is None where the format has no
    subnormals (e8m0: every pattern but NaN is a power of two)."""

    name: str
    aliases: tuple[str, ...]
    bits: int  # significant bits: 1 + exponent + mantissa (tf32: 19)
    storage_bits: int  # what one value occupies in memory (tf32: an fp32's 32)
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    max_value: float
    smallest_normal: float
    smallest_subnormal: float | None
    eps: float  # gap between 1 and the next value
    infinities: bool
    nan: bool
    torch_dtype: str | None
    source: str

    def as_fields(self) -> dict[str, object]:
        return {"name": self.name, "aliases": list(self.aliases), "bits": self.bits, "storage_bits": self.storage_bits,
                "sign_bits": self.sign_bits, "exponent_bits": self.exponent_bits, "mantissa_bits": self.mantissa_bits,
                "exponent_bias": self.exponent_bias, "max_value": self.max_value, "smallest_normal": self.smallest_normal,
                "smallest_subnormal": self.smallest_subnormal, "eps": self.eps, "infinities": self.infinities, "nan": self.nan,
                "torch_dtype": self.torch_dtype, "source": self.source}


@dataclass(frozen=True)
class BlockFormatRow:
    """A block-scaled format: ``block_size`` elements of ``element`` share one ``scale`` value."""

    name: str
    element: str
    block_size: int
    scale: str
    bits_per_value: float  # element bits + scale bits ÷ block size
    source: str


def _row(name: str, layout: FloatFormat, aliases: tuple[str, ...], source: str, storage_bits: int) -> FormatRow:
    return FormatRow(name=name, aliases=aliases, bits=layout.bits, storage_bits=storage_bits, sign_bits=1, exponent_bits=layout.exponent_bits,
                     mantissa_bits=layout.fraction_bits, exponent_bias=layout.bias, max_value=largest_normal(layout),
                     smallest_normal=smallest_normal(layout), smallest_subnormal=smallest_subnormal(layout), eps=machine_epsilon(layout),
                     infinities=layout.specials == "ieee", nan=layout.specials != "none", torch_dtype=_TORCH_NAMES.get(name), source=source)


def _e8m0() -> FormatRow:
    """The MX block scale: 8 exponent bits, no sign, no mantissa, bias 127; the pattern 0xFF is NaN,
    every other one is 2^(pattern − 127), so 0 stands for 2^-127 and 254 for 2^127."""
    return FormatRow(name="e8m0", aliases=("float8_e8m0fnu", "mx_scale"), bits=8, storage_bits=8, sign_bits=0, exponent_bits=8, mantissa_bits=0,
                     exponent_bias=127, max_value=2.0**127, smallest_normal=2.0**-127, smallest_subnormal=None, eps=1.0,
                     infinities=False, nan=True, torch_dtype=_TORCH_NAMES["e8m0"], source=_MX)


def number_formats() -> dict[str, FormatRow]:
    """Every format's row, by name, widest first."""
    rows = {name: _row(name, layout, aliases, source, storage) for name, layout, aliases, source, storage in _LAYOUTS}
    rows["e8m0"] = _e8m0()
    return rows


def block_formats() -> list[BlockFormatRow]:
    """The block-scaled formats: OCP's MXFP8/MXFP6/MXFP4 (32 elements, an e8m0 scale) and NVIDIA's
    NVFP4 (16 fp4 elements, an fp8 e4m3 scale)."""
    element_names = {"float8_e4m3fn": "fp8_e4m3", "float4_e2m1": "fp4_e2m1"}
    rows = [BlockFormatRow(name=f.name, element=element_names[f.element], block_size=f.block_size,
                           scale="fp8_e4m3" if f.name == "nvfp4" else "e8m0", bits_per_value=f.bits_per_element, source=f.source)
            for f in MX_FORMATS.values()]
    extra = (("mxfp8_e5m2", "fp8_e5m2", 8), ("mxfp6_e2m3", "fp6_e2m3", 6), ("mxfp6_e3m2", "fp6_e3m2", 6))
    rows += [BlockFormatRow(name=name, element=element, block_size=32, scale="e8m0", bits_per_value=bits + 8 / 32, source=_MX)
             for name, element, bits in extra]
    return sorted(rows, key=lambda row: (-row.bits_per_value, row.name))


def format_names() -> list[str]:
    """Every name and alias :func:`format_row` accepts."""
    return [spelling for row in number_formats().values() for spelling in (row.name, *row.aliases)]


def format_row(name: str) -> FormatRow:
    """The row of ``name`` (a row name or an alias, any case: ``bf16``, ``bfloat16``, ``e4m3``)."""
    wanted = str(name).strip().lower().removeprefix("torch.")
    for row in number_formats().values():
        if wanted == row.name or wanted in row.aliases:
            return row
    raise UnknownNameError("number format", name, format_names())
