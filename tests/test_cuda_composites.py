"""CUDA's allocations inside one op, traced on meta (resacct/account/gpu/tracing/cuda_composites.py), against the H200 record.

The record (docs/gpu/2026-11-30-h200-record.json.gz, torch 2.11 on the board) is the truth: its gqa-llama/fp32/math
step shows, per layer, sdpa's math path adding the mask in place and ``_safe_softmax``'s bool mask, row mask and
4-byte scalar beside one output; its efficient-attention steps show no philox seed/offset blocks. The predictions
here are made now, on meta tensors, with torch's own kernels: a test fails if the modelled form drifts from the board.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.tracing.cuda_step import sdpa_routing

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "docs" / "gpu" / "2026-11-30-h200-record.json.gz"
pytestmark = pytest.mark.skipif(not hasattr(torch.ops.aten, "_safe_softmax"),
                                reason="torch < 2.5: no _safe_softmax, no enable_gqa, no meta kernel for the efficient attention")
SCORES_BYTES = 4 * 16 * 1024 * 1024 * 4  # gqa-llama/fp32/math: batch 4, 16 query heads, 1024 × 1024 fp32 scores


def _events_after_first_segment(events: list[tuple[str, int]], size: int, count: int) -> list[tuple[str, int]]:
    start = next(index for index, (action, nbytes) in enumerate(events) if action == "segment_alloc" and nbytes == size)
    kept = [(action, nbytes) for action, nbytes in events[start:] if action in ("alloc", "free_completed")]
    return kept[:count]


def _sdpa_math_events(*, causal: bool) -> list[tuple[str, int]]:
    query = torch.empty(2, 8, 64, 16, device="meta", requires_grad=True)
    key_value = torch.empty(2, 2, 64, 16, device="meta", requires_grad=True)
    recorder = AllocationRecorder(device="meta")
    with recorder, sdpa_routing(None):
        out = torch.nn.functional.scaled_dot_product_attention(query, key_value, key_value, is_causal=causal, enable_gqa=True)
    del out
    return [(event.action, event.size) for event in recorder.allocator.events if event.action in ("alloc", "free_completed")]


def test_the_math_path_adds_the_mask_in_place_and_safe_softmax_keeps_its_temporaries_beside_one_output() -> None:
    scores = 2 * 8 * 64 * 64 * 4  # 256 KiB: the 2 × 8 heads' 64 × 64 float32 scores
    events = _sdpa_math_events(causal=True)
    assert [size for action, size in events if action == "alloc"].count(scores) == 2  # the scores and the softmax: no third (mask add out of place)
    softmax_at = [index for index, event in enumerate(events) if event == ("alloc", scores)][1]
    assert events[softmax_at:softmax_at + 9] == [
        ("alloc", scores), ("alloc", scores // 4),   # softmax's output, isneginf's bool mask
        ("alloc", 2 * 8 * 64), ("alloc", 4),          # the all-masked rows (bool, keepdim), the 0.0 scalar
        ("free_completed", 4), ("free_completed", 2 * 8 * 64), ("free_completed", scores // 4),  # C++ locals, reverse order
        ("free_completed", scores), ("alloc", 2 * 8 * 64 * 16 * 4)]  # the scores die; then attn @ V


def test_without_a_mask_no_add_takes_the_scores_block() -> None:
    events = _sdpa_math_events(causal=False)
    scores = 2 * 8 * 64 * 64 * 4
    assert [size for action, size in events if action == "alloc"].count(scores) == 2


def test_efficient_attentions_philox_seed_and_offset_stay_off_the_device() -> None:
    query = torch.empty(2, 4, 64, 32, device="meta", requires_grad=True)
    recorder = AllocationRecorder(device="meta")
    with recorder, sdpa_routing("efficient", (9, 0)):
        out = torch.nn.functional.scaled_dot_product_attention(query, query, query, is_causal=True)
    sizes = [event.size for event in recorder.allocator.events if event.action == "alloc"]
    assert sizes == [2 * 4 * 64 * 32 * 4, 2 * 4 * 64 * 4]  # the output and the float32 logsumexp (64 rows, padded to 32)
    assert out.shape == query.shape


@pytest.mark.skipif(torch.__version__ < "2.8", reason="the H200 record's predictions need flash's meta kernel (torch >= 2.8)")
def test_the_h200_gqa_math_steps_first_layer_is_the_boards_to_the_block() -> None:
    pytest.importorskip("transformers")
    from resacct.account.gpu.records.board_record import board_record_step, read_board_record
    from resacct.account.gpu.records.record_models import predict_step_of_record
    import resacct.account.gpu.tracing.allocation_trace as allocation_trace

    data = read_board_record(str(H200))
    step = board_record_step(str(H200), data, "gqa-llama/fp32/math")
    board = _events_after_first_segment([(entry[0], entry[2]) for entry in step["trace"]], SCORES_BYTES, 16)
    made: list[AllocationRecorder] = []
    enter = allocation_trace.AllocationRecorder.__enter__

    def keep(recorder: AllocationRecorder) -> AllocationRecorder:
        made.append(recorder)
        return enter(recorder)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(allocation_trace.AllocationRecorder, "__enter__", keep)
        predicted = predict_step_of_record(data, step)
    simulated = _events_after_first_segment([(event.action, event.size) for event in made[-1].allocator.events], SCORES_BYTES, 16)
    assert simulated == board
    assert predicted.peak_reserved_bytes == step["max_memory_reserved"]


def _torch_dense_rule():  # type: ignore[no-untyped-def]
    """torch's own Python form of ATen's non-overlapping-and-dense test (renamed between releases)."""
    import torch._prims_common as prims

    return getattr(prims, "is_non_overlapping_and_dense_or_false", None) or getattr(prims, "is_non_overlapping_and_dense")


@pytest.mark.parametrize("make", [
    lambda: torch.empty(4, 6), lambda: torch.empty(4, 6).t(), lambda: torch.empty(2, 3, 4).permute(2, 0, 1),
    lambda: torch.empty(4, 6)[:, :3], lambda: torch.empty(4, 1).expand(4, 5), lambda: torch.empty(1, 4, 1, 6).transpose(1, 3),
    lambda: torch.empty(8)[::2], lambda: torch.empty(()), lambda: torch.empty(3, 4).as_strided((3, 4), (1, 3)),
], ids=["contiguous", "transposed", "permuted", "sliced", "expanded", "size-one-dims", "strided", "scalar", "column-major"])
def test_the_engines_dense_rule_is_torchs(make) -> None:  # type: ignore[no-untyped-def]
    """input_buffer.cpp sums a second gradient into the first in place when the first is non-overlapping and dense (a
    transposed gradient too, where ``is_contiguous`` said no): the rule resacct applies is torch's, on every layout."""
    from resacct.account.gpu.tracing.cuda_composites import _non_overlapping_and_dense

    tensor = make()
    assert _non_overlapping_and_dense(tensor) == _torch_dense_rule()(tensor)
