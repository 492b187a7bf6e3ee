"""Accelerator peaks, memory and bandwidth from vendors' datasheets — dense and sparse kept apart.

Every number lives in ``resacct/facts/datasheets/accelerators.yaml`` with its source and how far to trust it
(``confidence``: the vendor's datasheet, derived from one, or third-party tables only).
Look a board up by its name, an alias, or the string ``torch.cuda.get_device_name()`` returns:

>>> h100 = get_accelerator("h100")
>>> h100.name, peak_flops_per_sec(h100, "bf16") / 1e12
('h100-sxm', 989.5)
>>> peak_flops_per_sec(h100, "bf16", sparse=True) / 1e12   # 2:4 structured sparsity
1979.0
>>> get_accelerator("NVIDIA H200").name
'h200-sxm'
>>> round(accelerator_intensity_flops_per_byte(h100, "bf16"))   # FLOPs per byte moved
295
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported only where a GPU is asked about: napkin commands never load it
    import torch

from resacct.errors import ResacctError, UnknownNameError

__all__ = [
    "Peak",
    "Accelerator",
    "PEAK_FORMATS",
    "CONFIDENCE_FLAGS",
    "accelerators",
    "accelerator_names",
    "get_accelerator",
    "accelerator_for_cuda_name",
    "current_accelerator",
    "peak_format",
    "format_bytes",
    "peak_flops_per_sec",
    "accelerator_intensity_flops_per_byte",
    "peak_source_text",
    "raw_accelerator_entry",
    "raw_accelerator_table",
]

DATA_FILE = "accelerators.yaml"
TERA = 1e12

#: How far a board's figures can be trusted, each with the flag printed beside the board:
#: the vendor's own document; derived from one (system ÷ GPUs, or a faithful transcription);
#: or third-party tables only, unconfirmed by the vendor (every output that uses them says so).
CONFIDENCE_FLAGS = {"datasheet": "", "derived": "[derived]", "third-party": "[third-party: unconfirmed by the vendor]"}

#: Formats a peak can be listed for. fp64_tensor is the tensor-core fp64 path; fp32 is the
#: non-tensor (CUDA-core) path that torch uses for float32 matmuls unless TF32 is allowed.
PEAK_FORMATS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")

_FORMAT_ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "tensorfloat32": "tf32",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "e4m3": "fp8", "e5m2": "fp8", "float8": "fp8", "float4_e2m1": "fp4", "e2m1": "fp4", "nvfp4": "fp4",
}


@dataclass(frozen=True)
class Peak:
    """One format's peak in operations per second: dense, and with 2:4 structured sparsity
    (``None`` where the format has no sparse mode). The two are never mixed."""

    dense_flops_per_sec: float
    sparse_flops_per_sec: float | None = None
    #: set where this one format's figures are less certain than the board's (e.g. ``third-party``);
    #: None: as the board's ``confidence``
    confidence: str | None = None


@dataclass(frozen=True)
class Accelerator:
    """One board as its datasheet describes it."""

    name: str
    display_name: str
    family: str
    memory_bytes: int
    memory_bandwidth_bytes_per_sec: float
    peaks: Mapping[str, Peak]
    source: str
    confidence: str
    aliases: tuple[str, ...] = ()
    cuda_names: tuple[str, ...] = ()
    note: str = ""
    #: thermal design power (board power) per device in watts, or None where no cited source gives it
    tdp_watts: float | None = None
    tdp_source: str = ""
    #: CUDA's compute capability (major, minor) of an NVIDIA board (datasheet key ``compute_capability: "8.6"``), else None
    compute_capability: tuple[int, int] | None = None
    #: the board's streaming multiprocessors (torch's ``multi_processor_count``), with where the figure was read; None where
    #: no source read gives it (a reduction kernel's staging buffer, sized by it, is then not predicted)
    multiprocessors: int | None = None
    multiprocessors_source: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.display_name})"

    @property
    def flag(self) -> str:
        """``[derived]`` or ``[third-party: unconfirmed by the vendor]``; empty for a datasheet entry."""
        return CONFIDENCE_FLAGS[self.confidence]

    @property
    def caveat(self) -> str:
        """The line every output that uses this board's figures carries where they come from
        third-party tables only; empty otherwise."""
        if self.confidence != "third-party":
            return ""
        return f"note: {self.name}'s figures are from third-party tables, unconfirmed by the vendor (sources: resacct devices {self.name})"

    def peak_confidence(self, fmt: str) -> str:
        """How far ``fmt``'s peak can be trusted: its own ``confidence`` where the table sets one,
        else the board's."""
        peak = self.peaks.get(fmt)
        return (peak.confidence if peak is not None and peak.confidence else self.confidence)


