"""One measurement per process for every caller that asks the same thing (issue 34).

Several claims often measure one model: four claims on a tiny architecture (its FLOPs, its state,
its saved activations, its peak), a claim and its phase twin on one step. :func:`shared_measurement`
makes such a measuring function pay once per process: the first call measures, the next ones
with the same inputs get a **copy** of that result (``copy.deepcopy``: a caller that changes what
it got changes nothing another caller sees).

The key is everything that decides the result: the function, its arguments bound to its
signature with the defaults filled in (``f(m, 2)`` and ``f(m, 2, recipe="fp32")`` are one key when
``recipe`` defaults to ``"fp32"``), and what torch itself brings — its version, its default dtype
and its intra-op thread count (the CPU flash-attention kernel's scratch grows with the threads).
Inputs that differ never share: a hypothesis example measures its own inputs. Arguments must be
hashable (numbers, strings, tuples); a function that builds its model from a name and numbers is
the shape this is made for.

A measurement can be **queued for the background** (``wrapper.start_in_background(...)``,
:func:`start_in_background`): :mod:`resacct.measurement.background`'s thread measures the queue one
at a time — a launch of gloo ranks (its processes work, the thread waits on their pipes), or, for a
function declared ``@shared_measurement(in_child=True)``, every queued call of it in one child
process — while this process runs other claims. A caller whose key is being measured waits for it;
one whose key is still queued takes it out and measures it itself, at once. A background call that
raised is forgotten, so the caller measures afresh and the error is its own.
:func:`wait_for_background` returns once nothing is queued or running (a timed claim waits there:
its cores are its own).

``RESACCT_MEMO=0`` turns sharing off (every call measures afresh: what
``benchmarks/claim_sharing.py`` compares against); :func:`memo_stats` counts hits and misses per
function; :func:`forget_shared_measurements` empties every memo (a fresh measurement, e.g. in a
test that patches what the measurement calls).

>>> calls = []
>>> @shared_measurement
... def measure(size: int, scale: int = 1) -> dict:
...     calls.append(size)
...     return {"bytes": size * scale}
>>> first = measure(4)
>>> first["bytes"] = -1  # the caller's copy
>>> measure(4, scale=1), len(calls)
({'bytes': 4}, 1)
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from resacct.errors import ResacctError
from resacct.measurement.background import Job, submit, wait_for_background

__all__ = ["shared_measurement", "memo_enabled", "memo_stats", "forget_shared_measurements", "start_in_background", "wait_for_background",
           "MemoStats", "MEMO_VARIABLE"]

MEMO_VARIABLE = "RESACCT_MEMO"
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class MemoStats:
    """Calls of one memoised function in this process: ``hits`` answered from the memo, ``misses`` measured."""

    function: str
    hits: int
    misses: int
    entries: int


def memo_enabled() -> bool:
    """Whether sharing is on: ``RESACCT_MEMO`` unset, empty or anything but ``0`` / ``off`` / ``false`` / ``no``."""
    return os.environ.get(MEMO_VARIABLE, "").strip().lower() not in {"0", "off", "false", "no"}


class _Memo:
    def __init__(self, function: Callable[..., Any], switchable: bool = True, in_child: bool = False) -> None:
        self.function = function
        self.switchable = switchable  # False: shared whatever RESACCT_MEMO says (a launch one run pays once by design)
        self.in_child = in_child  # its background calls run together in one child process
        self.wrapper: Callable[..., Any] = function  # what a child calls: the module-level name (set by shared_measurement)
        self.name = f"{function.__module__}.{function.__qualname__}"
        self.signature = inspect.signature(function)
        self.results: dict[tuple[Any, ...], Any] = {}
        self.queued: dict[tuple[Any, ...], Job] = {}  # keys queued for, or being measured by, the background thread
        self.hits = 0
        self.misses = 0
        self.lock = threading.Lock()

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        import torch

        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise ResacctError(f"{self.name}: arguments {args!r} {kwargs!r} do not fit {self.signature}: {error}") from None
        bound.apply_defaults()
        key = (tuple(bound.arguments.items()), torch.__version__, torch.get_default_dtype(), torch.get_num_threads())
        try:
            hash(key)
        except TypeError:
            raise ResacctError(f"{self.name}: arguments {dict(bound.arguments)!r} are not hashable; expected numbers, strings, tuples") from None
        return key

    def enabled(self) -> bool:
        return not self.switchable or memo_enabled()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled():
            self.misses += 1
            return self.function(*args, **kwargs)
        key = self.key(args, kwargs)
        with self.lock:
            job = self.queued.get(key)
            if job is not None and not job.started:  # still waiting its turn: measured here, now
                del self.queued[key]
                job.cancelled = True
        if job is not None and job.started:
            job.done.wait()  # measured in the background: its result (or, had it raised, a fresh call below)
        with self.lock:
            if key in self.results:
                self.hits += 1
                return copy.deepcopy(self.results[key])
        result = self.function(*args, **kwargs)  # outside the lock: a measurement may call another memoised one
        with self.lock:
            self.misses += 1
            self.results.setdefault(key, result)
            return copy.deepcopy(self.results[key])

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Queue ``args`` for the background thread unless sharing is off or the key is measured or
        queued; whether it was queued."""
        if not self.enabled():
            return False
        key = self.key(args, kwargs)
        with self.lock:
            if key in self.results or key in self.queued:
                return False
            job = self.queued[key] = Job(self, key, args, kwargs)
        submit(job)
        return True

    def run_jobs(self, batch: list[Job]) -> None:
        """Measure the queued calls of ``batch`` that no caller took out: in turn here, or in one child."""
        with self.lock:
            batch = [job for job in batch if not job.cancelled]
            for job in batch:
                job.started = True
        if self.in_child and batch:
            answers = _answers_from_child(self.wrapper, batch)
            for job, (measured, result) in zip(batch, answers):
                self._finish(job, result if measured else job)
            return
        for job in batch:
            try:
                result = self.function(*job.args, **job.kwargs)
            except BaseException:  # noqa: BLE001 - the caller measures again and raises it as the claim's own
                result = job
            self._finish(job, result)

    def _finish(self, job: Job, result: Any) -> None:
        with self.lock:
            if result is not job:
                self.misses += 1
                self.results.setdefault(job.key, result)
            self.queued.pop(job.key, None)
        job.done.set()

    def clear(self) -> None:
        with self.lock:
            self.results.clear()
            self.hits = self.misses = 0

    def stats(self) -> MemoStats:
        return MemoStats(function=self.name, hits=self.hits, misses=self.misses, entries=len(self.results))


