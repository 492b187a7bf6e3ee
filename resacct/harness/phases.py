"""Where a ``resacct verify`` run's wall time goes, phase by phase (report.json's ``run.phases``,
``--durations``' ``by phase`` line).

The run marks the end of each phase as it happens — ``start`` (torch, pytest and the claims
collected), ``shared imports`` (what the forked workers would each import again), ``claims in
parallel`` (the workers), ``claims alone`` (the timed, GPU, gloo and thread-dependent claims in
the verify process), ``claims`` (a run in one process), ``figures`` (roofline.png and
step-timeline.png) — and :func:`phase_seconds` turns the marks into each phase's seconds. The
claims' own seconds (``seconds_by_area``) say which claims cost; the phases say whether the cores
were busy: a parallel phase of 19 s on 2 cores holds up to 38 s of claims, a phase alone holds
one process's.

Each mark also reads the CPU seconds of this process and of the children it has reaped (the claims'
workers, at the end of the parallel phase; not the gloo ranks, which torch's forkserver starts):
:meth:`PhaseClock.phase_cpu_seconds` over :meth:`PhaseClock.phase_seconds` is how many cores a phase kept busy.

>>> clock = PhaseClock(started=100.0, started_cpu=1.0)
>>> clock.mark("start", now=102.5, cpu=3.0); clock.mark("claims", now=130.0, cpu=57.0); clock.mark("figures", now=131.25, cpu=58.0)
>>> clock.phase_seconds(), clock.phase_cpu_seconds()
({'start': 2.5, 'claims': 27.5, 'figures': 1.25}, {'start': 2.0, 'claims': 54.0, 'figures': 1.0})
"""

from __future__ import annotations

import resource
import time

__all__ = ["PhaseClock", "run_clock", "begin_run", "mark", "cpu_seconds"]


class PhaseClock:
    """The end of each phase of one run, in order (``time.monotonic`` seconds); a phase marked twice
    (a run's second pass through the same hook) keeps its first start and its last end."""

    def __init__(self, started: float | None = None, started_cpu: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.started_cpu = cpu_seconds() if started_cpu is None else started_cpu
        self.ends: dict[str, float] = {}
        self.cpu_at_end: dict[str, float] = {}

    def mark(self, phase: str, now: float | None = None, cpu: float | None = None) -> None:
        """``phase`` ended now (or at ``now``, with ``cpu`` seconds used by then)."""
        self.ends[phase] = time.monotonic() if now is None else now
        self.cpu_at_end[phase] = cpu_seconds() if cpu is None else cpu

    def phase_seconds(self) -> dict[str, float]:
        """Each phase's seconds, in the order they ended, from the end of the one before (the first
        from the run's start); rounded to 0.01 s."""
        seconds, previous = {}, self.started
        for phase, ended in sorted(self.ends.items(), key=lambda item: item[1]):
            seconds[phase] = round(max(ended - previous, 0.0), 2)
            previous = ended
        return seconds

    def phase_cpu_seconds(self) -> dict[str, float]:
        """Each phase's CPU seconds (this process and its reaped children), in the order of
        :meth:`phase_seconds`; rounded to 0.01 s."""
        seconds, previous = {}, self.started_cpu
        for phase, _ in sorted(self.ends.items(), key=lambda item: item[1]):
            seconds[phase] = round(max(self.cpu_at_end[phase] - previous, 0.0), 2)
            previous = self.cpu_at_end[phase]
        return seconds


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has reaped."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(used.ru_utime + used.ru_stime for used in usage)


_current: list[PhaseClock] = [PhaseClock()]


def begin_run(started: float | None = None) -> PhaseClock:
    """A new run's clock (``resacct verify`` calls it when it starts), the one :func:`mark` marks."""
    _current[0] = PhaseClock(started)
    return _current[0]


def run_clock() -> PhaseClock:
    """The clock of the run in progress (or of the last one)."""
    return _current[0]


def mark(phase: str) -> None:
    """``phase`` of the run in progress ended now."""
    _current[0].mark(phase)
