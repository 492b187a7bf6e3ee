"""The board's ceilings, as tools/gpu_record.py records them (issue 31): the most matmul FLOP/s over a
sweep of shapes per dtype (the MAMF method: the best of a sweep, not a datasheet), the bandwidth of a
large copy and the launch overhead of a tiny kernel.
"""

from __future__ import annotations

import time
from typing import Any


def time_it(fn: Any, cuda: bool, repeats: int) -> float:
    import torch

    fn()
    if cuda:
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - begin)
    return best


def record_ceilings(dry: bool, budget_sec: float) -> dict[str, Any]:
    """The most matmul FLOP/s over a shape sweep per dtype (MAMF), the bandwidth of a large copy, a launch's overhead."""
    import torch

    cuda = not dry
    device = "cuda" if cuda else "cpu"
    started = time.perf_counter()
    sizes = [1024, 2048, 4096, 6144, 8192, 12288, 16384] if cuda else [32, 64]
    shapes = [(n, n, n) for n in sizes] + ([(8192, 8192, 2048), (8192, 2048, 8192), (16384, 4096, 4096), (4096, 14336, 4096)] if cuda else [(64, 32, 64)])
    dtypes: dict[str, Any] = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
    fp8 = cuda and torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "float8_e4m3fn")
    if fp8 or dry:
        dtypes["fp8"] = getattr(torch, "float8_e4m3fn", None)
    matmul: dict[str, Any] = {}
    for label, dtype in dtypes.items():
        results = []
        torch.backends.cuda.matmul.allow_tf32 = label == "tf32"
        for m, n, k in shapes:
            if time.perf_counter() - started > budget_sec * 0.8 or (label in ("fp32", "tf32") and m * n * k > 8192**3):
                continue
            try:
                if label == "fp8":
                    a = torch.randn(m, k, device=device).to(dtype)
                    b = torch.randn(n, k, device=device).to(dtype).t()
                    one = torch.tensor(1.0, device=device)
                    fn = lambda a=a, b=b, one=one: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
                else:
                    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
                    fn = lambda a=a, b=b: a @ b  # noqa: E731
                seconds = time_it(fn, cuda, 5 if cuda else 2)
                results.append({"m": m, "n": n, "k": k, "flops_per_sec": 2 * m * n * k / seconds})
            except (RuntimeError, TypeError) as error:  # fp8 on a CPU build, a shape the board refuses
                results.append({"m": m, "n": n, "k": k, "error": str(error).splitlines()[0][:200]})
            finally:
                a = b = None
        best = max((r for r in results if "flops_per_sec" in r), key=lambda r: r["flops_per_sec"], default=None)
        matmul[label] = {"max_flops_per_sec": best and best["flops_per_sec"], "best_shape": best and [best["m"], best["n"], best["k"]], "sweep": results}
    torch.backends.cuda.matmul.allow_tf32 = False
    nbytes = (1 << 30) if cuda else (1 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_sec = time_it(lambda: dst.copy_(src), cuda, 10 if cuda else 2)
    tiny = torch.zeros(1, device=device)
    launches = 1000 if cuda else 50

    def launch_many() -> None:
        for _ in range(launches):
            tiny.add_(1)
    launch_sec = time_it(launch_many, cuda, 3)
    return {"matmul": matmul, "copy": {"bytes": nbytes, "seconds": copy_sec, "bandwidth_bytes_per_sec": 2 * nbytes / copy_sec,
                                       "note": "read + write: 2 × bytes ÷ time"},
            "launch": {"kernels": launches, "seconds": launch_sec, "per_launch_sec": launch_sec / launches, "kernel": "tiny.add_(1), back to back"},
            "seconds": round(time.perf_counter() - started, 2)}
