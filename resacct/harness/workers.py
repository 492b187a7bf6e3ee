"""``resacct verify`` on several cores: the claims' pytest loop split over forked worker processes.

Once the claims are collected, this process forks ``workers`` children (:class:`ClaimWorkers`, a
pytest plugin that takes over ``pytest_runtestloop``). The fork shares what is already imported
(torch, pytest, hypothesis, the checks) and collected, so a worker starts in milliseconds, where
an xdist worker imports and collects everything again. In a long run, what every worker would
import again (:data:`SHARED_IMPORTS`: transformers, torch._dynamo) is imported here first, while the
gloo ranks' forkserver starts on the other core (it imports torch and the rank programs: the
workers inherit its handle and never stop it). Then the run has two phases:

1. **In parallel**: the claims are grouped **by area** (one spec file: its claims share their
   memoised measurements, :mod:`resacct.measurement.memo`, so one process measures each once), and
   each worker, with **one torch thread**, asks for the next group as it finishes one, the largest
   groups first (:data:`AREA_SECONDS`, a scheduling estimate only). Each finished claim's pytest reports come back
   through a pipe, and this process replays them through its own hooks (the claims recorder, the
   progress bar, pytest's terminal), as xdist's controller does. Where this process may put its
   workers at Linux's idle scheduling priority and bring them back
   (:func:`~resacct.harness.worker_scheduling.idle_priority_returns`: root, or an RLIMIT_NICE that
   allows it), the claims that launch gloo ranks or depend on torch's thread count, and time
   nothing, run here first, once each worker holds a group and has one more queued, with the
   workers at ``SCHED_IDLE`` meanwhile: the ranks (or this process's threads) get the cores as if
   alone, and the workers only the time they leave.
2. **Alone**: the timed claims (their checks' ``timing=True``), the GPU claims, those that launch
   gloo ranks (mark ``distributed``; where the workers cannot be put at idle priority) and those whose values depend on torch's thread count
   (``threads_matter``) then run in this process, with torch's own thread count, while no worker
   runs: a time measured beside another process's work is the load's, CUDA is never used in a
   forked child, 2 or 4 ranks beside a worker oversubscribe 2 cores (ranks waiting in a collective
   spin: 23 s of the workers' wall for 8 s alone, loaded), and a worker never uses more than one thread
   (OpenMP's pool does not survive a fork: a process that had used it hangs in its child's first
   parallel region).

A worker that dies leaves the claims it had not reported to this process, which runs them after
the others. Ctrl-C reaches every process: each worker stops after the claim it runs, what was
reported is kept, and the run ends interrupted as a serial one does.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from resacct.errors import ResacctError
from resacct.harness.collector import freeze_alive
from resacct.harness.early_ranks import WORKERS_PLUGIN_NAME, start_ranks_early
from resacct.harness.phases import mark
from resacct.harness.worker_count import default_workers, workers_count
from resacct.harness.worker_process import WORKER_THREADS, Worker
from resacct.harness.worker_scheduling import idle_priority, idle_priority_returns

__all__ = ["ClaimWorkers", "WORKERS_PLUGIN_NAME", "AREA_SECONDS", "runs_alone", "item_groups", "will_replay", "default_workers", "workers_count"]

#: Seconds each area's claims that run in parallel took in one worker (one torch thread), idle, at
#: commit b628a3e (2026-11-28): only the order in which groups are handed out (largest first); an
#: area not listed counts 0.02 s a claim. A stale figure costs balance, never a result.
AREA_SECONDS = {"hf": 11.5, "account": 7.3, "peak": 2.2, "gpu_recorded": 2.1, "finetune": 2.1, "flops": 1.4, "optim": 1.25, "memory": 1.1,
                "init": 0.7, "data": 0.5, "perf": 0.5, "plan": 0.5, "models": 0.47, "seeding": 0.45, "einops": 0.35, "lecture_training": 0.34,
                "storage": 0.28, "checkpoint": 0.23, "lecture2024": 0.23, "train": 0.2, "inference": 0.17, "parallelism": 0.17, "dtypes": 0.15,
                "hardware": 0.11, "tensors": 0.07, "offload": 0.06, "energy": 0.06, "lecture": 0.05, "scale": 0.04, "napkin": 0.03,
                "runs": 0.02, "formats": 0.01, "devices": 0.01, "sharding": 0.01, "peak_sharded": 0.01, "runtime_model": 0.01}

#: Imported once in this process before the workers fork, when the claims to run are a long run's
#: (their areas' :data:`AREA_SECONDS`, less the share of claims a stored measurement judges — :func:`will_replay` —,
#: past :data:`_SHARED_IMPORTS_FROM_SECONDS`): each worker would
#: import them again (torch's compiler stack on the first build on meta, ~1 s idle; transformers
#: and its model classes, ~1 s), and the claims run here afterwards need them too.
SHARED_IMPORTS = ("torch._dynamo", "transformers", "transformers.models.llama.modeling_llama", "transformers.models.gpt2.modeling_gpt2")
_SHARED_IMPORTS_FROM_SECONDS = 10.0

#: How long a worker may take to stop after Ctrl-C (its claim's own cleanup: a launch kills its ranks) before it is killed.
_STOP_GRACE_SECONDS = 20.0


def runs_alone(item: pytest.Item) -> bool:
    """Whether a claim runs in the phase of its own: timed here, on a GPU, launching gloo ranks (2 or
    4 processes: beside a worker they oversubscribe the cores, and ranks waiting in a collective
    spin), or measuring what depends on torch's thread count (its check's ``threads_matter``)."""
    from resacct.harness.plugin import TIMED_KEYWORD

    return (TIMED_KEYWORD in item.extra_keyword_matches or item.get_closest_marker("gpu") is not None
            or item.get_closest_marker("distributed") is not None or _threads_matter(item))


def _area(item: pytest.Item) -> str:
    loaded = getattr(item, "loaded", None)
    return loaded.area if loaded is not None else item.path.name.split(".")[0]


@dataclass
class _Group:
    name: str
    items: list[pytest.Item] = field(default_factory=list)
    seconds: float = 0.0


def item_groups(items: Sequence[pytest.Item]) -> tuple[list[_Group], list[pytest.Item]]:
    """The parallel phase's groups (one per area, in the items' order within it), largest estimate
    first; and the items that run alone (:func:`runs_alone`), in order."""
    groups: dict[str, _Group] = {}
    alone = []
    for item in items:
        if runs_alone(item):
            alone.append(item)
        else:
            groups.setdefault(_area(item), _Group(_area(item))).items.append(item)
    for group in groups.values():
        measured = sum(1 for item in group.items if not will_replay(item))
        group.seconds = AREA_SECONDS.get(group.name, 0.02 * len(group.items)) * measured / len(group.items)
    return sorted(groups.values(), key=lambda group: -group.seconds), alone


def will_replay(item: pytest.Item) -> bool:
    """Whether a claim a worker runs (one torch thread) will be judged on a measurement an earlier ``resacct verify`` stored
    (:mod:`resacct.harness.replay`; never in a pytest run; a ``forall`` claim's examples where they repeat, noted as run through
    by an earlier run): its share of its area's estimate is then ~0 — a run that
    replays most claims needs no :data:`SHARED_IMPORTS` first. An estimate only: a stored file that does not read
    back whole is measured when the claim runs."""
    from resacct.harness.evaluate import FORALL_EXAMPLES_NOTE, forall_examples_inputs, is_replayable
    from resacct.harness.registry import get_check
    from resacct.harness.replay import is_stored, replay_folder

    claim = getattr(getattr(item, "loaded", None), "claim", None)
    if claim is None or replay_folder() is None:
        return False
    try:
        check = get_check(claim.measure)
    except ResacctError:  # not registered: its claim fails on that when it runs
        return False
    if not is_replayable(check, claim):
        return False
    if claim.forall:  # its examples are drawn as it runs: an earlier run's note that they ran through here stands for them
        return is_stored(FORALL_EXAMPLES_NOTE, forall_examples_inputs(claim), threads=WORKER_THREADS)
    return is_stored(claim.measure, check.replay_inputs(dict(claim.given)), threads=WORKER_THREADS)


class ClaimWorkers:
    """The pytest plugin (registered as :data:`WORKERS_PLUGIN_NAME`) that runs the claims on
    ``workers`` forked processes, then the timed and GPU ones here (see the module doc).
    ``on_interrupt``: called once a Ctrl-C reached this process, before the workers' last
    reports are replayed (the command's latch: that Ctrl-C is being handled)."""

    def __init__(self, workers: int, *, on_interrupt: Callable[[], object] | None = None, hide_in_workers: Sequence[object] = (),
                 beside_jobs: Sequence[Callable[[], object]] = ()) -> None:
        if workers < 2:
            raise ValueError(f"ClaimWorkers needs 2 workers or more, got {workers}")
        self.__name__ = WORKERS_PLUGIN_NAME  # pluggy registers an object under its __name__
        self.workers = workers
        self.on_interrupt = on_interrupt
        self.hide_in_workers = list(hide_in_workers)  # plugins a child must not call (the progress bar: its lock may be held by a thread the fork left behind)
        self.beside_jobs = list(beside_jobs)  # untimed work of the command's (a figure) run here beside the idle workers, where they can be idle

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection")
        if session.config.option.collectonly:
            return True
        groups, alone = item_groups(session.items)
        shared_imports = sum(group.seconds for group in groups) >= _SHARED_IMPORTS_FROM_SECONDS
        beside_here = bool(groups) and idle_priority_returns()
        beside = [item for item in alone if _untimed_on_the_cpu(item)] if beside_here else []
        alone = [item for item in alone if item not in beside]
        left = _Parallel(self, session, groups).run(import_first=_import_shared_modules if shared_imports else None, beside=beside,
                                                    beside_jobs=self.beside_jobs if beside_here else ())
        mark("claims in parallel")
        for index, item in enumerate(left + alone):
            following = (left + alone)[index + 1:]
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following[0] if following else None)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        mark("claims alone")
        return True


