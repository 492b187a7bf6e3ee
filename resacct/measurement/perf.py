"""Measuring speed honestly, and the roofline that explains it.

- :func:`time_callable` — warm-up, device synchronisation (CUDA events on a GPU), several
  repeats, the median; every sample is kept in the returned :class:`Timing`.
- :func:`achieved_flops_per_sec`, :func:`mfu` — FLOPs ÷ seconds, and that ÷ a peak.
- Arithmetic intensity and the roofline (formulas, no measurement): :mod:`resacct.formulas.roofline`,
  re-exported here.
- :func:`measure_ceilings` — this machine's two ceilings (a large copy → bytes/s, a large
  matmul → FLOP/s), so that the roofline also works on a CPU.

>>> matmul_intensity_flops_per_byte(1024, 1024, 1024, bytes_per_element=2)   # 2mkn / ((mk+kn+mn)·2)
341.3333333333333
>>> elementwise_intensity_flops_per_byte("add", bytes_per_element=4)           # n / (3n·4)
0.08333333333333333
>>> h100 = Roofline.of_accelerator("h100-sxm", "bf16")
>>> h100.bound(1.0), h100.bound(341.3)
('memory', 'compute')
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Shaped

from resacct.formulas import roofline as _roofline
from resacct.errors import ResacctError, UnknownNameError
from resacct.formulas.roofline import (  # re-exported: perf was their home before resacct.formulas.roofline
    ELEMENTWISE_OPERATIONS,
    ElementwiseCost,
    Roofline,
    bound_by,
    elementwise_intensity_flops_per_byte,
    matmul_bytes,
    matmul_flops,
    matmul_intensity_flops_per_byte,
    ridge_point_flops_per_byte,
    roofline_attainable_flops_per_sec,
)

__all__ = [
    "Timing",
    "time_callable",
    "achieved_flops_per_sec",
    "mfu",
    "MachineCeilings",
    "measure_memory_bandwidth",
    "measure_matmul_speed",
    "measure_ceilings",
    "OperationMeasurement",
    "OPERATIONS",
    "measure_operation",
    "measured_bytes",
    "threads",
    "save_roofline_png",
    *_roofline.__all__,
]

Number = float | int


def _positive(name: str, value: object, unit: str = "") -> float:
    """``value`` as a float, or a ResacctError that echoes it and says what is allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResacctError(f"{name} is {value!r}; expected a number > 0{unit}")
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise ResacctError(f"{name} is {value!r}; expected a finite number > 0{unit}")
    return float(value)


