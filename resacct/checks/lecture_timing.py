"""Timing the lecture's own ``time_matmul`` and MFU code on this machine.

CPU timings run with one thread (on a shared machine one thread disturbs and is disturbed
least) and compare best-of samples taken in turn, so that a burst of load slows both sides
alike. GPU forms skip without CUDA.
"""

from __future__ import annotations

import functools
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.training.lecture import get_device, get_promised_flop_per_sec, time_matmul
from resacct.measurement.perf import threads

MEASURING_THREADS = 1


class _CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.matmul, torch.ops.aten.bmm):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@check("lecture.time_matmul_calls", evidence="measured")
def time_matmul_calls() -> Outcome:
    """How many matrix multiplications one call of the lecture's ``time_matmul`` runs (counted
    at torch's dispatcher), no warm-up call included."""
    a, b = torch.ones(8, 8), torch.ones(8, 8)
    with _CountMatmuls() as counter:
        time_matmul(a, b)
    return Outcome(measured=counter.calls)


def _best_sec(function, repeats: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        samples.append(time.perf_counter() - began)
    return min(samples)


@check("lecture.cold_over_warm", evidence="measured", quantities=("cold_sec", "warm_sec"), timing=True, paired=True)
def cold_over_warm(m: int, k: int, n: int, pairs: int = 7) -> Outcome:
    """What a warm-up changes: the lecture's ``time_matmul`` on freshly made float32 tensors (its
    way: no warm-up) ÷ ``time_matmul`` on the same tensors after two untimed calls, each side the
    best of ``pairs`` fresh pairs (load only ever adds time, so best-ofs compare the work), one
    thread."""
    cold_times, warm_times = [], []
    with threads(MEASURING_THREADS):
        for _ in range(pairs):
            a, b = torch.ones(m, k), torch.randn(k, n)
            cold = time_matmul(a, b)
            a @ b
            a @ b
            warm = time_matmul(a, b)
            cold_times.append(cold)
            warm_times.append(warm)
    return Outcome(measured=min(cold_times) / min(warm_times), quantities={"cold_sec": min(cold_times), "warm_sec": min(warm_times)})


@functools.cache
def _bf16_over_fp32(m: int, k: int, n: int, repeats: int) -> tuple[float, float, float]:
    """Measured once per process: two claims read the same timing."""
    x, w = torch.ones(m, k), torch.randn(k, n)
    x16, w16 = x.to(torch.bfloat16), w.to(torch.bfloat16)
    flops = 2 * m * k * n
    fp32, bf16 = [], []
    with threads(MEASURING_THREADS):
        x @ w, x16 @ w16  # one untimed call each
        for _ in range(repeats):  # fp32 is ~50× quicker here: ten samples of it per bf16 one
            fp32.append(_best_sec(lambda: x @ w, 10))
            bf16.append(_best_sec(lambda: x16 @ w16, 1))
    fp32_speed, bf16_speed = flops / min(fp32), flops / min(bf16)
    return bf16_speed / fp32_speed, fp32_speed, bf16_speed


@check("lecture.cpu_bf16_over_fp32_flops", evidence="measured", quantities=("fp32_flops_per_sec", "bf16_flops_per_sec"), timing=True, paired=True,
       forget=(_bf16_over_fp32.cache_clear,))
def cpu_bf16_over_fp32_flops(m: int, k: int, n: int, repeats: int = 5) -> Outcome:
    """On this CPU: FLOP/s of ``x @ w`` in bfloat16 ÷ in float32 (x = ones(m, k), w = randn(k, n)
    as in tensor_operations_flops), best of ``repeats`` bf16 samples and ``10 × repeats`` fp32
    samples, taken in turn, one thread: on a loaded machine a best-of needs enough short samples.
    Which kind of CPU the claim is about is the spec's ``when:`` (resacct.measurement.machine_profile)."""
    ratio, fp32_speed, bf16_speed = _bf16_over_fp32(m, k, n, repeats)
    return Outcome(measured=ratio, quantities={"fp32_flops_per_sec": fp32_speed, "bf16_flops_per_sec": bf16_speed})


@check("lecture.mfu_as_coded", evidence="measured", quantities=("actual_flop_per_sec", "promised_flop_per_sec"), timing=True)
def mfu_as_coded(m: int, k: int, n: int, dtype: str = "float32") -> Outcome:
    """tensor_operations_flops (L432-464) as written, on a machine without CUDA: actual FLOP/s =
    2·B·D·K ÷ time_matmul, promised = get_promised_flop_per_sec(device, dtype), mfu = actual ÷ promised."""
    if torch.cuda.is_available():
        raise NotMeasurable("about a machine without CUDA; this one has a GPU")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    x, w = torch.ones(m, k, dtype=torch_dtype), torch.randn(k, n).to(torch_dtype)
    with threads(MEASURING_THREADS):
        actual = 2 * m * k * n / time_matmul(x, w)
    promised = get_promised_flop_per_sec(None, torch_dtype)
    return Outcome(measured=actual / promised, quantities={"actual_flop_per_sec": actual, "promised_flop_per_sec": promised})


@check("lecture.gpu_bf16_over_fp32_flops", evidence="measured", quantities=("fp32_flops_per_sec", "bf16_flops_per_sec", "bf16_mfu"), timing=True)
def gpu_bf16_over_fp32_flops(m: int, k: int, n: int) -> Outcome:
    """On the GPU, the lecture's own code: actual FLOP/s from ``time_matmul`` in bfloat16 ÷ in
    float32 (after one untimed call each), and the bf16 MFU against its own lookup."""
    if not torch.cuda.is_available():
        raise NotMeasurable("needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = get_device()
    x, w = torch.ones(m, k, device=device), torch.randn(k, n, device=device)
    x16, w16 = x.to(torch.bfloat16), w.to(torch.bfloat16)
    x @ w, x16 @ w16
    fp32_speed = 2 * m * k * n / time_matmul(x, w)
    bf16_speed = 2 * m * k * n / time_matmul(x16, w16)
    name = torch.cuda.get_device_properties(device).name
    try:
        bf16_mfu = bf16_speed / get_promised_flop_per_sec(name, torch.bfloat16)
    except ValueError:
        bf16_mfu = float("nan")
    return Outcome(measured=bf16_speed / fp32_speed, quantities={"fp32_flops_per_sec": fp32_speed, "bf16_flops_per_sec": bf16_speed, "bf16_mfu": bf16_mfu})


@check("lecture.gpu_unsynchronized_over_synchronized", evidence="measured", quantities=("unsynchronized_sec", "synchronized_sec"), timing=True)
def gpu_unsynchronized_over_synchronized(m: int, k: int, n: int) -> Outcome:
    """On the GPU: seconds per call of ``a @ b`` timed as time_matmul does but without its
    ``torch.cuda.synchronize()`` calls (the queue drained before, not after) ÷ time_matmul's own
    result, after one untimed call."""
    if not torch.cuda.is_available():
        raise NotMeasurable("needs a CUDA GPU (torch.cuda.is_available() is False)")
    a, b = torch.ones(m, k, device="cuda:0"), torch.randn(k, n, device="cuda:0")
    a @ b
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(5):
        a @ b
    unsynchronized = (time.perf_counter() - began) / 5
    synchronized = time_matmul(a, b)
    return Outcome(measured=unsynchronized / synchronized, quantities={"unsynchronized_sec": unsynchronized, "synchronized_sec": synchronized})
