"""This machine's roofline, measured so that it is a roof: dedicated kernels measure the two
ceilings, each until its best stops improving, and the operations placed under them are other
kernels, labelled by shape and dtype.

- **Memory roof**: a STREAM triad ``a = b + s·c`` over arrays past the last-level cache
  (twice it, 64-256 MiB each: :data:`OUT_OF_CACHE_ARRAY_BYTES`).
  Bytes are what the memory system moves: two arrays read, one written, and one more read for
  the written one — on a CPU a store first brings its cache line in (*write-allocate*). STREAM
  itself counts 3 arrays; both figures are kept (``stream_bytes_per_sec``).
  Each element-wise point also gets a triad over arrays of its own tensor size, sampled in turn
  with it: a point whose tensors sat in a cache would be held to that cache's roof, not DRAM's.
- **Compute roof**, one per dtype: the best of square matmuls of 192³, 320³, 384³ and 512³ —
  sizes no point uses. Before and after each sample of a matmul point, one sample of every roof size.
- **Clock**: with one thread, this thread's CPU time (:func:`sample_clock`): a sample the
  scheduler cut in two (five jobs on two cores) is not the kernel's speed, for roof or point.
- **Points**: element-wise ops on out-of-cache tensors and matmuls of other sizes, each with the
  bytes it must move (reads + writes, the lecture's count) and its FLOPs. A memory-bound point
  therefore sits at most at 3/4 (two reads, one write) or 2/3 (one read, one write) of the memory
  roof: its write-allocate reads are real traffic that its intensity does not count.

>>> roofline = MeasuredRoofline(memory=MemoryRoof(4e10, 3e10, 2**26, ()), compute={"float32": ComputeRoof("float32", 1e11, 512, ())}, points=())
>>> roofline.roofline("float32").ridge_point_flops_per_byte
2.5
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from resacct.errors import ResacctError
from resacct.measurement.perf import Roofline, threads
from resacct.measurement.triad import OUT_OF_CACHE_ARRAY_BYTES, last_level_cache_bytes, stream_triad, tiled_random

__all__ = [
    "sample_clock",
    "best_until_stable_sec",
    "MemoryRoof",
    "ComputeRoof",
    "RooflinePoint",
    "MeasuredRoofline",
    "last_level_cache_bytes",
    "measure_memory_roof",
    "measure_compute_roof",
    "measure_point",
    "OUT_OF_CACHE_ARRAY_BYTES",
    "ROOF_MATMUL_SIZES",
    "DEFAULT_POINTS",
    "QUICK_POINTS",
    "measure_machine_roofline",
    "save_measured_roofline_png",
    "write_measured_roofline_png",
    "this_machine_roofline",
]


def sample_clock() -> Callable[[], float]:
    """The clock samples are taken with: with one torch thread, this thread's CPU time
    (``time.thread_time``) — the kernel's own time, not the time it waited for a core on a shared
    machine (a wall-clock sample cut by the scheduler is noise, on roof and point alike); with more
    threads, the wall clock."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def best_until_stable_sec(function: Callable[[], object], *, min_samples: int = 8, max_samples: int = 40, window: int = 6,
                          improvement: float = 0.01, min_sample_sec: float = 2e-3, max_total_sec: float = 3.0,
                          clock: Callable[[], float] | None = None) -> tuple[float, ...]:
    """Seconds per call of ``function``, sampled until the best sample has not improved by more
    than ``improvement`` (relative) over the last ``window`` samples — the machine has shown what it
    can do — or ``max_samples`` / ``max_total_sec`` (wall clock) is reached. Calls shorter than
    ``min_sample_sec`` are batched into one sample. Samples are taken with ``clock`` (default:
    :func:`sample_clock`). Returns every sample (seconds per call); the roof uses the best.

    The call timed to size the batches is the first sample when it needs no batching (one call,
    after the warm-up's, as every later sample is): a one-sample measurement of a kernel of
    ``min_sample_sec`` or more costs two calls, not three (the roofline's points, sampled one at a
    time in turn with their roofs; docs/verify_time.md, session 15, has the before and after)."""
    now = clock or sample_clock()
    function()  # warm-up: allocator, first-touch, kernel selection
    began = now()
    function()
    one_call = now() - began
    calls = 1 if one_call >= min_sample_sec else math.ceil(min_sample_sec / max(one_call, 1e-9))
    samples: list[float] = [one_call] if calls == 1 else []
    best_at: list[float] = list(samples)
    started = time.perf_counter()
    while len(samples) < max_samples:
        began = now()
        for _ in range(calls):
            function()
        samples.append((now() - began) / calls)
        best_at.append(min(samples))
        if len(samples) >= max(min_samples, window + 1) and best_at[-window - 1] <= best_at[-1] * (1 + improvement):
            break
        if time.perf_counter() - started > max_total_sec and len(samples) >= min_samples:
            break
    return tuple(samples)


