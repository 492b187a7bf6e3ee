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
* **Errors are the program's own.** When the shared launch fails (a rank raises, dies, or runs out
  of time), the program asked for is launched again alone: its error, or its result, is what it
  would have been without the plan; the others stay planned and launch when asked. Ctrl-C is not
  caught.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from resacct.measurement import distributed
from resacct.measurement.distributed import DistributedError, DistributedUnavailableError, preload_in_ranks

preload_in_ranks(__name__)  # the ranks run run_rank_jobs

__all__ = ["plans_rank_jobs", "plan_claims", "planned_rank_jobs", "forget_planned_rank_jobs", "shared_rank_launch", "run_rank_jobs"]

#: A launch a check will ask for: (world size, program, its arguments after rank and world size, time limit in seconds).
PlannedLaunch = tuple[int, Callable[..., Any], tuple[Any, ...], float]
_planners: dict[str, Callable[..., Iterable[PlannedLaunch]]] = {}
_planned: dict[tuple[int, Callable[..., Any], tuple[Any, ...]], float] = {}  # insertion order: the claims' order
_kept: dict[tuple[int, Callable[..., Any], tuple[Any, ...]], list[Any]] = {}  # results run along, not yet asked for


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
        for world_size, program, args, timeout_seconds in launches:
            _planned.setdefault((world_size, program, tuple(args)), float(timeout_seconds))
    return len(_planned)


def planned_rank_jobs() -> list[tuple[int, Callable[..., Any], tuple[Any, ...]]]:
    """The launches planned and not yet run, in the claims' order."""
    return list(_planned)


def forget_planned_rank_jobs() -> None:
    """Drop the plan and every result kept for a later call."""
    _planned.clear()
    _kept.clear()


def run_rank_jobs(rank: int, world_size: int, jobs: tuple[tuple[Callable[..., Any], tuple[Any, ...]], ...]) -> list[Any]:
    """What each rank runs in a shared launch: every ``program(rank, world_size, *args)`` of
    ``jobs`` in turn, with the garbage of one collected before the next; their results in order."""
    results = []
    for program, args in jobs:
        results.append(program(rank, world_size, *args))
        gc.collect()
    return results


def shared_rank_launch(program: Callable[..., Any], world_size: int, *args: Any, timeout_seconds: float = 60.0) -> list[Any]:
    """``run_on_ranks(program, world_size, *args)``'s result — run together with every other planned
    launch of ``world_size`` ranks when there are some (see the module's docstring), or taken from
    such a launch that already ran it."""
    key = (world_size, program, tuple(args))
    _planned.pop(key, None)
    if key in _kept:
        return _kept.pop(key)
    along = [planned for planned in _planned if planned[0] == world_size]
    if not along:
        return distributed.run_on_ranks(program, world_size, *args, timeout_seconds=timeout_seconds)
    jobs = ((program, tuple(args)), *((other, other_args) for _, other, other_args in along))
    try:
        per_rank = distributed.run_on_ranks(run_rank_jobs, world_size, jobs,
                                            timeout_seconds=timeout_seconds + sum(_planned[planned] for planned in along))
    except DistributedUnavailableError:
        raise
    except DistributedError:  # its own launch says what went wrong with it (the others stay planned)
        return distributed.run_on_ranks(program, world_size, *args, timeout_seconds=timeout_seconds)
    for index, planned in enumerate(along, start=1):
        _planned.pop(planned, None)
        _kept[planned] = [results[index] for results in per_rank]
    return [results[0] for results in per_rank]
