"""`resacct verify` starts the gloo launches claims wait for once the claims are collected, in one
background thread, one launch at a time (issue 34); a timed claim waits until none runs."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from resacct.errors import ResacctError
from resacct.harness.registry import Check, Outcome
from resacct.measurement.memo import MEMO_VARIABLE, shared_measurement, start_in_background, wait_for_background


def _gated() -> tuple[list[int], threading.Event, object]:
    """A measurement that records its calls and, for input 1, blocks until the gate opens."""
    calls: list[int] = []
    gate = threading.Event()

    @shared_measurement
    def launch(size: int) -> dict[str, int]:
        calls.append(size)
        if size == 1:
            assert gate.wait(10)
        return {"bytes": size * 10}

    return calls, gate, launch


def test_a_queued_launch_runs_once_in_the_background_and_its_caller_gets_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, gate, launch = _gated()
    assert start_in_background(launch, 2) is True
    assert start_in_background(launch, 2) is False  # queued already
    wait_for_background()
    assert calls == [2]
    assert launch(2) == {"bytes": 20} and calls == [2]  # type: ignore[operator]
    assert launch.memo_stats().hits == 1 and launch.memo_stats().misses == 1  # type: ignore[attr-defined]


def test_launches_run_one_at_a_time_and_a_caller_takes_its_own_out_of_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two launches at once oversubscribe the cores; so the second waits its turn, and a claim that needs
    it before its turn measures it itself, once."""
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, gate, launch = _gated()
    start_in_background(launch, 1)  # blocks the background thread until the gate opens
    start_in_background(launch, 3)
    for _ in range(200):
        if calls:
            break
        threading.Event().wait(0.01)
    assert calls == [1]  # the second has not started beside the first
    assert launch(3) == {"bytes": 30}  # type: ignore[operator]
    assert calls == [1, 3]
    gate.set()
    wait_for_background()
    assert calls == [1, 3]  # the queued copy was taken out, not measured again
    assert launch(1) == {"bytes": 10} and calls == [1, 3]  # type: ignore[operator]


def test_a_background_launch_that_raised_is_measured_again_by_its_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls: list[int] = []

    @shared_measurement
    def broken(size: int) -> int:
        calls.append(size)
        raise ResacctError(f"rank 1 died ({size})")

    start_in_background(broken, 4)
    wait_for_background()
    with pytest.raises(ResacctError, match=r"rank 1 died \(4\)"):  # the claim's own error, raised in the claim
        broken(4)
    assert calls == [4, 4]


def test_a_launch_shared_by_design_is_shared_under_memo_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMO_VARIABLE, "0")
    calls: list[int] = []

    @shared_measurement(switchable=False)
    def launch(size: int) -> int:
        calls.append(size)
        return size

    @shared_measurement
    def switchable(size: int) -> int:
        calls.append(-size)
        return size

    assert [launch(2), launch(2), switchable(2), switchable(2)] == [2, 2, 2, 2]
    assert calls == [2, -2, -2]
    assert start_in_background(switchable, 5) is False  # sharing off: nothing to wait for


def test_only_a_shared_measurement_can_be_started_in_the_background() -> None:
    with pytest.raises(ResacctError, match="not a shared_measurement"):
        start_in_background(lambda size: size, 3)


def test_a_check_starts_its_background_with_a_claims_inputs_and_never_raises() -> None:
    started: list[dict[str, object]] = []

    def background(world_size: int, **_: object) -> bool:
        started.append({"world_size": world_size, **_})
        return True

    def outcome(**_: object) -> Outcome:
        return Outcome(measured=1)

    check = Check("area.launch", outcome, (), "", background=background)
    assert check.start_in_background(world_size=4, engine="zero1") is True
    assert started == [{"world_size": 4, "engine": "zero1"}]
    assert check.start_in_background(engine="zero1") is False  # an input missing: the claim's own run says so
    assert Check("area.plain", outcome, (), "").start_in_background(world_size=2) is False


def test_the_launching_and_child_checks_declare_what_they_wait_for() -> None:
    from resacct.harness.registry import get_check

    for name in ("sharding.per_rank_bytes_gloo", "sharding.sharded_matches_single_process", "sharding.paper_scale_per_rank_bytes",
                 "peak_sharded.step_peak_per_rank", "peak_sharded.peak_breakdown", "parallelism.tensor_parallel_layer_saved_bytes"):
        assert get_check(name).background is not None, name


