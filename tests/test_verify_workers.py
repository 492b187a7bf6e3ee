"""``resacct verify --workers N`` (issue 34): the claims on forked workers, one area per process,
the timed and thread-dependent claims alone afterwards in the parent, and a report equal to the one
a single process writes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from resacct.cli import main
from resacct.harness import registry
from resacct.harness.registry import Check, Outcome
from resacct.reporting import load_report

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"


def _claims(area: str, *claims: tuple[str, str, str]) -> str:
    lines = [f"area: {area}", 'source: test — "workers"', "claims:"]
    for claim_id, measure, given in claims:
        lines += [f"  - id: {claim_id}", f"    says: {claim_id}.", f"    measure: {measure}", f"    given: {given}", "    expect: {at_least: 0}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def logged_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three checks that log, to a file, the process, its torch threads and the time of each call:
    ``workers.shared`` measures through one memoised function (a line per real measurement),
    ``workers.plain`` measures nothing shared, ``workers.timed`` is a timing check."""
    from resacct.measurement.memo import shared_measurement

    log = tmp_path / "log.jsonl"

    def write(kind: str, **extra: object) -> None:
        with log.open("a") as file:
            file.write(json.dumps({"kind": kind, "pid": os.getpid(), "threads": torch.get_num_threads(), "at": time.monotonic(), **extra}) + "\n")

    @shared_measurement
    def measured_once(size: int) -> int:
        write("measurement", size=size)
        time.sleep(0.05)
        return size

    def shared(size: int) -> Outcome:
        write("shared")
        return Outcome(measured=measured_once(size))

    def plain(size: int) -> Outcome:
        write("plain")
        time.sleep(0.05)
        return Outcome(measured=size)

    def timed(size: int) -> Outcome:
        write("timed")
        return Outcome(measured=float(size))

    for name, function, timing in (("workers.shared", shared, False), ("workers.plain", plain, False), ("workers.timed", timed, True)):
        monkeypatch.setitem(registry._REGISTRY, name, Check(name, function, (), "", timing=timing, evidence="measured"))
    return log


