"""The step peak per rank under ZeRO-1 and FSDP2 (resacct.account.peak.sharded): predicted on fake
tensors under torch's fake process group, measured on gloo ranks (resacct.checks.peak_sharded).

The first tests need no process group; the rest launch child processes (the slow, distributed
tier) and share one cached launch per (world size, model) with specs/peak_sharded.claims.yaml.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from resacct.account.peak.sharded import KINDS, ShardedStorageTracker
from resacct.account.peak.sharded_measure import first_complete
from resacct.checks import peak_sharded as checks
from resacct.errors import ResacctError
from resacct.measurement.memory_timeline import STEP_PHASES


def test_a_storage_resize_is_an_allocation_and_a_free_and_names_the_storage_a_gathered_parameter():
    """FSDP allocates and frees its unsharded parameters with UntypedStorage.resize_, which the
    dispatcher never sees: the allocator does, so the tracker must."""
    original = torch.UntypedStorage.resize_
    tracker = ShardedStorageTracker()
    with tracker:
        tracker.mark("forward")
        flat = torch.empty(1024)  # 4096 bytes
        flat.untyped_storage().resize_(0)
        assert tracker.total_bytes == 0
        flat.untyped_storage().resize_(4096)
        assert tracker.total_bytes == 4096 and tracker.bytes_by_kind["all-gathered parameters"] == 4096
        tracker.mark("end")
    assert tracker.peak_bytes == 4096
    assert torch.UntypedStorage.resize_ is original  # the patch is undone on exit
    assert "all-gathered parameters" in KINDS


def test_a_storage_freed_on_another_thread_is_reported():
    """Over real tensors a gloo worker can drop a buffer's last reference: the census counts it
    late (when that thread gets the GIL), so the measurement retries such a census."""
    tracker = ShardedStorageTracker()
    with tracker:
        tracker.mark("forward")
        box = [torch.empty(256)]
        tracker.mark("end")
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    assert tracker.bytes_freed_elsewhere == 1024


def test_first_complete_keeps_the_first_complete_record_and_gives_up_after_max_attempts(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: None)  # one rank: the minimum is its own
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    results = iter([("lost a free", 65792), ("complete", 0), ("never asked", 0)])
    assert first_complete(lambda: next(results), "record") == ("complete", 2, 65792)
    with pytest.raises(ResacctError, match=r"no complete record in 12 attempts \(8 bytes off at most\)"):
        first_complete(lambda: ("incomplete", 8), "record")


def test_an_unknown_engine_is_refused_before_anything_launches():
    with pytest.raises(ResacctError, match="engine 'zero4': expected one of zero1, zero2, fsdp2, fsdp2-bf16"):
        checks.step_peak_per_rank(engine="zero4", world_size=2, model="mlp", batch=16)
    with pytest.raises(ResacctError, match=r"engines \['fsdp3'\]: expected some of zero1, zero2, fsdp2, fsdp2-bf16"):
        checks.sharded_peak_measurements(2, "mlp", 16, 1, ("fsdp3",))


def test_where_fsdp2_cannot_be_traced_zero1_launches_alone_and_fsdp2_skips(monkeypatch):
    """torch 2.11 and 2.12: FSDP2 calls no dist.all_gather_single, whose buffers the prediction names, so FSDP2's claims
    skip; ZeRO-1 (DDP + ZeroRedundancyOptimizer) calls neither and is measured in a launch of its own."""
    import resacct.account.peak.sharded as sharded
    import resacct.account.peak.sharded_gaps as sharded_gaps
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setattr(sharded_gaps, "named_collectives_gap", lambda: "torch 2.12's FSDP2 does not call dist.all_gather_single")
    assert checks._launch_engines("zero1", 2) == checks._launch_engines("zero1", 4) == ("zero1",)
    assert checks._launch_census("zero1", 2, census=True) == ("zero1",)
    checks._require_engines(("zero1",))
    for engine in ("zero2", "fsdp2", "fsdp2-bf16"):
        with pytest.raises(NotMeasurable, match="does not call dist.all_gather_single"):
            checks._require_engines(checks._launch_engines(engine, 2))
    gather = torch.distributed.all_gather_single if hasattr(torch.distributed, "all_gather_single") else None
    tracker = ShardedStorageTracker()
    with sharded._collectives_named(tracker, 2, backend="allocator", engine="zero1"):  # nothing patched: ZeRO-1 calls neither
        assert getattr(torch.distributed, "all_gather_single", None) is gather
    with pytest.raises(ResacctError, match="does not call dist.all_gather_single"):
        with sharded._collectives_named(tracker, 2, backend="allocator", engine="fsdp2"):
            pass


def test_before_torch_2_11_zero1_is_not_traced_either_and_says_why(monkeypatch):
    """torch 2.9.1 and 2.10 (measured): the fake process group cannot broadcast fake tensors, which DDP and
    ZeroRedundancyOptimizer do: ZeRO-1's claims skip and ``resacct shard --engine zero1`` refuses in one line."""
    import resacct.account.peak.sharded as sharded
    import resacct.account.peak.sharded_gaps as sharded_gaps
    from torch.torch_version import TorchVersion

    from resacct.harness.registry import NotMeasurable

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.10.0"))
    monkeypatch.setattr(sharded_gaps, "named_collectives_gap", lambda: "torch 2.10's FSDP2 does not call dist.all_gather_single")
    assert "torch 2.10.0's fake process group cannot broadcast fake tensors" in sharded.engine_gap("zero1")
    assert set(sharded.ENGINES) == {"zero1", *sharded.FSDP_OPTIONS}  # engine_gap: every engine but ZeRO-1 is FSDP's
    with pytest.raises(NotMeasurable, match=r"expected torch 2\.11 or later|lacks what the sharded step peak runs"):  # torch 2.4: no FSDP2 at all
        checks._require_engines(checks._launch_engines("zero1", 2))
    with pytest.raises(ResacctError, match="cannot broadcast fake tensors"):
        with sharded._collectives_named(ShardedStorageTracker(), 2, backend="allocator", engine="zero1"):
            pass


