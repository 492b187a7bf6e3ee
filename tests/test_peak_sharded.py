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
from tests.sharded_engines import assert_phase_peaks_equal, fsdp2_peaks_elsewhere, needs_every_sharded_engine


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
    """A torch whose FSDP2 cannot be traced (2.6: it cannot step CPU tensors) skips FSDP2's claims and refuses ``resacct
    shard`` for it; ZeRO-1, where it can be traced, is measured in a launch of its own."""
    import resacct.account.peak.sharded_gaps as sharded_gaps
    from resacct.account.peak.sharded_collectives import collectives_named
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setattr(sharded_gaps, "fsdp_gap", lambda: "torch 2.6's FSDP2 cannot step CPU tensors")
    assert checks._launch_engines("zero1", 2) == checks._launch_engines("zero1", 4) == ("zero1",)
    assert checks._launch_census("zero1", 2, census=True) == ("zero1",)
    checks._require_engines(("zero1",))
    for engine in ("zero2", "fsdp2", "fsdp2-bf16"):
        with pytest.raises(NotMeasurable, match="cannot step CPU tensors"):
            checks._require_engines(checks._launch_engines(engine, 2))
    gather_name, _ = sharded_gaps.fsdp_collective_names()
    gather, broadcast = getattr(torch.distributed, gather_name), torch.distributed.broadcast
    tracker = ShardedStorageTracker()
    with collectives_named(tracker, 2, backend="allocator", engine="zero1"):  # ZeRO-1 gathers nothing: its broadcasts alone
        assert getattr(torch.distributed, gather_name) is gather and torch.distributed.broadcast is not broadcast
    assert torch.distributed.broadcast is broadcast
    with pytest.raises(ResacctError, match="cannot step CPU tensors"):
        with collectives_named(tracker, 2, backend="allocator", engine="fsdp2"):
            pass


def test_a_ddp_without_init_sync_leaves_zero1_untraced_and_says_why(monkeypatch):
    """torch 2.6 (measured): its DistributedDataParallel has no init_sync, which the traced ZeRO-1 step passes, and its
    FSDP2 cannot step CPU tensors: every engine's claims skip and ``resacct shard`` refuses in one line."""
    import resacct.account.peak.sharded as sharded
    import torch.nn.parallel
    from torch.torch_version import TorchVersion

    from resacct.account.peak.sharded_collectives import collectives_named
    from resacct.harness.registry import NotMeasurable

    class DistributedDataParallelOf26(torch.nn.Module):
        def __init__(self, module, device_ids=None, gradient_as_bucket_view=False):  # no init_sync
            super().__init__()

    monkeypatch.setattr(torch, "__version__", TorchVersion("2.6.0"))
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", DistributedDataParallelOf26)
    assert "torch 2.6.0's DistributedDataParallel has no init_sync" in sharded.engine_gap("zero1")
    assert "torch 2.6.0's FSDP2 cannot step CPU tensors" in sharded.engine_gap("fsdp2") and sharded.fsdp_gap() == sharded.engine_gap("zero2")
    assert set(sharded.ENGINES) == {"zero1", *sharded.FSDP_OPTIONS}  # engine_gap: every engine but ZeRO-1 is FSDP's
    for engine in sharded.ENGINES:
        with pytest.raises(NotMeasurable, match=r"expected torch 2\.7 or later|lacks what the sharded step peak runs"):  # 2.4: no FSDP2
            checks._require_engines(checks._launch_engines(engine, 2))
    with pytest.raises(ResacctError, match="has no init_sync"):
        with collectives_named(ShardedStorageTracker(), 2, backend="allocator", engine="zero1"):
            pass


