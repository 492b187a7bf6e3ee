"""tools/slow_audit.py (issue 34): the slow mark's rule checked against a run — the recorder's CPU and
wall seconds per phase, and the command that lists the unmarked items over the line."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("tools_slow_audit", REPO / "tools" / "slow_audit.py")
assert _SPEC is not None and _SPEC.loader is not None
slow_audit = sys.modules.setdefault(_SPEC.name, importlib.util.module_from_spec(_SPEC))
if not hasattr(slow_audit, "main"):
    _SPEC.loader.exec_module(slow_audit)

BUSY_SUITE = """
import time

import pytest


def _busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.fixture(scope="module")
def shared():
    _busy(0.05)


def test_busy_call():
    _busy(0.05)


def test_busy_setup(shared):
    pass


@pytest.mark.slow
def test_busy_but_marked():
    _busy(0.05)


def test_waits_without_cpu():
    time.sleep(0.05)


def test_quick():
    pass
"""


def test_the_lines_are_pytest_ini_s() -> None:
    """The command's lines are the ones pytest.ini's slow marker states (a changed rule changes both)."""
    ini = configparser.ConfigParser()
    ini.read(REPO / "pytest.ini")
    slow = next(line for line in ini["pytest"]["markers"].splitlines() if line.strip().startswith("slow:"))
    assert f"{slow_audit.TEST_LINE_S} s or more (a test)" in slow and f"{slow_audit.CLAIM_LINE_S} s or more (a claim)" in slow


def _record_busy_suite(pytester: pytest.Pytester, path: Path) -> Path:
    """BUSY_SUITE run in process with the recorder writing to ``path``."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_suite=BUSY_SUITE)
    pytester.runpytest_inprocess("-p", "no:cacheprovider", plugins=[slow_audit.SlowAuditRecorder(path)]).assert_outcomes(passed=5)
    return path


def test_the_recorder_writes_cpu_and_wall_seconds_and_the_command_lists_what_is_over(
        pytester: pytest.Pytester, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _record_busy_suite(pytester, tmp_path / "items.json")
    items = {item["nodeid"].partition("::")[2]: item for item in json.loads(path.read_text())["items"]}
    assert set(items) == {"test_busy_call", "test_busy_setup", "test_busy_but_marked", "test_waits_without_cpu", "test_quick"}
    assert items["test_busy_call"]["cpu_s"]["call"] >= 0.05 and items["test_busy_setup"]["cpu_s"]["setup"] >= 0.05
    assert items["test_waits_without_cpu"]["wall_s"]["call"] >= 0.05 > items["test_waits_without_cpu"]["cpu_s"]["call"]
    assert items["test_busy_but_marked"]["marked_slow"] and not items["test_busy_call"]["marked_slow"]

    capsys.readouterr()
    assert slow_audit.main([str(path), "--test-line", "0.04"]) == 1  # CPU seconds, the default where recorded
    listed = [line.split()[-1].partition("::")[2] for line in capsys.readouterr().out.splitlines()]
    assert sorted(listed) == ["test_busy_call", "test_busy_setup"]  # the marked one and the sleeper are not
    assert slow_audit.main([str(path), "--test-line", "0.04", "--by", "wall"]) == 1
    out = capsys.readouterr().out
    assert "test_waits_without_cpu" in out and "most in setup" in out and "test_busy_but_marked" not in out
    assert slow_audit.main([str(path)]) == 0  # nothing near 0.7 s
    assert "0 of 5 items not marked slow are over the line (cpu seconds" in capsys.readouterr().err
    assert slow_audit.main([str(path), "--marked"]) == 0  # the marked one's 0.05 s is under half of 0.7 s
    out, err = capsys.readouterr()
    assert out.split()[-1].endswith("::test_busy_but_marked") and "1 of 1 items marked slow" in err
    assert slow_audit.main([str(path), "--marked", "--test-line", "0.04"]) == 0 and capsys.readouterr().out == ""


def test_the_command_reads_pytest_durations_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run.txt"
    run.write_text("""============ slowest durations ============
0.62s call     tests/test_a.py::test_x[a b]@lora-7b
0.10s setup    tests/test_a.py::test_x[a b]@lora-7b
0.50s call     resacct/specs/hf.claims.yaml::hf-one@claims:hf.claims.yaml
0.44s call     resacct/specs/hf.claims.yaml::hf-two@claims:hf.claims.yaml
0.69s call     tests/test_a.py::test_y
4 passed in 3.00s
""")
    assert slow_audit.main([str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["0.72", "0.50"]  # setup + call; a claim's own line
    assert out[0].endswith("tests/test_a.py::test_x[a b]") and "claim (line 0.45 s" in out[1]
    assert slow_audit.main([str(run), "--by", "cpu"]) == 2
    assert "has wall seconds only" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "no durations here\n", "{\"items\": 3}"])
def test_a_file_without_item_times_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    run = tmp_path / "run.txt"
    run.write_text(text)
    assert slow_audit.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slow_audit: ") and str(run) in err


def test_workers_says_when_each_worker_finished_and_the_largest_groups(
        pytester: pytest.Pytester, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--workers (issue 34): the idle tail of --dist loadgroup, from the items' worker and times."""
    recorded = _record_busy_suite(pytester, tmp_path / "recorded.json")
    items = json.loads(recorded.read_text())["items"]
    assert {item["worker"] for item in items} == {os.environ.get("PYTEST_XDIST_WORKER", "main")}  # the in-process run's worker
    assert all(0 < item["start"] < item["stop"] for item in items)

    def record(nodeid: str, worker: str, start: float, stop: float, group: str = "") -> dict[str, object]:
        return {"nodeid": nodeid, "wall_s": {"call": stop - start}, "cpu_s": {"call": stop - start}, "marked_slow": False,
                "worker": worker, "group": group, "start": start, "stop": stop}

    run = tmp_path / "items.json"
    run.write_text(json.dumps({"items": [
        record("tests/test_a.py::test_1", "gw0", 100.0, 110.0, "lora-7b"), record("tests/test_a.py::test_2", "gw0", 110.0, 140.0, "lora-7b"),
        record("tests/test_b.py::test_3", "gw1", 100.5, 120.0), record("tests/test_b.py::test_4", "gw1", 120.0, 125.0)]}))
    assert slow_audit.worker_finishes(slow_audit.read_items(run)) == [("gw1", 2, 24.5, 24.5, 25.0), ("gw0", 2, 40.0, 40.0, 40.0)]
    assert slow_audit.largest_groups(slow_audit.read_items(run)) == [("lora-7b", 2, 40.0)]
    capsys.readouterr()
    assert slow_audit.main([str(run), "--workers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gw1") and "idle  15.0 s before the last worker" in out[0] and "idle   0.0 s" in out[1]
    assert out[2] == "group lora-7b: 2 items, 40.0 wall s"
    old = tmp_path / "old.json"  # a file from before workers were recorded: one line, exit 2
    old.write_text(json.dumps({"items": [{"nodeid": "tests/test_a.py::test_1", "wall_s": {"call": 1.0}}]}))
    assert slow_audit.main([str(old), "--workers"]) == 2
    assert "no item carries its worker and times" in capsys.readouterr().err
