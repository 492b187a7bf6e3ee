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

>>> clock = PhaseClock(started=100.0)
>>> clock.mark("start", now=102.5); clock.mark("claims", now=130.0); clock.mark("figures", now=131.25)
>>> clock.phase_seconds()
{'start': 2.5, 'claims': 27.5, 'figures': 1.25}
"""

from __future__ import annotations

import time

__all__ = ["PhaseClock", "run_clock", "begin_run", "mark"]


class PhaseClock:
    """The end of each phase of one run, in order (``time.monotonic`` seconds); a phase marked twice
    (a run's second pass through the same hook) keeps its first start and its last end."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.ends: dict[str, float] = {}

    def mark(self, phase: str, now: float | None = None) -> None:
        """``phase`` ended now (or at ``now``)."""
        self.ends[phase] = time.monotonic() if now is None else now

    def phase_seconds(self) -> dict[str, float]:
        """Each phase's seconds, in the order they ended, from the end of the one before (the first
        from the run's start); rounded to 0.01 s."""
        seconds, previous = {}, self.started
        for phase, ended in sorted(self.ends.items(), key=lambda item: item[1]):
            seconds[phase] = round(max(ended - previous, 0.0), 2)
            previous = ended
        return seconds


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
