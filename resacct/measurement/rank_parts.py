"""A launch's time limits, per rank and per part (:mod:`resacct.measurement.distributed`).

A launch gives its ranks ``timeout_seconds`` from its start. A rank program made of parts — a shared
launch runs several programs one after the other (:func:`resacct.measurement.rank_jobs.run_rank_jobs`)
— gives each part its own limit instead: :func:`part_deadline` tells the launcher, before the part
starts, its name and how long it may take. The launcher then waits for that rank until that part's
deadline (no longer the launch's), and a part that overruns stops the launch with
:class:`DistributedPartTimeoutError`, which names it. A hung part is stopped within its own limit,
not after the sum of every part's.
"""

from __future__ import annotations

import math
import multiprocessing.connection
import time
from collections.abc import Sequence
from typing import Any

from resacct.measurement.lifeline import OutputRelay
from resacct.measurement.rank_errors import DistributedError, DistributedTimeoutError, died_without_answering, raised, rank_failure

__all__ = ["DistributedPartTimeoutError", "part_deadline", "report_parts_to", "collect"]

_ERROR_GATHER_SECONDS = 1.0
_RELAY_EVERY_SECONDS = 0.25
_reporter: multiprocessing.connection.Connection | None = None  # in a rank: its connection to the launcher


class DistributedPartTimeoutError(DistributedTimeoutError):
    """A part of a rank program (:func:`part_deadline`) did not finish within its own limit; ``part`` names it."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part


def report_parts_to(connection: multiprocessing.connection.Connection | None) -> None:
    """In a rank: where :func:`part_deadline` reports (the rank's connection to its launcher; ``None``: nowhere)."""
    global _reporter
    _reporter = connection


def part_deadline(part: str, seconds: float) -> None:
    """In a rank: the part named ``part`` starts now and must end within ``seconds``; the launcher waits
    for this rank until then (in place of the launch's own limit, or the previous part's) and stops the
    launch when it overruns. Outside a rank it does nothing."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise DistributedError(f"part {part!r}: seconds {seconds!r}: expected a finite number of seconds greater than 0")
    if _reporter is not None:
        _reporter.send(("part", (str(part), float(seconds))))


def _timed_out(program_name: str, processes: Sequence[Any], late: list[int], parts: dict[int, tuple[str, float]], limit_seconds: float,
               results: dict[int, Any]) -> DistributedTimeoutError:
    returned = f" (ranks {sorted(results)} had returned)" if results else ""
    named = {parts[rank] for rank in late if rank in parts}
    if len(named) == 1 and all(rank in parts for rank in late):
        part, seconds = named.pop()
        return DistributedPartTimeoutError(f"{program_name} on {len(processes)} ranks: ranks {late} did not finish {part} within its "
                                           f"{seconds:g} s; they were killed{returned}", part)
    return DistributedTimeoutError(f"{program_name} on {len(processes)} ranks: ranks {late} did not finish within {limit_seconds:g} s; "
                                   f"they were killed{returned}")


def collect(connections: dict[multiprocessing.connection.Connection, int], processes: Sequence[Any], timeout_seconds: float,
            program_name: str, relay: OutputRelay, started: float) -> list[Any]:
    """Every rank's result, in rank order, waiting for each rank until its deadline: the launch's
    (``timeout_seconds`` from ``started``; a child started in the background ran meanwhile), or its
    current part's (:func:`part_deadline`). Raises when a rank fails or runs late."""
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str]] = {}
    deadlines = {rank: started + timeout_seconds for rank in connections.values()}
    parts: dict[int, tuple[str, float]] = {}
    pending = dict(connections)
    while pending:
        relay.pump()
        now = time.monotonic()
        late = sorted(rank for rank in pending.values() if deadlines[rank] <= now)
        if late:
            if errors:
                break
            raise _timed_out(program_name, processes, late, parts, timeout_seconds, results)
        wait = min(deadlines[rank] for rank in pending.values()) - now
        for connection in multiprocessing.connection.wait(list(pending), timeout=min(wait, _RELAY_EVERY_SECONDS)):
            rank = pending[connection]
            try:
                status, payload = connection.recv()
            except EOFError:
                status, payload = "died", died_without_answering(processes[rank], relay, rank)
            if status == "part":  # the rank started a part with a limit of its own
                parts[rank] = payload
                if not errors:  # after a failure, only the moment the others have to report
                    deadlines[rank] = time.monotonic() + payload[1]
                continue
            del pending[connection]
            if status in ("error", "died"):
                if not errors:  # give the other ranks a moment to report, to find who failed first-hand
                    deadlines = {other: min(deadline, time.monotonic() + _ERROR_GATHER_SECONDS) for other, deadline in deadlines.items()}
                errors[rank] = raised(payload) if status == "error" else payload
            else:
                results[rank] = payload
    if errors:
        raise rank_failure(errors, program_name)
    return [results[rank] for rank in range(len(processes))]
