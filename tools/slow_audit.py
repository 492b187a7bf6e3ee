"""The slow mark's rule, checked against a run (issue 34): list every quick-tier item over the line.

pytest.ini's rule: a test that takes 0.7 s or more, or a claim that takes 0.45 s or more, is marked
``slow`` and leaves the quick tier (``--run-slow`` runs it; ``.ci/run`` does). Nothing checked it, and
tests drifted over the line unmarked. This module is both halves of the check:

* a pytest plugin, switched on by ``pytest --slow-audit PATH`` (``tests/conftest.py`` adds the option):
  every item's seconds per phase (setup, call, teardown) and the CPU seconds it spent — this
  process's and those of the child processes it waited for (subprocess CLI runs, spawned ranks) —
  written to PATH as JSON, from every xdist worker;
* a command that reads such a file, or the text of ``pytest --durations=0``, and prints each item
  over the line that is not marked slow, slowest first, with the phase that holds most of its time
  (a ``setup`` of seconds is a shared fixture: make it cheaper, or move its module). It exits 1 when
  any is listed, 0 when none, 2 on a file it cannot read.

An item's time is setup + call + teardown: what the quick tier pays for it. ``--by cpu`` (the default
where the file has them) judges CPU seconds, which a machine shared by other work inflates far less
than wall seconds; ``--by wall`` judges wall seconds, the rule's own measure on an idle machine.
CPU seconds miss work done for an item elsewhere: a child process it did not wait for (the gloo
ranks' forkserver, a measuring child kept for the run), or a measurement shared by several claims
(the first asks and pays, the others read it at ~0 CPU s). Read such items by wall seconds.

    pytest -n 2 --dist loadgroup -p no:cacheprovider --slow-audit /tmp/items.json
    python tools/slow_audit.py /tmp/items.json            # CPU seconds
    python tools/slow_audit.py --by wall /tmp/items.json  # an idle machine
    python tools/slow_audit.py --marked /tmp/items.json   # of a --run-slow run: marked slow, now quick
    python tools/slow_audit.py --workers /tmp/items.json  # when each xdist worker finished; the largest groups
    pytest --durations=0 -q > run.txt; python tools/slow_audit.py run.txt   # wall seconds only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TEST_LINE_S = 0.7  # pytest.ini's slow marker: "0.7 s or more (a test)"
CLAIM_LINE_S = 0.45  # "or 0.45 s or more (a claim)"
PHASES = ("setup", "call", "teardown")
OPTION = "--slow-audit"
_CLAIMS_FILE = re.compile(r"\.claims\.ya?ml::")
_CPU_KEY = pytest.StashKey[dict[str, float]]()
_DURATION_LINE = re.compile(r"^\s*(?P<seconds>\d+(?:\.\d+)?)s\s+(?P<phase>setup|call|teardown)\s+(?P<nodeid>\S.*?)\s*$")


class AuditError(Exception):
    """A file the audit cannot read (the command: one line on stderr, exit 2)."""


def _cpu_seconds() -> float:
    """This process's CPU seconds (every thread) plus those of its children that have been waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def plain_nodeid(nodeid: str) -> str:
    """The node id without xdist's ``@group`` suffix (``--dist loadgroup``)."""
    return re.sub(r"@[\w.:-]+$", "", nodeid)


def is_claim(nodeid: str) -> bool:
    return bool(_CLAIMS_FILE.search(nodeid))


def line_for(nodeid: str, *, test_line_s: float = TEST_LINE_S, claim_line_s: float = CLAIM_LINE_S) -> float:
    return claim_line_s if is_claim(nodeid) else test_line_s


@dataclass
class ItemTime:
    nodeid: str
    wall_s: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    marked_slow: bool = False
    worker: str = ""  # the xdist worker that ran it ("main" without xdist; "" in files from before)
    group: str = ""  # its --dist loadgroup group ("" where none)
    start: float = 0.0  # epoch seconds: its setup began, its teardown ended (0 where not recorded)
    stop: float = 0.0

    def total(self, by: str) -> float:
        return sum((self.cpu_s if by == "cpu" else self.wall_s).values())

    def main_phase(self, by: str) -> str:
        phases = self.cpu_s if by == "cpu" else self.wall_s
        return max(phases, key=phases.__getitem__) if phases else "call"


