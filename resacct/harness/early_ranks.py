"""Start the gloo ranks' forkserver as soon as a run's claims are collected, when some of them launch
ranks (mark ``distributed``): the forkserver imports torch and the rank programs' modules (about 2 s
on an idle 2-core machine) beside the claims that run before the first launch, not in front of it."""

from __future__ import annotations

from typing import Any

from resacct.errors import ResacctError

__all__ = ["start_ranks_early", "WORKERS_PLUGIN_NAME"]

#: The name ``resacct verify``'s workers plugin (:class:`resacct.harness.workers.ClaimWorkers`) is registered under.
WORKERS_PLUGIN_NAME = "resacct-claim-workers"


def start_ranks_early(session: Any, *, force: bool = False) -> bool:
    """Start the forkserver when ``session`` (a pytest session after collection) runs resacct claims
    marked ``distributed`` in this process (not an xdist worker: those get claims in an order of their own;
    not when collected in ``resacct verify``'s process that forks workers, :mod:`resacct.harness.workers`,
    which calls it with ``force`` once they are forked: they must not inherit it); whether it was started."""
    from resacct.harness.plugin import ClaimItem  # a host project's own tests marked distributed are not resacct's to start for

    manager = getattr(session.config, "pluginmanager", None)
    forks = manager is not None and manager.has_plugin(WORKERS_PLUGIN_NAME) and not force
    if forks or hasattr(session.config, "workerinput") or not any(isinstance(item, ClaimItem) and item.get_closest_marker("distributed")
                                                         for item in session.items):
        return False
    from resacct.harness.registry import all_checks
    from resacct.measurement.distributed import start_forkserver_early

    all_checks()  # imports every check module: those whose ranks run their code name it to be preloaded
    try:
        start_forkserver_early()
    except (ResacctError, OSError):  # e.g. a TMPDIR too long for its socket: the claims that launch say so, one by one
        return False
    return True
