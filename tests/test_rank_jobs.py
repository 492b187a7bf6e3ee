"""One gloo launch per world size for the launches a run's claims will ask for (resacct.measurement.rank_jobs)."""

from __future__ import annotations

import pytest

import resacct.measurement.distributed as distributed
from resacct.measurement import rank_jobs
from resacct.measurement.distributed_group import pid_on_rank, raise_on_rank, sleep_on_rank
from resacct.measurement.rank_errors import DistributedRankError, DistributedTimeoutError
from resacct.measurement.rank_parts import DistributedPartTimeoutError


@pytest.fixture(autouse=True)
def _no_plan_left():
    rank_jobs.forget_planned_rank_jobs()
    yield
    rank_jobs.forget_planned_rank_jobs()


def _counting_launches(monkeypatch) -> list[tuple]:
    launches: list[tuple] = []
    real = distributed.run_on_ranks

    def counted(program, world_size, *args, **kwargs):
        launches.append((program.__name__, world_size))
        return real(program, world_size, *args, **kwargs)

    real_child = distributed.started_isolated

    def counted_child(program, *args, **kwargs):
        launches.append((program.__name__, 1))
        return real_child(program, *args, **kwargs)

    monkeypatch.setattr(distributed, "run_on_ranks", counted)
    monkeypatch.setattr(distributed, "started_isolated", counted_child)
    return launches


def _planner(world_size: int, tag: str, fail: bool = False):
    return [(world_size, raise_on_rank if fail else pid_on_rank, (1,) if fail else (tag,), 30.0)]


rank_jobs.plans_rank_jobs("test_rank_jobs.tagged")(_planner)
rank_jobs.plans_rank_jobs("test_rank_jobs.child")(lambda n: [rank_jobs.PlannedLaunch(2, __import__("math").factorial, (n,), 30.0, isolated=True)])


def test_the_plan_keeps_each_launch_once_in_order_and_skips_refused_inputs():
    planned = rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}), ("other.check", {"x": 1}),
                                     ("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}), ("test_rank_jobs.tagged", {"nonsense": 1}),
                                     ("test_rank_jobs.tagged", {"world_size": 4, "tag": "b"})])
    assert planned == 2
    assert rank_jobs.planned_rank_jobs() == [(2, pid_on_rank, ("a",), False), (4, pid_on_rank, ("b",), False)]
    assert rank_jobs.plan_claims([]) == 0 and rank_jobs.planned_rank_jobs() == [], "a new plan replaces the old"


def test_without_a_plan_a_launch_runs_its_program_alone(monkeypatch):
    launches = []
    monkeypatch.setattr(distributed, "run_on_ranks", lambda program, world_size, *args, **kwargs: launches.append((program, args)) or ["r0", "r1"])
    assert rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=5) == ["r0", "r1"]
    assert launches == [(pid_on_rank, ("a",))]