@dataclass(frozen=True)
class MemoryRoof:
    """Best bytes/s of the STREAM triad: ``bandwidth_bytes_per_sec`` counts the write-allocate
    read (4 arrays), ``stream_bytes_per_sec`` counts as STREAM does (3 arrays)."""

    bandwidth_bytes_per_sec: float
    stream_bytes_per_sec: float
    array_bytes: int
    samples_sec: tuple[float, ...]


@dataclass(frozen=True)
class ComputeRoof:
    """Best FLOP/s of a ``size``³ matmul in ``dtype``."""

    dtype: str
    peak_flops_per_sec: float
    size: int
    samples_sec: tuple[float, ...]


@dataclass(frozen=True)
class RooflinePoint:
    """One operation timed here: ``label`` names its shapes and dtype; bytes are reads + writes."""

    label: str
    operation: str
    dtype: str
    flops: float
    bytes_moved: float
    samples_sec: tuple[float, ...]
    roof_samples_sec: tuple[float, ...] = ()  # its roof kernels' samples, taken in turn with this point's
    memory_roof_bytes_per_sec: float = 0.0  # a triad over arrays of this point's tensor size, sampled in turn with it

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes_moved

    @property
    def best_flops_per_sec(self) -> float:
        return self.flops / min(self.samples_sec)


@dataclass(frozen=True)
class MeasuredRoofline:
    """The measured roofs (one memory roof, a compute roof per dtype) and the points under them."""

    memory: MemoryRoof
    compute: dict[str, ComputeRoof]
    points: tuple[RooflinePoint, ...]
    threads: int = 1

    def roofline(self, dtype: str = "float32") -> Roofline:
        if dtype not in self.compute:
            raise ResacctError(f"no compute roof measured for dtype {dtype!r}; measured: {', '.join(self.compute)}")
        roof = self.compute[dtype]
        return Roofline(f"this machine ({dtype}, {self.threads} thread{'s' if self.threads != 1 else ''})",
                        roof.peak_flops_per_sec, self.memory.bandwidth_bytes_per_sec)

    def attainable_flops_per_sec(self, point: RooflinePoint) -> float:
        """min(compute roof, intensity × memory roof); the memory roof is the best triad over
        arrays past the cache or over arrays of the point's own size, whichever moved more."""
        bandwidth = max(self.memory.bandwidth_bytes_per_sec, point.memory_roof_bytes_per_sec)
        peak = self.roofline(point.dtype).peak_flops_per_sec
        return min(peak, point.intensity_flops_per_byte * bandwidth)

    def share_of_roof(self, point: RooflinePoint) -> float:
        """The point's best FLOP/s ÷ the roof above it (≤ 1 when the roof is a roof)."""
        return point.best_flops_per_sec / self.attainable_flops_per_sec(point)

    def bound(self, point: RooflinePoint) -> str:
        return self.roofline(point.dtype).bound(point.intensity_flops_per_byte)


def _memory_roof(samples: tuple[float, ...], size: int) -> MemoryRoof:
    return MemoryRoof(bandwidth_bytes_per_sec=4 * size / min(samples), stream_bytes_per_sec=3 * size / min(samples),
                      array_bytes=size, samples_sec=samples)