class SlowAuditRecorder:
    """The plugin: CPU seconds per phase on the worker (carried on the report), written by the
    process that sees every report (the xdist controller, or the one process)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: dict[str, ItemTime] = {}

    @staticmethod
    def _timed(item: pytest.Item, phase: str) -> Iterator[None]:
        start = _cpu_seconds()
        try:
            yield
        finally:
            item.stash.setdefault(_CPU_KEY, {})[phase] = _cpu_seconds() - start

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "setup")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "call")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._timed(item, "teardown")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        report = yield
        # extra attributes travel with the report from an xdist worker to the controller
        report.slow_audit_cpu_s = item.stash.get(_CPU_KEY, {}).get(call.when)
        report.slow_audit_marked = item.get_closest_marker("slow") is not None
        report.slow_audit_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        return report

    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = self.items.setdefault(plain_nodeid(report.nodeid), ItemTime(plain_nodeid(report.nodeid)))
        entry.wall_s[report.when] = float(report.duration)
        cpu_s = getattr(report, "slow_audit_cpu_s", None)
        if cpu_s is not None:
            entry.cpu_s[report.when] = float(cpu_s)
        entry.marked_slow = entry.marked_slow or bool(getattr(report, "slow_audit_marked", False))
        entry.worker = str(getattr(report, "slow_audit_worker", entry.worker))
        entry.group = report.nodeid.rpartition("@")[2] if plain_nodeid(report.nodeid) != report.nodeid else entry.group
        start, stop = float(getattr(report, "start", 0) or 0), float(getattr(report, "stop", 0) or 0)
        entry.start = min(entry.start, start) if entry.start and start else (entry.start or start)
        entry.stop = max(entry.stop, stop)

    def pytest_sessionfinish(self, session: Any) -> None:
        if getattr(session.config, "workerinput", None) is not None:
            return  # an xdist worker: the controller has every report and writes the file
        records = [{"nodeid": entry.nodeid, "wall_s": entry.wall_s, "cpu_s": entry.cpu_s, "marked_slow": entry.marked_slow,
                    "worker": entry.worker, "group": entry.group, "start": entry.start, "stop": entry.stop}
                   for entry in self.items.values()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"items": records}, indent=1) + "\n")


def read_items(path: Path) -> list[ItemTime]:
    """The items of a ``--slow-audit`` JSON file or of ``pytest --durations=0``'s text."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise AuditError(f"cannot read {str(path)!r}: {error}") from error
    if text.lstrip().startswith("{"):
        try:
            records = json.loads(text)["items"]
            return [ItemTime(r["nodeid"], dict(r["wall_s"]), dict(r.get("cpu_s") or {}), bool(r.get("marked_slow")),
                             str(r.get("worker") or ""), str(r.get("group") or ""), float(r.get("start") or 0), float(r.get("stop") or 0))
                    for r in records]
        except (ValueError, KeyError, TypeError) as error:
            raise AuditError(f"{str(path)!r} is not a --slow-audit file (expected {{\"items\": [...]}}): {error}") from error
    items: dict[str, ItemTime] = {}
    for line in text.splitlines():
        if match := _DURATION_LINE.match(line):
            nodeid = plain_nodeid(match["nodeid"])
            items.setdefault(nodeid, ItemTime(nodeid)).wall_s[match["phase"]] = float(match["seconds"])
    if not items:
        raise AuditError(f"{str(path)!r} holds no item times: expected a --slow-audit JSON file or "
                         f"the output of pytest --durations=0 (lines like '0.72s call tests/test_x.py::test_y')")
    return list(items.values())


def over_the_line(items: Iterable[ItemTime], by: str, *, test_line_s: float = TEST_LINE_S,
                  claim_line_s: float = CLAIM_LINE_S) -> list[ItemTime]:
    """The items not marked slow whose time is at or over their line, slowest first."""
    over = [item for item in items if not item.marked_slow
            and item.total(by) >= line_for(item.nodeid, test_line_s=test_line_s, claim_line_s=claim_line_s)]
    return sorted(over, key=lambda item: item.total(by), reverse=True)


def marked_but_quick(items: Iterable[ItemTime], by: str, *, test_line_s: float = TEST_LINE_S,
                     claim_line_s: float = CLAIM_LINE_S) -> list[ItemTime]:
    """The items marked slow that took under half their line (a ``--run-slow`` run): made fast since, or
    marked on a loaded machine's say-so — candidates for the quick tier again. Fastest first."""
    quick = [item for item in items if item.marked_slow
             and item.total(by) < 0.5 * line_for(item.nodeid, test_line_s=test_line_s, claim_line_s=claim_line_s)]
    return sorted(quick, key=lambda item: item.total(by))


