"""bf16 ÷ fp32 matmul FLOP/s on this CPU under each oneDNN/ATen cap: the table in docs/machines.md.

    python benchmarks/bf16_by_isa.py

Each cap runs in a fresh process (the caps are read when torch starts): the profile's
``cpu_bf16_matmul`` beside ``lecture.cpu_bf16_over_fp32_flops`` (1024×256 @ 256×64, one thread,
best-of samples taken in turn). A cap above what the chip has changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CAPS = [
    {},
    {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ATEN_CPU_CAPABILITY": "avx2"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
]

_PROBE = """
import json
from resacct.checks.lecture_timing import cpu_bf16_over_fp32_flops
from resacct.measurement.machine_profile import this_machine
outcome = cpu_bf16_over_fp32_flops(1024, 256, 64)
print(json.dumps({"kind": this_machine().cpu_bf16_matmul, "ratio": outcome.measured}))
"""


def main() -> int:
    print(f"{'cap':<52} {'bf16 matmul':<12} {'bf16 / fp32':>11}")
    for cap in CAPS:
        environment = {key: value for key, value in os.environ.items() if key not in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")}
        environment.update(cap)
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=environment, timeout=300)
        if done.returncode != 0:
            print(f"{str(cap):<52} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        label = " ".join(f"{key}={value}" for key, value in cap.items()) or "none (native)"
        print(f"{label:<52} {row['kind']:<12} {row['ratio']:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