def test_where_every_engine_is_traced_they_share_the_launch(monkeypatch):
    import resacct.account.peak.sharded_gaps as sharded_gaps

    monkeypatch.setattr(sharded_gaps, "fsdp_gap", lambda: None)
    monkeypatch.setattr(sharded_gaps, "engine_gap", lambda engine: None)
    assert checks._launch_engines("zero1", 2) == tuple(checks.ENGINE_STAGES) and checks._launch_engines("zero1", 4) == ("zero1", "fsdp2")
    checks._require_engines(tuple(checks.ENGINE_STAGES))


def test_fsdp2s_collectives_are_named_under_the_names_this_torch_calls():
    """FSDP2 calls dist.all_gather_single / reduce_scatter_single from torch 2.13, all_gather_into_tensor /
    reduce_scatter_tensor before: the names patched are those its collectives module calls."""
    import inspect

    from resacct.account.peak.sharded_gaps import fsdp_collective_names

    _fsdp_collectives = pytest.importorskip("torch.distributed.fsdp._fully_shard._fsdp_collectives",
                                            reason=f"torch {torch.__version__} has no FSDP2 (fully_shard)")

    source = inspect.getsource(_fsdp_collectives)
    gather, scatter = fsdp_collective_names()
    assert f"dist.{gather}(" in source and f"dist.{scatter}(" in source


def test_a_collective_torch_cannot_run_on_fake_tensors_returns_as_the_fake_groups_does():
    """torch <= 2.10: FakeTensorMode raises UnsupportedOperatorException for c10d's collectives (no fake kernel); the call
    then returns as the fake group's does (None, or a finished work for async_op), and every later fake call at once.
    Anything else is torch's: a real tensor's call, another operator's error."""
    from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException

    from resacct.account.peak.sharded_collectives import _FakeCollectives

    calls = []

    def no_fake_kernel(*args, **kwargs):
        calls.append(kwargs)
        raise UnsupportedOperatorException(torch.ops.c10d._allgather_base_.default)

    real = torch.zeros(4)
    with FakeTensorMode():
        fake_tensor = torch.empty(4)
    stand_in = _FakeCollectives(always=False)
    assert stand_in(lambda *args, **kwargs: "torch's", real, real, async_op=False) == "torch's"
    assert stand_in(no_fake_kernel, fake_tensor, fake_tensor) is None and stand_in.standing_in and len(calls) == 1
    work = stand_in(no_fake_kernel, fake_tensor, fake_tensor, async_op=True)
    assert work.wait() is True and work.is_completed() and len(calls) == 1  # stood in at once: torch is not asked again
    with pytest.raises(UnsupportedOperatorException):  # not c10d's: torch's own error
        _FakeCollectives(always=False)(lambda *a, **k: (_ for _ in ()).throw(UnsupportedOperatorException(torch.ops.aten.add.Tensor)),
                                       fake_tensor, fake_tensor)
    with pytest.raises(UnsupportedOperatorException):  # a real tensor's error is never stood in for
        _FakeCollectives(always=False)(no_fake_kernel, real, real)


# --- launches: fake process group + gloo ranks (slow) -----------------------------------------

#: the launches are cached per process: on the worker that runs peak_sharded.claims.yaml (--dist loadgroup), they are shared
same_worker_as_the_claims = pytest.mark.xdist_group("claims:peak_sharded.claims.yaml")


#: (world size, model, batch, seq, engines): one launch each. The claims' launches (the MLP on 2 ranks,
#: every engine; on 4, ZeRO-1 and FSDP2) and a GPT with its blocks as FSDP units; bf16 there too
#: (oneDNN's matmul scratchpad).
LAUNCHES = [(2, "mlp", 16, 1, checks.LAUNCH_ENGINES[2]), (4, "mlp", 16, 1, checks.LAUNCH_ENGINES[4]),
            (2, "gpt-math", 2, 32, ("zero1", "fsdp2-bf16"))]


