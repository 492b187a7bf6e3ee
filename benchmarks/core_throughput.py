"""How much work this machine's CPUs deliver together: N processes each spinning the same pure-Python loop, against one alone.

    python benchmarks/core_throughput.py                    # 2 processes (a 2-core machine's verify), 3 rounds
    python benchmarks/core_throughput.py --processes 4 --rounds 5

benchmarks/verify_time.py and benchmarks/fit_speed.py (their wall-clock bars) print it before and after (:func:`print_probe`).

Why (issue 34): ``resacct verify``'s bar is "25 s idle on 2 cores", and its run is CPU-bound — but two virtual CPUs
are not always two cores' work. On the 2-core Xeon VM of round four (2026-11-29, 23:40), one loop alone took
2.9-3.4 s and two at once 2.9-4.9 s each: the pair did 1.3-2.0 × one CPU's work, moving from minute to minute
(SMT siblings or a host shared with others; the VM reports 1 thread per core and 0 % steal). A wall figure of
verify on such a machine says as much about its neighbours as about verify: this prints what the CPUs delivered, and
how fast one was (the loop's seconds alone: 2.9-3.4 s for 30 M iterations at 23:40, 4.6 s at 23:46 the same evening).

Each round runs the loop in one process alone, then in N at once (started together), then alone again, each in a fresh
``python -c`` child timing its own loop; a round's figure is Σ (seconds alone, the mean of the two, ÷ seconds in the group): N when
the CPUs are N cores' worth, 1 when N processes share one core. The rounds take turns alone and together (the
machine's state moves both alike); printed: each round's figure and the median. No torch needed."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

#: Iterations of the loop: ~0.5 s of one CPU on the Xeon above (a round costs ~2.5 s with 2 processes).
DEFAULT_LOOPS = 5_000_000

_LOOP_PROGRAM = ("import time\nstart = time.perf_counter()\ntotal = 0\nfor index in range({loops}):\n    total += index\n"
                 "print(time.perf_counter() - start)")


def spin_seconds(processes: int, loops: int = DEFAULT_LOOPS) -> list[float]:
    """Wall seconds of the loop in each of ``processes`` children started together (each times its own loop, not its start)."""
    children = [subprocess.Popen([sys.executable, "-c", _LOOP_PROGRAM.format(loops=loops)], stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    seconds = []
    for child in children:
        output, _ = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"a spinning child exited with status {child.returncode}")
        seconds.append(float(output))
    return seconds


def delivered(alone_seconds: float, together_seconds: Sequence[float]) -> float:
    """One CPU's work done per unit of time by the group: Σ alone ÷ each one's seconds in the group."""
    if alone_seconds <= 0 or not together_seconds or min(together_seconds) <= 0:
        raise ValueError(f"seconds must be positive: alone {alone_seconds}, together {list(together_seconds)}")
    return sum(alone_seconds / seconds for seconds in together_seconds)


class Round(NamedTuple):
    """One round: what the group delivered (:func:`delivered`) and the loop's seconds alone (the mean of before and after:
    how fast one CPU was then — the same machine's figure moves with it, from minute to minute on a shared host)."""

    delivered: float
    alone_seconds: float


def cores_delivered(processes: int = 2, rounds: int = 3, loops: int = DEFAULT_LOOPS,
                    spin: Callable[[int, int], list[float]] = spin_seconds) -> list[Round]:
    """One figure per round (:func:`delivered`): the loop in ``processes`` at once, against the mean of the loop alone just before
    and just after (one slow sample alone would otherwise make the group look faster than whole cores)."""
    if processes < 1 or rounds < 1 or loops < 1:
        raise ValueError(f"processes, rounds and loops must be 1 or more: got {processes}, {rounds}, {loops}")
    figures = []
    for _ in range(rounds):
        before = spin(1, loops)[0]
        together = spin(processes, loops)
        after = spin(1, loops)[0]
        alone = (before + after) / 2
        figures.append(Round(delivered(alone, together), alone))
    return figures


def summary(processes: int, rounds: Sequence[Round], loops: int = DEFAULT_LOOPS) -> str:
    """One line: the median of the rounds, each round's figure, and how long the loop took alone."""
    shown = ", ".join(f"{one.delivered:.2f}" for one in rounds)
    alone = statistics.median(one.alone_seconds for one in rounds)
    return (f"{processes} processes at once did {statistics.median(one.delivered for one in rounds):.2f} × one CPU's work "
            f"(a pure-Python loop; rounds: {shown}; {processes:.2f} would be {processes} whole cores); "
            f"one alone: {alone:.2f} s for {loops:,} iterations")


def probe_line(when: str, *, processes: int = 2, rounds: int = 3, loops: int = DEFAULT_LOOPS) -> str | None:
    """The line another benchmark prints before and after its runs (``CPUs before: …``); None on a machine of fewer CPUs
    than ``processes`` (nothing to compare)."""
    import os

    if (os.cpu_count() or 1) < processes:
        return None
    return f"CPUs {when}: {summary(processes, cores_delivered(processes, rounds, loops), loops)}"


def print_probe(when: str, *, skip: bool = False, rounds: int = 3, loops: int = DEFAULT_LOOPS) -> None:
    """Print :func:`probe_line` (unless ``skip``: a benchmark's ``--no-core-probe``, or nothing to compare)."""
    line = None if skip else probe_line(when, rounds=rounds, loops=loops)
    if line is not None:
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="processes spinning at once (default 2: verify's workers on 2 cores)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each alone then together (default 3)")
    parser.add_argument("--loops", type=int, default=DEFAULT_LOOPS, help=f"iterations of the loop (default {DEFAULT_LOOPS:,}: ~0.5 s)")
    args = parser.parse_args(argv)
    for name in ("processes", "rounds", "loops"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be 1 or more, got {getattr(args, name)}")
    print(summary(args.processes, cores_delivered(args.processes, args.rounds, args.loops), args.loops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
