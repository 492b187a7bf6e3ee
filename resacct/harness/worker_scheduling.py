"""Linux's idle scheduling priority for ``resacct verify``'s workers (:mod:`resacct.harness.workers`)
while gloo ranks, or the parent's threads, run in the parent."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence

__all__ = ["idle_priority", "idle_priority_returns", "LAUNCHES_ALONE_ENV"]

#: ``1``: :func:`idle_priority_returns` says False, so verify runs its gloo launches in the phase alone
#: (as before idle priority was used; for side-by-side measurements).
LAUNCHES_ALONE_ENV = "RESACCT_VERIFY_LAUNCHES_ALONE"


def idle_priority_returns() -> bool:
    """Whether this process may put a worker at Linux's idle scheduling priority (``SCHED_IDLE``) and
    bring it back: root with CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0. Tried on a
    throwaway thread; False elsewhere (no such policy, or a worker would stay idle for good).
    ``RESACCT_VERIFY_LAUNCHES_ALONE=1`` says False (the launches then run in the phase alone)."""
    if os.environ.get(LAUNCHES_ALONE_ENV) == "1" or not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
        return False
    returned: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread alone
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            returned.append(True)
        except OSError:
            returned.append(False)

    thread = threading.Thread(target=probe, name="resacct-idle-priority-probe")
    thread.start()
    thread.join()
    return returned == [True]


@contextlib.contextmanager
def idle_priority(pids: Sequence[int]) -> Iterator[None]:
    """The processes ``pids`` at ``SCHED_IDLE`` inside the block (what they fork or start meanwhile
    starts at the normal priority: ``SCHED_RESET_ON_FORK``), at ``SCHED_OTHER`` again after it."""
    lowered = []
    try:
        for pid in pids:
            with contextlib.suppress(OSError):  # gone already
                os.sched_setscheduler(pid, os.SCHED_IDLE | os.SCHED_RESET_ON_FORK, os.sched_param(0))
                lowered.append(pid)
        yield
    finally:
        for pid in lowered:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