def measure_memory_roof(*, device: str = "cpu", array_bytes: int | None = None, **sampling: float) -> MemoryRoof:
    """The STREAM triad, best until stable (4 arrays moved a call: write-allocate counted)."""
    triad, size = stream_triad(device, array_bytes)
    return _memory_roof(best_until_stable_sec(triad, **sampling), size)  # type: ignore[arg-type]


def measure_compute_roof(dtype: str = "float32", *, size: int = 512, device: str = "cpu", **sampling: float) -> ComputeRoof:
    """A ``size``³ matmul in ``dtype``, best until stable: 2·size³ FLOPs a call."""
    from resacct.facts.dtypes import parse_dtype

    torch_dtype = parse_dtype(dtype)
    a = torch.randn(size, size, device=device).to(torch_dtype)
    b = torch.randn(size, size, device=device).to(torch_dtype)
    out = torch.empty(size, size, dtype=torch_dtype, device=device)
    samples = best_until_stable_sec(functools.partial(torch.matmul, a, b, out=out), **sampling)  # type: ignore[arg-type]
    return ComputeRoof(dtype=str(dtype), peak_flops_per_sec=2 * size**3 / min(samples), size=size, samples_sec=samples)


def _dims(shape: tuple[int, ...]) -> str:
    return "×".join(str(size) for size in shape)


def _point_kernel(operation: str, shape: tuple[int, ...], dtype: str, device: str) -> tuple[Callable[[], object], float, float, str, int]:
    """(call, FLOPs, bytes read + written, label, bytes of one tensor) of a roofline point."""
    from resacct.facts.dtypes import parse_dtype

    torch_dtype = parse_dtype(dtype)
    element = torch.empty((), dtype=torch_dtype).element_size()
    if operation == "matmul":
        m, k, n = shape
        a, b = torch.randn(m, k, device=device).to(torch_dtype), torch.randn(k, n, device=device).to(torch_dtype)
        out = torch.empty(m, n, dtype=torch_dtype, device=device)
        return (functools.partial(torch.matmul, a, b, out=out), 2.0 * m * k * n, float((m * k + k * n + m * n) * element),
                f"matmul {m}×{k} @ {k}×{n} {dtype}", max(m * k, k * n, m * n) * element)
    if operation in ("add", "relu", "gelu", "copy"):
        x, y = tiled_random(shape, device).to(torch_dtype), tiled_random(shape, device).to(torch_dtype)
        out = torch.empty_like(x)
        calls = {"add": (functools.partial(torch.add, x, y, out=out), 1, 3),
                 "relu": (functools.partial(torch.clamp_min, x, 0, out=out), 1, 2),
                 "gelu": (functools.partial(torch._C._nn.gelu, x, approximate="tanh", out=out), 9, 2),
                 "copy": (functools.partial(out.copy_, x), 0, 2)}
        function, flops_per_element, tensors = calls[operation]
        return (function, float(flops_per_element * x.numel()), float(tensors * x.numel() * element),
                f"{operation} [{_dims(shape)}] {dtype}", x.numel() * element)
    raise ResacctError(f"roofline point {operation!r}: expected add, relu, gelu, copy or matmul")


def _one_sample_sec(function: Callable[[], object]) -> float:
    return best_until_stable_sec(function, min_samples=1, max_samples=1, max_total_sec=math.inf)[0]


