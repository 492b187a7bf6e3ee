"""The STREAM triad ``a = b + 3·c`` over arrays past the last-level cache: the memory roof's kernel
(:mod:`resacct.measurement.measured_roofline`) and the runtime model's DRAM rate
(:mod:`resacct.measurement.runtime_model`), and how large its arrays are on this machine."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

import torch
from jaxtyping import Float

__all__ = ["last_level_cache_bytes", "OUT_OF_CACHE_ARRAY_BYTES", "out_of_cache_elements", "tiled_random", "stream_triad"]


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache Linux reports (sysfs), else ``default``."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=default)


#: The out-of-cache triad's bytes per array: twice the last-level cache, at least 64 MiB, at most
#: 256 MiB. The cap is for servers whose one L3 is shared by the whole socket: a 2-core VM on a
#: 300 MiB-L3 Xeon took 3.0 s a roof with 600 MiB arrays, 1.1 s with 256 MiB, for the same one-thread
#: bandwidth (17.4 vs 17.0 GB/s, ``python benchmarks/triad_array_size.py``); three 256 MiB arrays
#: still overflow any cache up to 384 MiB.
OUT_OF_CACHE_ARRAY_BYTES = (64 * 2**20, 256 * 2**20)


def out_of_cache_elements(element_bytes: int, cache_bytes: int | None = None) -> int:
    """Elements per array for the out-of-cache triad: :data:`OUT_OF_CACHE_ARRAY_BYTES`' bounds on
    twice ``cache_bytes`` (default: :func:`last_level_cache_bytes`)."""
    low, high = OUT_OF_CACHE_ARRAY_BYTES
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    return min(max(2 * cache, low), high) // element_bytes


_RANDOM_BLOCK_ELEMENTS = 1 << 16


def tiled_random(shape: tuple[int, ...], device: str) -> Float[torch.Tensor, "..."]:
    """A float32 tensor of ``shape`` holding normal random values: one block of 64 Ki drawn and
    tiled over it. The kernels timed here run at one speed on any normal values; drawing each of a
    64 MiB array's 16 M values took ~0.06 s a call (a second of the roofline's 2.6 s), tiling copies."""
    block = torch.randn(min(math.prod(shape), _RANDOM_BLOCK_ELEMENTS), device=device)
    rows, left = divmod(math.prod(shape), block.numel())
    flat = torch.empty(math.prod(shape), device=device)
    flat[: rows * block.numel()].view(rows, block.numel()).copy_(block.expand(rows, block.numel()))
    flat[rows * block.numel():].copy_(block[:left])
    return flat.view(shape)


def stream_triad(device: str, array_bytes: int | None) -> tuple[Callable[[], object], int]:
    """The STREAM triad ``a = b + 3·c`` (``torch.add(b, c, alpha=3, out=a)``), float32, and its array bytes."""
    elements = (array_bytes // 4) if array_bytes else out_of_cache_elements(4)
    b, c = tiled_random((elements,), device), tiled_random((elements,), device)
    a = torch.empty_like(b)
    return functools.partial(torch.add, b, c, alpha=3.0, out=a), elements * 4
