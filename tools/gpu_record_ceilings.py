"""The board's ceilings, as tools/gpu_record.py records them (issue 31): the most matmul FLOP/s over a
sweep of shapes per dtype (the MAMF method: the best of a sweep, not a datasheet), the bandwidth of a
large copy and the launch overhead of a tiny kernel; and since round four, session 29, sdpa's fused kernels timed
over a sweep of batch × sequence × head size (:func:`attention_sweep`): the training steps' attention calls are four
shapes, too few to tell a per-call cost from a rate (docs/gpu.md, "How fast the board's attention kernels ran").
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
    attention = attention_sweep(dry, max(budget_sec - (time.perf_counter() - started), 0.0))
    attention["decode"] = decode_attention_calls(dry, max(budget_sec - (time.perf_counter() - started), 0.0))
    return {"matmul": matmul, "attention": attention, "copy": {"bytes": nbytes, "seconds": copy_sec, "bandwidth_bytes_per_sec": 2 * nbytes / copy_sec,
                                       "note": "read + write: 2 × bytes ÷ time"},
            "launch": {"kernels": launches, "seconds": launch_sec, "per_launch_sec": launch_sec / launches, "kernel": "tiny.add_(1), back to back"},
            "seconds": round(time.perf_counter() - started, 2)}


#: (batch, sequence) of the attention sweep on a board: the training steps' shapes (4 × 1,024, 2 × 1,024, 4 × 512, 1 × 256)
#: among more, so a per-call term and a rate can be told apart; 16 heads, causal, head size 64 and 128
ATTENTION_SHAPES = [(1, 256), (1, 512), (4, 512), (1, 1024), (2, 1024), (4, 1024), (8, 1024), (1, 2048), (4, 2048), (8, 2048), (1, 4096), (2, 4096)]
ATTENTION_HEADS = 16


def attention_sweep(dry: bool, budget_sec: float) -> dict[str, Any]:
    """sdpa's flash kernel (bf16) and memory-efficient kernel (bf16 and fp32) timed over :data:`ATTENTION_SHAPES` × head
    sizes 64 and 128, causal: forward alone and forward + backward (best of 5, CUDA-synchronised), with the FLOPs torch's
    counter gives a causal call (the whole square: 4 × b × h × s² × d forward, 2.5 × that with the backward). A shape the
    kernel refuses keeps its one-line error; shapes left when ``budget_sec`` is spent are not timed (``skipped``). In a
    dry run: the CPU's math kernel on two tiny shapes (a layout check)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    cuda = not dry
    device = "cuda" if cuda else "cpu"
    started = time.perf_counter()
    kernels = ([("flash", SDPBackend.FLASH_ATTENTION, torch.bfloat16), ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.float32)] if cuda else [("math", SDPBackend.MATH, torch.float32)])
    shapes, heads, head_sizes = (ATTENTION_SHAPES, ATTENTION_HEADS, (64, 128)) if cuda else ([(1, 16), (2, 32)], 2, (8,))
    rows: list[dict[str, Any]] = []
    skipped = 0
    for kernel, backend, dtype in kernels:
        for head_size in head_sizes:
            for batch, seq in shapes:
                if time.perf_counter() - started > budget_sec:
                    skipped += 1
                    continue
                row: dict[str, Any] = {"kernel": kernel, "dtype": str(dtype).removeprefix("torch."), "batch": batch, "seq": seq, "heads": heads,
                                       "head_size": head_size, "causal": True, "forward_flops": 4 * batch * heads * seq * seq * head_size}
                try:
                    q, k, v = (torch.randn(batch, heads, seq, head_size, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
                    grad = torch.randn(batch, heads, seq, head_size, device=device, dtype=dtype)

                    def forward(q: Any = q, k: Any = k, v: Any = v) -> Any:
                        with sdpa_kernel(backend):
                            return scaled_dot_product_attention(q, k, v, is_causal=True)

                    def forward_backward(grad: Any = grad) -> None:
                        forward().backward(grad)

                    with torch.no_grad():
                        row["forward_sec"] = time_it(forward, cuda, 5 if cuda else 2)
                    row["forward_backward_sec"] = time_it(forward_backward, cuda, 5 if cuda else 2)
                except RuntimeError as error:  # a kernel that refuses the shape or dtype (flash has no fp32)
                    row["error"] = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
                finally:
                    q = k = v = grad = None
                rows.append(row)
    return {"sweep": rows, "skipped": skipped, "seconds": round(time.perf_counter() - started, 2),
            "flops": "torch's counter on a causal call: the whole square (4 × b × h × s² × d forward; the backward 2 × the forward)"}


#: one generated token's attention calls, as generate makes them: one query over a cache of DECODE_CONTEXT positions
DECODE_CONTEXT = 1024
DECODE_CALLS = 16


def decode_attention_calls(dry: bool, budget_sec: float) -> list[dict[str, Any]]:
    """sdpa's kernels on one query over a bf16 cache (batch 1, 32 heads of 64: Llama-3.2-1B's, its 8 key/value heads
    repeated to the query's as transformers' ``repeat_kv`` gives them), each call CUDA-synchronised: :data:`DECODE_CALLS` calls over the same cache length, then as many over a
    cache one position longer each call — as a decode loop grows it. The 2026-11-30 record's served tokens spent 2.46 ms
    of host time per cuDNN attention call; if cuDNN builds a graph per new shape, the growing calls pay it and the
    repeated ones do not (docs/gpu.md). Per kernel: ``repeated_sec`` and ``growing_sec`` (medians), or ``error``. In a
    dry run: the CPU's math kernel, tiny."""
    import statistics

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    cuda = not dry
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    kernels = [(name, getattr(SDPBackend, backend)) for name, backend in
               (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")) if hasattr(SDPBackend, backend)]
    if dry:
        kernels = [("math", SDPBackend.MATH)]
    heads, head_size, context, calls = (32, 64, DECODE_CONTEXT, DECODE_CALLS) if cuda else (4, 8, 16, 3)
    started = time.perf_counter()
    rows = []
    for name, backend in kernels:
        if time.perf_counter() - started > budget_sec:
            rows.append({"kernel": name, "skipped": True})
            continue
        row: dict[str, Any] = {"kernel": name, "batch": 1, "heads": heads, "head_size": head_size, "context": context, "calls": calls}
        try:
            query = torch.randn(1, heads, 1, head_size, device=device, dtype=dtype)
            # a new contiguous cache per length, made before the timing: transformers' cache grows by torch.cat
            caches = {length: (torch.randn(1, heads, length, head_size, device=device, dtype=dtype),
                               torch.randn(1, heads, length, head_size, device=device, dtype=dtype))
                      for length in range(context, context + calls + 1)}

            def timed(length: int) -> float:
                keys, values = caches[length]
                if cuda:
                    torch.cuda.synchronize()
                begin = time.perf_counter()
                with sdpa_kernel(backend):
                    scaled_dot_product_attention(query, keys, values)
                if cuda:
                    torch.cuda.synchronize()
                return time.perf_counter() - begin

            with torch.no_grad():
                timed(context)  # its first call (a library's set-up) is not counted
                row["repeated_sec"] = statistics.median(timed(context) for _ in range(calls))
                row["growing_sec"] = statistics.median(timed(context + 1 + index) for index in range(calls))
        except RuntimeError as error:  # a kernel that refuses one query
            row["error"] = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        rows.append(row)
    return rows