def measure_point(operation: str, shape: tuple[int, ...], dtype: str = "float32", *, device: str = "cpu", samples: int = 5,
                  alongside: tuple[Callable[[], object], ...] = (), alongside_samples: dict[int, list[float]] | None = None,
                  triad_alongside: bool = False) -> RooflinePoint:
    """Time one operation (best of ``samples``) with its FLOPs and compulsory bytes. Before and
    after each sample of the operation, one sample of every kernel in ``alongside`` (the roof's
    kernels) is taken, appended to ``alongside_samples[index]``: roof and point see the same load,
    and the roof gets twice as many samples per kernel as the point. With ``triad_alongside``, a triad over
    arrays of the point's tensor size is sampled the same way: the point's own memory roof.

    ``operation``: ``add``, ``relu``, ``gelu`` (tanh, 9 FLOPs an element), ``copy`` on a tensor of
    ``shape``; ``matmul`` with ``shape`` = (m, k, n)."""
    function, flops, moved, label, tensor_bytes = _point_kernel(operation, shape, dtype, device)
    kernels = list(alongside)
    if triad_alongside:
        kernels.append(stream_triad(device, tensor_bytes)[0])
    taken: dict[int, list[float]] = {index: [] for index in range(len(kernels))}
    times = []
    for _ in range(samples):  # each sample of the point between two rounds of its roof's kernels
        for index, kernel in enumerate(kernels):
            taken[index].append(_one_sample_sec(kernel))
        times.append(_one_sample_sec(function))
        for index, kernel in enumerate(kernels):
            taken[index].append(_one_sample_sec(kernel))
    if alongside_samples is not None:
        for index in range(len(alongside)):
            alongside_samples.setdefault(index, []).extend(taken[index])
    own_triad = 4 * (tensor_bytes // 4 * 4) / min(taken[len(alongside)]) if triad_alongside else 0.0
    return RooflinePoint(label=label, operation=operation, dtype=str(dtype), flops=flops, bytes_moved=moved, samples_sec=tuple(times),
                         roof_samples_sec=tuple(sample for values in taken.values() for sample in values), memory_roof_bytes_per_sec=own_triad)


#: Square matmul sizes whose best is the compute roof — on both sides of the point sizes below,
#: none of them: from 128³ to 512³ a matmul runs near the same FLOP/s here, so the roof is the best
#: of a sweep, each size sampled in turn with every matmul point.
ROOF_MATMUL_SIZES = (192, 320, 384, 512)

#: (operation, shape) placed under the roofs: element-wise tensors of 2²³–2²⁴ float32 elements
#: (32–64 MiB, past a 16–32 MiB cache) and matmuls of sizes other than the compute roof's. A small
#: matmul (64³: 48 KiB of operands) runs from cache after its first call, so the DRAM roof does
#: not bound it: matmul points start at 256³ (43 FLOP/byte, right of any ridge measured here).
DEFAULT_POINTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("copy", (4096, 4096)), ("add", (4096, 4096)), ("relu", (4096, 4096)), ("gelu", (4096, 4096)),
    ("matmul", (256, 256, 256)), ("matmul", (1024, 1024, 1024)), ("matmul", (2048, 2048, 2048)),
)
QUICK_POINTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("add", (4096, 4096)), ("relu", (4096, 4096)), ("gelu", (2048, 4096)), ("matmul", (256, 256, 256)), ("matmul", (1024, 1024, 1024)),
)


def _square_matmul(size: int, device: str) -> Callable[[], object]:
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return functools.partial(torch.matmul, a, b, out=torch.empty(size, size, device=device))