@pytest.mark.slow
@pytest.mark.distributed
def test_planned_launches_of_one_world_size_share_one_launch(monkeypatch):
    launches = _counting_launches(monkeypatch)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": tag}) for tag in ("a", "b", "c")]
                          + [("test_rank_jobs.tagged", {"world_size": 4, "tag": "d"})])
    b = rank_jobs.shared_rank_launch(pid_on_rank, 2, "b", timeout_seconds=30)
    a = rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)
    c = rank_jobs.shared_rank_launch(pid_on_rank, 2, "c", timeout_seconds=30)
    assert launches == [("run_rank_jobs", 2)], "one launch ran the three 2-rank programs, none for 4 ranks yet"
    assert [tag for tag, _, _ in a + b + c] == ["a", "a", "b", "b", "c", "c"] and [rank for _, rank, _ in a] == [0, 1]
    assert [pid for _, _, pid in a] == [pid for _, _, pid in b] == [pid for _, _, pid in c], "the same two processes ran them"
    assert rank_jobs.planned_rank_jobs() == [(4, pid_on_rank, ("d",), False)]
    again = rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)
    assert launches[-1] == ("pid_on_rank", 2) and [pid for _, _, pid in again] != [pid for _, _, pid in a], "a result is handed out once"
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": size, "tag": tag}) for size in (2, 4) for tag in ("a", "b")])
    assert [rank for _, rank, _ in rank_jobs.shared_rank_launch(pid_on_rank, 4, "b", timeout_seconds=30)] == [0, 1, 2, 3]
    assert [rank for _, rank, _ in rank_jobs.shared_rank_launch(pid_on_rank, 2, "b", timeout_seconds=30)] == [0, 1], "each world size its own"
    assert rank_jobs.planned_rank_jobs() == [] and launches[-2:] == [("run_rank_jobs", 4), ("run_rank_jobs", 2)]
    assert [rank for _, rank, _ in rank_jobs.shared_rank_launch(pid_on_rank, 4, "a", timeout_seconds=30)] == [0, 1, 2, 3], \
        "the program of the same arguments kept from the 2-rank launch is not the 4-rank one"
    assert [rank for _, rank, _ in rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)] == [0, 1]
    assert launches[-1] == ("run_rank_jobs", 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_child_planned_beside_a_launch_runs_with_it_and_is_handed_to_whoever_asks(monkeypatch):
    import math

    launches = _counting_launches(monkeypatch)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}), ("test_rank_jobs.child", {"n": 5}),
                           ("test_rank_jobs.child", {"n": -1})])
    rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)
    assert launches == [("factorial", 1), ("factorial", 1), ("run_rank_jobs", 2)], "both children started with the ranks"
    assert rank_jobs.planned_rank_jobs() == []
    with rank_jobs.shared_started_isolated(math.factorial, 5, timeout_seconds=30) as result:
        assert result() == 120
    assert len(launches) == 3, "its result came from the child beside the ranks"
    with pytest.raises(DistributedRankError, match="ValueError"), rank_jobs.shared_started_isolated(math.factorial, -1, timeout_seconds=30) as result:
        result()
    assert launches[-1] == ("factorial", 1), "a child that failed beside the ranks runs again for its caller: its own error"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_planned_program_costs_the_others_nothing_but_its_own_error_is_its_own(monkeypatch):
    launches = _counting_launches(monkeypatch)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}), ("test_rank_jobs.tagged", {"world_size": 2, "tag": "x", "fail": True})])
    good = rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)
    assert [tag for tag, _, _ in good] == ["a", "a"]
    assert launches == [("run_rank_jobs", 2), ("pid_on_rank", 2)], "the shared launch failed: the one asked for ran alone"
    with pytest.raises(DistributedRankError, match="raise_on_rank: rank 1 raised ValueError"):
        rank_jobs.shared_rank_launch(raise_on_rank, 2, 1, timeout_seconds=30)
    assert launches[-1] == ("raise_on_rank", 2)


def test_collected_claims_that_launch_plan_their_launches(monkeypatch):
    """start_ranks_early plans the launches of the collected claims marked distributed with fixed inputs, only those."""
    from types import SimpleNamespace

    from resacct.harness.early_ranks import start_ranks_early
    from resacct.harness.plugin import ClaimItem

    monkeypatch.setattr(distributed, "start_forkserver_early", lambda: None)

    def item(marks, given, forall=None):
        node = object.__new__(ClaimItem)
        node.get_closest_marker = lambda name: name if name in marks else None
        node.loaded = SimpleNamespace(claim=SimpleNamespace(measure="test_rank_jobs.tagged", given=given, forall=forall or {}))
        return node

    items = [item({"distributed"}, {"world_size": 2, "tag": "a"}), item({"slow"}, {"world_size": 2, "tag": "not distributed"}),
             item({"distributed"}, {"world_size": 2}, forall={"tag": "st.text()"}), item({"distributed"}, {"world_size": 4, "tag": "b"})]
    assert start_ranks_early(SimpleNamespace(config=SimpleNamespace(), items=items))
    assert rank_jobs.planned_rank_jobs() == [(2, pid_on_rank, ("a",), False), (4, pid_on_rank, ("b",), False)]