def test_where_fsdp2_is_traced_every_engine_shares_the_launch(monkeypatch):
    import resacct.account.peak.sharded as sharded
    import resacct.account.peak.sharded_gaps as sharded_gaps

    monkeypatch.setattr(sharded_gaps, "named_collectives_gap", lambda: None)
    assert checks._launch_engines("zero1", 2) == tuple(checks.ENGINE_STAGES) and checks._launch_engines("zero1", 4) == ("zero1", "fsdp2")
    checks._require_engines(tuple(checks.ENGINE_STAGES))


# --- launches: fake process group + gloo ranks (slow) -----------------------------------------

#: the launches are cached per process: on the worker that runs peak_sharded.claims.yaml (--dist loadgroup), they are shared
same_worker_as_the_claims = pytest.mark.xdist_group("claims:peak_sharded.claims.yaml")
needs_fsdp2_collectives_of_torch_2_13 = pytest.mark.skipif(not hasattr(torch.distributed, "reduce_scatter_single"),
                                       reason="FSDP2's collectives of torch 2.13 (dist.reduce_scatter_single) are missing here")

#: (world size, model, batch, seq, engines): one launch each. The claims' launches (the MLP on 2 ranks,
#: every engine; on 4, ZeRO-1 and FSDP2) and a GPT with its blocks as FSDP units; bf16 there too
#: (oneDNN's matmul scratchpad).
LAUNCHES = [(2, "mlp", 16, 1, checks.LAUNCH_ENGINES[2]), (4, "mlp", 16, 1, checks.LAUNCH_ENGINES[4]),
            (2, "gpt-math", 2, 32, ("zero1", "fsdp2-bf16"))]


