"""``shard --device``'s tracker (fake CPU tensors) allocates as the verified recorder on meta does (issue 31).

:class:`~resacct.account.gpu.tracing.allocation_trace.AllocationRecorder` on meta tensors is the path the H200 record proves
(gqa-llama/fp32/math reserved to the byte). :class:`~resacct.account.gpu.answers.sharded_cuda.CudaShardedTracker` runs each rank
on fake **CPU** tensors: before session 25 a grouped-query call off flash ran the CPU's sdpa choice (its flash kernel: no
scores), ``_safe_softmax`` allocated one output, the mask's add a second scores block and the efficient kernel's philox
seed and offset two device blocks. Here both paths trace the same calls, and the allocator events must be the same list.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.tracing.cuda_step import sdpa_routing
from resacct.account.gpu.answers.sharded_cuda import CudaShardedTracker

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.aten, "_safe_softmax"),
                                reason="torch < 2.5: no _safe_softmax, no enable_gqa, no meta kernel for the efficient attention")
HOPPER = (9, 0)


def _events(allocator) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return [(event.action, event.size) for event in allocator.events if event.action in ("alloc", "free_completed")]


def _attention_step(kernel: str | None, kv_heads: int, device: str) -> None:
    query = torch.empty(2, 8, 64, 16, device=device, requires_grad=True)
    key_value = torch.empty(2, kv_heads, 64, 16, device=device, requires_grad=True)
    with sdpa_routing(kernel, HOPPER):
        out = torch.nn.functional.scaled_dot_product_attention(query, key_value, key_value, is_causal=True, enable_gqa=kv_heads != 8)
        out.sum().backward()


def _on_meta(kernel: str | None, kv_heads: int) -> list[tuple[str, int]]:
    recorder = AllocationRecorder(device="meta")
    with recorder:
        _attention_step(kernel, kv_heads, "meta")
    return _events(recorder.allocator)


def _on_fake_cpu(kernel: str | None, kv_heads: int) -> CudaShardedTracker:
    tracker = CudaShardedTracker()
    with FakeTensorMode(), tracker:
        tracker.mark("forward")
        _attention_step(kernel, kv_heads, "cpu")
    return tracker


@pytest.mark.parametrize(("kernel", "kv_heads", "scores_blocks"), [
    pytest.param("efficient", 2, 2, id="gqa-off-flash-falls-to-the-math-path"),
    pytest.param(None, 2, 2, id="sdpas-own-choice-is-the-math-path"),
    pytest.param("efficient", 8, 0, id="efficient-seed-and-offset-on-the-host"),
])
def test_one_attention_call_and_its_backward_allocate_the_recorders_events(kernel: str | None, kv_heads: int, scores_blocks: int) -> None:
    on_meta = _on_meta(kernel, kv_heads)
    tracker = _on_fake_cpu(kernel, kv_heads)
    assert _events(tracker.allocator) == on_meta
    scores = 2 * 8 * 64 * 64 * 4
    assert [size for action, size in on_meta if action == "alloc"].count(scores) >= scores_blocks  # the math path's scores are there
    assert ("alloc", 8) not in on_meta  # no philox seed/offset on the device
    assert not tracker.allocator.active or all(size > 0 for size in tracker.allocator.active.values())


def test_a_block_shared_by_the_in_place_mask_add_is_freed_once_both_holders_died() -> None:
    """The mask's add takes the scores' block: no third scores-sized block, the block freed once, when the later of its
    holders dies — as the recorder on meta frees it."""
    tracker = CudaShardedTracker()
    with FakeTensorMode():
        query, mask = torch.empty(1, 2, 32, 8), torch.zeros(32, 32)
        with tracker, sdpa_routing(None):
            tracker.mark("forward")
            out = torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=mask)
            del out
            events = _events(tracker.allocator)  # now: a block made from the query lives as long as it does
    recorder = AllocationRecorder(device="meta")
    query, mask = torch.empty(1, 2, 32, 8, device="meta"), torch.zeros(32, 32, device="meta")
    with recorder, sdpa_routing(None):
        out = torch.nn.functional.scaled_dot_product_attention(query, query, query, attn_mask=mask)
        del out
    scores = 2 * 32 * 32 * 4
    assert events == _events(recorder.allocator)
    assert events.count(("alloc", scores)) == events.count(("free_completed", scores)) == 2  # the scores (mask added in), softmax's output
    assert scores not in [block.size for block in tracker.allocator.active.values()]  # both holders died: the block went back


@pytest.mark.slow  # two traces of a 2-layer Llama step (~2 CPU s)
def test_a_gqa_llama_step_off_flash_predicts_the_recorders_peaks() -> None:
    """A whole fp32 training step of a grouped-query Llama on an H100 (efficient routing, every call falls to the math
    path): the sharded tracker's start, allocated and reserved peaks are :func:`predict_cuda_step_memory`'s."""
    pytest.importorskip("transformers")
    from resacct.account.gpu.tracing.cuda_step import cuda_adamw, predict_cuda_step_memory
    from resacct.account.gpu.answers.sharded_cuda import _step_counts
    from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step
    from tests.fixtures_hf_models import tiny_llama

    def loss(model, batch):  # type: ignore[no-untyped-def]
        return model(input_ids=batch, labels=batch).loss

    tokens = torch.zeros(2, 32, dtype=torch.long)
    predicted = predict_cuda_step_memory(tiny_llama().to("meta"), tokens, loss, attention="efficient", capability=HOPPER)
    tracker = CudaShardedTracker()
    with FakeTensorMode():
        net, fake_tokens = tiny_llama(), torch.zeros(2, 32, dtype=torch.long)
        with tracker, sdpa_routing("efficient", HOPPER) as routing:
            tracker.classify(list(net.parameters()), "parameters")
            tracker.classify(list(net.buffers()), "buffers")  # the rotary embedding's inverse frequencies
            tracker.classify([fake_tokens], "inputs")
            optimizer = cuda_adamw(list(net.parameters()))
            make_optimizer_state(net, optimizer)
            tracker.on_host(_step_counts(optimizer))
            run_training_step(net, fake_tokens, loss, optimizer, tracker.mark)
    assert routing.math_calls == routing.calls == 2
    assert tracker.window is not None
    assert (tracker.window[0], tracker.allocator.peak_allocated_bytes, tracker.allocator.peak_reserved_bytes) == (
        predicted.start_allocated_bytes, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes)


def _branches_backward(device: str) -> None:
    first, second = torch.nn.Linear(64, 64, bias=False, device=device), torch.nn.Linear(64, 64, bias=False, device=device)
    x = torch.empty(16, 64, device=device, requires_grad=True)
    (first(x) + second(x)).sum().backward()


def test_autograd_sums_a_second_gradient_into_the_first_in_place_as_the_recorder_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """x's two gradients meet in autograd's buffer, which alone holds the first: a GPU adds the second into it (no block
    for the sum). The tracker on fake CPU tensors measures its own use counts for that (sharded_cuda.tracker_sole_counts)
    and gives the allocator the recorder-on-meta's events; with the sum out of place it would make one more block."""
    from resacct.account.gpu.answers import sharded_cuda

    recorder = AllocationRecorder(device="meta")
    with recorder:
        _branches_backward("meta")

    def on_fake_cpu() -> list[tuple[str, int]]:
        tracker = CudaShardedTracker()
        with FakeTensorMode(), tracker:
            tracker.mark("forward")
            _branches_backward("cpu")
        return _events(tracker.allocator)

    assert sharded_cuda.tracker_sole_counts() is not None
    in_place = on_fake_cpu()
    assert in_place == _events(recorder.allocator)
    monkeypatch.setattr(sharded_cuda, "tracker_sole_counts", lambda: None)  # as before session 27: every sum out of place
    out_of_place = on_fake_cpu()
    assert out_of_place.count(("alloc", 16 * 64 * 4)) == in_place.count(("alloc", 16 * 64 * 4)) + 1
