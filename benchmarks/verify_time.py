"""Wall time of `resacct verify` on the full CPU claims suite, in one process and with xdist.

    python benchmarks/verify_time.py

Prints the wall time of each run side by side with the ratio, and the claims summary line each
run printed (they must agree). The bar from the verify issue: under 60 s on the 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAR_SECONDS = 60.0


def run_verify(*extra: str) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as report_dir:
        command = [sys.executable, "-m", "resacct", "verify", "--quiet", "--report-dir", report_dir, *extra]
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "CI": "true"})
        wall_seconds = time.perf_counter() - started
    summary = next((line for line in completed.stdout.splitlines() if line.startswith("claims:")), completed.stderr.strip()[-200:])
    return wall_seconds, summary


def main() -> int:
    one_process_seconds, one_summary = run_verify()
    two_workers_seconds, two_summary = run_verify("--workers", "2")
    print(f"resacct verify              {one_process_seconds:6.1f} s   {one_summary}")
    print(f"resacct verify --workers 2  {two_workers_seconds:6.1f} s   {two_summary}")
    print(f"ratio (one process / two workers): {one_process_seconds / two_workers_seconds:.2f}")
    print(f"bar {BAR_SECONDS:.0f} s: {'met' if min(one_process_seconds, two_workers_seconds) < BAR_SECONDS else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
