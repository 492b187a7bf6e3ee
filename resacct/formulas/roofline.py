"""Arithmetic intensity and the roofline: formulas only, no measurement (this machine's measured
roofs live in :mod:`resacct.measurement.measured_roofline`, timing in :mod:`resacct.measurement.perf`, which re-exports
these names).

- intensity (FLOPs per byte moved) of a matmul, which grows with its sizes, and of element-wise
  operations, which is a constant far below 1 FLOP/byte;
- the roofline: attainable FLOP/s = min(peak, intensity × bandwidth), the ridge point where the
  two roofs meet, and which roof bounds a kernel.

>>> matmul_intensity_flops_per_byte(1024, 1024, 1024, bytes_per_element=2)   # 2mkn / ((mk+kn+mn)·2)
341.3333333333333
>>> Roofline.of_accelerator("h100-sxm", "bf16").bound(1.0)
'memory'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from resacct.errors import UnknownNameError
from resacct.facts.hardware import Accelerator, get_accelerator, peak_flops_per_sec
from resacct.formulas.validation import positive_number as _positive
from resacct.formulas.validation import whole_number as _whole

__all__ = [
    "matmul_flops",
    "matmul_bytes",
    "matmul_intensity_flops_per_byte",
    "ELEMENTWISE_OPERATIONS",
    "ElementwiseCost",
    "elementwise_intensity_flops_per_byte",
    "ridge_point_flops_per_byte",
    "roofline_attainable_flops_per_sec",
    "bound_by",
    "Roofline",
]

Number = float | int
Bound = Literal["memory", "compute"]


# ---------------------------------------------------------------------------------------------
# Arithmetic intensity


def matmul_flops(m: int, k: int, n: int) -> int:
    """2mkn of an (m×k) @ (k×n) product: :func:`resacct.formulas.flops.matmul_flops` for the sizes the
    roofline speaks in."""
    from resacct.formulas.flops import matmul_flops as matmul_flops_of_shapes

    return matmul_flops_of_shapes((_whole("m", m), _whole("k", k)), (k, _whole("n", n)))


def matmul_bytes(m: int, k: int, n: int, bytes_per_element: Number) -> float:
    """Bytes a matmul must move at least once: read A (m×k) and B (k×n), write C (m×n)."""
    element = _positive("bytes_per_element", bytes_per_element)
    return (_whole("m", m) * _whole("k", k) + k * _whole("n", n) + m * n) * element


def matmul_intensity_flops_per_byte(m: int, k: int, n: int, bytes_per_element: Number) -> float:
    """2mkn / ((mk + kn + mn) · bytes): grows with the matrix sizes (≈ 2n/(3·bytes) for n×n×n);
    a matrix-vector product (n = 1) stays near 2/bytes."""
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, bytes_per_element)


@dataclass(frozen=True)
class ElementwiseCost:
    """FLOPs per output element and tensors of that size read or written, per element-wise op."""

    flops_per_element: float
    tensors_moved: int
    note: str = ""


ELEMENTWISE_OPERATIONS: dict[str, ElementwiseCost] = {
    "add": ElementwiseCost(1.0, 3, "x + y: read x and y, write the sum"),
    "mul": ElementwiseCost(1.0, 3, "x * y: read x and y, write the product"),
    "relu": ElementwiseCost(1.0, 2, "max(x, 0): read x, write the result"),
    "gelu": ElementwiseCost(9.0, 2, "tanh-approximated GELU: 8 multiplies/adds and one tanh an element"),
    "copy": ElementwiseCost(0.0, 2, "read x, write a copy: no arithmetic at all"),
}


def elementwise_intensity_flops_per_byte(operation: str, bytes_per_element: Number) -> float:
    """FLOPs per element ÷ bytes moved per element. Constant in the size, and far below 1 FLOP/byte:
    add is n / (3n·bytes), relu n / (2n·bytes)."""
    try:
        cost = ELEMENTWISE_OPERATIONS[operation]
    except KeyError:
        raise UnknownNameError("element-wise operation", operation, list(ELEMENTWISE_OPERATIONS)) from None
    return cost.flops_per_element / (cost.tensors_moved * _positive("bytes_per_element", bytes_per_element))


# ---------------------------------------------------------------------------------------------
# The roofline


def ridge_point_flops_per_byte(peak_flops_per_sec: Number, bandwidth_bytes_per_sec: Number) -> float:
    """The intensity where the two roofs meet: peak ÷ bandwidth ("accelerator intensity")."""
    return _positive("peak_flops_per_sec", peak_flops_per_sec) / _positive("bandwidth_bytes_per_sec", bandwidth_bytes_per_sec)


def roofline_attainable_flops_per_sec(intensity_flops_per_byte: Number, peak_flops_per_sec: Number, bandwidth_bytes_per_sec: Number) -> float:
    """min(peak, intensity × bandwidth): a kernel cannot compute faster than the arithmetic units
    nor faster than memory delivers its operands.

    >>> roofline_attainable_flops_per_sec(0.25, 989.5e12, 3.35e12) / 1e12   # "0.25 is really bad"
    0.8375
    """
    intensity = _positive("intensity_flops_per_byte", intensity_flops_per_byte)
    return min(_positive("peak_flops_per_sec", peak_flops_per_sec), intensity * _positive("bandwidth_bytes_per_sec", bandwidth_bytes_per_sec))


def bound_by(intensity_flops_per_byte: Number, peak_flops_per_sec: Number, bandwidth_bytes_per_sec: Number) -> Bound:
    """"memory" when the intensity is below the ridge point (moving bytes takes longer than the
    arithmetic), else "compute"."""
    ridge = ridge_point_flops_per_byte(peak_flops_per_sec, bandwidth_bytes_per_sec)
    return "memory" if _positive("intensity_flops_per_byte", intensity_flops_per_byte) < ridge else "compute"


@dataclass(frozen=True)
class Roofline:
    """Two ceilings — peak FLOP/s and memory bandwidth — of a datasheet or of a measurement."""

    name: str
    peak_flops_per_sec: float
    bandwidth_bytes_per_sec: float

    @classmethod
    def of_accelerator(cls, accelerator: str | Accelerator, dtype: str = "bf16", *, sparse: bool = False) -> Roofline:
        board = get_accelerator(accelerator)
        mode = "sparse" if sparse else "dense"
        return cls(f"{board.name} {dtype} {mode}", peak_flops_per_sec(board, dtype, sparse=sparse), board.memory_bandwidth_bytes_per_sec)

    @property
    def ridge_point_flops_per_byte(self) -> float:
        return ridge_point_flops_per_byte(self.peak_flops_per_sec, self.bandwidth_bytes_per_sec)

    def attainable_flops_per_sec(self, intensity_flops_per_byte: Number) -> float:
        return roofline_attainable_flops_per_sec(intensity_flops_per_byte, self.peak_flops_per_sec, self.bandwidth_bytes_per_sec)

    def bound(self, intensity_flops_per_byte: Number) -> Bound:
        return bound_by(intensity_flops_per_byte, self.peak_flops_per_sec, self.bandwidth_bytes_per_sec)