def _broadcast_coalesced_ops():
    """In a child, under the fake group and FakeTensorMode: the ops (less ``prim.device``) of torch's own
    ``dist._broadcast_coalesced`` over three buffers of two dtypes, and of resacct's stand-in for what surrounds its broadcasts."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from resacct.account.peak.sharded_collectives import _coalesced_around_the_broadcast

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is not torch.ops.prim.device.default:
                self.seen.append((str(func), tuple(out.shape) if isinstance(out, torch.Tensor) else None))
            return out

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with FakeTensorMode():
            buffers = [torch.ones(1000), torch.ones(10), torch.ones(7, dtype=torch.float64)]
            with Ops() as by_torch:
                dist._broadcast_coalesced(dist.group.WORLD, buffers, 250 * 2**20, 0)
            with Ops() as stood_in:
                _coalesced_around_the_broadcast(buffers, 250 * 2**20)
    finally:
        dist.destroy_process_group()
    return by_torch.seen, stood_in.seen


@pytest.mark.slow  # 4.1 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_ddps_buffer_broadcast_stood_in_for_makes_torchs_flat_buffers():
    """DDP broadcasts its module's buffers each forward with dist._broadcast_coalesced: chunks flattened (a cat), broadcast,
    copied back. Where torch cannot run the broadcast on fake tensors (<= 2.10) resacct does the rest itself: the same ops
    in the same order as torch's own call, less the broadcasts."""
    if torch.__version__ < (2, 11):
        pytest.skip(f"torch {torch.__version__} cannot run the fake group's broadcast on fake tensors: nothing to compare with")
    from resacct.measurement.distributed import run_isolated

    by_torch, stood_in = run_isolated(_broadcast_coalesced_ops, timeout_seconds=120)
    assert ("aten.cat.default", (1010,)) in stood_in and [op for op in by_torch if not op[0].startswith("c10d.")] == stood_in


def _predicted_with_and_without_stand_ins(engines):
    """In a child: each engine's predictions (both ranks, allocator and census) with torch's fake collectives and with every
    one stood in for; and how often torch's own gathered, reduce-scattered and broadcast in each."""
    import torch.distributed as dist

    from resacct.account.peak.sharded import build_peak_model, predict_rank_summaries
    from resacct.account.peak.sharded_gaps import fsdp_collective_names

    calls = {"stand_in": 0, "torch": 0}
    mode = ["torch"]
    for name in (*fsdp_collective_names(), "broadcast", "_broadcast_coalesced"):
        def counted(*args, __collective=getattr(dist, name), **kwargs):
            calls[mode[0]] += 1
            return __collective(*args, **kwargs)

        setattr(dist, name, counted)
    model, inputs, loss_fn = build_peak_model("mlp", 16, 1)
    model.register_buffer("scale", torch.ones(1000))  # DDP broadcasts it each forward (dist._broadcast_coalesced)
    results = {}
    for engine in engines:
        mode[0] = "torch"
        by_torch = predict_rank_summaries(model, inputs, loss_fn, engine, 2, (0, 1), backends=("allocator", "census"))
        mode[0] = "stand_in"
        stood_in = predict_rank_summaries(model, inputs, loss_fn, engine, 2, (0, 1), backends=("allocator", "census"), stand_in=True)
        results[engine] = (by_torch, stood_in)
    return results, calls


@pytest.mark.slow  # one child, 16 fake steps: ~15 s
@needs_every_sharded_engine
def test_a_step_with_every_fake_collective_stood_in_for_predicts_torchs_own_bytes():
    """Where torch runs the fake group's collectives on fake tensors (2.11 on), standing in for every one of them — what
    torch 2.10 and older need (resacct.account.peak.sharded_collectives) — gives each engine's prediction, every rank's
    allocator and census summary, unchanged: the collectives allocate nothing a stand-in leaves out."""
    if torch.__version__ < (2, 11):
        pytest.skip(f"torch {torch.__version__} cannot run the fake group's collectives on fake tensors: nothing to compare with")
    from resacct.account.peak.sharded import ENGINES
    from resacct.measurement.distributed import run_isolated

    results, calls = run_isolated(_predicted_with_and_without_stand_ins, tuple(ENGINES), timeout_seconds=300)
    assert calls["torch"] > 0 and calls["stand_in"] == 0, calls  # the stand-ins were taken: torch's collectives never called
    for engine, (by_torch, stood_in) in results.items():
        assert stood_in == by_torch, engine
        assert by_torch[0]["allocator"]["peak_bytes"] > 0