@pytest.mark.parametrize(("world_size", "model", "batch", "seq", "engines"), LAUNCHES, ids=["mlp-2-ranks", "mlp-4-ranks", "gpt-math-2-ranks"])
@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_each_ranks_predicted_peak_equals_the_allocator_in_every_phase(world_size, model, batch, seq, engines):
    for engine, runs in checks.sharded_peak_measurements(world_size, model, batch, seq, engines).items():
        _each_rank_exact(engine, runs, world_size)


def _each_rank_exact(engine, runs, world_size):
    assert len(runs["predicted"]) == len(runs["measured"]) == world_size
    for rank, (predicted, measured) in enumerate(zip(runs["predicted"], runs["measured"])):
        allocator = measured["allocator"]
        assert predicted["allocator"]["peak_bytes"] == allocator["peak_bytes"], (engine, rank)
        assert predicted["allocator"]["start_bytes"] == allocator["start_bytes"], (engine, rank)
        assert predicted["allocator"]["phase"] == allocator["phase"], (engine, rank)
        assert predicted["allocator"]["phase_peak_bytes"] == allocator["phase_peak_bytes"], (engine, rank)
        assert 1 <= allocator["attempts"] <= checks.MAX_ATTEMPTS


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@pytest.mark.skipif(hasattr(torch.distributed, "reduce_scatter_single") or torch.__version__ < (2, 11),
                    reason="FSDP2 is traced here (ZeRO-1 shares its launch: the test above), or ZeRO-1 is not (before torch 2.11)")
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_alone_on_a_torch_whose_fsdp2_is_not_traced_equals_the_allocator(world_size):
    """torch 2.11 and 2.12 (the tox envs): ZeRO-1's launch of its own, each rank exact; on 2 ranks its census too."""
    runs = checks.sharded_peak_measurements(world_size, "mlp", 16, 1, ("zero1",), ("zero1",) if world_size == 2 else ())["zero1"]
    _each_rank_exact("zero1", runs, world_size)


@pytest.mark.parametrize("engine", list(checks.ENGINE_STAGES))
@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_the_census_over_real_tensors_equals_the_prediction_kind_by_kind(engine):
    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)[engine]
    for predicted, measured in zip(runs["predicted"], runs["measured"]):
        census = measured["census"]
        assert 1 <= census["attempts"] <= checks.MAX_ATTEMPTS
        assert {kind: value for kind, value in predicted["census"]["bytes_by_kind"].items() if value} == \
               {kind: value for kind, value in census["bytes_by_kind"].items() if value}
        assert sum(census["bytes_by_kind"].values()) == census["peak_bytes"]
        assert set(census["phase_peak_bytes"]) == set(STEP_PHASES)


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_without_gloos_worker_thread_buffers_the_fsdp2_prediction_falls_short():
    """The census prediction leaves out what gloo allocates on its worker thread (AVG's divisor,
    the all-gather's flat copy): against the allocator it is short — the model of gloo is needed."""
    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)["fsdp2"]
    for predicted, measured in zip(runs["predicted"], runs["measured"]):
        assert predicted["census"]["peak_bytes"] < measured["allocator"]["peak_bytes"] == predicted["allocator"]["peak_bytes"]
        assert predicted["allocator"]["bytes_by_kind"]["backend buffers (gloo, DDP reducer)"] > 0


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_zero1_ranks_differ_by_their_optimizer_shards_and_fsdp2_peaks_in_backward():
    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)
    zero1 = [rank["allocator"]["peak_bytes"] for rank in runs["zero1"]["measured"]]
    shards = [rank["state"]["optimizer_state_bytes"] for rank in runs["zero1"]["measured"]]
    assert zero1[0] - zero1[1] == shards[0] - shards[1] > 0  # whole tensors per rank: rank 0 owns the larger bias
    assert [rank["allocator"]["phase"] for rank in runs["zero1"]["measured"]] == ["optimizer step"] * 2
    assert [rank["allocator"]["phase"] for rank in runs["fsdp2"]["measured"]] == ["backward"] * 2


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_this_process_never_joined_a_process_group():
    import torch.distributed as dist

    checks.sharded_peak_measurements(2, "mlp", 16, 1)
    assert not dist.is_initialized()
    assert not [child for child in multiprocessing.active_children() if child.name.startswith("resacct-rank-")]


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_zero2_keeps_every_unit_gathered_from_forward_to_backward_and_bf16_gathers_half_the_bytes():
    """reshard_after_forward=False: the whole model gathered at the forward's end (its peak); the
    bf16 policy gathers bf16 copies (half of fp32) and keeps fp32 shards and state."""
    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)
    for zero2, fsdp2, bf16 in zip(runs["zero2"]["measured"], runs["fsdp2"]["measured"], runs["fsdp2-bf16"]["measured"]):
        assert zero2["census"]["phase"] == "forward" and _gathered_bytes(zero2) == zero2["state"]["model_parameter_bytes"]
        # One unit gathered at each backward peak; which of the two kinds holds it there depends on the
        # CPU (Zen with avx512_bf16 and AVX512_CORE peak after the copy-out into the unsharded
        # parameters, AMX and AVX2 before it): a test must not hard-code one CPU's composition.
        assert _gathered_bytes(fsdp2) == fsdp2["state"]["largest_unit_bytes"] > 0
        assert _gathered_bytes(bf16) * 2 == _gathered_bytes(fsdp2)
        assert bf16["state"]["optimizer_state_bytes"] == fsdp2["state"]["optimizer_state_bytes"]
        assert bf16["state"]["parameter_bytes"] == fsdp2["state"]["parameter_bytes"]


