"""Measuring performance claims: FLOPs from ``FlopCounterMode``, bytes from tensor storages,
seconds from timers on this machine (one thread: the machine is shared), peaks from datasheets.

Intensities are measured from real tensors (the meta device for large ones: their sizes are
real, nothing is allocated); speeds are measured with :func:`resacct.measurement.perf.time_callable`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from resacct.checks.hardware import raw_bandwidth_bytes_per_sec, raw_peak_flops_per_sec
from resacct.facts.dtypes import dtype_bytes, parse_dtype
from resacct.errors import ResacctError
from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.perf import (
    Roofline,
    achieved_flops_per_sec,
    elementwise_intensity_flops_per_byte,
    matmul_flops,
    matmul_intensity_flops_per_byte,
    measured_bytes,
    mfu,
    threads,
    time_callable,
)

Number = float | int
MEASURING_THREADS = 1


def counted_flops(function: Callable[[], object]) -> int:
    """FLOPs torch's FlopCounterMode counts while ``function`` runs."""
    with FlopCounterMode(display=False) as counter:
        function()
    return counter.get_total_flops()


_CASTS = ("convert_element_type", "_to_copy")


def _pointwise_flops(function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> int:
    """FLOPs of an element-wise function: one per element for every pointwise op in torch's own
    decomposition of it (GELU is decomposed into its multiplies, adds and tanh)."""
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    table = get_decompositions([torch.ops.aten.gelu])
    graph = make_fx(function, decomposition_table=table)(x).graph
    flops = 0
    for node in graph.nodes:
        if node.op != "call_function" or any(cast in str(node.target) for cast in _CASTS):
            continue  # dtype conversions (bf16 → fp32 and back) move data but do no arithmetic
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.numel() == x.numel():
            flops += value.numel()
    return flops


_ELEMENTWISE: dict[str, tuple[int, Callable[..., torch.Tensor]]] = {
    # name: (inputs, function)
    "add": (2, torch.add),
    "mul": (2, torch.mul),
    "relu": (1, torch.relu),
    "gelu": (1, functools.partial(F.gelu, approximate="tanh")),
}


def _elementwise_flops_and_bytes(operation: str, elements: int, dtype: torch.dtype) -> tuple[int, int]:
    arity, function = _ELEMENTWISE[operation]
    inputs = [torch.randn(elements).to(dtype) for _ in range(arity)]
    output = function(*inputs)
    flops = _pointwise_flops(function, inputs[0]) if arity == 1 else output.numel()  # x ⊕ y: one op an element
    return flops, measured_bytes(*inputs, output)


def _matmul_flops_and_bytes(m: int, k: int, n: int, dtype: torch.dtype, device: str) -> tuple[int, int]:
    a = torch.empty(m, k, dtype=dtype, device=device)
    b = torch.empty(k, n, dtype=dtype, device=device)
    result: list[torch.Tensor] = []
    flops = counted_flops(lambda: result.append(a @ b))
    return flops, measured_bytes(a, b, result[0])


def _operation_flops_and_bytes(operation: str, size: int, dtype: torch.dtype) -> tuple[int, int]:
    """Measured FLOPs and bytes of ``operation``: matmul is size³, matvec (size×size)@(size×1),
    dot (1×size)@(size×1); element-wise ones act on ``size`` elements."""
    shapes = {"matmul": (size, size, size), "matvec": (size, size, 1), "dot": (1, size, 1)}
    if operation in shapes:
        return _matmul_flops_and_bytes(*shapes[operation], dtype=dtype, device="meta")
    return _elementwise_flops_and_bytes(operation, size, dtype)


def _predicted_intensity(operation: str, size: int, dtype: str) -> float:
    element = dtype_bytes(dtype)
    shapes = {"matmul": (size, size, size), "matvec": (size, size, 1), "dot": (1, size, 1)}
    if operation in shapes:
        return matmul_intensity_flops_per_byte(*shapes[operation], bytes_per_element=element)
    return elementwise_intensity_flops_per_byte(operation, element)


# ---------------------------------------------------------------------------------------------
# Arithmetic intensity


@check("perf.matmul_intensity", evidence="measured", quantities=("element_size", "flops", "bytes"))
def matmul_intensity(m: int, k: int, n: int, dtype: str = "float32") -> Outcome:
    """FLOPs of ``a @ b`` (FlopCounterMode) ÷ bytes of the storages of a (m×k), b (k×n) and the
    result (meta tensors: real sizes, nothing allocated)."""
    torch_dtype = parse_dtype(dtype)
    flops, bytes_moved = _matmul_flops_and_bytes(m, k, n, torch_dtype, "meta")
    element_size = torch.empty(0, dtype=torch_dtype).element_size()
    return Outcome(
        measured=flops / bytes_moved,
        predicted=matmul_intensity_flops_per_byte(m, k, n, bytes_per_element=dtype_bytes(dtype)),
        quantities={"element_size": element_size, "flops": flops, "bytes": bytes_moved},
    )


@check("perf.square_matmul_intensity", evidence="measured", quantities=("element_size",))
def square_matmul_intensity(n: int, dtype: str = "bfloat16") -> Outcome:
    """Measured intensity of an n×n @ n×n matmul (FlopCounterMode ÷ storage bytes, meta tensors)."""
    outcome = matmul_intensity(n, n, n, dtype)
    return Outcome(measured=outcome.measured, predicted=outcome.predicted, quantities={"element_size": outcome.quantities["element_size"]})


@check("perf.elementwise_intensity", evidence="measured", quantities=("element_size", "flops", "bytes"))
def elementwise_intensity(operation: str, elements: int, dtype: str = "float32") -> Outcome:
    """FLOPs (one per element per pointwise op in torch's decomposition) ÷ bytes of the storages
    of the inputs and the output of ``operation`` on ``elements`` elements."""
    torch_dtype = parse_dtype(dtype)
    flops, bytes_moved = _elementwise_flops_and_bytes(operation, elements, torch_dtype)
    return Outcome(
        measured=flops / bytes_moved,
        predicted=elementwise_intensity_flops_per_byte(operation, dtype_bytes(dtype)),
        quantities={"element_size": torch.empty(0, dtype=torch_dtype).element_size(), "flops": flops, "bytes": bytes_moved},
    )


# ---------------------------------------------------------------------------------------------
# The roofline on a datasheet


@check("perf.roofline_bound", evidence="measured", quantities=("intensity_flops_per_byte", "ridge_flops_per_byte"))
def roofline_bound(operation: str, size: int, device: str, dtype: str = "bfloat16", table_dtype: str = "bf16") -> Outcome:
    """"memory" or "compute": the operation's measured intensity (FLOPs and bytes from torch)
    against ``device``'s datasheet ridge point (peak ÷ bandwidth)."""
    flops, bytes_moved = _operation_flops_and_bytes(operation, size, parse_dtype(dtype))
    intensity = flops / bytes_moved
    ridge = raw_peak_flops_per_sec(device, table_dtype) / raw_bandwidth_bytes_per_sec(device)
    predicted = Roofline.of_accelerator(device, table_dtype).bound(_predicted_intensity(operation, size, dtype))
    return Outcome(
        measured="memory" if intensity < ridge else "compute",
        predicted=predicted,
        quantities={"intensity_flops_per_byte": intensity, "ridge_flops_per_byte": ridge},
    )


@check("perf.roofline_fraction_of_peak", evidence="arithmetic")
def roofline_fraction_of_peak(intensity: Number, device: str, dtype: str = "bf16") -> Outcome:
    """The fraction of ``device``'s datasheet peak a kernel of ``intensity`` FLOP/byte can reach:
    min(1, intensity × bandwidth ÷ peak)."""
    peak, bandwidth = raw_peak_flops_per_sec(device, dtype), raw_bandwidth_bytes_per_sec(device)
    roofline = Roofline.of_accelerator(device, dtype)
    return Outcome(measured=min(1.0, intensity * bandwidth / peak), predicted=roofline.attainable_flops_per_sec(intensity) / roofline.peak_flops_per_sec)


# ---------------------------------------------------------------------------------------------
# MFU arithmetic on the lecture's numbers


@check("perf.achieved_flops_per_sec", evidence="measured", quantities=("flops",))
def achieved_flops_per_sec_of_matmul(m: int, k: int, n: int, seconds: Number) -> Outcome:
    """FLOPs of an (m×k)@(k×n) matmul (FlopCounterMode, meta tensors) ÷ the stated ``seconds``."""
    flops, _ = _matmul_flops_and_bytes(m, k, n, torch.float32, "meta")
    return Outcome(measured=flops / seconds, predicted=achieved_flops_per_sec(matmul_flops(m, k, n), seconds), quantities={"flops": flops})


@check("perf.worked_mfu", evidence="arithmetic", quantities=("peak_flops_per_sec",))
def worked_mfu(achieved_flops_per_sec: Number, device: str, dtype: str) -> Outcome:
    """A stated achieved FLOP/s ÷ ``device``'s datasheet peak for ``dtype``."""
    peak = raw_peak_flops_per_sec(device, dtype)
    return Outcome(measured=achieved_flops_per_sec / peak, predicted=mfu(achieved_flops_per_sec, peak_flops_per_sec(device, dtype)),
                   quantities={"peak_flops_per_sec": peak})


# ---------------------------------------------------------------------------------------------
# Timed on this machine (CPU)


def _interleaved_samples_sec(functions: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Seconds per call of each function, ``repeats`` samples each, taken in turn so that a
    burst of load on the shared machine slows them alike."""
    for function in functions:
        function()
        function()
    samples: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for index, function in enumerate(functions):
            samples[index].append(time_callable(function, warmup=0, repeats=1).median_sec)
    return samples


@check("perf.cpu_speed_ratio", evidence="measured", quantities=("matmul_flops_per_sec", "add_flops_per_sec"), timing=True, paired=True)
def cpu_speed_ratio(matmul_size: int = 512, add_elements: int = 2**23, repeats: int = 9) -> Outcome:
    """FLOP/s a float32 matmul_size³ matmul reaches ÷ what an ``add`` over ``add_elements``
    elements reaches, timed here in turn with one thread. "Reaches" is the best of the samples
    for both: on a shared machine medians swing 5× with the neighbours' load, best-ofs by a few
    percent. FLOPs: FlopCounterMode for the matmul, one per output element for the add."""
    a, b = torch.randn(matmul_size, matmul_size), torch.randn(matmul_size, matmul_size)
    product = torch.empty(matmul_size, matmul_size)
    x, y = torch.randn(add_elements), torch.randn(add_elements)
    total = torch.empty(add_elements)
    matmul_counted = counted_flops(functools.partial(torch.matmul, a, b))
    with threads(MEASURING_THREADS):
        matmul_samples, add_samples = _interleaved_samples_sec(
            [functools.partial(torch.matmul, a, b, out=product), functools.partial(torch.add, x, y, out=total)], repeats)
    matmul_speed = matmul_counted / min(matmul_samples)
    add_speed = total.numel() / min(add_samples)
    return Outcome(measured=matmul_speed / add_speed, quantities={"matmul_flops_per_sec": matmul_speed, "add_flops_per_sec": add_speed})


@check("perf.cpu_matmul_mfu", evidence="measured", quantities=("achieved_flops_per_sec", "ceiling_flops_per_sec"), timing=True)
def cpu_matmul_mfu(m: int, k: int, n: int, ceiling_size: int = 512, repeats: int = 7) -> Outcome:
    """MFU of a real float32 (m×k)@(k×n) matmul on this CPU: FLOPs (FlopCounterMode) ÷ its median
    seconds, ÷ this machine's matmul ceiling (the best FLOP/s of a ceiling_size³ matmul, timed in
    turn with it, one thread)."""
    a, b, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    big_a, big_b = torch.randn(ceiling_size, ceiling_size), torch.randn(ceiling_size, ceiling_size)
    big_out = torch.empty(ceiling_size, ceiling_size)
    flops = counted_flops(functools.partial(torch.matmul, a, b))
    ceiling_flops = counted_flops(functools.partial(torch.matmul, big_a, big_b))
    with threads(MEASURING_THREADS):
        op_samples, ceiling_samples = _interleaved_samples_sec(
            [functools.partial(torch.matmul, a, b, out=out), functools.partial(torch.matmul, big_a, big_b, out=big_out)], repeats)
    achieved = flops / statistics.median(op_samples)
    ceiling = ceiling_flops / min(ceiling_samples)
    return Outcome(measured=achieved / ceiling, quantities={"achieved_flops_per_sec": achieved, "ceiling_flops_per_sec": ceiling})


def _forget_machine_roofline() -> None:
    from resacct.measurement.measured_roofline import this_machine_roofline

    this_machine_roofline.cache_clear()


@check("perf.cpu_roofline_bound", evidence="measured", quantities=("intensity_flops_per_byte", "ridge_flops_per_byte"), timing=True, forget=(_forget_machine_roofline,))
def cpu_roofline_bound(operation: str, size: int, dtype: str = "float32") -> Outcome:
    """"memory" or "compute" on THIS machine: the operation's measured intensity (torch's FLOPs
    and bytes) against the measured ridge point (best matmul FLOP/s ÷ best triad bytes/s, see
    :mod:`resacct.measurement.measured_roofline`)."""
    flops, bytes_moved = _operation_flops_and_bytes(operation, size, parse_dtype(dtype))
    intensity = flops / bytes_moved
    from resacct.measurement.measured_roofline import this_machine_roofline

    roofline = this_machine_roofline().roofline("float32")
    ridge = roofline.ridge_point_flops_per_byte
    return Outcome(
        measured="memory" if intensity < ridge else "compute",
        predicted=roofline.bound(_predicted_intensity(operation, size, dtype)),
        quantities={"intensity_flops_per_byte": intensity, "ridge_flops_per_byte": ridge},
    )


# ---------------------------------------------------------------------------------------------
# Timed on a GPU


def _cuda_board_of_family(family: str) -> tuple[str, str]:
    if not torch.cuda.is_available():
        raise NotMeasurable(f"needs a CUDA GPU; torch {torch.__version__} sees none")
    name = torch.cuda.get_device_name(0)
    board = accelerator_for_cuda_name(name)
    if board is None:
        raise NotMeasurable(f"GPU {name!r} is not in resacct/facts/datasheets/accelerators.yaml; its peak is unknown")
    if board.family != family:
        raise NotMeasurable(f"the claim is about {family} GPUs; this one is {name!r} ({board.family})")
    return name, board.name


def _cuda_matmul_seconds(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 10, *, tf32: bool = False) -> float:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32  # off by default: float32 means the fp32 path, as its peak does
    try:
        return time_callable(functools.partial(torch.matmul, a, b, out=out), device="cuda", warmup=3, repeats=repeats).median_sec
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


_TABLE_FORMAT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@check("perf.gpu_matmul_mfu", evidence="measured", quantities=("achieved_flops_per_sec", "peak_flops_per_sec"), timing=True)
def gpu_matmul_mfu(m: int, k: int, n: int, dtype: str, family: str) -> Outcome:
    """MFU of an (m×k)@(k×n) matmul timed on GPU 0 with CUDA events (median of 10), FLOPs from
    FlopCounterMode, against the board's dense datasheet peak for ``dtype`` (TF32 off)."""
    _, board = _cuda_board_of_family(family)
    if dtype not in _TABLE_FORMAT:
        raise ResacctError(f"dtype {dtype!r}: expected one of {', '.join(_TABLE_FORMAT)}")
    flops, _ = _matmul_flops_and_bytes(m, k, n, parse_dtype(dtype), "meta")
    achieved = flops / _cuda_matmul_seconds(m, k, n, parse_dtype(dtype))
    peak = raw_peak_flops_per_sec(board, _TABLE_FORMAT[dtype])
    return Outcome(measured=achieved / peak, quantities={"achieved_flops_per_sec": achieved, "peak_flops_per_sec": peak})


