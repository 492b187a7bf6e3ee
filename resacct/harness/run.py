"""Running claims files through pytest in this process and getting the report document back.

pytest runs with the claims plugin (jaxtyping's hook is left out: the caller has already imported
resacct), its own output goes to ``pytest.log``, and a rich progress bar on stderr advances as
claims finish. With ``workers`` ≥ 2 the claims run on that many forked processes, then the timed
ones alone here (:mod:`resacct.harness.workers`). Ctrl-C inside the run stops it; the claims that finished are kept and the result
says it was interrupted — also when Python drops the KeyboardInterrupt (one raised inside a gc
callback or a ``__del__`` is only reported as "ignored": hypothesis registers gc callbacks), as
the next claim's hook raises it again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError
from resacct.harness.collector import TunedCollector
from resacct.harness.phases import mark

__all__ = ["ClaimsRun", "InterruptLatch", "run_claims"]


@dataclass
class ClaimsRun:
    exit_code: int
    document: dict[str, Any]
    interrupted: bool


class InterruptLatch:
    """Ctrl-C for a whole command: SIGINT raises KeyboardInterrupt as Python's own handler does, and
    is remembered, so one that Python dropped (see the module's docstring) is raised again by
    :meth:`check`; inside :meth:`deferred` it is only remembered."""

    def __init__(self) -> None:
        self.received = False
        self._raised_again = False
        self._deferring = False

    def handler(self, signal_number: int, frame: Any) -> None:
        self.received = True
        if not self._deferring:
            raise KeyboardInterrupt

    def handled(self) -> None:
        """The Ctrl-C received is being handled (raised already): :meth:`check` will not raise it again."""
        self._raised_again = self.received

    def check(self) -> None:
        """Raise KeyboardInterrupt once if a Ctrl-C came and was not raised (deferred) or was dropped."""
        if self.received and not self._raised_again:
            self._raised_again = True
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        """This latch as the SIGINT handler (in the main thread; elsewhere signals are not ours)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self.handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)

    @contextlib.contextmanager
    def deferred(self):
        """Ctrl-C inside the block is raised when it ends: an import of torch completes (interrupted
        half-way, torch cannot be imported again in the process: ``duplicate registrations``, a segfault)."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        self.check()


class _Progress:
    """pytest plugin that advances a rich progress bar as claims finish, and stops the run at the
    first hook after a Ctrl-C that Python dropped."""

    def __init__(self, progress: Any, latch: InterruptLatch):
        self.progress = progress
        self.latch = latch
        self.task = None

    def pytest_collection_finish(self, session: Any) -> None:
        mark("start")
        self.latch.check()
        self.task = self.progress.add_task("verifying claims", total=len(session.items))

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.latch.check()

    def pytest_runtest_logreport(self, report: Any) -> None:
        if self.task is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
            self.progress.advance(self.task)
        self.latch.check()


@contextlib.contextmanager
def _environment_variable(name: str, value: str | None):
    previous = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


def _pytest_error(log_text: str) -> str | None:
    for line in log_text.splitlines():
        if line.startswith("ERROR:"):
            return line.removeprefix("ERROR:").strip()
    return None


def run_claims(files: list[Path], directory: Path, *, pattern: str | None = None, workers: int = 1,
               gpu_required: bool = False, show_progress: bool = True, tracebacks: bool = False,
               latch: InterruptLatch | None = None, beside_jobs: Sequence[Callable[[], object]] = ()) -> ClaimsRun:
    """Run pytest on ``files``, writing ``report.json`` and ``pytest.log`` into ``directory``
    (which should be the run's own; see :class:`resacct.reporting.ReportStaging`). With
    ``tracebacks`` pytest runs verbose, so a check's foreign exception keeps its traceback.
    ``latch``: the command's Ctrl-C latch, when it has one (installed here otherwise). ``workers``:
    processes that run the claims (1: this one; more: forked workers, the timed claims then alone
    here: :mod:`resacct.harness.workers`). ``beside_jobs``: untimed work (a figure) the workers' run
    may do while its workers wait at idle priority; a job must keep its own result and errors (it may
    not run at all: one worker, or no idle priority to be had)."""
    import pytest
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "report.json"
    rootdir = files[0].parent.parent
    args = [str(path) for path in files]
    # Hermetic: no ini file and no conftest.py of whatever checkout or project the specs sit in
    # (a repository's root conftest would install its own test-suite machinery into this run).
    # no:unraisableexception: its end-of-session gc.collect() over torch and transformers took ~0.3 s, for
    # warnings this run never shows (an unraisable exception still reaches pytest.log through sys.unraisablehook).
    # no:logging: its capture around each claim's setup, call and teardown cost ~0.4 s a run, for records no
    # claim reads (a library's warning still reaches pytest.log through logging's last-resort handler).
    # --assert=plain: the claims are YAML items, and rewriting resacct's own modules (a pytest11 plugin's
    # distribution) for their 10 asserts re-parsed ~100 files a run where bytecode is not written.
    args += ["-c", os.devnull, "--noconftest", "--rootdir", str(rootdir), "-p", "no:cacheprovider", "-p", "no:unraisableexception",
             "-p", "no:logging", "--assert=plain",
             *(["-v", "--tb=short"] if tracebacks else ["-q"]), "--no-claims-summary", "--claims-json", str(json_path)]
    if pattern:
        args += ["-k", pattern]
    log = io.StringIO()
    latch = latch or InterruptLatch()
    plugins: list[Any] = []
    with latch.installed(), _environment_variable("RESACCT_REQUIRE_GPU", "1" if gpu_required else None):
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True, disable=not show_progress) as progress:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                try:
                    plugins.append(_Progress(progress, latch))
                    plugins.append(TunedCollector())  # resacct.harness.collector
                    if workers > 1:
                        from resacct.harness.workers import ClaimWorkers

                        plugins.append(ClaimWorkers(workers, on_interrupt=latch.handled, hide_in_workers=plugins[:1], beside_jobs=beside_jobs))
                    exit_code = int(pytest.main(args, plugins=plugins))
                except Exception:
                    if not latch.received:
                        raise
                    # pytest's own report of the Ctrl-C can fail (a traceback entry without a line number:
                    # TypeError in _pytest/_code/code.py); the run was interrupted all the same
                    exit_code = int(pytest.ExitCode.INTERRUPTED)
    mark("claims" if workers < 2 else "claims report")
    (directory / "pytest.log").write_text(log.getvalue(), encoding="utf-8")
    interrupted = exit_code == int(pytest.ExitCode.INTERRUPTED) or latch.received
    if json_path.exists():
        document = json.loads(json_path.read_text(encoding="utf-8"))
    elif interrupted:
        from resacct.harness.report import environment_fingerprint

        document = {"environment": environment_fingerprint(), "claims": []}
    else:
        refused = _pytest_error(log.getvalue())
        if refused:
            raise ResacctError(f"pytest refused the run: {refused}")
        if pattern and exit_code == int(pytest.ExitCode.NO_TESTS_COLLECTED):
            raise ResacctError(f"no claim matches -k {pattern!r}")
        last = [line.strip() for line in log.getvalue().splitlines() if line.strip()][-1:] or ["no output"]
        raise ResacctError(f"pytest ran no claims (pytest exit {exit_code}): {last[0]}")
    return ClaimsRun(exit_code, document, interrupted)
