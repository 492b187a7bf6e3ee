"""Measuring hardware claims: datasheet peaks, memory and intensity; on a GPU, the board itself.

Without the board in hand, the ground truth for a peak is its datasheet. These checks read
``resacct/facts/datasheets/accelerators.yaml`` raw (numbers as printed, TFLOP/s, no lookup logic), while
the prediction goes through resacct's lookup (names, aliases, dtype names, dense/sparse).
On a GPU, ``hardware.cuda_*`` checks ask torch about the device itself.
"""

from __future__ import annotations

from typing import Any

import torch

from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.facts.hardware import (
    accelerator_for_cuda_name,
    accelerator_intensity_flops_per_byte,
    current_accelerator,
    get_accelerator,
    peak_flops_per_sec,
    raw_accelerator_entry,
    raw_accelerator_table,
)
from resacct.errors import ResacctError

TERA = 1e12


def raw_entry(device: str) -> dict[str, Any]:
    """The data file's entry for the canonical name ``device``, untouched."""
    entry = raw_accelerator_entry(device)
    if entry is None:
        raise ResacctError(f"claims name boards by their canonical key; {device!r} is not one of {', '.join(raw_accelerator_table())}")
    return entry


def raw_peak_flops_per_sec(device: str, dtype: str, sparse: bool = False) -> float:
    """The datasheet peak as written in the data file (TFLOP/s × 1e12); dtype is the file's key."""
    peaks = raw_entry(device)["peaks_tera_per_sec"]
    if dtype not in peaks:
        raise ResacctError(f"{device} lists no {dtype} peak; it lists {', '.join(peaks)}")
    value = peaks[dtype]["sparse" if sparse else "dense"]
    if value is None:
        raise ResacctError(f"{device} {dtype} has no sparse peak")
    return float(value) * TERA


def raw_bandwidth_bytes_per_sec(device: str) -> float:
    return float(raw_entry(device)["memory_bandwidth_bytes_per_sec"])


def raw_memory_bytes(device: str) -> int:
    return int(raw_entry(device)["memory_bytes"])


@check("hardware.peak", evidence="published")
def datasheet_peak(device: str, dtype: str, sparse: bool = False) -> Outcome:
    """Peak FLOP/s of ``device`` for ``dtype`` (dense, or 2:4-sparse), as its datasheet prints it."""
    return Outcome(measured=raw_peak_flops_per_sec(device, dtype, sparse), predicted=peak_flops_per_sec(device, dtype, sparse=sparse))


@check("hardware.sparse_speedup", evidence="arithmetic", quantities=("dense_flops_per_sec", "sparse_flops_per_sec"))
def sparse_speedup(device: str, dtype: str) -> Outcome:
    """Sparse ÷ dense peak of ``device`` for ``dtype`` on its datasheet."""
    dense, sparse = raw_peak_flops_per_sec(device, dtype), raw_peak_flops_per_sec(device, dtype, sparse=True)
    predicted = peak_flops_per_sec(device, dtype, sparse=True) / peak_flops_per_sec(device, dtype)
    return Outcome(measured=sparse / dense, predicted=predicted, quantities={"dense_flops_per_sec": dense, "sparse_flops_per_sec": sparse})


@check("hardware.memory_bytes", evidence="published")
def memory_bytes(device: str) -> Outcome:
    """HBM capacity of ``device`` in bytes, as its datasheet prints it (decimal GB)."""
    return Outcome(measured=raw_memory_bytes(device), predicted=get_accelerator(device).memory_bytes)


