"""Where a run's report files go, without ever losing a complete report.

Each run writes into its own temporary directory beside the report directory
(``.reports.<pid>.<random>.tmp``); nothing in ``reports/`` changes while claims run. At the end,
under a lock on the parent directory, the run's files are renamed into place one by one
(``report.json`` last). A partial run (``--area``, ``-k``, interrupted) never replaces a complete
report: it goes to ``reports-partial/`` instead when ``reports/`` holds a complete one. Files in
the report directory that resacct did not write are left alone; one of resacct's files that this
run did not produce (``roofline.png`` under ``--no-roofline``) is removed, so everything there is
from one run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError
from resacct.reporting.documents import is_complete, load_report, strict_json_text
from resacct.reporting.html import render_html
from resacct.reporting.markdown import render_errata_markdown, render_markdown

__all__ = ["REPORT_FILES", "REPORT_FILES_LISTED", "ReportStaging", "write_report_files", "holds_complete_report"]

REPORT_FILES = ("roofline.png", "step-timeline.png", "pytest.log", "errata.md", "report.md", "report.html", "report.json")  # report.json goes last
#: the same files in the order ``resacct verify`` names them
REPORT_FILES_LISTED = ("report.json", "report.md", "report.html", "errata.md", "roofline.png", "step-timeline.png", "pytest.log")
_TEMPORARY_SUFFIX = ".tmp"


def write_report_files(document: dict[str, Any], directory: Path, roofline_png: bytes | None = None,
                       timeline_png: bytes | None = None) -> dict[str, Path]:
    """Write report.json (strict JSON), report.md, report.html and errata.md into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {
        "json": directory / "report.json",
        "markdown": directory / "report.md",
        "html": directory / "report.html",
        "errata": directory / "errata.md",
    }
    written["json"].write_text(strict_json_text(document, non_finite="string"), encoding="utf-8")
    written["markdown"].write_text(render_markdown(document), encoding="utf-8")
    written["html"].write_text(render_html(document, roofline_png, timeline_png), encoding="utf-8")
    written["errata"].write_text(render_errata_markdown(document), encoding="utf-8")
    return written


def holds_complete_report(directory: Path) -> bool:
    """True when ``directory/report.json`` is a readable report of a complete run."""
    try:
        return is_complete(load_report(directory / "report.json"))
    except ResacctError:
        return False


def _unusable(directory: Path, why: str) -> ResacctError:
    return ResacctError(f"report directory {str(directory)!r} {why}; --report-dir needs a directory resacct may create and write")


class ReportStaging:
    """The run's own temporary directory (``path``), created beside ``target`` at once, so a bad
    ``--report-dir`` is refused before any claim runs."""

    def __init__(self, target: Path):
        self.target = Path(os.path.abspath(target))
        if self.target.exists() and not self.target.is_dir():
            raise _unusable(target, "is a file" if self.target.is_file() else "exists and is not a directory")
        parent = self.target.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temporaries(parent, self.target.name)
            self.path = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.{os.getpid()}.", suffix=_TEMPORARY_SUFFIX, dir=parent))
        except OSError as error:
            raise _unusable(target, f"cannot be created ({_why_not(self.target, error)})") from None

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """An OSError while the run writes its files (a full disk, a quota, a file system gone
        read-only) is one line naming the report directory and the reason; what ``target`` held is kept."""
        try:
            yield
        except OSError as error:
            where = f": {error.filename}" if error.filename else ""
            raise ResacctError(f"report directory {str(self.target)!r} cannot be written ({error.strerror or error}{where}); "
                               f"its earlier files are unchanged; free space there or pass another --report-dir") from None

    def publish(self, *, complete: bool) -> Path:
        """Move the run's files into ``target`` (or ``target-partial`` when the run is partial and
        ``target`` holds a complete report); returns where they went. The staging directory is removed."""
        with _interrupts_deferred(), _locked(self.target.parent):
            destination = self.target
            if not complete and holds_complete_report(self.target):
                destination = self.target.with_name(self.target.name + "-partial")
            try:
                if destination.exists() and not destination.is_dir():
                    raise _unusable(destination, "is a file")
                destination.mkdir(exist_ok=True)
                for name in REPORT_FILES:
                    source, placed = self.path / name, destination / name
                    if source.exists():
                        os.replace(source, placed)
                    elif placed.is_file():
                        placed.unlink()  # a file of an older run must not pass for this run's
            except OSError as error:
                raise _unusable(destination, f"cannot be written ({error.strerror or error})") from None
            finally:
                self.discard()
        return destination


def _why_not(target: Path, error: OSError) -> str:
    """The reason a directory cannot be made: a file where a folder should be, else the OS's words."""
    for ancestor in target.parents:
        if ancestor.exists():
            return f"{str(ancestor)!r} is a file" if not ancestor.is_dir() else (error.strerror or str(error))
    return error.strerror or str(error)


def _remove_stale_temporaries(parent: Path, name: str) -> None:
    """Staging directories of runs that were killed (their process is gone)."""
    for candidate in parent.glob(f".{name}.*{_TEMPORARY_SUFFIX}"):
        pid_text = candidate.name.removeprefix(f".{name}.").split(".", 1)[0]
        if not pid_text.isdigit() or not candidate.is_dir():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
        except OSError:
            pass  # alive, or not ours to judge


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (flock on its descriptor; none where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Ctrl-C while the files are being moved takes effect after the move, not half-way through it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if received:
        raise KeyboardInterrupt
