"""The measured step of a recorded process is the last warm-up step's allocator calls replayed (steady_replay): the same
events, peaks, segments, ops and op labels as the step traced, and traced where the logged step was not closed."""

from __future__ import annotations

import pytest
import torch

from resacct.account.gpu.allocator.cuda_allocator import CachingAllocatorModel
from resacct.account.gpu.records.steady_replay import SteadyStepLog
from resacct.measurement.torch_limits import GQA_FLOPS_LIMIT, gqa_attention_flops_countable

# torch 2.8 to 2.11's FLOP counter asserts on grouped-query attention: these trace a grouped-query model's FLOPs (docs/matrix.md)
needs_gqa_flops = pytest.mark.skipif(not gqa_attention_flops_countable(), reason=GQA_FLOPS_LIMIT)

H200_RECORD = "docs/gpu/2026-11-30-h200-record.json.gz"


def _events(allocator: CachingAllocatorModel) -> list[tuple[str, int, int]]:
    return [(event.action, event.addr, event.size) for event in allocator.events]


def _step(allocator: CachingAllocatorModel, sink: object, first_owner: int) -> None:
    """A step's calls: blocks made and freed in an order that splits, reuses and grows segments."""
    sizes = [3 << 20, 700, 25 << 20, 1 << 20, 512, 9 << 20]
    for index, size in enumerate(sizes):
        sink.malloc(first_owner + index, size)  # type: ignore[attr-defined]
        if index % 2:
            sink.free(first_owner + index - 1)  # type: ignore[attr-defined]
    for index in range(1, len(sizes), 2):
        sink.free(first_owner + index)  # type: ignore[attr-defined]


class _Both:
    """Calls made on the allocator and logged, as recorded_history's ``_logged`` does."""

    def __init__(self, allocator: CachingAllocatorModel, log: SteadyStepLog) -> None:
        self.allocator, self.log = allocator, log

    def malloc(self, owner: int, size: int, stream: int = 0) -> None:
        self.log.malloc(owner, size, stream)
        self.allocator.malloc(owner, size, stream)

    def free(self, owner: int) -> None:
        self.log.free(owner)
        self.allocator.free(owner)


def test_a_closed_steps_calls_replayed_give_the_events_the_step_itself_gives() -> None:
    traced, replayed = CachingAllocatorModel(), CachingAllocatorModel()
    for allocator in (traced, replayed):
        allocator.malloc("kept", 40 << 20)  # a parameter held through every step
        _step(allocator, allocator, 0)  # the first step: segments made
    log = SteadyStepLog()
    for allocator in (traced, replayed):
        _step(allocator, _Both(allocator, log) if allocator is replayed else allocator, 100)  # the logged step
    assert log.closed() and len(log.calls) == 12
    _step(traced, traced, 200)
    log.replay(replayed, iter(range(10**6)))
    assert _events(replayed) == _events(traced) and replayed.reserved_bytes == traced.reserved_bytes
    assert replayed.peak_allocated_bytes == traced.peak_allocated_bytes and replayed.allocated_bytes == traced.allocated_bytes == 40 << 20


def test_a_step_that_frees_an_older_block_or_keeps_one_is_not_closed() -> None:
    frees_older, keeps = SteadyStepLog(), SteadyStepLog()
    frees_older.malloc(1, 512)
    frees_older.free(1)
    frees_older.free("made before")
    keeps.malloc(1, 512)
    assert not frees_older.closed() and not keeps.closed()
    keeps.free(1)
    assert keeps.closed()


def test_a_replay_labels_each_event_with_the_op_that_made_it() -> None:
    log, allocator = SteadyStepLog(), CachingAllocatorModel()
    log.op_names.append("mm")
    log.malloc(1, 4096)
    log.op_names.extend(["view", "add"])  # a view makes no call: no label of its own
    log.malloc(2, 4096)
    log.free(1)
    starts: list[tuple[int, str]] = []
    log.replay(allocator, iter(range(10)), starts)
    assert [name for _, name in starts] == ["mm", "add"] and starts[0][0] == 0
    assert [event.action for event in allocator.events][starts[1][0]:] == ["alloc", "free_requested", "free_completed"]
    assert set(allocator.active) == {("steady replay", 1)}  # fresh owners, never the logged step's own


def test_a_replayed_free_of_a_block_the_log_never_made_is_an_error() -> None:
    with pytest.raises(KeyError):
        SteadyStepLog(calls=[("free", 7, -1)]).replay(CachingAllocatorModel(), iter(range(10)))