@check("hardware.accelerator_intensity", evidence="arithmetic", quantities=("peak_flops_per_sec", "bandwidth_bytes_per_sec"))
def accelerator_intensity(device: str, dtype: str, sparse: bool = False) -> Outcome:
    """Datasheet peak FLOP/s ÷ datasheet memory bandwidth: FLOPs per byte at the ridge point."""
    peak, bandwidth = raw_peak_flops_per_sec(device, dtype, sparse), raw_bandwidth_bytes_per_sec(device)
    return Outcome(
        measured=peak / bandwidth,
        predicted=accelerator_intensity_flops_per_byte(device, dtype, sparse=sparse),
        quantities={"peak_flops_per_sec": peak, "bandwidth_bytes_per_sec": bandwidth},
    )


@check("hardware.has_peak", evidence="published")
def has_peak(device: str, dtype: str) -> Outcome:
    """Whether the datasheet of ``device`` lists a peak for ``dtype`` at all."""
    try:
        peak_flops_per_sec(device, dtype)
        predicted = True
    except ResacctError:
        predicted = False
    return Outcome(measured=dtype in raw_entry(device)["peaks_tera_per_sec"], predicted=predicted)


@check("hardware.boards_with_peak", evidence="published")
def boards_with_peak(dtype: str) -> Outcome:
    """Sorted names of the boards in the table whose datasheets list a ``dtype`` peak."""
    table = raw_accelerator_table()
    measured = sorted(name for name, entry in table.items() if dtype in entry["peaks_tera_per_sec"])
    predicted = sorted(name for name in table if dtype in get_accelerator(name).peaks)
    return Outcome(measured=measured, predicted=predicted)


def _cuda_device_name() -> str:
    if not torch.cuda.is_available():
        raise NotMeasurable(f"needs a CUDA GPU; torch {torch.__version__} sees none")
    return torch.cuda.get_device_name(0)


@check("hardware.cuda_device_in_table", evidence="measured")
def cuda_device_in_table() -> Outcome:
    """Whether torch's name for GPU 0 is one of the table's CUDA names (or one of them plus a MIG
    slice's suffix, " MIG 1g.10gb")."""
    name = _cuda_device_name()
    cuda_names = [cuda for entry in raw_accelerator_table().values() for cuda in entry.get("cuda_names", [])]
    measured = any(name == cuda or name.startswith(cuda + " MIG ") for cuda in cuda_names)
    return Outcome(measured=measured, predicted=current_accelerator() is not None)


@check("hardware.cuda_total_memory_mib", evidence="measured", quantities=("total_memory_bytes", "mem_get_info_total_bytes", "datasheet_memory_bytes"))
def cuda_total_memory_mib(name_contains: str) -> Outcome:
    """``torch.cuda.get_device_properties(0).total_memory`` in MiB (2**20 bytes), on a GPU whose
    name contains ``name_contains`` (skipped on others); ``torch.cuda.mem_get_info()``'s total
    and the datasheet's capacity as quantities."""
    name = _cuda_device_name()
    if name_contains not in name:
        raise NotMeasurable(f"about a GPU named *{name_contains}*; this one is {name!r}")
    total = int(torch.cuda.get_device_properties(0).total_memory)
    board = accelerator_for_cuda_name(name)
    return Outcome(measured=total / 2**20, quantities={"total_memory_bytes": total, "mem_get_info_total_bytes": int(torch.cuda.mem_get_info(0)[1]),
                                                       "datasheet_memory_bytes": raw_memory_bytes(board.name) if board is not None else None})


@check("hardware.cuda_memory_ratio", evidence="measured", quantities=("total_memory_bytes", "datasheet_memory_bytes"))
def cuda_memory_ratio() -> Outcome:
    """``get_device_properties(0).total_memory`` ÷ the datasheet's capacity for this board."""
    name = _cuda_device_name()
    board = accelerator_for_cuda_name(name)
    if board is None:
        raise NotMeasurable(f"GPU {name!r} is not in resacct/facts/datasheets/accelerators.yaml")
    total = torch.cuda.get_device_properties(0).total_memory
    datasheet = raw_memory_bytes(board.name)
    return Outcome(measured=total / datasheet, quantities={"total_memory_bytes": total, "datasheet_memory_bytes": datasheet})