def test_claims_that_replay_a_stored_measurement_plan_no_launch(monkeypatch, tmp_path):
    """verify replaying an earlier run's measurements (resacct.harness.replay): a distributed claim whose measurement is
    stored is not planned; when every distributed claim's is, the forkserver is not even started."""
    from types import SimpleNamespace

    from resacct.harness import replay
    from resacct.harness.early_ranks import start_ranks_early
    from resacct.harness.plugin import ClaimItem
    from resacct.harness.registry import Outcome

    from resacct.measurement import lifeline

    started, stopped = [], []
    monkeypatch.setattr(distributed, "start_forkserver_early", lambda: started.append(True))
    monkeypatch.setattr(lifeline, "stop_forkserver", lambda: stopped.append(True))
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)

    def item(given, forall=None):
        node = object.__new__(ClaimItem)
        node.get_closest_marker = lambda name: name if name == "distributed" else None
        node.loaded = SimpleNamespace(claim=SimpleNamespace(measure="test_rank_jobs.tagged", given=given, forall=forall or {}))
        return node

    with replay.replaying(False, folder=tmp_path):
        replay.store_measurement("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}, Outcome(measured=1))
    with replay.replaying(False, folder=tmp_path):
        items = [item({"world_size": 2, "tag": "a"}), item({"world_size": 4, "tag": "b"})]
        assert start_ranks_early(SimpleNamespace(config=SimpleNamespace(), items=items)) and started == [True]
        assert rank_jobs.planned_rank_jobs() == [(4, pid_on_rank, ("b",), False)]
        assert not stopped
        assert not start_ranks_early(SimpleNamespace(config=SimpleNamespace(), items=items[:1])) and started == [True]
        assert stopped == [True], "a forkserver verify started first (early_ranks.start_forkserver_first) is stopped unused"
        forall = [*items[:1], item({"world_size": 2}, forall={"tag": "st.text()"})]  # launches ranks, never replayed
        assert start_ranks_early(SimpleNamespace(config=SimpleNamespace(), items=forall)) and started == [True, True]


def test_the_sharded_checks_plan_what_they_launch():
    """Each claim of the sharded areas plans the launch its check asks shared_rank_launch for (one per world size and program)."""
    from resacct.account.peak.sharded import predict_sharded_step_peaks_in_process
    from resacct.checks import parallelism, peak_sharded, sharding_plans, sharding_runs

    rank_jobs.plan_claims([("sharding.per_rank_bytes_gloo", {"engine": "zero1", "world_size": 4}),
                           ("sharding.zero1_partition_excess", {"world_size": 4}),
                           ("sharding.paper_scale_per_rank_bytes", {"zero_stage": 1, "world_size": 64}),
                           ("sharding.largest_model_on_devices", {"zero_stage": 1, "devices": 8, "device_memory_bytes": 8e10}),
                           ("peak_sharded.peak_breakdown", {"engine": "zero2", "world_size": 2, "model": "mlp", "batch": 16, "rank": 0}),
                           ("parallelism.tensor_parallel_layer_saved_bytes", {"seq": 16, "batch": 2, "hidden": 64, "heads": 4})])
    engines, beside = peak_sharded._launch_engines("zero2", 2), sharding_plans.PAPER_SCALE_BESIDE_WORLD_SIZE  # every engine this torch traces
    paper_runs = sharding_runs._paper_scale_runs(sharding_runs.PAPER_SCALE_CONFIGURATIONS)  # (64, mixed-adam) and (8, fp32-adamw): one child
    assert sharding_runs.fsdp2_cpu_gap() is not None or sharding_runs.launch_parts(4) == sharding_runs.LAUNCH_PARTS[4]
    expected = [(4, sharding_runs.sharded_training_on_rank, (sharding_runs.launch_parts(4),), False),  # FSDP2's pieces left out on torch 2.6
                (beside, sharding_runs.paper_scale_state_on_fake_ranks, (paper_runs,), True),
                (2, peak_sharded.measured_on_rank, (engines, "mlp", 16, 1, peak_sharded._launch_census("zero2", 2, True)), False),
                (2, predict_sharded_step_peaks_in_process, (engines, "mlp", 16, 1, 2, (0, 1), peak_sharded._launch_census("zero2", 2, True)), True),
                (2, parallelism.tensor_parallel_saved_bytes_on_rank, (16, 2, 64, 4, False), False)]
    sharding_ok, peak_ok = _measurable(sharding_runs._require_sharding_engines), _measurable(lambda: peak_sharded._require_engines(engines))
    runnable = [sharding_ok, sharding_ok, peak_ok, peak_ok, True]
    assert rank_jobs.planned_rank_jobs() == [launch for launch, runs in zip(expected, runnable) if runs], \
        "a torch without a sharding engine plans nothing for its claims (they skip without launching)"


def _measurable(requirement) -> bool:
    from resacct.harness.registry import NotMeasurable

    try:
        requirement()
    except NotMeasurable:
        return False
    return True


@pytest.mark.parametrize("error", [KeyboardInterrupt(), rank_jobs.DistributedUnavailableError("no gloo here")])
def test_ctrl_c_and_a_torch_without_gloo_end_a_shared_launch_without_a_second_one(monkeypatch, error):
    launches = []

    def refuse(program, world_size, *args, **kwargs):
        launches.append(program.__name__)
        raise error

    monkeypatch.setattr(distributed, "run_on_ranks", refuse)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": tag}) for tag in ("a", "b")])
    with pytest.raises(type(error)):
        rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=5)
    assert launches == ["run_rank_jobs"], "not launched again alone"


# --- each program within its own time limit; forgetting what was kept --------------------------------