@pytest.mark.parametrize(("world_size", "model", "batch", "seq", "engines"), LAUNCHES, ids=["mlp-2-ranks", "mlp-4-ranks", "gpt-math-2-ranks"])
@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_every_sharded_engine
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
        assert_phase_peaks_equal(predicted["allocator"]["phase_peak_bytes"], allocator["phase_peak_bytes"], engine)
        assert 1 <= allocator["attempts"] <= checks.MAX_ATTEMPTS


@pytest.mark.parametrize("engine", list(checks.ENGINE_STAGES))
@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_every_sharded_engine
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
@needs_every_sharded_engine
def test_without_gloos_worker_thread_buffers_the_fsdp2_prediction_falls_short():
    """The census prediction leaves out what gloo allocates on its worker thread (AVG's divisor,
    the all-gather's flat copy): against the allocator it is short — the model of gloo is needed. Before torch 2.9 gloo
    makes no divisor, and nothing of its worker thread's is live at the peak: there the census is the allocator's peak."""
    from resacct.account.peak.sharded_collectives import gloo_divides_for_avg

    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)["fsdp2"]
    for predicted, measured in zip(runs["predicted"], runs["measured"]):
        assert measured["allocator"]["peak_bytes"] == predicted["allocator"]["peak_bytes"]
        if gloo_divides_for_avg():
            assert predicted["census"]["peak_bytes"] < measured["allocator"]["peak_bytes"]
            assert predicted["allocator"]["bytes_by_kind"]["backend buffers (gloo, DDP reducer)"] > 0
        else:
            assert predicted["census"]["peak_bytes"] == measured["allocator"]["peak_bytes"]


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_every_sharded_engine
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
@needs_every_sharded_engine
def test_this_process_never_joined_a_process_group():
    import torch.distributed as dist

    checks.sharded_peak_measurements(2, "mlp", 16, 1)
    assert not dist.is_initialized()
    assert not [child for child in multiprocessing.active_children() if child.name.startswith("resacct-rank-")]


@pytest.mark.distributed
@same_worker_as_the_claims
@pytest.mark.slow
@needs_every_sharded_engine
def test_zero2_keeps_every_unit_gathered_from_forward_to_backward_and_bf16_gathers_half_the_bytes():
    """reshard_after_forward=False: the whole model gathered at the forward's end (its peak); the
    bf16 policy gathers bf16 copies (half of fp32) and keeps fp32 shards and state."""
    runs = checks.sharded_peak_measurements(2, "mlp", 16, 1)
    for zero2, fsdp2, bf16 in zip(runs["zero2"]["measured"], runs["fsdp2"]["measured"], runs["fsdp2-bf16"]["measured"]):
        assert zero2["census"]["phase"] == "forward" and _gathered_bytes(zero2) == zero2["state"]["model_parameter_bytes"]
        # One unit gathered at each backward peak; which of the two kinds holds it there depends on the
        # CPU (Zen with avx512_bf16 and AVX512_CORE peak after the copy-out into the unsharded
        # parameters, AMX and AVX2 before it): a test must not hard-code one CPU's composition.
        if fsdp2_peaks_elsewhere():  # torch 2.12: no layer gathered at FSDP2's peak, with or without the bf16 policy
            assert _gathered_bytes(fsdp2) == _gathered_bytes(bf16) == 0
        else:
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
@needs_every_sharded_engine
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
@needs_every_sharded_engine
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
