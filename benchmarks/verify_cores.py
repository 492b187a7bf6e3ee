"""Where `resacct verify` leaves a core idle: the machine's busy cores (``/proc/stat``, every 0.25 s)
over each phase `--durations` names, and the core-seconds each phase leaves idle — the part of the
wall no claim's CPU time can explain (issue 34: ≤ 25 s on 2 cores needs both cores busy throughout).

    python benchmarks/verify_cores.py               # one run of the shipped claims
    python benchmarks/verify_cores.py --rounds 2    # two runs, one table each

Linux only (``/proc/stat``). The counts are the whole machine's: run it on an otherwise idle one
(the load average before and after is printed). The report goes to a temporary folder; nothing is
written elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_SECONDS = 0.25


def _cpu_times() -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) of the machine."""
    with open("/proc/stat") as stat:
        values = [int(value) for value in stat.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def _sample(samples: list[tuple[float, float]], stop: threading.Event, cores: int) -> None:
    previous = _cpu_times()
    while not stop.wait(SAMPLE_SECONDS):
        now = _cpu_times()
        total, idle = now[0] - previous[0], now[1] - previous[1]
        samples.append((time.perf_counter(), cores * (1 - idle / total) if total else 0.0))
        previous = now


def one_run(cores: int) -> tuple[float, dict[str, float], list[tuple[float, float]], float]:
    """(the run's wall seconds, its phases' wall seconds in order, the samples, when it started)."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(samples, stop, cores), daemon=True)
    with tempfile.TemporaryDirectory() as folder:
        sampler.start()
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "resacct", "verify", "--durations", "0", "--report-dir", folder], cwd=ROOT,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
        if done.returncode not in (0, 1):
            raise SystemExit(f"resacct verify exited {done.returncode}: {done.stderr.strip()[-400:]}")
        phases = json.loads((Path(folder) / "report.json").read_text())["run"]["phases"]
    return wall, phases, samples, started


def table(wall: float, phases: dict[str, float], samples: list[tuple[float, float]], started: float, cores: int) -> list[str]:
    lines = [f"{'phase':46s} {'wall s':>7s} {'busy cores':>11s} {'idle core-s':>12s}"]
    begin, idle_total = started, 0.0
    for name, seconds in phases.items():
        inside = [busy for when, busy in samples if begin < when <= begin + seconds]
        busy = sum(inside) / len(inside) if inside else float("nan")
        idle = (cores - busy) * seconds if inside else 0.0
        idle_total += idle
        lines.append(f"{name:46s} {seconds:7.1f} {busy:11.2f} {idle:12.1f}")
        begin += seconds
    lines.append(f"{'whole run (process start to exit)':46s} {wall:7.1f} {'':11s} {idle_total:12.1f}  (in the phases)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs, one table each (default 1)")
    args = parser.parse_args(argv)
    if not os.path.exists("/proc/stat"):
        print("needs Linux's /proc/stat", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    print(f"{cores} cores; load average before: {os.getloadavg()[0]:.1f}")
    for round_ in range(1, args.rounds + 1):
        wall, phases, samples, started = one_run(cores)
        print(f"round {round_}: resacct verify {wall:.1f} s wall")
        print("\n".join("  " + line for line in table(wall, phases, samples, started, cores)))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
