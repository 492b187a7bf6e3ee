"""One gloo launch per world size for every rank program a run will ask for (issue 34).

Each launch of :func:`resacct.measurement.distributed.run_on_ranks` pays its fork, its rendezvous,
its teardown and each rank's first calls into FSDP, DTensor and the profiler (0.1-0.2 s on 2 cores),
whatever its program does. The sharded claims ask for several programs on the same number of ranks
(sharding's training, peak_sharded's step peaks, parallelism's tensor-parallel layers): when a run
knows them in advance, the first that is asked for runs them all, one after the other, in one launch.

* **The plan.** A module whose checks launch ranks registers a planner per check
  (:func:`plans_rank_jobs`): from a claim's inputs, the launches the check will ask for. When a
  pytest session's claims are collected, :func:`plan_claims` (called by
  :mod:`resacct.harness.early_ranks`) keeps those of the claims that run in this process, so a
  run of ``--area`` or ``-k`` plans only what its claims need.
* **The launch.** :func:`shared_rank_launch` runs the program asked for first, then every other
  planned program of that world size (:func:`run_rank_jobs` in each rank), keeps their results
  until they are asked for, and returns its own. Nothing planned: one launch of the program alone,
  as :func:`~resacct.measurement.distributed.run_on_ranks`.
* **Children beside.** A planner may also plan a child process (``isolated=True``: a program that
  runs alone, such as peak_sharded's prediction on fake tensors) beside the launch of a world size:
  it starts with that launch (the ranks' collectives leave a core idle part of the time), and
  :func:`shared_started_isolated` hands its result to whoever asks for it.
* **Errors are the program's own.** When the shared launch fails (a rank raises or dies), the
  program asked for is launched again alone: its error, or its result, is what it would have been
  without the plan; the others stay planned and launch when asked. Ctrl-C is not caught.
* **Each program within its own time limit.** The ranks tell the launcher when each program starts
  (:func:`~resacct.measurement.distributed.part_deadline`): a hung one is stopped after its own limit,
  not after the sum of every program's. The program asked for that hangs gets its own timeout error
  (not a second wait alone); another that hangs is no longer planned (it launches alone when asked:
  its own error), and the one asked for is launched again alone.
* :func:`resacct.measurement.memo.forget_shared_measurements` forgets the results kept for later callers.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from resacct.measurement import distributed
from resacct.measurement.distributed import DistributedError, DistributedPartTimeoutError, DistributedUnavailableError, preload_in_ranks
from resacct.measurement.memo import on_forget

preload_in_ranks(__name__)  # the ranks run run_rank_jobs

__all__ = ["PlannedLaunch", "plans_rank_jobs", "plan_claims", "planned_rank_jobs", "forget_planned_rank_jobs", "shared_rank_launch",
           "shared_started_isolated", "run_rank_jobs"]


class PlannedLaunch(NamedTuple):
    """A launch a check will ask for: ``program(rank, world_size, *args)`` on ``world_size`` ranks, or
    with ``isolated`` ``program(*args)`` in one child beside the launch of ``world_size`` ranks."""

    world_size: int
    program: Callable[..., Any]
    args: tuple[Any, ...]
    timeout_seconds: float
    isolated: bool = False


_Key = tuple[int, Callable[..., Any], tuple[Any, ...], bool]
_planners: dict[str, Callable[..., Iterable[PlannedLaunch]]] = {}
_planned: dict[_Key, float] = {}  # (world size, program, args, isolated) → time limit; insertion order: the claims' order
_kept: dict[tuple[int | None, Callable[..., Any], tuple[Any, ...]], Any] = {}  # results run along, not yet asked for (a child's: world size None)
on_forget(_kept.clear)  # memo.forget_shared_measurements(): a claim asked again measures again


def plans_rank_jobs(*check_names: str) -> Callable[[Callable[..., Iterable[PlannedLaunch]]], Callable[..., Iterable[PlannedLaunch]]]:
    """Register ``planner(**inputs)`` for the checks ``check_names``: the launches (world size,
    program, arguments, time limit) a claim with those inputs will ask :func:`shared_rank_launch`
    for; none when the check will not launch (e.g. this torch lacks the engine it measures)."""

    def register(planner: Callable[..., Iterable[PlannedLaunch]]) -> Callable[..., Iterable[PlannedLaunch]]:
        for name in check_names:
            _planners[name] = planner
        return planner

    return register


def plan_claims(claims: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
    """Replace the plan with the launches of ``claims`` ((check name, inputs) of each claim that
    will run in this process); how many distinct launches were planned. A planner that refuses a
    claim's inputs plans nothing for it (the claim reports its own error)."""
    forget_planned_rank_jobs()
    for name, inputs in claims:
        planner = _planners.get(name)
        if planner is None:
            continue
        try:
            launches = list(planner(**inputs))
        except Exception:  # noqa: BLE001 - the claim itself will say what is wrong with its inputs
            continue
        for launch in launches:
            launch = PlannedLaunch(*launch)
            _planned.setdefault((launch.world_size, launch.program, tuple(launch.args), launch.isolated), float(launch.timeout_seconds))
    return len(_planned)