@check("perf.gpu_matmul_speedup", evidence="measured", quantities=("fast_sec", "slow_sec"), timing=True)
def gpu_matmul_speedup(m: int, k: int, n: int, fast_dtype: str, slow_dtype: str, family: str) -> Outcome:
    """Seconds of the matmul in ``slow_dtype`` ÷ seconds in ``fast_dtype`` on GPU 0 (TF32 off)."""
    _cuda_board_of_family(family)
    fast = _cuda_matmul_seconds(m, k, n, parse_dtype(fast_dtype))
    slow = _cuda_matmul_seconds(m, k, n, parse_dtype(slow_dtype))
    if not (math.isfinite(fast) and fast > 0):
        raise ResacctError(f"timing the {fast_dtype} matmul gave {fast!r} seconds")
    return Outcome(measured=slow / fast, quantities={"fast_sec": fast, "slow_sec": slow})


@check("perf.gpu_tf32_matmul_fp32_mfu", evidence="measured", quantities=("achieved_flops_per_sec", "fp32_peak_flops_per_sec", "tf32_peak_flops_per_sec"), timing=True)
def gpu_tf32_matmul_fp32_mfu(m: int, k: int, n: int, family: str) -> Outcome:
    """"MFU" of a float32 (m×k)@(k×n) matmul timed on GPU 0 with TF32 on
    (``torch.backends.cuda.matmul.allow_tf32 = True``: cuBLAS may round the inputs to TF32 and use
    the tensor cores) against the board's plain fp32 peak (no tensor cores). The datasheet's TF32
    peak is a quantity: the measured rate should sit under it, and far above the fp32 one."""
    _, board = _cuda_board_of_family(family)
    flops, _ = _matmul_flops_and_bytes(m, k, n, torch.float32, "meta")
    achieved = flops / _cuda_matmul_seconds(m, k, n, torch.float32, tf32=True)
    fp32_peak = raw_peak_flops_per_sec(board, "fp32")
    return Outcome(measured=achieved / fp32_peak, quantities={"achieved_flops_per_sec": achieved, "fp32_peak_flops_per_sec": fp32_peak,
                                                              "tf32_peak_flops_per_sec": raw_peak_flops_per_sec(board, "tf32")})


@check("perf.roofline_points_share_of_roof", evidence="measured", quantities=("points", "memory_roof_bytes_per_sec", "compute_roof_flops_per_sec"), timing=True,
       forget=(_forget_machine_roofline,))
def roofline_points_share_of_roof() -> Outcome:
    """The largest (best FLOP/s ÷ attainable FLOP/s under the measured roofs) over the points of
    this machine's measured roofline (:func:`resacct.measurement.measured_roofline.this_machine_roofline`):
    above 1 means a point beats a roof, i.e. the roof was not measured right."""
    from resacct.measurement.measured_roofline import this_machine_roofline

    roofline = this_machine_roofline()
    shares = {point.label: round(roofline.share_of_roof(point), 3) for point in roofline.points if point.flops > 0}
    return Outcome(measured=max(shares.values()), quantities={"points": shares, "memory_roof_bytes_per_sec": roofline.memory.bandwidth_bytes_per_sec,
                                                               "compute_roof_flops_per_sec": roofline.compute["float32"].peak_flops_per_sec})