def raw_accelerator_entry(name: str) -> dict[str, Any] | None:
    """One board's entry of the data file exactly as written (None for a name the file lacks): a
    fresh copy, like :func:`raw_accelerator_table`, of that entry alone."""
    entry = _raw_table().get(name)
    return None if entry is None else copy.deepcopy(entry)


def raw_accelerator_table() -> dict[str, Any]:
    """The data file exactly as written (peaks in TFLOP/s): for checks that must not go through
    resacct's own lookup. A fresh copy each call (callers may not change the table)."""
    return copy.deepcopy(_raw_table())


@functools.cache
def _raw_table() -> dict[str, Any]:
    from resacct.facts.yaml_text import safe_load_text

    text = importlib.resources.files("resacct.facts").joinpath("datasheets", DATA_FILE).read_text(encoding="utf-8")
    table = safe_load_text(text)
    if not isinstance(table, dict) or not table:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE} must map accelerator names to their datasheet entries")
    return table


def _positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {what} is {value!r}; expected a finite number > 0")
    return float(value)


def _parse_peaks(name: str, raw: Any) -> dict[str, Peak]:
    if not isinstance(raw, dict) or not raw:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.peaks_tera_per_sec must map formats to {{dense, sparse}}")
    peaks = {}
    for fmt, entry in raw.items():
        if fmt not in PEAK_FORMATS:
            raise UnknownNameError(f"peak format in {name}", fmt, list(PEAK_FORMATS))
        if not isinstance(entry, dict):
            raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.{fmt} is {entry!r}; expected {{dense, sparse}}")
        dense = _positive_number(entry.get("dense"), f"{name}.{fmt}.dense")
        sparse = entry.get("sparse")
        sparse_flops = None if sparse is None else _positive_number(sparse, f"{name}.{fmt}.sparse") * TERA
        confidence = entry.get("confidence")
        if confidence is not None and confidence not in CONFIDENCE_FLAGS:
            raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.{fmt}.confidence is {confidence!r}; "
                               f"expected one of {', '.join(CONFIDENCE_FLAGS)}")
        unknown = sorted(set(entry) - {"dense", "sparse", "confidence"})
        if unknown:
            raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.{fmt} has the unknown key {unknown[0]!r}; known: confidence, dense, sparse")
        peaks[fmt] = Peak(dense_flops_per_sec=dense * TERA, sparse_flops_per_sec=sparse_flops, confidence=confidence)
    return peaks


def _parse_accelerator(name: str, entry: dict[str, Any]) -> Accelerator:
    known = {"display_name", "family", "aliases", "cuda_names", "memory_bytes", "memory_bandwidth_bytes_per_sec",
             "source", "confidence", "note", "peaks_tera_per_sec", "tdp_watts", "tdp_source", "compute_capability",
             "multiprocessors", "multiprocessors_source"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name} has the unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if entry.get("confidence") not in CONFIDENCE_FLAGS:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.confidence is {entry.get('confidence')!r}; "
                           f"expected one of {', '.join(CONFIDENCE_FLAGS)}")
    return Accelerator(
        name=name,
        display_name=str(entry["display_name"]),
        family=str(entry["family"]),
        memory_bytes=int(_positive_number(entry["memory_bytes"], f"{name}.memory_bytes")),
        memory_bandwidth_bytes_per_sec=_positive_number(entry["memory_bandwidth_bytes_per_sec"], f"{name}.memory_bandwidth_bytes_per_sec"),
        peaks=_parse_peaks(name, entry.get("peaks_tera_per_sec")),
        source=str(entry["source"]),
        confidence=str(entry["confidence"]),
        aliases=tuple(str(alias) for alias in entry.get("aliases", ())),
        cuda_names=tuple(str(cuda) for cuda in entry.get("cuda_names", ())),
        note=str(entry.get("note", "")),
        tdp_watts=_tdp_watts(name, entry),
        tdp_source=str(entry.get("tdp_source", "")),
        compute_capability=_compute_capability(name, entry.get("compute_capability")),
        multiprocessors=_multiprocessors(name, entry),
        multiprocessors_source=str(entry.get("multiprocessors_source", "")),
    )