def planned_rank_jobs() -> list[tuple[int, Callable[..., Any], tuple[Any, ...], bool]]:
    """The launches planned and not yet run, in the claims' order: (world size, program, args, isolated)."""
    return list(_planned)


def _forget_planned_child(program: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A child's result does not depend on the launch it was planned beside: forget it under every world size."""
    for key in [key for key in _planned if key[1:] == (program, args, True)]:
        del _planned[key]


def forget_planned_rank_jobs() -> None:
    """Drop the plan and every result kept for a later call."""
    _planned.clear()
    _kept.clear()


def run_rank_jobs(rank: int, world_size: int, jobs: tuple[tuple[Callable[..., Any], tuple[Any, ...], float], ...]) -> list[Any]:
    """What each rank runs in a shared launch: every ``program(rank, world_size, *args)`` of ``jobs``
    ((program, args, time limit)) in turn, each within its own time limit (the launcher stops a hung one
    then: :func:`~resacct.measurement.distributed.part_deadline`), with the garbage of one collected before
    the next; their results in order."""
    results = []
    for index, (program, args, timeout_seconds) in enumerate(jobs):
        distributed.part_deadline(_job_name(index, len(jobs), program), timeout_seconds)
        results.append(program(rank, world_size, *args))
        gc.collect()
    return results


def _job_name(index: int, count: int, program: Callable[..., Any]) -> str:
    return f"{getattr(program, '__qualname__', repr(program))} (program {index + 1} of {count})"


def shared_rank_launch(program: Callable[..., Any], world_size: int, *args: Any, timeout_seconds: float = 60.0) -> list[Any]:
    """``run_on_ranks(program, world_size, *args)``'s result — run together with every other planned
    launch of ``world_size`` ranks when there are some, with the children planned beside it (see the
    module's docstring), or taken from such a launch that already ran it."""
    args = tuple(args)
    _planned.pop((world_size, program, args, False), None)
    if (world_size, program, args) in _kept:
        return _kept.pop((world_size, program, args))
    along = [key for key in _planned if key[0] == world_size and not key[3]]
    beside = [key for key in _planned if key[0] == world_size and key[3]]
    if not along and not beside:
        return distributed.run_on_ranks(program, world_size, *args, timeout_seconds=timeout_seconds)
    jobs = ((program, args, timeout_seconds), *((key[1], key[2], _planned[key]) for key in along))
    own_timeout = None
    with contextlib.ExitStack() as children:
        started = {key: children.enter_context(distributed.started_isolated(key[1], *key[2], timeout_seconds=_planned.pop(key)))
                   for key in beside}  # no longer planned: a child that fails leaves its caller to run it again (its own error)
        try:  # each program within its own limit (run_rank_jobs); the launch's until the first starts
            per_rank = distributed.run_on_ranks(run_rank_jobs, world_size, jobs, timeout_seconds=timeout_seconds)
        except DistributedUnavailableError:
            raise
        except DistributedPartTimeoutError as error:  # a program ran past its own limit: that one is not run again in a shared launch
            per_rank, hung = None, [key for index, key in enumerate(along, start=1) if error.part == _job_name(index, len(jobs), key[1])]
            own_timeout = None if hung else error  # the one asked for: its own error, after its own limit (not twice that)
            for key in hung:
                _planned.pop(key, None)
        except DistributedError:  # its own launch says what went wrong with it (the others stay planned)
            per_rank = None
        for key, result in started.items():
            with contextlib.suppress(DistributedError):
                _kept[(None, key[1], key[2])] = result()
    if own_timeout is not None:
        raise own_timeout
    if per_rank is None:
        return distributed.run_on_ranks(program, world_size, *args, timeout_seconds=timeout_seconds)
    for index, key in enumerate(along, start=1):
        _planned.pop(key, None)
        _kept[(world_size, key[1], key[2])] = [results[index] for results in per_rank]
    return [results[0] for results in per_rank]


@contextlib.contextmanager
def shared_started_isolated(program: Callable[..., Any], *args: Any, timeout_seconds: float = 60.0) -> Iterator[Callable[[], Any]]:
    """:func:`~resacct.measurement.distributed.started_isolated`, or the result of the child a shared
    launch already ran beside its ranks (:func:`shared_rank_launch`); no longer planned either way."""
    args = tuple(args)
    _forget_planned_child(program, args)
    if (None, program, args) in _kept:
        result = _kept.pop((None, program, args))
        yield lambda: result
        return
    with distributed.started_isolated(program, *args, timeout_seconds=timeout_seconds) as started:
        yield started
