"""Start the gloo ranks' forkserver as soon as a run's claims are collected, when some of them launch
ranks (mark ``distributed``): the forkserver imports torch and the rank programs' modules (about 2 s
on an idle 2-core machine) beside the claims that run before the first launch, not in front of it; and plan
the launches those claims will ask for, so that one launch per world size serves them
(:mod:`resacct.measurement.rank_jobs`).

A whole ``resacct verify`` run on two cores or more starts it sooner still, first thing
(:func:`start_forkserver_first`): verify's own start — torch's import, the claims' collection — keeps
one core busy for ~3 s, and the forkserver's imports (~2.8 CPU s) fill the other, where they used to
take a core from the shared imports and the first claims. The rank programs' modules are named
then by :data:`RANK_PROGRAM_MODULES` (their checks are not imported yet); a run whose claims all
replay their stored measurements stops it unused."""

from __future__ import annotations

from typing import Any

from resacct.errors import ResacctError

__all__ = ["start_ranks_early", "start_forkserver_first", "RANK_PROGRAM_MODULES", "WORKERS_PLUGIN_NAME"]

#: The name ``resacct verify``'s workers plugin (:class:`resacct.harness.workers.ClaimWorkers`) is registered under.
WORKERS_PLUGIN_NAME = "resacct-claim-workers"

#: The modules the shipped checks name for the ranks with ``preload_in_ranks`` (at their import): what
#: :func:`start_forkserver_first` has the forkserver import before any check module is imported. One
#: left out costs its ranks an import, never a result (tests/test_distributed_launch.py keeps the list whole).
RANK_PROGRAM_MODULES = ("resacct.measurement.rank_jobs", "resacct.checks.parallelism", "resacct.checks.sharding_training",
                        "resacct.checks.peak_sharded", "resacct.account.peak.sharded", "resacct.account.peak.models",
                        "resacct.account.answers.generic", "resacct.measurement.native_stderr",
                        "resacct.checks.sharding_runs", "resacct.account.answers.sharded", "resacct.account.peak.sharded_measure")


def start_forkserver_first() -> bool:
    """Start the forkserver now, before this process imports torch, with :data:`RANK_PROGRAM_MODULES`
    among its preloads (``resacct verify``'s whole runs: see the module doc); whether it started."""
    from resacct.measurement.distributed import preload_in_ranks, start_forkserver_early

    preload_in_ranks(*RANK_PROGRAM_MODULES)
    try:
        start_forkserver_early()
    except (ResacctError, OSError):  # e.g. a TMPDIR too long for its socket: the claims that launch say so, one by one
        return False
    return True


def start_ranks_early(session: Any, *, force: bool = False) -> bool:
    """Start the forkserver when ``session`` (a pytest session after collection) runs resacct claims
    marked ``distributed`` in this process (not an xdist worker: those get claims in an order of their own;
    in ``resacct verify``'s process that forks workers, :mod:`resacct.harness.workers` calls it with
    ``force`` before they are forked, beside the imports they share: they inherit its handle and never
    stop it); whether it was started."""
    from resacct.harness.plugin import ClaimItem  # a host project's own tests marked distributed are not resacct's to start for

    manager = getattr(session.config, "pluginmanager", None)
    forks = manager is not None and manager.has_plugin(WORKERS_PLUGIN_NAME) and not force
    if forks or hasattr(session.config, "workerinput") or not any(isinstance(item, ClaimItem) and item.get_closest_marker("distributed")
                                                         for item in session.items):
        return False
    from resacct.harness.registry import all_checks
    from resacct.measurement.distributed import start_forkserver_early
    from resacct.measurement.lifeline import stop_forkserver
    from resacct.measurement.rank_jobs import plan_claims

    all_checks()  # imports every check module: those whose ranks run their code name it to be preloaded (and plan their launches)
    launching, replayed = _claims_that_launch(session.items)
    if not launching and replayed == _distributed_claims(session.items):  # every one replays a stored measurement: nothing launches
        stop_forkserver()  # one started first (start_forkserver_first) has nothing to serve
        return False
    plan_claims(launching)  # one launch per world size for what these claims ask (rank_jobs)
    try:
        start_forkserver_early()
    except (ResacctError, OSError):  # e.g. a TMPDIR too long for its socket: the claims that launch say so, one by one
        return False
    return True


def _distributed_claims(items: list[Any]) -> int:
    from resacct.harness.plugin import ClaimItem

    return sum(1 for item in items if isinstance(item, ClaimItem) and item.get_closest_marker("distributed"))


def _key_inputs(measure: str, given: dict[str, Any]) -> dict[str, Any]:
    """A claim's inputs as its check keys a stored measurement (:meth:`~resacct.harness.registry.Check.replay_inputs`); as
    given where the check is not registered (its claim fails on that when it runs, not here)."""
    from resacct.errors import ResacctError
    from resacct.harness.registry import get_check

    try:
        return get_check(measure).replay_inputs(given)
    except ResacctError:
        return given


def _claims_that_launch(items: list[Any]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """(check name, inputs) of each collected claim marked ``distributed`` with fixed inputs (``given``, no ``forall``) whose
    measurement an earlier run did not store on this setup, and how many such claims it did store (:mod:`resacct.harness.replay`:
    they replay it, launching nothing)."""
    from resacct.harness.plugin import ClaimItem
    from resacct.harness.replay import stored_measurement

    claims, replayed = [], 0
    for item in items:
        claim = getattr(getattr(item, "loaded", None), "claim", None)
        if isinstance(item, ClaimItem) and claim is not None and item.get_closest_marker("distributed") and not claim.forall:
            if stored_measurement(claim.measure, _key_inputs(claim.measure, dict(claim.given))) is None:
                claims.append((claim.measure, dict(claim.given)))
            else:
                replayed += 1
    return claims, replayed
