"""``resacct verify`` on several cores: the claims' pytest loop split over forked worker processes.

Once the claims are collected, this process forks ``workers`` children (:class:`ClaimWorkers`, a
pytest plugin that takes over ``pytest_runtestloop``). The fork shares what is already imported
(torch, pytest, hypothesis, the checks) and collected, so a worker starts in milliseconds, where
an xdist worker imports and collects everything again. In a long run, what every worker would
import again (:data:`SHARED_IMPORTS`: transformers, torch._dynamo) is imported first, on a thread of
this process, while one worker forked before them runs the smallest groups on the other core; the
workers forked after them inherit them, and the early one stops after its group (a replacement is
forked). Then the run has two phases:

1. **In parallel**: the claims are grouped **by area** (one spec file: its claims share their
   memoised measurements, :mod:`resacct.measurement.memo`, so one process measures each once), and
   each worker, with **one torch thread**, asks for the next group as it finishes one, the largest
   groups first (:data:`AREA_SECONDS`, a scheduling estimate only). Each finished claim's pytest reports come back
   through a pipe, and this process replays them through its own hooks (the claims recorder, the
   progress bar, pytest's terminal), as xdist's controller does.
2. **Alone**: the timed claims (their checks' ``timing=True``), the GPU claims, those that launch
   gloo ranks (mark ``distributed``) and those whose values depend on torch's thread count
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
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from resacct.harness.early_ranks import WORKERS_PLUGIN_NAME, start_ranks_early
from resacct.harness.phases import mark
from resacct.harness.worker_count import default_workers, workers_count

__all__ = ["ClaimWorkers", "WORKERS_PLUGIN_NAME", "AREA_SECONDS", "runs_alone", "item_groups", "default_workers", "workers_count"]

#: Seconds each area's claims that run in parallel took in one worker (one torch thread), idle, at
#: commit b628a3e (2026-11-28): only the order in which groups are handed out (largest first; the
#: worker forked before the shared imports takes the smallest); an area not listed counts 0.02 s a
#: claim. A stale figure costs balance, never a result.
AREA_SECONDS = {"hf": 11.5, "account": 7.3, "peak": 2.2, "gpu_recorded": 2.1, "finetune": 2.1, "flops": 1.4, "optim": 1.25, "memory": 1.1,
                "init": 0.7, "data": 0.5, "perf": 0.5, "plan": 0.5, "models": 0.47, "seeding": 0.45, "einops": 0.35, "lecture_training": 0.34,
                "storage": 0.28, "checkpoint": 0.23, "lecture2024": 0.23, "train": 0.2, "inference": 0.17, "parallelism": 0.17, "dtypes": 0.15,
                "hardware": 0.11, "tensors": 0.07, "offload": 0.06, "energy": 0.06, "lecture": 0.05, "scale": 0.04, "napkin": 0.03,
                "runs": 0.02, "formats": 0.01, "devices": 0.01, "sharding": 0.01, "peak_sharded": 0.01, "runtime_model": 0.01}

#: Imported once in this process before the workers fork, when the claims to run are a long run's
#: (their areas' :data:`AREA_SECONDS` past :data:`_SHARED_IMPORTS_FROM_SECONDS`): each worker would
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
        group.seconds = AREA_SECONDS.get(group.name, 0.02 * len(group.items))
    return sorted(groups.values(), key=lambda group: -group.seconds), alone


class ClaimWorkers:
    """The pytest plugin (registered as :data:`WORKERS_PLUGIN_NAME`) that runs the claims on
    ``workers`` forked processes, then the timed and GPU ones here (see the module doc).
    ``on_interrupt``: called once a Ctrl-C reached this process, before the workers' last
    reports are replayed (the command's latch: that Ctrl-C is being handled)."""

    def __init__(self, workers: int, *, on_interrupt: Callable[[], object] | None = None, hide_in_workers: Sequence[object] = ()) -> None:
        if workers < 2:
            raise ValueError(f"ClaimWorkers needs 2 workers or more, got {workers}")
        self.__name__ = WORKERS_PLUGIN_NAME  # pluggy registers an object under its __name__
        self.workers = workers
        self.on_interrupt = on_interrupt
        self.hide_in_workers = list(hide_in_workers)  # plugins a child must not call (the progress bar: its lock may be held by a thread the fork left behind)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection")
        if session.config.option.collectonly:
            return True
        groups, alone = item_groups(session.items)
        shared_imports = sum(group.seconds for group in groups) >= _SHARED_IMPORTS_FROM_SECONDS
        left = _Parallel(self, session, groups).run(import_first=_import_shared_modules if shared_imports else None)
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
        self.from_the_end: set[Any] = set()  # the connections of workers that take the smallest groups first
        self.retiring: set[Any] = set()  # those told to stop at their next request
        self.stopping = False

    def run(self, import_first: Callable[[], object] | None = None) -> list[pytest.Item]:
        """Run every group on the workers; the items no worker reported (a worker died), to run here.
        ``import_first``: modules every worker would import again (:data:`SHARED_IMPORTS`), imported
        here on a thread while one worker, forked before them, runs the smallest groups; the other
        workers are forked once they are in (they inherit them) and take the largest groups first."""
        if not self.groups or not hasattr(os, "fork"):
            if import_first is not None:
                import_first()
                mark("shared imports")
            return self._left()
        wanted = min(self.plugin.workers, len(self.groups))
        try:
            if import_first is not None and wanted > 1:
                self._fork(1, from_the_end=True)
                imports = _ImportsOnAThread(import_first)
                self._serve_until(imports.done.poll, also=imports.done)
                imports.finish()
                mark("shared imports")
                early = set(self.connections)
                self.retiring |= early  # told to stop at its next group: what it imported itself, the others inherit
                self._fork(wanted - 1)
                self._serve_until(lambda: not early & set(self.connections))
            elif import_first is not None:
                import_first()
                mark("shared imports")
            self._fork(min(wanted, len(self.pending)) - len(self.connections))
            start_ranks_early(self.session, force=True)  # for the ranks launched here afterwards: it imports torch beside the workers
            self._serve()
        except KeyboardInterrupt:
            self._stop_after_interrupt()
            raise
        finally:
            self._reap()
        return self._left()

    def _fork(self, count: int, *, from_the_end: bool = False) -> None:
        """Fork ``count`` workers (fewer where the system has no process to give: the workers started
        so far, or this process, run the claims); ``from_the_end``: they ask for the smallest groups first."""
        sys.stdout.flush()
        sys.stderr.flush()
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
                _Worker(self.plugin, self.session, self.groups, child_end).serve()
            child_end.close()
            self.connections[parent_end] = (pid, [])
            if from_the_end:
                self.from_the_end.add(parent_end)

    def _serve_until(self, finished: Callable[[], bool], *, also: Any = None) -> None:
        """Serve the workers until ``finished()`` (checked after every message; ``also``: one more
        connection to wake up on, not read here) or no worker is left."""
        while self.connections and not finished():
            for ready in multiprocessing.connection.wait([*self.connections, *([also] if also is not None else [])]):
                if ready is not also:
                    self._receive(ready)
        while not finished():  # no worker left (each died): what remains runs here afterwards
            multiprocessing.connection.wait([also] if also is not None else [], timeout=0.05)

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
        if self.pending and connection not in self.retiring and not (self.session.shouldfail or self.session.shouldstop):
            index = self.pending.pop(-1 if connection in self.from_the_end else 0)
            self.connections[connection][1].append(index)
            connection.send(("group", index))
        else:
            connection.send(("stop",))

    def _forget(self, connection: Any) -> None:
        pid, _ = self.connections.pop(connection)
        self.from_the_end.discard(connection)
        self.retiring.discard(connection)
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


class _Worker:
    """A forked worker: asks for a group, runs it, sends every report; until told to stop."""

    def __init__(self, plugin: ClaimWorkers, session: pytest.Session, groups: list[_Group], connection: Any) -> None:
        self.plugin = plugin
        self.session = session
        self.groups = groups
        self.connection = connection
        self.interrupted = False

    def serve(self) -> None:
        status = 0
        try:
            self._become_worker()
            while not self.interrupted:
                self.connection.send(("ready",))
                message = self.connection.recv()
                if message[0] != "group":
                    break
                self._run(self.groups[message[1]])
        except KeyboardInterrupt:
            with contextlib.suppress(BaseException):
                self.connection.send(("interrupted",))
        except (EOFError, BrokenPipeError):  # the run is gone
            pass
        except BaseException:  # noqa: BLE001 - told to this process's stderr; its claims run in the parent
            status = 1
            with contextlib.suppress(BaseException):
                sys.__stderr__.write(f"resacct verify: a claims worker failed:\n{traceback.format_exc()}")
        finally:
            with contextlib.suppress(BaseException):
                from resacct.measurement.lifeline import stop_forkserver

                stop_forkserver()
            os._exit(status)

    def _become_worker(self) -> None:
        import torch

        signal.signal(signal.SIGINT, self._on_sigint)
        torch.set_num_threads(1)  # two workers on two cores: one thread each
        manager = self.session.config.pluginmanager
        for plugin in self.plugin.hide_in_workers:
            if manager.is_registered(plugin):
                manager.unregister(plugin)
        manager.register(_Sender(self.connection, self.session.config), "resacct-claim-worker-sender")
        capture = manager.getplugin("capturemanager")
        if capture is not None and capture._global_capturing is not None:  # its own capture files: the parent's are shared with it
            capture._global_capturing = None
            capture.start_global_capturing()

    def _on_sigint(self, signal_number: int, frame: Any) -> None:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt

    def _run(self, group: _Group) -> None:
        for index, item in enumerate(group.items):
            following = group.items[index + 1] if index + 1 < len(group.items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
            if self.interrupted:
                raise KeyboardInterrupt


class _ImportsOnAThread:
    """``function`` run on a daemon thread (imports: the GIL is released while files are read, and the
    serving loop it shares the process with waits on its workers' pipes); ``done`` is readable once it has returned."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.done, self._tell = multiprocessing.Pipe(duplex=False)
        self.error: BaseException | None = None
        self.function = function
        self.thread = threading.Thread(target=self._run, name="resacct-shared-imports", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.function()
        except BaseException as error:  # noqa: BLE001 - raised again on the serving thread
            self.error = error
        finally:
            self._tell.send(True)

    def finish(self) -> None:
        """Join the thread (before any fork: a child must not inherit a thread mid-import) and raise its error."""
        self.thread.join()
        self.done.close()
        self._tell.close()
        if self.error is not None:
            raise self.error


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


class _Sender:
    """In a worker: every report and log event goes to the parent, which replays it."""

    def __init__(self, connection: Any, config: pytest.Config) -> None:
        self.connection = connection
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.connection.send(("logstart", nodeid, location))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.connection.send(("logfinish", nodeid, location))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.connection.send(("report", self.config.hook.pytest_report_to_serializable(config=self.config, report=report)))


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
