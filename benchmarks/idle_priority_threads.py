"""What workers at Linux's ``SCHED_IDLE`` cost a process that uses two torch threads (issue 34:
``resacct verify`` runs its thread-dependent claims and gloo launches while its workers wait at idle
priority, resacct/harness/worker_scheduling.py).

    python benchmarks/idle_priority_threads.py [--rounds 3]

A 2-thread loop of 256² matmuls and tanh (300 layers) timed alone, then beside two forked
processes spinning at ``SCHED_IDLE``, round by round. A worker at normal priority makes two OpenMP
threads spin at every parallel region; one at idle priority should cost little. Linux only.
"""

from __future__ import annotations

import argparse
import os
import time


def _loop_sec() -> float:
    import torch

    began = time.perf_counter()
    x = torch.randn(256, 256)
    for _ in range(300):
        x = torch.tanh(x @ (torch.randn(256, 256) / 16))
    return time.perf_counter() - began


def _idle_spinner() -> int:
    pid = os.fork()
    if pid == 0:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        while True:
            pass
    return pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args(argv)
    if not hasattr(os, "SCHED_IDLE"):
        raise SystemExit("needs Linux's SCHED_IDLE")
    import torch

    torch.set_num_threads(2)
    _loop_sec()  # warm-up
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}")
    for _ in range(args.rounds):
        alone = _loop_sec()
        spinners = [_idle_spinner(), _idle_spinner()]
        time.sleep(0.1)
        try:
            beside = _loop_sec()
        finally:
            for pid in spinners:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        print(f"alone {alone:.3f} s   beside 2 SCHED_IDLE spinners {beside:.3f} s   (ratio {beside / alone:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