def _multiprocessors(name: str, entry: dict[str, Any]) -> int | None:
    """The board's multiprocessor count, a whole number > 0 with its source (either alone is refused); absent: None."""
    value, source = entry.get("multiprocessors"), entry.get("multiprocessors_source")
    if value is None:
        if source:
            raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.multiprocessors_source is given without multiprocessors")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.multiprocessors is {value!r}; expected a whole number > 0")
    if not source:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.multiprocessors is given without multiprocessors_source; "
                           "every figure carries its source")
    return value


def _compute_capability(name: str, value: Any) -> tuple[int, int] | None:
    """``"8.6"`` → (8, 6); absent → None; anything else refused, naming the entry."""
    if value is None:
        return None
    match = re.fullmatch(r"([0-9]{1,2})\.([0-9])", str(value)) if isinstance(value, str) else None
    if match is None:
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.compute_capability is {value!r}; expected a quoted "
                           "'major.minor' such as \"8.6\"")
    return int(match.group(1)), int(match.group(2))


def _tdp_watts(name: str, entry: dict[str, Any]) -> float | None:
    """The board's TDP in watts; a TDP without its source (or a source without a TDP) is refused."""
    if entry.get("tdp_watts") is None:
        if entry.get("tdp_source"):
            raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.tdp_source is given without tdp_watts")
        return None
    if not entry.get("tdp_source"):
        raise ResacctError(f"resacct/facts/datasheets/{DATA_FILE}: {name}.tdp_watts is given without tdp_source; every figure carries its source")
    return _positive_number(entry["tdp_watts"], f"{name}.tdp_watts")


@functools.cache
def accelerators() -> dict[str, Accelerator]:
    """Every accelerator of the table, by canonical name, validated once."""
    return {name: _parse_accelerator(name, entry) for name, entry in _raw_table().items()}


def accelerator_names() -> list[str]:
    """Canonical names, then aliases: every spelling :func:`get_accelerator` accepts."""
    table = accelerators()
    return list(table) + [alias for accelerator in table.values() for alias in accelerator.aliases]


