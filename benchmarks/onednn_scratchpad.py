"""oneDNN's scratchpad of 16-bit matmuls on this CPU, as resacct's kernel probe measures it
(resacct.measurement.kernel_probe: the real op once, the allocator's bytes above its output), beside
the fp32 accumulator m·n·4 + 128 that oneDNN's bf16 emulation allocates. The figures in
docs/account.md ("oneDNN's scratchpad") come from:

    .venv/bin/python benchmarks/onednn_scratchpad.py                                   # this CPU (AMX here)
    ONEDNN_MAX_CPU_ISA=AVX512_CORE .venv/bin/python benchmarks/onednn_scratchpad.py    # bf16 emulated
    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/onednn_scratchpad.py           # no oneDNN path: 0
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from resacct.measurement import kernel_probe  # noqa: E402

SHAPES = [(16, 64, 256), (16, 256, 64), (64, 16, 256), (256, 16, 64), (64, 512, 128), (2048, 64, 256), (512, 1024, 4096), (2048, 1024, 4096),
          (4096, 4096, 4096)]


def main() -> None:
    kernel_probe.MAX_PROBE_FLOPS, kernel_probe.MAX_PROBE_BYTES = 1e13, 2**31  # every shape here runs for real
    print(f"bf16 matmuls through oneDNN: {kernel_probe.onednn_matmuls('bfloat16')}; emulated: {kernel_probe.emulated_bf16()}; "
          f"{torch.get_num_threads()} threads")
    print(f"{'dtype':9} {'m × k × n':>18} {'scratchpad B':>14} {'m·n·4 + 128':>14} {'probe s':>8}")
    for dtype in (torch.bfloat16, torch.float16):
        for m, k, n in SHAPES:
            with FakeTensorMode():
                args = (torch.empty(m, k, dtype=dtype), torch.empty(k, n, dtype=dtype))
                started = time.perf_counter()
                scratch = kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, args, {})
            print(f"{str(dtype).removeprefix('torch.'):9} {f'{m} × {k} × {n}':>18} {scratch!s:>14} {m * n * 4 + 128:>14,} {time.perf_counter() - started:>8.2f}")


if __name__ == "__main__":
    main()
