"""A ``resacct verify`` claims worker, the child side of :mod:`resacct.harness.workers`: forked from
the run's process, it asks for a group of claims, runs it with one torch thread and sends every
pytest report and log event back through its pipe (the parent replays them); until told to stop."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import pytest

__all__ = ["Worker", "WORKER_THREADS"]

#: torch's intra-op threads in each worker: two workers on two cores, one thread each (OpenMP's pool does not survive a
#: fork); a stored measurement's key names the count (resacct.harness.replay), so the parent asks with this one
WORKER_THREADS = 1


class Worker:
    """A forked worker: asks for a group, runs it, sends every report; until told to stop."""

    def __init__(self, hide_in_workers: Sequence[object], session: pytest.Session, groups: Sequence[Any], connection: Any) -> None:
        """``hide_in_workers``: plugins a child must not call (the progress bar: its lock may be held by
        a thread the fork left behind); ``groups``: the run's groups (``.items``), asked for by index."""
        self.hide_in_workers = hide_in_workers
        self.session = session
        self.groups = groups
        self.connection = connection
        self.interrupted = False
        self.inherited_forkserver: int | None = None

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
                from resacct.measurement.lifeline import forkserver_pid, stop_forkserver

                if forkserver_pid() != self.inherited_forkserver:  # one this worker started; the run's own is the parent's
                    stop_forkserver()
            os._exit(status)

    def _become_worker(self) -> None:
        import torch

        from resacct.measurement.lifeline import forkserver_pid

        self.inherited_forkserver = forkserver_pid()  # the parent's gloo forkserver, started before the fork: never stopped here
        signal.signal(signal.SIGINT, self._on_sigint)
        torch.set_num_threads(WORKER_THREADS)  # two workers on two cores: one thread each
        manager = self.session.config.pluginmanager
        for plugin in self.hide_in_workers:
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

    def _run(self, group: Any) -> None:
        for index, item in enumerate(group.items):
            following = group.items[index + 1] if index + 1 < len(group.items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
            if self.interrupted:
                raise KeyboardInterrupt


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