class _Parallel:
    """Phase 1: the workers, the groups handed out one at a time, the reports replayed here."""

    def __init__(self, plugin: ClaimWorkers, session: pytest.Session, groups: list[_Group]) -> None:
        self.plugin = plugin
        self.session = session
        self.config = session.config
        self.groups = groups
        self.pending = list(range(len(groups)))
        self.connections: dict[Any, tuple[int, list[int]]] = {}  # connection → (pid, groups given to that worker)
        self.reported: set[str] = set()
        self.stopping = False

    def run(self, import_first: Callable[[], object] | None = None, beside: Sequence[pytest.Item] = (),
            beside_jobs: Sequence[Callable[[], object]] = ()) -> list[pytest.Item]:
        """Run every group on the workers; the items no worker reported (a worker died), to run here.
        ``import_first``: modules every worker would import again (:data:`SHARED_IMPORTS`), imported
        here before the workers are forked (they inherit them), beside the gloo ranks' forkserver starting.
        ``beside``: claims that launch gloo ranks or use this process's threads and time nothing, run here once the workers are
        forked, then ``beside_jobs``, the workers at idle priority meanwhile (:func:`~resacct.harness.worker_scheduling.idle_priority`)."""
        if not self.groups or not hasattr(os, "fork"):
            if import_first is not None:
                import_first()
                mark("shared imports")
            return [*self._left(), *beside]
        wanted = min(self.plugin.workers, len(self.groups))
        try:
            # the gloo ranks' forkserver imports torch and the rank programs on the other core while the shared
            # imports load here (the workers inherit its handle and leave it alone: worker_process.Worker)
            start_ranks_early(self.session, force=True)
            if import_first is not None:
                import_first()
                mark("shared imports")
            self._fork(wanted)
            if beside or beside_jobs:
                self._run_beside_idle_workers(beside, beside_jobs)
            self._serve()
        except KeyboardInterrupt:
            self._stop_after_interrupt()
            raise
        finally:
            self._reap()
        return self._left()

    def _fork(self, count: int) -> None:
        """Fork ``count`` workers (fewer where the system has no process to give: the workers started
        so far, or this process, run the claims)."""
        sys.stdout.flush()
        sys.stderr.flush()
        freeze_alive()  # the shared imports too: no worker's full collection scans them (resacct.harness.collector)
        for _ in range(count):
            parent_end, child_end = multiprocessing.Pipe(duplex=True)
            try:
                pid = os.fork()
            except OSError:
                parent_end.close()
                child_end.close()
                return
            if pid == 0:  # the worker: never returns
                parent_end.close()
                Worker(self.plugin.hide_in_workers, self.session, self.groups, child_end).serve()
            child_end.close()
            self.connections[parent_end] = (pid, [])

    def _serve_until(self, finished: Callable[[], bool]) -> None:
        """Serve the workers until ``finished()`` (checked after every message) or no worker is left."""
        while self.connections and not finished():
            for ready in multiprocessing.connection.wait(list(self.connections)):
                self._receive(ready)

    def _run_beside_idle_workers(self, items: Sequence[pytest.Item], jobs: Sequence[Callable[[], object]]) -> None:
        """Run ``items`` here (claims that launch gloo ranks or use torch's threads), then ``jobs``, with every worker at
        idle priority: the ranks or threads get the cores as if alone, and the workers only the time
        they leave (ranks waiting in collectives, starting, tearing down). Their messages wait in the pipes meanwhile, so each holds
        a group and has one more queued first (it answers its next requests one behind)."""
        self._serve_until(lambda: not self.pending or all(given for _, given in self.connections.values()))
        for connection in list(self.connections):
            if self.pending:
                self._give(connection)
        with idle_priority([pid for pid, _ in self.connections.values()]):
            for index, item in enumerate(items):
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=items[index + 1] if index + 1 < len(items) else None)
                if self.session.shouldfail:
                    raise self.session.Failed(self.session.shouldfail)
                if self.session.shouldstop:
                    raise self.session.Interrupted(self.session.shouldstop)
            for job in jobs:
                job()
        mark("launches and threads beside the workers")

    def _left(self) -> list[pytest.Item]:
        return [item for group in self.groups for item in group.items if item.nodeid not in self.reported]

    def _serve(self) -> None:
        while self.connections:
            for connection in multiprocessing.connection.wait(list(self.connections)):
                self._receive(connection)

    def _receive(self, connection: Any) -> bool:
        """Handle one message of a worker; False once it has ended (its connection is closed)."""
        try:
            message = connection.recv()
        except (EOFError, OSError):
            self._forget(connection)
            return False
        kind = message[0]
        if kind == "ready":
            self._give(connection)
        elif kind == "report":
            report = self.config.hook.pytest_report_from_serializable(config=self.config, data=message[1])
            if report.when == "call" or (report.when == "setup" and not report.passed):  # what the claims recorder keeps
                self.reported.add(report.nodeid)
            self.config.hook.pytest_runtest_logreport(report=report)
        elif kind == "logstart":
            self.config.hook.pytest_runtest_logstart(nodeid=message[1], location=message[2])
        elif kind == "logfinish":
            self.config.hook.pytest_runtest_logfinish(nodeid=message[1], location=message[2])
        elif kind == "interrupted" and not self.stopping:  # a Ctrl-C that reached a worker alone stops the run all the same
            signal.raise_signal(signal.SIGINT)
        return True

    def _give(self, connection: Any) -> None:
        try:
            if self.pending and not (self.session.shouldfail or self.session.shouldstop):
                index = self.pending.pop(0)
                self.connections[connection][1].append(index)
                connection.send(("group", index))
            else:
                connection.send(("stop",))
        except OSError:  # it stopped already (a request answered one behind: its stop was read): its pipe's end tells
            pass

    def _forget(self, connection: Any) -> None:
        pid, _ = self.connections.pop(connection)
        connection.close()
        _wait_for(pid, timeout_seconds=_STOP_GRACE_SECONDS)

    def _stop_after_interrupt(self) -> None:
        """Ctrl-C here: each worker stops after its claim (the terminal's Ctrl-C reached it too, or
        this sends one); the reports already sent are replayed, then the interrupt goes on."""
        self.stopping = True
        if self.plugin.on_interrupt is not None:
            self.plugin.on_interrupt()
        self.pending.clear()
        for pid, _ in self.connections.values():
            _signal(pid, signal.SIGINT)
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        while self.connections and time.monotonic() < deadline:
            for connection in multiprocessing.connection.wait(list(self.connections), timeout=max(0.0, deadline - time.monotonic())):
                try:
                    self._receive(connection)
                except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
                    deadline = 0.0

    def _reap(self) -> None:
        for connection, (pid, _) in list(self.connections.items()):
            _signal(pid, signal.SIGKILL)
            connection.close()
            _wait_for(pid, timeout_seconds=5.0)
        self.connections.clear()


def _untimed_on_the_cpu(item: pytest.Item) -> bool:
    """A claim that runs alone (:func:`runs_alone`) only for the cores it takes — it launches gloo ranks
    (mark ``distributed``) or its values depend on torch's thread count (``threads_matter``) — and
    measures no time and needs no GPU: it may run while the workers work at idle priority."""
    from resacct.harness.plugin import TIMED_KEYWORD

    return TIMED_KEYWORD not in item.extra_keyword_matches and item.get_closest_marker("gpu") is None and runs_alone(item)


def _import_shared_modules() -> None:
    import importlib

    for name in SHARED_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed, or broken: the claims that need it say so themselves
            continue


def _threads_matter(item: pytest.Item) -> bool:
    """Whether a claim's check declares its values depend on torch's thread count (``threads_matter``)."""
    from resacct.errors import ResacctError
    from resacct.harness.registry import get_check

    loaded = getattr(item, "loaded", None)
    if loaded is None:
        return False
    try:
        return get_check(loaded.claim.measure).depends_on_threads(dict(loaded.claim.given))
    except ResacctError:  # an unknown check: the claim's own run says so
        return False


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, number)


def _wait_for(pid: int, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        if time.monotonic() >= deadline:
            _signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
        time.sleep(0.01)