def _normalized(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@functools.cache
def _spellings() -> dict[str, str]:
    spellings: dict[str, str] = {}
    for accelerator in accelerators().values():
        for spelling in (accelerator.name, *accelerator.aliases, *accelerator.cuda_names, accelerator.display_name):
            spellings.setdefault(_normalized(spelling), accelerator.name)
    return spellings


def accelerator_for_cuda_name(device_name: str) -> Accelerator | None:
    """The board whose CUDA name ``device_name`` is, or is followed by a MIG slice's suffix
    (" MIG 1g.10gb"); the longest matching CUDA name wins, so "NVIDIA H200 NVL" is not read as
    "NVIDIA H200". Any other suffix is another board: "NVIDIA H20-3e" is not "NVIDIA H20", nor
    "NVIDIA GeForce RTX 4090 D" (114 SMs) the RTX 4090.

    >>> accelerator_for_cuda_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb").name
    'h100-sxm'
    >>> accelerator_for_cuda_name("NVIDIA GeForce RTX 4090 D") is None
    True
    """
    wanted = " ".join(device_name.lower().split())
    best: tuple[int, Accelerator] | None = None
    for accelerator in accelerators().values():
        for cuda_name in accelerator.cuda_names:
            known = " ".join(cuda_name.lower().split())
            if wanted == known or wanted.startswith(known + " mig "):
                if best is None or len(known) > best[0]:
                    best = (len(known), accelerator)
    return best[1] if best else None


def get_accelerator(name: str | Accelerator) -> Accelerator:
    """The accelerator called ``name``: canonical name, alias, display name or CUDA device name
    (case and spaces do not matter). Unknown names raise UnknownNameError with close matches.

    >>> get_accelerator("NVIDIA A100-SXM4-80GB").name
    'a100-sxm-80gb'
    """
    if isinstance(name, Accelerator):
        return name
    if not isinstance(name, str) or not name.strip():
        raise ResacctError(f"accelerator name {name!r} is empty; expected e.g. h100-sxm, a100, 'NVIDIA H200'")
    canonical = _spellings().get(_normalized(name))
    if canonical is not None:
        return accelerators()[canonical]
    by_cuda_name = accelerator_for_cuda_name(name)
    if by_cuda_name is not None:
        return by_cuda_name
    raise UnknownNameError("accelerator", _normalized(name), accelerator_names())


def current_accelerator() -> Accelerator | None:
    """The table's entry for CUDA device 0, or None without a GPU (or for a board not in the table)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return accelerator_for_cuda_name(torch.cuda.get_device_name(0))


def peak_format(dtype: str | torch.dtype) -> str:
    """The peak-table key for a dtype: ``torch.bfloat16`` → ``"bf16"``, ``"float32"`` → ``"fp32"``.

    >>> import torch
    >>> peak_format(torch.float8_e4m3fn)
    'fp8'
    """
    if dtype is None or isinstance(dtype, numbers.Number):  # 16 and 16.0 alike: a number is no format name
        raise ResacctError(f"peak format {_shown_number(dtype)}: expected a format name such as 'bf16', 'fp8' or 'tf32', or a torch.dtype "
                           f"(got type {type(dtype).__name__})")
    text = str(dtype).removeprefix("torch.").strip().lower()
    key = _FORMAT_ALIASES.get(text, text)
    if key not in PEAK_FORMATS:
        shown = dtype if len(str(dtype)) <= 60 else str(dtype)[:56] + "…" + str(dtype)[-3:]
        raise UnknownNameError("peak format", shown, list(PEAK_FORMATS) + sorted(_FORMAT_ALIASES))
    return key


def _shown_number(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # repr() refuses ints over 4,300 digits
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    return repr(value)


_FORMAT_BYTES = {"fp64": 8, "fp64_tensor": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp4": 0.5}


def format_bytes(dtype: str | torch.dtype) -> float:
    """Bytes an operand of this peak format occupies in memory (tf32 is stored as 4-byte fp32),
    always a float (fp4 takes half a byte). A number is refused, 16 and 16.0 alike: the argument
    names a format, it is not a size.

    >>> format_bytes("bf16"), format_bytes("tf32"), format_bytes("fp4")
    (2.0, 4.0, 0.5)
    """
    return float(_FORMAT_BYTES[peak_format(dtype)])


def peak_flops_per_sec(accelerator: str | Accelerator, dtype: str | torch.dtype = "bf16", *, sparse: bool = False) -> float:
    """The datasheet peak for ``dtype``: dense by default, ``sparse=True`` for 2:4 structured
    sparsity (twice the dense figure on tensor cores; refused where there is no sparse mode)."""
    board = get_accelerator(accelerator)
    fmt = peak_format(dtype)
    peak = board.peaks.get(fmt)
    if peak is None:
        raise ResacctError(f"{board.name} has no {fmt} peak in the table (its source prints none; why: resacct devices {board.name}); "
                           f"it lists {', '.join(board.peaks)}")
    if not sparse:
        return peak.dense_flops_per_sec
    if peak.sparse_flops_per_sec is None:
        raise ResacctError(f"{board.name} {fmt} has no structured-sparsity peak; use the dense peak (sparse=False)")
    return peak.sparse_flops_per_sec


def accelerator_intensity_flops_per_byte(accelerator: str | Accelerator, dtype: str | torch.dtype = "bf16", *, sparse: bool = False) -> float:
    """Peak FLOP/s ÷ memory bandwidth: how many FLOPs a kernel must do per byte it moves to
    keep the arithmetic units busy (the roofline's ridge point). Below it, a kernel is
    memory-bound."""
    board = get_accelerator(accelerator)
    return peak_flops_per_sec(board, dtype, sparse=sparse) / board.memory_bandwidth_bytes_per_sec


def peak_source_text(accelerator: str | Accelerator, dtype: str | torch.dtype = "bf16") -> str:
    """Where a dense peak used for MFU comes from, in words, saying so when it is a third-party figure.

    >>> peak_source_text("h20", "fp16")
    'h20 fp16 dense peak (third-party table, unconfirmed by the vendor)'
    """
    board = get_accelerator(accelerator)
    fmt = peak_format(dtype)
    third_party = " (third-party table, unconfirmed by the vendor)" if board.peak_confidence(fmt) == "third-party" else ""
    return f"{board.name} {fmt} dense peak{third_party}"
