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
* **Errors are the program's own.** When the shared launch fails (a rank raises, dies, or runs out
  of time), the program asked for is launched again alone: its error, or its result, is what it
  would have been without the plan; the others stay planned and launch when asked. Ctrl-C is not
  caught.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from resacct.measurement import distributed
from resacct.measurement.distributed import DistributedError, DistributedUnavailableError, preload_in_ranks

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
    jobs = ((program, args), *((other, other_args) for _, other, other_args, _ in along))
    with contextlib.ExitStack() as children:
        started = {key: children.enter_context(distributed.started_isolated(key[1], *key[2], timeout_seconds=_planned.pop(key)))
                   for key in beside}  # no longer planned: a child that fails leaves its caller to run it again (its own error)
        try:
            per_rank = distributed.run_on_ranks(run_rank_jobs, world_size, jobs,
                                                timeout_seconds=timeout_seconds + sum(_planned[key] for key in along))
        except DistributedUnavailableError:
            raise
        except DistributedError:  # its own launch says what went wrong with it (the others stay planned)
            per_rank = None
        for key, result in started.items():
            with contextlib.suppress(DistributedError):
                _kept[(None, key[1], key[2])] = result()
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
