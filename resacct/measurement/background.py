"""The background queue of shared measurements (issue 34): what ``resacct verify`` starts once the
claims are collected, so that the other core works while this process runs the claims before.

One thread takes the queued measurements **one batch at a time**, in the order they were queued
(two gloo launches at once oversubscribe two cores: their ranks spin in collectives — 55 s for what
took 21 s in turn); while a timed claim runs (:func:`cores_to_itself`) no batch starts. A batch is one measurement (a launch of ranks: its processes do the work, the
thread only waits on their pipes), or, for a measurement declared ``in_child``, every queued call
of it at once, measured in **one child process** (:func:`measure_in_child`): the child imports
what they need (transformers, peft) once and runs them in turn with this process's thread count, so
they measure what they would measure here. :mod:`resacct.measurement.memo` owns the jobs (who
waits, who takes a job still queued, what a failed one becomes); this module only runs them.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "submit", "wait_for_background", "cores_to_itself", "measure_in_child", "CHILD_TIMEOUT_SECONDS"]

#: The longest one child may take over its batch (every tiny architecture's step: ~10 s idle).
CHILD_TIMEOUT_SECONDS = 600.0


@dataclass(eq=False)
class Job:
    """One queued call of a shared measurement: ``owner.run_jobs([...])`` measures it; ``done`` is set
    once it is measured (or failed); a job ``cancelled`` before it ``started`` is skipped."""

    owner: Any
    key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    started: bool = False
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)


_PENDING: collections.deque[Job] = collections.deque()
_CONDITION = threading.Condition()
_RUNNING = [0]  # batches taken and not finished
_PAUSED = [0]  # timed claims running: no batch starts meanwhile
_WORKER: list[threading.Thread] = []


def submit(job: Job) -> None:
    """Queue ``job`` behind the others; the background thread starts on the first."""
    with _CONDITION:
        _PENDING.append(job)
        _CONDITION.notify_all()
        if not _WORKER:
            _WORKER.append(threading.Thread(target=_work, name="resacct background measurements", daemon=True))
            _WORKER[0].start()


def _next_batch() -> list[Job]:
    with _CONDITION:
        while not _PENDING or _PAUSED[0]:
            _CONDITION.wait()
        batch = [_PENDING.popleft()]
        if getattr(batch[0].owner, "in_child", False):  # every queued call of it: one child imports their modules once
            batch += [job for job in _PENDING if job.owner is batch[0].owner]
            for job in batch[1:]:
                _PENDING.remove(job)
        _RUNNING[0] += 1
        return batch


def _work() -> None:
    while True:
        batch = _next_batch()
        try:
            batch[0].owner.run_jobs(batch)
        finally:
            with _CONDITION:
                _RUNNING[0] -= 1
                _CONDITION.notify_all()


def wait_for_background() -> None:
    """Return once no background measurement is queued or running."""
    with _CONDITION:
        while _PENDING or _RUNNING[0]:
            _CONDITION.wait()


@contextlib.contextmanager
def cores_to_itself() -> Iterator[None]:
    """For a timed claim: wait until the batch running now (if any) is done, and start no other until
    the block ends — the claim's timings get both cores; the queue goes on after it."""
    with _CONDITION:
        _PAUSED[0] += 1
        while _RUNNING[0]:
            _CONDITION.wait()
    try:
        yield
    finally:
        with _CONDITION:
            _PAUSED[0] -= 1
            _CONDITION.notify_all()


def measure_in_child(function: Callable[..., Any], calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]], threads: int) -> list[tuple[bool, Any]]:
    """What the child runs: ``function(*args, **kwargs)`` for each call in turn, with torch's intra-op
    ``threads`` of the process that asked; per call (True, the result) or (False, the error's text)."""
    import torch

    torch.set_num_threads(threads)  # the launch's child starts at one thread; the measurement is the asking process's
    answers: list[tuple[bool, Any]] = []
    for args, kwargs in calls:
        try:
            answers.append((True, function(*args, **kwargs)))
        except Exception as error:  # noqa: BLE001 - the asking process measures that call again, and fails there as the claim's own
            answers.append((False, f"{type(error).__name__}: {error}"))
    return answers
