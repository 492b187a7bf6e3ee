"""Wall time and peak memory of the CPU test suite under the CI hypothesis profile.

    python benchmarks/suite_time_memory.py                       # the README's test command (quick tier, 2 workers)
    python benchmarks/suite_time_memory.py -n auto --dist loadgroup --run-slow   # everything
    python benchmarks/suite_time_memory.py resacct/specs         # the claims, one process

Runs pytest in a child process (CI=true selects the derandomised ``ci`` profile) and reads the
child's peak resident memory from ``getrusage(RUSAGE_CHILDREN)``. The bars from the harness issue
are < 60 s wall and < 2 GiB peak on the 2-core machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WALL_BAR_SECONDS = 60.0
MEMORY_BAR_BYTES = 2 * 2**30


README_TEST_ARGUMENTS = ["-n", "auto", "--dist", "loadgroup"]


def main(arguments: list[str]) -> int:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(arguments or README_TEST_ARGUMENTS)]
    environment = {**os.environ, "CI": "true"}
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    wall_seconds = time.perf_counter() - started
    peak_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    tail = lines[-1:]
    tier = [line for line in lines if line.startswith("quick tier:")]
    print(f"command:      {' '.join(command[2:])}")
    print(f"pytest says:  {tail[0] if tail else '(nothing)'} (exit {completed.returncode})")
    if tier:
        print(f"              {tier[0]}")
    print(f"wall time:    {wall_seconds:.1f} s   (bar {WALL_BAR_SECONDS:.0f} s: {'met' if wall_seconds < WALL_BAR_SECONDS else 'MISSED'})")
    print(f"peak memory:  {peak_bytes / 2**20:.0f} MiB (bar {MEMORY_BAR_BYTES / 2**20:.0f} MiB: {'met' if peak_bytes < MEMORY_BAR_BYTES else 'MISSED'})")
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