_MEMOS: list[_Memo] = []


def _answers_from_child(function: Callable[..., Any], batch: list[Job]) -> list[tuple[bool, Any]]:
    import torch

    from resacct.measurement.background import CHILD_TIMEOUT_SECONDS, measure_in_child
    from resacct.measurement.distributed import run_isolated

    try:
        return run_isolated(measure_in_child, function, [(job.args, job.kwargs) for job in batch], torch.get_num_threads(),  # type: ignore[no-any-return]
                            timeout_seconds=CHILD_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - the child failed as a whole: every caller measures here
        return [(False, None)] * len(batch)


def shared_measurement(function: Callable[..., _Result] | None = None, *, switchable: bool = True, in_child: bool = False) -> Any:
    """``function`` measured once per process per key (see the module doc); each caller gets a copy.
    The wrapper has ``cache_clear()`` (this function's memo), ``memo_stats()`` and
    ``start_in_background(...)``. ``@shared_measurement(switchable=False)``: shared even under
    ``RESACCT_MEMO=0`` — for a launch of ranks whose one run serves several claims by design.
    ``in_child=True``: its background calls run in one child process, together (see the module
    doc); the function and its arguments must pickle, and so must its results."""
    if function is None:
        return functools.partial(shared_measurement, switchable=switchable, in_child=in_child)
    memo = _Memo(function, switchable, in_child)
    _MEMOS.append(memo)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> _Result:
        return memo(*args, **kwargs)  # type: ignore[no-any-return]

    memo.wrapper = wrapper
    wrapper.cache_clear = memo.clear  # type: ignore[attr-defined]
    wrapper.memo_stats = memo.stats  # type: ignore[attr-defined]
    wrapper.start_in_background = lambda *args, **kwargs: memo.start(args, kwargs)  # type: ignore[attr-defined]
    return wrapper


def start_in_background(measurement: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Queue ``measurement(*args, **kwargs)`` (a :func:`shared_measurement`) for the background
    thread, which measures queued calls one at a time, for a caller that will ask for it later;
    whether it was queued (not when sharing is off, or that key is measured or queued already).

    >>> import time
    >>> @shared_measurement
    ... def slow_square(x: int) -> int:
    ...     time.sleep(0.05)
    ...     return x * x
    >>> start_in_background(slow_square, 7), start_in_background(slow_square, 7)
    (True, False)
    >>> slow_square(7), slow_square.memo_stats().misses
    (49, 1)
    """
    start = getattr(measurement, "start_in_background", None)
    if start is None:
        raise ResacctError(f"{getattr(measurement, '__qualname__', measurement)!r} is not a shared_measurement; only those can be started in the background")
    return bool(start(*args, **kwargs))


def memo_stats() -> list[MemoStats]:
    """Hits and misses of every memoised function imported in this process, in definition order."""
    return [memo.stats() for memo in _MEMOS]


def forget_shared_measurements() -> None:
    """Empty every memo (and its counts): the next call of each function measures afresh."""
    for memo in _MEMOS:
        memo.clear()