def _both_ways(name: str) -> tuple[object, object, list, list, list, list]:
    from resacct.account.gpu.records.board_record import board_record_step, read_board_record
    from resacct.account.gpu.records.record_models import predict_step_of_record

    data = read_board_record(H200_RECORD)
    step = board_record_step(H200_RECORD, data, name)
    out = []
    for replay in (False, True):
        ops: list = []
        window: list = []
        out.append((predict_step_of_record(data, step, ops=ops, window=window, replay=replay), ops, window))
    (traced, traced_ops, traced_window), (replayed, replayed_ops, replayed_window) = out
    return traced, replayed, traced_ops, replayed_ops, traced_window, replayed_window


def _assert_the_same(name: str) -> None:
    traced, replayed, traced_ops, replayed_ops, traced_window, replayed_window = _both_ways(name)
    for field in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_requested_bytes", "start_allocated_bytes", "start_reserved_bytes",
                  "live_at_peak_bytes", "segments", "attention"):
        assert getattr(replayed, field) == getattr(traced, field), field
    assert [(op.op, op.flops, op.bytes, op.kernel) for op in replayed_ops] == [(op.op, op.flops, op.bytes, op.kernel) for op in traced_ops]
    assert replayed_window == traced_window and len(traced_window) > 1000


@needs_gqa_flops
@pytest.mark.slow  # two predictions of a recorded process (~1 CPU s)
@pytest.mark.skipif(torch.__version__ < "2.8", reason="the H200 record's predictions need flash's meta kernel (torch >= 2.8)")
def test_the_replayed_measured_step_of_a_recorded_mixture_of_experts_is_the_traced_one() -> None:
    pytest.importorskip("transformers")
    _assert_the_same("mixtral-small/bf16/grouped_mm-experts")


@needs_gqa_flops
@pytest.mark.slow  # every recorded step predicted twice (~30 CPU s)
@pytest.mark.skipif(torch.__version__ < "2.8", reason="the H200 record's predictions need flash's meta kernel (torch >= 2.8)")
def test_every_recorded_steps_measured_step_replayed_is_the_traced_one() -> None:
    pytest.importorskip("transformers")
    from resacct.account.gpu.records.board_record import read_board_record

    for step in read_board_record(H200_RECORD)["steps"]:
        if "ops" in step:
            _assert_the_same(step["name"])


def test_a_step_that_is_not_closed_is_traced_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the logged step was not closed the measured step is traced: the replay is never called."""
    from resacct.account.gpu.records import steady_replay
    from resacct.account.gpu.records.record_models import predict_record_step

    replayed: list[bool] = []
    monkeypatch.setattr(steady_replay.SteadyStepLog, "closed", lambda self: False)
    monkeypatch.setattr(steady_replay.SteadyStepLog, "replay", lambda self, *args: replayed.append(True))
    predicted = predict_record_step(TINY_STEP, dry_run=True)
    assert not replayed and predicted.peak_reserved_bytes >= predicted.peak_allocated_bytes > 0


TINY_STEP = {"name": "tiny", "family": "resacct", "recipe": "fp32", "attention": "math", "batch": 2, "seq": 16,
             "model_config": {"vocab_size": 64, "context_length": 16, "n_layers": 2, "n_heads": 2, "d_model": 32, "mlp_ratio": 4, "attention": "math"}}


@pytest.mark.parametrize("recipe", ["fp32", "bf16-autocast", "bf16-fp32-master"])
def test_a_tiny_recorded_steps_measured_step_replayed_is_the_traced_one(recipe: str) -> None:
    from resacct.account.gpu.records.record_models import predict_record_step

    step = {**TINY_STEP, "recipe": recipe}
    runs = []
    for replay in (False, True):
        ops: list = []
        window: list = []
        runs.append((predict_record_step(step, dry_run=False, capability="9.0", ops=ops, window=window, multiprocessors=132, replay=replay), ops, window))
    (traced, traced_ops, traced_window), (replayed, replayed_ops, replayed_window) = runs
    assert (replayed.peak_allocated_bytes, replayed.peak_reserved_bytes, replayed.live_at_peak_bytes, replayed.segments) == (
        traced.peak_allocated_bytes, traced.peak_reserved_bytes, traced.live_at_peak_bytes, traced.segments)
    assert [(op.op, op.flops, op.bytes) for op in replayed_ops] == [(op.op, op.flops, op.bytes) for op in traced_ops] and traced_ops
    assert replayed_window == traced_window and any(action == "alloc" for action, _, _ in traced_window)
