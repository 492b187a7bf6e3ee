"""``resacct verify --last``: list the last run's report without running a claim.

``--status failed`` after a run used to mean a second run of every claim (which replaced the
report, and with it the outcome that was asked about). ``--last`` reads ``<report-dir>/report.json``
as the run left it and prints it as the run would have: ``--status``, ``--all``, ``--durations``,
``--json``, ``-q`` and ``-v`` apply; the exit status is the run's (1 when a claim failed or is invalid).
What selects or runs claims (``--area``, ``-k``, ``--workers`` ...) has nothing to do here: one line,
exit 2. When ``<report-dir>-partial/`` holds a newer partial run, a line says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError

__all__ = ["RUN_ONLY_OPTIONS", "last_report", "refuse_run_options"]

#: ``verify``'s options that choose or run claims, by their ``args`` attribute: refused with ``--last``.
RUN_ONLY_OPTIONS = {"specs": "--specs", "area": "--area", "pattern": "-k", "machine_dependent": "--machine-dependent",
                    "gpu_required": "--gpu-required", "workers": "--workers", "no_roofline": "--no-roofline",
                    "no_timeline": "--no-timeline", "merge": "--merge", "explore": "--explore"}


def refuse_run_options(args: argparse.Namespace) -> None:
    """A :class:`ResacctError` naming the first option given with ``--last`` that only a run uses."""
    for attribute, option in RUN_ONLY_OPTIONS.items():
        if getattr(args, attribute, None):
            raise ResacctError(f"{option} chooses or runs claims, and --last runs none (it lists the report in --report-dir); "
                               "drop one of them")


def last_report(report_dir: Path) -> tuple[dict[str, Any], Path, list[str], str | None]:
    """(report.json's document, the folder, the report files in it, a note on a newer partial run or
    None) of the last run in ``report_dir``; a :class:`ResacctError` saying how to make one when there is none."""
    from resacct.reporting import load_report
    from resacct.reporting.directory import REPORT_FILES_LISTED

    path = report_dir / "report.json"
    if not path.is_file():
        raise ResacctError(f"no report in {str(report_dir)!r} (no report.json there): run `resacct verify` first, "
                           "or name the folder a run wrote with --report-dir")
    document = load_report(path)
    files = [name for name in REPORT_FILES_LISTED if (report_dir / name).is_file()]
    partial = report_dir.with_name(report_dir.name + "-partial") / "report.json"
    note = None
    if partial.is_file() and partial.stat().st_mtime > path.stat().st_mtime:
        note = (f"a newer partial run is in {partial.parent}/ (an --area or -k run, or one stopped by Ctrl-C); "
                f"--last --report-dir {partial.parent} lists it")
    return document, report_dir, files, note