def test_verify_starts_what_collected_claims_wait_for_and_a_timed_claim_has_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    import resacct.harness.run as run
    from resacct.harness.plugin import TIMED_KEYWORD, ClaimItem

    started: list[str] = []
    quiet: list[bool] = []

    @contextlib.contextmanager
    def recording():  # type: ignore[no-untyped-def]
        quiet.append(True)
        yield

    monkeypatch.setattr(run, "_start_in_background", lambda claim: started.append(claim.measure))
    monkeypatch.setattr("resacct.measurement.background.cores_to_itself", recording)

    def item(measure: str, *, forall: dict[str, str] | None = None, marks: tuple[str, ...] = (), timed: bool = False) -> ClaimItem:
        claim = SimpleNamespace(measure=measure, forall=forall or {}, marks=list(marks), when={}, given={})
        fake = object.__new__(ClaimItem)
        fake.loaded = SimpleNamespace(claim=claim)  # type: ignore[attr-defined]
        fake.extra_keyword_matches = {TIMED_KEYWORD} if timed else set()  # type: ignore[misc]
        return fake

    plugin = run._background_plugin()
    items = [item("sharding.launch"), item("flops.law", forall={"m": "dim"}), item("perf.gpu", marks=("gpu",), timed=True), item("perf.cpu", timed=True)]
    plugin.pytest_collection_finish(SimpleNamespace(items=items))
    gpu = torch.cuda.is_available()
    assert started == ["sharding.launch", *(["perf.gpu"] if gpu else []), "perf.cpu"]  # a GPU claim only where one is
    for each in items:
        wrapper = plugin.pytest_runtest_call(each)
        next(wrapper)
        with pytest.raises(StopIteration):
            wrapper.send(None)
    assert len(quiet) == (2 if gpu else 1)  # the timed claims that run here have the cores; the others do not ask


def test_a_timed_claim_waits_for_the_running_batch_and_none_starts_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.measurement.background import cores_to_itself

    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    calls, gate, launch = _gated()
    start_in_background(launch, 1)  # running, until the gate opens
    for _ in range(200):
        if calls:
            break
        threading.Event().wait(0.01)
    entered = threading.Event()
    leave = threading.Event()

    def timed_claim() -> None:
        with cores_to_itself():
            entered.set()
            assert leave.wait(10)

    claim = threading.Thread(target=timed_claim)
    claim.start()
    assert not entered.wait(0.3)  # the running launch first
    gate.set()
    assert entered.wait(10)
    start_in_background(launch, 6)
    threading.Event().wait(0.3)
    assert calls == [1]  # queued behind the timed claim
    leave.set()
    claim.join()
    wait_for_background()
    assert calls == [1, 6]


def test_the_transformers_torch_check_parses_the_requirements_once_per_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every HF claim asks whether transformers works with this torch; parsing its ~240 requirements
    each time was 2 s of verify. What was read decides: new metadata is judged afresh."""
    import packaging.requirements

    from resacct.measurement import torch_limits

    parsed: list[str] = []

    class Counting(packaging.requirements.Requirement):
        def __init__(self, text: str) -> None:
            parsed.append(text)
            super().__init__(text)

    monkeypatch.setattr(packaging.requirements, "Requirement", Counting)
    monkeypatch.setattr(torch_limits.importlib.metadata, "version", lambda name: "5.99.1")
    monkeypatch.setattr(torch_limits.importlib.metadata, "requires", lambda name: ['torch>=2.0; extra == "torch"', "numpy>=1.17"])
    assert torch_limits.transformers_unusable() is None and torch_limits.transformers_unusable() is None
    assert parsed == ['torch>=2.0; extra == "torch"', "numpy>=1.17"]
    monkeypatch.setattr(torch_limits.importlib.metadata, "requires", lambda name: ['torch>=99; extra == "torch"'])
    assert "needs torch>=99" in (torch_limits.transformers_unusable() or "")


def test_an_in_child_measurements_queued_calls_go_to_one_child_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queued call of an ``in_child`` measurement is one batch (one child imports transformers
    once); what the child could not measure is measured again by its caller."""
    import resacct.measurement.memo as memo

    monkeypatch.delenv(MEMO_VARIABLE, raising=False)
    batches: list[list[tuple[object, ...]]] = []
    gate = threading.Event()

    def child(function: object, batch: list[object]) -> list[tuple[bool, object]]:
        assert gate.wait(10)
        batches.append([job.args for job in batch])  # type: ignore[attr-defined]
        return [(job.args != (3,), None if job.args == (3,) else 100 + job.args[0]) for job in batch]  # type: ignore[attr-defined]

    monkeypatch.setattr(memo, "_answers_from_child", child)
    here: list[int] = []

    @shared_measurement(in_child=True)
    def step(size: int) -> int:
        here.append(size)
        return size

    for size in (1, 2, 3):
        start_in_background(step, size)
    gate.set()
    wait_for_background()
    assert batches == [[(1,), (2,), (3,)]]
    assert [step(1), step(2), step(3)] == [101, 102, 3] and here == [3]  # type: ignore[operator]


def test_the_childs_program_measures_each_call_with_the_askers_threads() -> None:
    import math

    from resacct.measurement.background import measure_in_child
    from resacct.measurement.distributed import run_isolated

    answers = run_isolated(measure_in_child, math.factorial, [((5,), {}), ((-1,), {})], 1, timeout_seconds=120)
    assert answers[0] == (True, 120)
    assert answers[1][0] is False and "ValueError" in answers[1][1]