rank_jobs.plans_rank_jobs("test_rank_jobs.hangs")(lambda world_size, seconds: [(world_size, sleep_on_rank, (0, 600.0), seconds)])


@pytest.mark.slow
@pytest.mark.distributed
def test_a_hung_program_in_a_shared_launch_is_stopped_within_its_own_limit(monkeypatch):
    """Before: the shared launch's limit was the sum of its programs' (30 + 1 s here; ~630 s in verify)."""
    import time

    launches = _counting_launches(monkeypatch)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"}), ("test_rank_jobs.hangs", {"world_size": 2, "seconds": 1.0}),
                           ("test_rank_jobs.tagged", {"world_size": 2, "tag": "b"})])
    started = time.monotonic()
    good = rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=30)
    assert time.monotonic() - started < 20, "the hung program was stopped after its own 1 s, not the launch's 31 s"
    assert [tag for tag, _, _ in good] == ["a", "a"] and launches == [("run_rank_jobs", 2), ("pid_on_rank", 2)]
    assert rank_jobs.planned_rank_jobs() == [(2, pid_on_rank, ("b",), False)], "the hung one launches alone when asked; the others stay planned"
    assert [tag for tag, _, _ in rank_jobs.shared_rank_launch(pid_on_rank, 2, "b", timeout_seconds=30)] == ["b", "b"]
    started = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match=r"sleep_on_rank on 2 ranks: ranks \[[0-9, ]+\] did not finish within 1 s"):
        rank_jobs.shared_rank_launch(sleep_on_rank, 2, 0, 600.0, timeout_seconds=1.0)
    assert time.monotonic() - started < 15 and launches[-2:] == [("pid_on_rank", 2), ("sleep_on_rank", 2)], "alone: its own error"


@pytest.mark.slow
@pytest.mark.distributed
def test_the_program_asked_for_that_hangs_in_a_shared_launch_times_out_once_within_its_own_limit(monkeypatch):
    import time

    launches = _counting_launches(monkeypatch)
    rank_jobs.plan_claims([("test_rank_jobs.hangs", {"world_size": 2, "seconds": 1.0}), ("test_rank_jobs.tagged", {"world_size": 2, "tag": "a"})])
    started = time.monotonic()
    with pytest.raises(DistributedPartTimeoutError, match=r"did not finish sleep_on_rank \(program 1 of 2\) within its 1 s") as error:
        rank_jobs.shared_rank_launch(sleep_on_rank, 2, 0, 600.0, timeout_seconds=1.0)
    assert time.monotonic() - started < 15 and launches == [("run_rank_jobs", 2)], "not waited for a second time alone"
    assert error.value.part == "sleep_on_rank (program 1 of 2)"
    assert rank_jobs.planned_rank_jobs() == [(2, pid_on_rank, ("a",), False)]


def test_part_deadline_outside_a_rank_does_nothing_and_refuses_a_bad_limit():
    distributed.part_deadline("a part", 1.0)  # no launcher to tell: nothing happens
    for seconds in (0, -1.0, float("inf"), True):
        with pytest.raises(distributed.DistributedError, match=rf"part 'a part': seconds {seconds!r}: expected a finite number of seconds greater than 0"):
            distributed.part_deadline("a part", seconds)


def test_forgetting_shared_measurements_forgets_the_results_a_shared_launch_kept(monkeypatch):
    from resacct.measurement.memo import forget_shared_measurements

    launches = []

    def fake_launch(program, world_size, *args, **kwargs):
        launches.append(program.__name__)
        jobs = args[0] if program is rank_jobs.run_rank_jobs else ((program, args, 1.0),)
        results = [[(job_args[0], rank, len(launches)) for _, job_args, _ in jobs] for rank in range(world_size)]
        return results if program is rank_jobs.run_rank_jobs else [ranks[0] for ranks in results]

    monkeypatch.setattr(distributed, "run_on_ranks", fake_launch)
    rank_jobs.plan_claims([("test_rank_jobs.tagged", {"world_size": 2, "tag": tag}) for tag in ("a", "b", "c")])
    rank_jobs.shared_rank_launch(pid_on_rank, 2, "a", timeout_seconds=5)
    assert rank_jobs.shared_rank_launch(pid_on_rank, 2, "b", timeout_seconds=5) == [("b", 0, 1), ("b", 1, 1)], "kept from the shared launch"
    forget_shared_measurements()
    assert rank_jobs.shared_rank_launch(pid_on_rank, 2, "c", timeout_seconds=5) == [("c", 0, 2), ("c", 1, 2)], "launched again"
    assert launches == ["run_rank_jobs", "pid_on_rank"]