def measure_machine_roofline(*, dtypes: tuple[str, ...] = ("float32",), points: tuple[tuple[str, tuple[int, ...]], ...] = DEFAULT_POINTS,
                             thread_count: int | None = 1, device: str = "cpu", point_samples: int = 5,
                             matmul_sizes: tuple[int, ...] = ROOF_MATMUL_SIZES, max_roof_sec: float = 3.0) -> MeasuredRoofline:
    """Both roofs (compute: per dtype, the best of the ``matmul_sizes``), then the points (float32),
    then the roofs once more. Before and after each sample of a matmul point, one sample of every
    roof matmul size is taken; around each sample of an element-wise point, one sample of a triad over
    arrays of its own tensor size (its memory roof, beside the out-of-cache triad). Samples are
    this thread's CPU time (:func:`sample_clock`) and a roof is the best it showed in any of them,
    the same statistic as a point's: a burst of load lowers neither a roof alone nor a point alone."""
    with threads(thread_count):
        used_threads = torch.get_num_threads()
        triad, array_bytes = stream_triad(device, None)
        roof_matmuls = tuple(_square_matmul(size, device) for size in matmul_sizes)

        def roofs() -> tuple[list[float], dict[str, ComputeRoof]]:
            return (list(best_until_stable_sec(triad, max_total_sec=max_roof_sec)),
                    {dtype: max((measure_compute_roof(dtype, size=size, device=device, max_total_sec=max_roof_sec) for size in matmul_sizes),
                                key=lambda roof: roof.peak_flops_per_sec) for dtype in dtypes})

        triad_samples, compute = roofs()
        matmul_samples: dict[int, list[float]] = {}
        measured = tuple(measure_point(operation, shape, device=device, samples=point_samples,
                                       alongside=roof_matmuls if operation == "matmul" else (), alongside_samples=matmul_samples,
                                       triad_alongside=operation != "matmul")
                         for operation, shape in points)
        triad_again, compute_again = roofs()
    memory = _memory_roof(tuple(triad_samples + triad_again), array_bytes)
    compute = {dtype: max(compute[dtype], compute_again[dtype], key=lambda roof: roof.peak_flops_per_sec) for dtype in dtypes}
    if matmul_samples and "float32" in compute:  # the samples taken in turn with the matmul points, per roof size
        paired = [ComputeRoof("float32", 2 * matmul_sizes[index] ** 3 / min(samples), matmul_sizes[index], tuple(samples))
                  for index, samples in matmul_samples.items()]
        compute["float32"] = max([compute["float32"], *paired], key=lambda roof: roof.peak_flops_per_sec)
    return MeasuredRoofline(memory=memory, compute=compute, points=measured, threads=used_threads)


def save_measured_roofline_png(path: str | Path, measured: MeasuredRoofline, *, title: str = "") -> Path:
    """Draw the measured roofs (a compute roof per dtype) and the points, labelled by shape and dtype."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    bandwidth = measured.memory.bandwidth_bytes_per_sec
    intensities = [point.intensity_flops_per_byte for point in measured.points if point.flops > 0]
    intensities += [roof.peak_flops_per_sec / bandwidth for roof in measured.compute.values()]
    low, high = min(intensities) / 4, max(intensities) * 4
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    figure, axes = plt.subplots(figsize=(8, 5))
    for dtype, roof in measured.compute.items():
        axes.loglog(xs, [min(roof.peak_flops_per_sec, x * bandwidth) for x in xs],
                    label=f"{dtype} roof: {roof.size}³ matmul {roof.peak_flops_per_sec / 1e9:.3g} GFLOP/s; "
                          f"triad {bandwidth / 1e9:.3g} GB/s (4 arrays moved)")
    # Each point is numbered beside its marker and named in full in the legend below the axes: long
    # labels written beside the markers overlapped (add and relu sit together) and ran off the right edge.
    for number, point in enumerate((point for point in measured.points if point.flops > 0), start=1):
        axes.scatter([point.intensity_flops_per_byte], [point.best_flops_per_sec], zorder=3,
                     label=f"{number}. {point.label} ({measured.share_of_roof(point):.0%} of the roof)")
        axes.annotate(str(number), (point.intensity_flops_per_byte, point.best_flops_per_sec),
                      textcoords="offset points", xytext=(5, 3), fontsize=8)
    axes.set_xlabel("arithmetic intensity (FLOP / byte read + written)")
    axes.set_ylabel("FLOP/s (best sample)")
    axes.set_title(title or "This machine's measured roofline")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7, frameon=False)
    figure.savefig(str(path), dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


@functools.cache
def this_machine_roofline() -> MeasuredRoofline:
    """This CPU's roofline with the quick points, one thread, measured once per process."""
    return measure_machine_roofline(points=QUICK_POINTS, point_samples=3, max_roof_sec=0.5)


def write_measured_roofline_png(path: str | Path) -> Path:
    """Draw this machine's roofline (:func:`this_machine_roofline`, a few seconds) into ``path``."""
    return save_measured_roofline_png(path, this_machine_roofline(), title="resacct: this machine's measured roofline (one thread)")