def _gathered_bytes(rank: dict) -> int:
    """The gathered parameters live at a rank's census peak, whichever FSDP buffer holds them."""
    kinds = rank["census"]["bytes_by_kind"]
    return kinds.get("all-gather buffers", 0) + kinds.get("all-gathered parameters", 0)


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_four_zero1_ranks_are_uneven_and_four_fsdp2_ranks_equal():
    """ZeroRedundancyOptimizer gives whole tensors: the MLP's 4 tensors on 4 ranks leave two ranks a
    bias each (they peak in backward); FSDP2 splits every tensor's rows, every rank alike."""
    runs = checks.sharded_peak_measurements(4, "mlp", 16, 1, checks.LAUNCH_ENGINES[4])
    zero1 = runs["zero1"]["measured"]
    assert [rank["allocator"]["phase"] for rank in zero1] == ["optimizer step"] * 2 + ["backward"] * 2
    assert len({rank["allocator"]["peak_bytes"] for rank in runs["fsdp2"]["measured"]}) == 1
    assert max(rank["allocator"]["peak_bytes"] for rank in runs["fsdp2"]["measured"]) < min(rank["allocator"]["peak_bytes"] for rank in zero1)


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_fsdp2_collectives_of_torch_2_13
def test_without_the_census_a_rank_reports_the_same_engine_state():
    """LAUNCH_CENSUS: where no breakdown claim reads the census (4 ranks), the step peak claims' state comes from a step
    without the tracker — the same storages, measured here beside the census launch's on 2 ranks."""
    from resacct.measurement.distributed import run_on_ranks

    assert checks.LAUNCH_CENSUS[4] == () and checks._launch_census("fsdp2", 4, census=True) == ("fsdp2",)
    with_census = checks.sharded_peak_measurements(2, "mlp", 16, 1)
    without = run_on_ranks(checks.measured_on_rank, 2, ("zero1", "fsdp2"), "mlp", 16, 1, (), timeout_seconds=180)
    for engine in ("zero1", "fsdp2"):
        for measured, plain in zip(with_census[engine]["measured"], (rank[engine] for rank in without)):
            assert "census" in measured and "census" not in plain
            assert plain["state"] == measured["state"] and plain["state"]["optimizer_state_bytes"] > 0