def _whole(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ResacctError(f"{name} is {value!r}; expected a whole number ≥ {minimum}")
    return value


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass(frozen=True)
class Timing:
    """Seconds per call: one sample per repeat (each sample averages ``calls_per_sample`` calls).

    ``median_sec`` is the number to report; ``best_sec`` is what a ceiling uses (the machine
    can do at least that well); ``spread`` (slowest ÷ fastest) says how noisy the machine was.
    """

    samples_sec: tuple[float, ...]
    calls_per_sample: int
    warmup_calls: int
    device: str

    @property
    def median_sec(self) -> float:
        return statistics.median(self.samples_sec)

    @property
    def best_sec(self) -> float:
        return min(self.samples_sec)

    @property
    def spread(self) -> float:
        return max(self.samples_sec) / min(self.samples_sec)


def _device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def _synchronize(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


def _one_sample_sec(function: Callable[[], object], calls: int, device_type: str) -> float:
    """Mean seconds per call over ``calls`` back-to-back calls, the device drained before and after."""
    if device_type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            function()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    _synchronize(device_type)
    began = time.perf_counter()
    for _ in range(calls):
        function()
    _synchronize(device_type)
    return (time.perf_counter() - began) / calls


def time_callable(
    function: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    min_sample_sec: float = 2e-3,
    max_calls_per_sample: int = 1000,
) -> Timing:
    """Time ``function()`` honestly: ``warmup`` untimed calls (allocator, kernels, caches), then
    ``repeats`` samples. On a GPU the queue is drained before and after each sample and CUDA
    events time it (kernels run asynchronously: a host clock alone would time the launch).
    Calls shorter than ``min_sample_sec`` are batched so that each sample is long enough for
    the clock; the samples are seconds per call.

    >>> timing = time_callable(lambda: sum(range(100)), repeats=3)
    >>> len(timing.samples_sec), timing.median_sec > 0
    (3, True)
    """
    _whole("warmup", warmup, minimum=0)
    _whole("repeats", repeats)
    _whole("max_calls_per_sample", max_calls_per_sample)
    device_type = _device_type(device)
    for _ in range(warmup):
        function()
    _synchronize(device_type)
    one_call_sec = _one_sample_sec(function, 1, device_type)
    calls = 1 if one_call_sec >= min_sample_sec else min(max_calls_per_sample, math.ceil(min_sample_sec / max(one_call_sec, 1e-9)))
    samples = tuple(_one_sample_sec(function, calls, device_type) for _ in range(repeats))
    return Timing(samples_sec=samples, calls_per_sample=calls, warmup_calls=warmup + 1, device=str(device))


@contextmanager
def threads(count: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(count)`` (None: leave it), then restore.
    On a shared machine one thread disturbs the neighbours least and is disturbed least."""
    if count is None:
        yield
        return
    _whole("threads", count)
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# FLOP/s and MFU


def achieved_flops_per_sec(flops: Number, seconds: Number) -> float:
    """FLOPs done ÷ seconds taken.

    >>> achieved_flops_per_sec(2 * 16384 * 32768 * 8192, 0.163) / 1e13   # the lecture's fp32 matmul
    5.396376087244172
    """
    return _positive("flops", flops) / _positive("seconds", seconds, " (a duration)")


def mfu(achieved_flops_per_sec: Number, peak_flops_per_sec: Number) -> float:
    """Model FLOPs utilisation: achieved FLOP/s ÷ promised (peak) FLOP/s.

    A result above 1 means the peak is the wrong one (another dtype, dense vs sparse) or the
    timing is wrong (e.g. a GPU not synchronised); it is returned, not hidden.

    >>> round(mfu(5.4e13, 6.75e13), 3)
    0.8
    """
    return _positive("achieved_flops_per_sec", achieved_flops_per_sec) / _positive("peak_flops_per_sec", peak_flops_per_sec)


# ---------------------------------------------------------------------------------------------
# Measuring this machine


def measured_bytes(*tensors: Shaped[torch.Tensor, "..."]) -> int:
    """Bytes of the storages behind ``tensors`` (what a kernel reading/writing them touches once)."""
    return sum(tensor.untyped_storage().nbytes() for tensor in tensors)


@dataclass(frozen=True)
class MachineCeilings:
    """This machine's measured roofline: best copy bandwidth and best matmul FLOP/s seen."""

    device: str
    dtype: str
    threads: int
    bandwidth_bytes_per_sec: float
    peak_flops_per_sec: float
    copy_timing: Timing
    matmul_timing: Timing
    matmul_size: int
    copy_bytes: int

    @property
    def roofline(self) -> Roofline:
        threads = f"{self.threads} thread" + ("s" if self.threads != 1 else "")
        return Roofline(f"this machine ({self.device}, {self.dtype}, {threads})", self.peak_flops_per_sec, self.bandwidth_bytes_per_sec)


def _dtype(name: str | torch.dtype) -> torch.dtype:
    from resacct.facts.dtypes import parse_dtype

    return parse_dtype(name)


def measure_memory_bandwidth(*, device: str = "cpu", copy_bytes: int = 64 * 2**20, repeats: int = 5) -> tuple[float, Timing]:
    """Best bytes/s of ``dst.copy_(src)`` over ``copy_bytes`` (read once + written once = 2 × size).
    Make ``copy_bytes`` larger than the last-level cache, or this measures the cache."""
    elements = max(1, _whole("copy_bytes", copy_bytes) // 4)
    source = torch.ones(elements, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    timing = time_callable(functools.partial(target.copy_, source), device=device, repeats=repeats)
    return 2 * measured_bytes(source) / timing.best_sec, timing


def measure_matmul_speed(*, size: int = 1024, dtype: str = "float32", device: str = "cpu", repeats: int = 5) -> tuple[float, Timing]:
    """Best FLOP/s of a size×size×size matmul (2·size³ FLOPs a call) and its timing."""
    torch_dtype = _dtype(dtype)
    a = torch.randn(_whole("size", size), size, device=device).to(torch_dtype)
    b = torch.randn(size, size, device=device).to(torch_dtype)
    out = torch.empty(size, size, dtype=torch_dtype, device=device)
    timing = time_callable(functools.partial(torch.matmul, a, b, out=out), device=device, repeats=repeats)
    return matmul_flops(size, size, size) / timing.best_sec, timing


def measure_ceilings(*, device: str = "cpu", dtype: str = "float32", matmul_size: int = 512, copy_bytes: int = 64 * 2**20,
                     thread_count: int | None = None, repeats: int = 7) -> MachineCeilings:
    """This machine's two roofs: a large copy gives bytes/s, a large matmul gives FLOP/s.

    Ceilings use the best sample: the machine did at least that well. The defaults keep each
    sample to a few milliseconds on a CPU (a 512³ matmul, a 64 MiB copy — past the last-level
    cache), short enough to run between interruptions on a busy machine; all of it takes well
    under a second on a 2-core CPU.
    """
    with threads(thread_count):
        bandwidth, copy_timing = measure_memory_bandwidth(device=device, copy_bytes=copy_bytes, repeats=repeats)
        peak, matmul_timing = measure_matmul_speed(size=matmul_size, dtype=dtype, device=device, repeats=repeats)
        used_threads = torch.get_num_threads()
    return MachineCeilings(device=str(device), dtype=str(dtype), threads=used_threads, bandwidth_bytes_per_sec=bandwidth,
                           peak_flops_per_sec=peak, copy_timing=copy_timing, matmul_timing=matmul_timing,
                           matmul_size=matmul_size, copy_bytes=copy_bytes)


@dataclass(frozen=True)
class OperationMeasurement:
    """One operation timed on this machine, with resacct's FLOP and byte counts for it."""

    name: str
    size: int
    dtype: str
    flops: float
    bytes_moved: float
    timing: Timing

    @property
    def intensity_flops_per_byte(self) -> float:
        """0 for a copy: it moves bytes and does no arithmetic."""
        return self.flops / self.bytes_moved

    @property
    def achieved_flops_per_sec(self) -> float:
        return self.flops / self.timing.median_sec

    @property
    def achieved_bytes_per_sec(self) -> float:
        return self.bytes_moved / self.timing.median_sec


def _elementwise_setup(operation: str, size: int, dtype: torch.dtype, device: str) -> tuple[Callable[[], object], float, float]:
    cost = ELEMENTWISE_OPERATIONS[operation]
    x = torch.randn(size, device=device).to(dtype)
    y = torch.randn(size, device=device).to(dtype)
    out = torch.empty_like(x)
    calls: dict[str, Callable[[], object]] = {
        "add": functools.partial(torch.add, x, y, out=out),
        "mul": functools.partial(torch.mul, x, y, out=out),
        "relu": functools.partial(torch.clamp_min, x, 0, out=out),
        "gelu": functools.partial(torch.nn.functional.gelu, x, approximate="tanh"),
        "copy": functools.partial(out.copy_, x),
    }
    return calls[operation], cost.flops_per_element * size, float(cost.tensors_moved * size * x.element_size())


#: Operations :func:`measure_operation` can time; ``size`` means elements (element-wise),
#: n for an n×n×n matmul, n for an (n×n) @ (n×1) matrix-vector product.
OPERATIONS = ("add", "mul", "relu", "gelu", "copy", "matmul", "matvec")


def measure_operation(operation: str, size: int, *, dtype: str = "float32", device: str = "cpu", repeats: int = 5,
                      thread_count: int | None = None) -> OperationMeasurement:
    """Time one operation and attach resacct's FLOPs and bytes for it (median seconds)."""
    if operation not in OPERATIONS:
        raise UnknownNameError("operation", operation, list(OPERATIONS))
    torch_dtype = _dtype(dtype)
    _whole("size", size)
    with threads(thread_count):
        if operation in ("matmul", "matvec"):
            n = 1 if operation == "matvec" else size
            a = torch.randn(size, size, device=device).to(torch_dtype)
            b = torch.randn(size, n, device=device).to(torch_dtype)
            out = torch.empty(size, n, dtype=torch_dtype, device=device)
            function: Callable[[], object] = functools.partial(torch.matmul, a, b, out=out)
            flops, bytes_moved = float(matmul_flops(size, size, n)), matmul_bytes(size, size, n, a.element_size())
        else:
            function, flops, bytes_moved = _elementwise_setup(operation, size, torch_dtype, device)
        timing = time_callable(function, device=device, repeats=repeats)
    return OperationMeasurement(name=operation, size=size, dtype=str(dtype), flops=flops, bytes_moved=bytes_moved, timing=timing)


def save_roofline_png(path: str, roofline: Roofline, points: list[tuple[str, float, float]], *, title: str = "") -> str:
    """Draw ``roofline`` (log-log) with ``points`` = (label, intensity FLOP/byte, achieved FLOP/s)
    and write it to ``path`` with matplotlib's Agg backend. Returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    intensities = [intensity for _, intensity, _ in points if intensity > 0] + [roofline.ridge_point_flops_per_byte]
    low, high = min(intensities) / 4, max(intensities) * 4
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.loglog(xs, [roofline.attainable_flops_per_sec(x) for x in xs], color="black", label=f"roofline: {roofline.name}")
    axes.axvline(roofline.ridge_point_flops_per_byte, color="gray", linestyle=":", label=f"ridge {roofline.ridge_point_flops_per_byte:.3g} FLOP/byte")
    for index, (label, intensity, achieved) in enumerate(points):
        if intensity > 0 and achieved > 0 and math.isfinite(achieved):
            axes.scatter([intensity], [achieved], zorder=3)
            below = index % 2 == 1  # alternate label sides so that neighbours do not overlap
            axes.annotate(label, (intensity, achieved), textcoords="offset points", xytext=(4, -12 if below else 5), fontsize=8)
    axes.set_xlabel("arithmetic intensity (FLOP / byte)")
    axes.set_ylabel("FLOP/s")
    axes.set_title(title or f"Roofline — {roofline.name}")
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