def _entries(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow  # 2.1 s (4 agents on 2 cores)
def test_one_area_runs_in_one_worker_and_timed_claims_run_alone_afterwards(tmp_path: Path, logged_checks: Path, capsys) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "alpha.claims.yaml").write_text(_claims("alpha", *[(f"alpha-{i}", "workers.shared", "{size: 3}") for i in range(4)]))
    (specs / "beta.claims.yaml").write_text(_claims("beta", *[(f"beta-{i}", "workers.plain", f"{{size: {i}}}") for i in range(4)],
                                                    ("beta-timed", "workers.timed", "{size: 1}")))
    report_dir = tmp_path / "reports"
    assert main(["verify", "--specs", str(specs), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", "-q", "--workers", "2"]) == 0
    entries = _entries(logged_checks)
    by_kind = {kind: [entry for entry in entries if entry["kind"] == kind] for kind in ("measurement", "shared", "plain", "timed")}
    assert len(by_kind["shared"]) == 4 and len(by_kind["measurement"]) == 1  # the area's claims share one measurement
    assert len({entry["pid"] for entry in by_kind["shared"] + by_kind["measurement"]}) == 1
    workers = {entry["pid"] for entry in by_kind["shared"] + by_kind["plain"]}
    assert os.getpid() not in workers and len({entry["pid"] for entry in by_kind["plain"]}) == 1
    assert all(entry["threads"] == 1 for entry in by_kind["shared"] + by_kind["plain"])  # one torch thread per worker
    timed = by_kind["timed"]
    assert timed and all(entry["pid"] == os.getpid() and entry["threads"] == torch.get_num_threads() for entry in timed)
    assert min(entry["at"] for entry in timed) > max(entry["at"] for entry in by_kind["shared"] + by_kind["plain"])  # alone: after them
    document = load_report(report_dir / "report.json")
    assert sorted(record["id"] for record in document["claims"]) == sorted([*(f"alpha-{i}" for i in range(4)), *(f"beta-{i}" for i in range(4)), "beta-timed"])


@pytest.mark.slow  # 1.8 s (4 agents on 2 cores)
def test_claims_of_a_worker_that_dies_run_in_the_parent(tmp_path: Path, logged_checks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = os.getpid()

    def dies_in_a_worker(size: int) -> Outcome:
        if os.getpid() != parent:
            os._exit(9)
        return Outcome(measured=size)

    monkeypatch.setitem(registry._REGISTRY, "workers.dies", Check("workers.dies", dies_in_a_worker, (), "", evidence="measured"))
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "alpha.claims.yaml").write_text(_claims("alpha", ("alpha-0", "workers.plain", "{size: 1}"), ("alpha-dies", "workers.dies", "{size: 2}"),
                                                     ("alpha-2", "workers.plain", "{size: 3}")))
    (specs / "beta.claims.yaml").write_text(_claims("beta", ("beta-0", "workers.plain", "{size: 4}")))
    report_dir = tmp_path / "reports"
    assert main(["verify", "--specs", str(specs), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", "-q", "--workers", "2"]) == 0
    outcomes = {record["id"]: record["outcome"] for record in load_report(report_dir / "report.json")["claims"]}
    assert outcomes == {"alpha-0": "holds", "alpha-dies": "holds", "alpha-2": "holds", "beta-0": "holds"}


def _comparable(document: dict) -> list[dict]:
    return sorted(({key: value for key, value in record.items() if key not in ("seconds", "cpu_seconds")} for record in document["claims"]), key=lambda r: r["id"])


@pytest.mark.slow  # 9.5 s (4 agents on 2 cores)
def test_a_serial_and_a_parallel_run_write_the_same_claims(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record but its seconds (wall and CPU): forall examples (derandomized, and Hypothesis' draws no longer
    depend on what the process imported before), thread-dependent values (init's variances: alone,
    with the run's threads)."""
    monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "ci")
    specs = tmp_path / "specs"
    specs.mkdir()
    for area in ("storage", "devices", "optim", "init", "tensors"):
        shutil.copy(SPECS / f"{area}.claims.yaml", specs)
    documents = []
    for workers in ("1", "2"):
        report_dir = tmp_path / f"reports-{workers}"
        main(["verify", "--specs", str(specs), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", "-q", "--workers", workers])
        documents.append(load_report(report_dir / "report.json"))
    serial, parallel = documents
    assert len(serial["claims"]) == 93 and {record["outcome"] for record in serial["claims"]} == {"holds", "refuted", "skipped"}
    assert _comparable(serial) == _comparable(parallel)
    assert serial["evidence"] == parallel["evidence"]


def test_timed_gpu_and_thread_dependent_claims_run_alone_and_areas_stay_whole() -> None:
    from resacct.harness.plugin import TIMED_KEYWORD
    from resacct.harness.workers import item_groups

    class Claim:
        def __init__(self, measure: str, given: dict) -> None:
            self.measure, self.given = measure, given

    class Item:
        def __init__(self, area: str, measure: str, given: dict | None = None, *, timed: bool = False, gpu: bool = False) -> None:
            self.loaded = type("Loaded", (), {"area": area, "claim": Claim(measure, given or {})})()
            self.extra_keyword_matches = {TIMED_KEYWORD} if timed else set()
            self.gpu = gpu

        def get_closest_marker(self, name: str) -> object:
            return object() if name == "gpu" and self.gpu else None

    items = [Item("peak", "peak.step_peak", {"model": "mlp"}), Item("perf", "perf.cpu_matmul_mfu", timed=True),
             Item("peak", "peak.step_peak", {"model": "sdpa-block"}), Item("hf", "hf.any"), Item("init", "init.deep_variance_ratio"),
             Item("peak", "peak.phase_matches"), Item("devices", "devices.x", gpu=True), Item("hf", "hf.other")]
    groups, alone = item_groups(items)
    assert alone == [items[1], items[2], items[4], items[6]]  # timed; the CPU flash kernel's scratch; init's sums; a GPU claim
    assert {group.name: group.items for group in groups} == {"hf": [items[3], items[7]], "peak": [items[0], items[5]]}
    assert [group.name for group in groups] == ["hf", "peak"]  # largest estimate first


def test_claims_a_stored_measurement_judges_count_nothing_in_their_areas_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm run (most claims replayed) schedules by what is left to measure, and so skips the shared imports."""
    from resacct.harness import workers

    class Item:
        def __init__(self, area: str, stored: bool) -> None:
            self.loaded = type("Loaded", (), {"area": area, "claim": type("Claim", (), {"measure": f"{area}.x", "given": {}})()})()
            self.extra_keyword_matches: set[str] = set()
            self.stored = stored

        def get_closest_marker(self, name: str) -> object:
            return None

    monkeypatch.setattr(workers, "will_replay", lambda item: item.stored)
    items = [Item("hf", True), Item("hf", True), Item("peak", True), Item("peak", False), Item("flops", False)]
    groups, _ = workers.item_groups(items)
    seconds = {group.name: group.seconds for group in groups}
    assert seconds == {"hf": 0.0, "peak": pytest.approx(workers.AREA_SECONDS["peak"] / 2), "flops": workers.AREA_SECONDS["flops"]}
    assert [group.name for group in groups] == ["flops", "peak", "hf"]  # flops 1.4 s, half of peak's 2.2 s
    assert sum(seconds.values()) < workers._SHARED_IMPORTS_FROM_SECONDS <= workers.AREA_SECONDS["hf"] + workers.AREA_SECONDS["peak"]


def test_a_worker_replays_a_claim_whose_measurement_is_stored_for_one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)  # the suite turns stored measurements off

    from resacct.harness import replay
    from resacct.harness.evaluate import FORALL_EXAMPLES_NOTE, forall_examples_inputs
    from resacct.harness.registry import Outcome
    from resacct.harness.workers import will_replay

    inputs = {"rows": 4, "cols": 4, "row_fraction": 0.25, "col_fraction": 0.5}

    def item(forall: dict | None = None, marks: tuple[str, ...] = ()) -> object:
        claim = type("Claim", (), {"id": "offset", "measure": "tensors.element_offset", "given": inputs, "forall": forall,
                                   "examples": None, "marks": list(marks)})()
        return type("Item", (), {"loaded": type("Loaded", (), {"claim": claim})()})()

    threads = torch.get_num_threads()
    monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "dev")
    drawn = item(forall={"rows": "dim"})
    with replay.replaying(False, folder=tmp_path):
        assert not will_replay(item())
        torch.set_num_threads(1)  # as a worker measures it
        try:
            replay.store_measurement("tensors.element_offset", inputs, Outcome(measured=6))
            monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "ci")
            assert not will_replay(drawn)  # no earlier run's note that its examples ran through
            replay.store_measurement(FORALL_EXAMPLES_NOTE, forall_examples_inputs(drawn.loaded.claim), 25)
        finally:
            torch.set_num_threads(threads)
        assert will_replay(item())  # asked from the parent, whatever its own thread count
        assert will_replay(drawn)  # its examples repeat, and ran through in an earlier run
        monkeypatch.setenv("RESACCT_HYPOTHESIS_PROFILE", "dev")
        assert not will_replay(drawn)  # new examples every run: measured
        assert not will_replay(item(marks=("gpu",)))
    assert not will_replay(item())  # a run that does not replay (pytest's)


def test_hypothesis_draws_no_constants_from_imported_modules_while_a_claims_examples_run() -> None:
    from hypothesis.internal.conjecture import providers

    from resacct.harness.pytest_settings import examples_independent_of_imports

    before = providers._get_local_constants
    with examples_independent_of_imports():
        pool = providers._get_local_constants()
        assert not (pool.integers or pool.floats or pool.strings or pool.bytes)
    assert providers._get_local_constants is before


def test_the_default_is_two_workers_on_a_linux_machine_with_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.harness import workers

    monkeypatch.setattr(workers.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(workers.sys, "platform", "linux")
    assert workers.default_workers() == 2
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 1)
    assert workers.default_workers() == 1
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(workers.sys, "platform", "darwin")  # no fork after torch's import there
    assert workers.default_workers() == 1
    monkeypatch.setattr(workers.sys, "platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA in a forked child fails: not by default
    assert workers.default_workers() == 1


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _policy() -> int:
    return os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


def _children_policies() -> dict[str, int]:
    """This process's children (verify's forked workers) and their scheduling policies, keyed by pid (as JSON keys)."""
    children = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in (task / "children").read_text().split())
    policies = {}
    for pid in children:
        with contextlib.suppress(OSError):
            policies[str(pid)] = os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK
    return policies


def _beside_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, alone: bool) -> tuple[list[dict], dict]:
    """verify over two areas of sleeping claims and one claim marked distributed (a stand-in launch of
    1 s): each logs its process, scheduling policy and times."""
    log = tmp_path / f"beside-{alone}.jsonl"

    from resacct.measurement.lifeline import forkserver_pid

    def note(kind: str, **extra: object) -> None:
        server = forkserver_pid()
        with log.open("a") as file:  # the gloo forkserver this process knows of, and whether it is still running (not a zombie)
            file.write(json.dumps({"kind": kind, "pid": os.getpid(), "policy": _policy(), "at": time.monotonic(), "forkserver": server,
                                   "forkserver_running": server is not None and _running(server), **extra}) + "\n")

    def sleeper(size: int) -> Outcome:
        note("start")
        time.sleep(0.3)
        note("end")
        return Outcome(measured=size)

    def launch(size: int) -> Outcome:
        note("launch-start", children=_children_policies())
        time.sleep(1.0)
        note("launch-end")
        return Outcome(measured=size)

    def threads(size: int) -> Outcome:
        note("threads", threads=torch.get_num_threads())
        return Outcome(measured=size)

    monkeypatch.setitem(registry._REGISTRY, "workers.threads", Check("workers.threads", threads, (), "", evidence="measured", threads_matter=True))
    monkeypatch.setitem(registry._REGISTRY, "workers.sleeper", Check("workers.sleeper", sleeper, (), "", evidence="measured"))
    monkeypatch.setitem(registry._REGISTRY, "workers.launch", Check("workers.launch", launch, (), "", evidence="measured"))
    if alone:
        monkeypatch.setenv("RESACCT_VERIFY_LAUNCHES_ALONE", "1")
    else:
        monkeypatch.delenv("RESACCT_VERIFY_LAUNCHES_ALONE", raising=False)
    specs = tmp_path / f"specs-{alone}"
    specs.mkdir()
    for area in ("alpha", "beta"):
        (specs / f"{area}.claims.yaml").write_text(_claims(area, *[(f"{area}-{i}", "workers.sleeper", f"{{size: {i}}}") for i in range(8)]))
    (specs / "ranks.claims.yaml").write_text(_claims("ranks", ("ranks-0", "workers.launch", "{size: 1}")).replace(
        "    measure: workers.launch", "    measure: workers.launch\n    marks: [distributed]"))
    (specs / "threads.claims.yaml").write_text(_claims("threads", ("threads-0", "workers.threads", "{size: 2}")))
    report_dir = tmp_path / f"reports-{alone}"
    assert main(["verify", "--specs", str(specs), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", "-q", "--workers", "2"]) == 0
    document = load_report(report_dir / "report.json")
    assert {record["outcome"] for record in document["claims"]} == {"holds"} and len(document["claims"]) == 18
    return [json.loads(line) for line in log.read_text().splitlines()], document


@pytest.mark.slow  # two verify runs of ~3 s and a forkserver
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_claims_that_launch_ranks_run_beside_the_workers_at_idle_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the workers can be brought back from idle priority, a claim that launches ranks (or depends
    on torch's thread count) and times nothing runs in the parent while the workers work at SCHED_IDLE (they get only what the ranks
    leave), and the workers are back at SCHED_OTHER afterwards; RESACCT_VERIFY_LAUNCHES_ALONE=1 runs
    it in the phase alone, after every worker's claim, as before."""
    from resacct.harness.worker_scheduling import idle_priority_returns

    if not idle_priority_returns():
        pytest.skip("this process may not bring a worker back from SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE below 20)")
    entries, document = _beside_run(tmp_path, monkeypatch, alone=False)
    (launch_start,) = [entry for entry in entries if entry["kind"] == "launch-start"]
    (launch_end,) = [entry for entry in entries if entry["kind"] == "launch-end"]
    starts = [entry for entry in entries if entry["kind"] == "start"]
    assert launch_start["pid"] == os.getpid() and launch_start["policy"] == os.SCHED_OTHER
    assert launch_end["at"] < max(entry["at"] for entry in entries if entry["kind"] == "end")  # beside the workers, not after them
    workers = {str(entry["pid"]) for entry in starts}
    assert workers and str(os.getpid()) not in workers
    # the workers at idle priority while the ranks run, as this process sees them at the launch's start (however starved
    # a loaded machine leaves them, which may mean no claim of theirs starts inside the launch's second) ...
    assert workers <= set(launch_start["children"]) and {launch_start["children"][pid] for pid in workers} == {os.SCHED_IDLE}
    # ... and whatever they logged inside it, at idle priority too
    during = [entry for entry in entries if entry["kind"] in ("start", "end") and launch_start["at"] + 0.05 < entry["at"] < launch_end["at"] - 0.05]
    assert all(entry["policy"] == os.SCHED_IDLE for entry in during)
    after = [entry for entry in starts if entry["at"] > launch_end["at"] + 0.5]
    assert after and all(entry["policy"] == os.SCHED_OTHER for entry in after)
    assert "launches and threads beside the workers" in document["run"]["phases"]
    (threads,) = [entry for entry in entries if entry["kind"] == "threads"]  # a thread-dependent claim too: here, with this process's threads
    assert threads["pid"] == os.getpid() and threads["threads"] == torch.get_num_threads()
    assert threads["at"] < max(entry["at"] for entry in entries if entry["kind"] == "end")

    entries, document = _beside_run(tmp_path, monkeypatch, alone=True)
    (launch_start,) = [entry for entry in entries if entry["kind"] == "launch-start"]
    assert launch_start["at"] > max(entry["at"] for entry in entries if entry["kind"] == "end")  # alone: after every worker's claim
    # the gloo forkserver started before the workers were forked (beside the imports they share): they inherited it, and
    # their exit left it running for the launches afterwards
    assert launch_start["forkserver"] is not None and launch_start["forkserver_running"]
    assert {entry["forkserver"] for entry in entries if entry["kind"] == "start"} == {launch_start["forkserver"]}
    assert all(entry["policy"] == os.SCHED_OTHER for entry in entries)
    assert "launches and threads beside the workers" not in document["run"]["phases"]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_idle_priority_lowers_and_restores_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.harness.worker_scheduling import idle_priority, idle_priority_returns

    monkeypatch.setenv("RESACCT_VERIFY_LAUNCHES_ALONE", "1")
    assert idle_priority_returns() is False
    monkeypatch.delenv("RESACCT_VERIFY_LAUNCHES_ALONE")
    if not idle_priority_returns():
        pytest.skip("this process may not bring a process back from SCHED_IDLE")
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    try:
        with idle_priority([pid, 2 ** 22 + 12345]):  # a pid that does not exist is passed over
            assert os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK == os.SCHED_IDLE
        assert os.sched_getscheduler(pid) == os.SCHED_OTHER
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


@pytest.mark.slow  # one verify run of ~3 s
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_a_command_job_runs_beside_the_idle_workers(tmp_path: Path, logged_checks: Path) -> None:
    """run_claims' beside_jobs (verify's step-timeline.png) run in this process while the workers work at idle priority."""
    from resacct.harness.run import run_claims
    from resacct.harness.worker_scheduling import idle_priority_returns

    if not idle_priority_returns():
        pytest.skip("this process may not bring a worker back from SCHED_IDLE")
    specs = tmp_path / "specs"
    specs.mkdir()
    for area in ("alpha", "beta"):
        (specs / f"{area}.claims.yaml").write_text(_claims(area, *[(f"{area}-{i}", "workers.plain", f"{{size: {i}}}") for i in range(12)]))
    ran: list[tuple[int, float]] = []
    run = run_claims(sorted(specs.glob("*.claims.yaml")), tmp_path / "reports", workers=2, show_progress=False,
                     beside_jobs=[lambda: ran.append((os.getpid(), time.monotonic()))])
    assert {record["outcome"] for record in run.document["claims"]} == {"holds"}
    plain = [entry for entry in _entries(logged_checks) if entry["kind"] == "plain"]
    assert ran and ran[0][0] == os.getpid() and ran[0][1] < max(entry["at"] for entry in plain)


def test_a_figure_drawn_beside_is_kept_and_one_that_failed_is_drawn_again(tmp_path: Path) -> None:
    from resacct.cli._drawn_beside import DrawnBeside

    calls: list[int] = []

    def draw() -> Path:
        calls.append(1)
        if len(calls) == 1 and failing:
            raise RuntimeError("no display")
        return tmp_path / "figure.png"

    failing = False
    drawn = DrawnBeside(draw)
    drawn()
    assert drawn.path() == tmp_path / "figure.png" and len(calls) == 1  # not drawn twice
    failing, calls[:] = True, []
    drawn = DrawnBeside(draw)
    drawn()  # fails quietly beside the claims ...
    assert drawn.path() == tmp_path / "figure.png" and len(calls) == 2  # ... and is drawn at the end, where its error would be the run's
    assert DrawnBeside(draw).path() == tmp_path / "figure.png"  # never run beside (one worker, no idle priority): drawn at the end