def worker_finishes(items: Iterable[ItemTime]) -> list[tuple[str, int, float, float, float]]:
    """Per xdist worker: (worker, items, its items' wall seconds, its items' CPU seconds, seconds from the
    run's first item to its own last): how long the worker that finished first sat idle at the end."""
    timed = [item for item in items if item.worker and item.stop]
    if not timed:
        raise AuditError("no item carries its worker and times (a --slow-audit file written before they were "
                         "recorded, or pytest --durations text): run pytest --slow-audit PATH again")
    first = min(item.start for item in timed)
    workers: dict[str, list[ItemTime]] = {}
    for item in timed:
        workers.setdefault(item.worker, []).append(item)
    return sorted(((name, len(ran), sum(i.total("wall") for i in ran), sum(i.total("cpu") for i in ran),
                    max(i.stop for i in ran) - first) for name, ran in workers.items()), key=lambda row: row[4])


def largest_groups(items: Iterable[ItemTime], count: int = 5) -> list[tuple[str, int, float]]:
    """The --dist loadgroup groups with the most wall seconds: (group, items, wall seconds). One worker
    runs a whole group, so a group near half the run's seconds leaves the other worker idle."""
    groups: dict[str, list[float]] = {}
    for item in items:
        if item.group:
            groups.setdefault(item.group, []).append(item.total("wall"))
    return sorted(((name, len(walls), sum(walls)) for name, walls in groups.items()), key=lambda row: -row[2])[:count]


def _print_workers(items: list[ItemTime]) -> int:
    rows = worker_finishes(items)
    last = rows[-1][4]
    for name, count, wall_s, cpu_s, finished_s in rows:
        print(f"{name:6s} {count:5d} items  {wall_s:8.1f} wall s  {cpu_s:8.1f} cpu s  last item done at {finished_s:7.1f} s"
              f"  (idle {last - finished_s:5.1f} s before the last worker)")
    for name, count, wall_s in largest_groups(items):
        print(f"group {name}: {count} items, {wall_s:.1f} wall s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slow_audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a --slow-audit JSON file, or pytest --durations=0 output")
    parser.add_argument("--by", choices=("cpu", "wall"), default=None,
                        help="judge CPU seconds (default where the file has them) or wall seconds")
    parser.add_argument("--test-line", type=float, default=TEST_LINE_S, metavar="S", help=f"a test's line (default {TEST_LINE_S})")
    parser.add_argument("--claim-line", type=float, default=CLAIM_LINE_S, metavar="S", help=f"a claim's line (default {CLAIM_LINE_S})")
    parser.add_argument("--marked", action="store_true",
                        help="list instead the items marked slow that took under half their line (a --run-slow run); exit 0")
    parser.add_argument("--workers", action="store_true",
                        help="list instead when each xdist worker finished its last item, and the largest loadgroup groups; exit 0")
    args = parser.parse_args(argv)
    try:
        items = read_items(args.run)
        if args.workers:
            return _print_workers(items)
    except AuditError as error:
        print(f"slow_audit: {error}", file=sys.stderr)
        return 2
    by = args.by or ("cpu" if any(item.cpu_s for item in items) else "wall")
    if by == "cpu" and not any(item.cpu_s for item in items):
        print(f"slow_audit: --by cpu: {str(args.run)!r} has wall seconds only (pytest --durations); use --by wall "
              f"or a {OPTION} file", file=sys.stderr)
        return 2
    if args.marked:
        quick = marked_but_quick(items, by, test_line_s=args.test_line, claim_line_s=args.claim_line)
        for item in quick:
            print(f"{item.total(by):7.2f} {by} s  marked slow, under half its line  {item.nodeid}")
        print(f"{len(quick)} of {sum(item.marked_slow for item in items)} items marked slow took under half their line "
              f"({by} seconds)", file=sys.stderr)
        return 0
    over = over_the_line(items, by, test_line_s=args.test_line, claim_line_s=args.claim_line)
    for item in over:
        line = line_for(item.nodeid, test_line_s=args.test_line, claim_line_s=args.claim_line)
        kind = "claim" if is_claim(item.nodeid) else "test"
        print(f"{item.total(by):7.2f} {by} s  {kind} (line {line} s, most in {item.main_phase(by)})  {item.nodeid}")
    print(f"{len(over)} of {len(items)} items not marked slow are over the line ({by} seconds; tests "
          f"{args.test_line} s, claims {args.claim_line} s)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
