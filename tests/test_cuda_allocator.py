"""The CUDA caching allocator model (resacct/account/gpu/allocator/cuda_allocator.py) against truth:

- the committed record of a real board (docs/gpu/2026-11-26-h100-80gb-hbm3.json): every
  ``memory_allocated()`` growth its gpu claims measured, reproduced by the model;
- the allocator's behaviour as c10/cuda/CUDACachingAllocator.cpp and PyTorch's "CUDA semantics"
  notes document it (each test names the rule), case by case;
- properties that must hold for any sequence of allocations and frees (hypothesis).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.account.gpu.allocator.cuda_allocator import (
    KLARGE_BUFFER_BYTES,
    KSMALL_BUFFER_BYTES,
    AllocatorConfig,
    CachingAllocatorModel,
    CudaOutOfMemory,
    round_size,
)
from resacct.errors import ResacctError

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "gpu" / "2026-11-26-h100-80gb-hbm3.json"
MiB = 2**20

#: the gpu claims of the committed H100 record that measured memory_allocated() growth: claim id → the float32 tensors made
_ALLOCATED_CLAIMS = {
    "two-32x32-on-gpu-allocate-8192-bytes": [32 * 32 * 4] * 2,
    "small-gpu-tensors-round-to-512-bytes": [3 * 3 * 4],
    "lecture-4x8-float32-gpu-takes-512-byte-block": [4 * 8 * 4] * 2,
    "lecture-gpu-one-float-allocates-512-bytes": [4],
    "lecture-gpu-4000-bytes-round-to-4096": [1000 * 4],
}


@pytest.mark.parametrize("claim_id", sorted(_ALLOCATED_CLAIMS))
def test_model_reproduces_the_h100_records_allocated_growth(claim_id: str) -> None:
    """Proven on a real board: the H100 run of 2026-11-26 measured these growths of memory_allocated()."""
    claims = {c["id"]: c for c in json.loads(RECORD.read_text())["gpu_claims"]}
    measured = claims[claim_id]["measured"]
    model = CachingAllocatorModel()
    for index, nbytes in enumerate(_ALLOCATED_CLAIMS[claim_id]):
        model.malloc(index, nbytes)
    assert model.allocated_bytes == measured


def test_small_requests_share_a_2_mib_segment_best_fit_reuses_a_freed_block() -> None:
    """kSmallBuffer: small requests are packed in 2 MiB segments; get_free_block is best fit (lower_bound on size)."""
    model = CachingAllocatorModel()
    model.malloc("a", 4096)
    model.malloc("b", 600)       # 1024
    model.malloc("c", 100_000)   # 100,352
    assert model.reserved_bytes == KSMALL_BUFFER_BYTES and len(model.segments()) == 1
    model.free("b")              # a 1024-byte hole between a and c
    model.malloc("d", 700)       # best fit: the 1024 hole, not the large tail
    blocks = model.segments()[0]["blocks"]
    assert [b["size"] for b in blocks] == [4096, 1024, 100_352, KSMALL_BUFFER_BYTES - 4096 - 1024 - 100_352]
    assert [b["allocated"] for b in blocks] == [True, True, True, False]


def test_large_requests_under_10_mib_split_a_20_mib_segment() -> None:
    """get_allocation_size: 1–10 MiB → kLargeBuffer (20 MiB); should_split: large remainder > kSmallSize."""
    model = CachingAllocatorModel()
    model.malloc("a", 3 * MiB)
    model.malloc("b", 5 * MiB)
    assert model.reserved_bytes == KLARGE_BUFFER_BYTES
    assert [b["size"] for b in model.segments()[0]["blocks"]] == [3 * MiB, 5 * MiB, 12 * MiB]


def test_a_large_block_is_handed_out_whole_when_the_remainder_is_at_most_1_mib() -> None:
    """should_split (large pool): remaining > kSmallSize, so up to 1 MiB more is counted as allocated."""
    model = CachingAllocatorModel()
    model.malloc("big", 12 * MiB)              # its own 12 MiB segment
    model.free("big")
    model.malloc("almost", 11 * MiB + 512)      # 12 MiB - 11.0005 MiB < 1 MiB: not split
    assert model.allocated_bytes == 12 * MiB and model.requested_bytes == 11 * MiB + 512
    model.free("almost")
    model.malloc("less", 10 * MiB)              # remainder 2 MiB > 1 MiB: split
    assert model.allocated_bytes == 10 * MiB


def test_requests_over_10_mib_get_their_own_segment_rounded_to_2_mib() -> None:
    model = CachingAllocatorModel()
    model.malloc("a", 11 * MiB + 1)
    assert model.reserved_bytes == 12 * MiB
    assert model.allocated_bytes == 12 * MiB  # the remainder (1 MiB - 512) is not > kSmallSize: the block is handed out whole
    model.malloc("b", 14 * MiB)
    assert model.reserved_bytes == model.allocated_bytes == 26 * MiB


def test_freed_neighbours_merge_and_empty_cache_returns_whole_segments_only() -> None:
    """try_merge_blocks on free; release_cached_blocks frees segments that are one free block."""
    model = CachingAllocatorModel()
    for name in "abc":
        model.malloc(name, 3 * MiB)
    model.malloc("other", 30 * MiB)
    model.free("a"); model.free("b")
    model.empty_cache()  # the 20 MiB segment still holds c
    assert model.reserved_bytes == KLARGE_BUFFER_BYTES + 30 * MiB
    model.free("c")
    first = next(segment for segment in model.segments() if segment["total_size"] == KLARGE_BUFFER_BYTES)  # a, b and c's segment
    assert [b["size"] for b in first["blocks"]] == [KLARGE_BUFFER_BYTES]  # merged back into one block
    model.empty_cache()
    assert model.reserved_bytes == 30 * MiB
    assert [e.action for e in model.events if e.action.startswith("segment")] == ["segment_alloc", "segment_alloc", "segment_free"]


def test_streams_never_share_blocks() -> None:
    """Blocks are re-allocated only on their stream (BlockComparatorSize orders by stream first)."""
    model = CachingAllocatorModel()
    model.malloc("a", 4096, stream=0)
    model.free("a")
    model.malloc("b", 4096, stream=7)
    assert model.reserved_bytes == 2 * KSMALL_BUFFER_BYTES
    assert sorted(s["stream"] for s in model.segments()) == [0, 7]


def test_max_split_size_keeps_oversize_blocks_whole_and_for_oversize_requests() -> None:
    """max_split_size: smaller requests never take an oversize block; an oversize one only if within kLargeBuffer."""
    model = CachingAllocatorModel(AllocatorConfig(max_split_size_bytes=64 * MiB))
    model.malloc("huge", 100 * MiB)
    model.free("huge")
    model.malloc("small", 30 * MiB)             # < max_split: the free 100 MiB block is not used
    assert model.reserved_bytes == 130 * MiB
    model.malloc("near", 90 * MiB)              # ≥ max_split and 100 < 90 + 20: reuses it, unsplit
    assert model.reserved_bytes == 130 * MiB and model.active["near"].size == 100 * MiB
    model.free("near")
    model.malloc("far", 70 * MiB)               # 100 ≥ 70 + 20: not reused
    assert model.reserved_bytes == 200 * MiB


def test_capacity_frees_the_cache_before_out_of_memory() -> None:
    """malloc's fallbacks: release_cached_blocks then retry; out of memory only when that cannot help."""
    model = CachingAllocatorModel(AllocatorConfig(capacity_bytes=100 * MiB))
    model.malloc("a", 60 * MiB)
    model.free("a")
    model.malloc("b", 70 * MiB)  # 60 cached + 70 > 100: the cached segment is freed first
    assert model.reserved_bytes == 70 * MiB
    assert [e.action for e in model.events if e.action.startswith("segment")] == ["segment_alloc", "segment_free", "segment_alloc"]
    with pytest.raises(CudaOutOfMemory, match="capacity_bytes=104857600"):
        model.malloc("c", 40 * MiB)


def test_expandable_segments_grow_one_segment_page_by_page() -> None:
    """expandable_segments: one segment per stream and pool, mapped in pages (kLargeBuffer for the large pool)."""
    model = CachingAllocatorModel(AllocatorConfig(expandable_segments=True))
    model.malloc("a", 3 * MiB)
    model.malloc("b", 30 * MiB)
    assert model.reserved_bytes == 40 * MiB  # 20 MiB page, then 20 more for b's 33 MiB end
    assert len(model.segments()) == 1 and model.segments()[0]["total_size"] == 40 * MiB
    model.free("a"); model.free("b")
    assert model.reserved_bytes == 40 * MiB
    model.empty_cache()
    assert model.reserved_bytes == 0 and model.segments() == []
    model.malloc("c", 100)  # the small pool's own segment, 2 MiB pages
    assert model.reserved_bytes == KSMALL_BUFFER_BYTES


def test_bad_ids_are_errors_naming_them() -> None:
    model = CachingAllocatorModel()
    model.malloc("x", 10)
    with pytest.raises(ResacctError, match="'x' is already live"):
        model.malloc("x", 10)
    with pytest.raises(ResacctError, match="'y', which is not live"):
        model.free("y")
    with pytest.raises(ResacctError, match="-1 bytes"):
        round_size(-1)


# ── properties ────────────────────────────────────────────────────────────────────────────
_SIZES = st.one_of(st.integers(0, 4096), st.integers(4096, 2 * MiB), st.integers(2 * MiB, 40 * MiB))
_OPS = st.lists(st.tuples(st.booleans(), _SIZES, st.integers(0, 1), st.integers(0, 30)), min_size=1, max_size=60)


def _run(ops: list, config: AllocatorConfig) -> tuple[CachingAllocatorModel, dict]:
    model, live, counter = CachingAllocatorModel(config), {}, 0
    for allocate, size, stream, pick in ops:
        if allocate or not live:
            counter += 1
            model.malloc(counter, size, stream)
            if size:
                live[counter] = size
        else:
            owner = sorted(live)[pick % len(live)]
            model.free(owner)
            del live[owner]
        assert model.reserved_bytes >= model.allocated_bytes
        assert model.allocated_bytes == sum(block.size for block in model.active.values())
        assert model.allocated_bytes >= sum(round_size(size) for size in live.values())
        assert sum(s["total_size"] for s in model.segments()) == model.reserved_bytes
    return model, live


@settings(max_examples=60, deadline=None)
@given(_OPS, st.sampled_from([AllocatorConfig(), AllocatorConfig(expandable_segments=True), AllocatorConfig(max_split_size_bytes=8 * MiB)]))
def test_properties_of_any_sequence(ops: list, config: AllocatorConfig) -> None:
    model, live = _run(ops, config)
    assert model.peak_allocated_bytes == max((a for a, _ in model.timeline), default=0)
    assert model.peak_reserved_bytes >= max((r for _, r in model.timeline), default=0)
    assert sum(model.live_at_peak().values()) == model.peak_allocated_bytes
    for owner, block in model.active.items():
        if block.small:  # the small pool always splits: exactly the rounded size
            assert block.size == round_size(live[owner])
        elif not config.expandable_segments and config.max_split_size_bytes is None:
            assert block.size - round_size(live[owner]) <= MiB  # handed out whole only within kSmallSize
    reserved = model.reserved_bytes
    for owner in list(live):
        model.free(owner)
    assert model.allocated_bytes == 0 and model.reserved_bytes == reserved  # freeing keeps the cache
    model.empty_cache()
    assert model.reserved_bytes == 0 and model.segments() == []


def test_new_segments_are_placed_below_the_last_as_the_recorded_boards_cudamalloc_did() -> None:
    """Best fit breaks ties by address: of two equal free blocks the lower is taken. The recorded boards placed most new
    segments below the previous one, so the newest segment's block wins a tie — as here."""
    model = CachingAllocatorModel()
    model.malloc("old", 30 * MiB)
    model.malloc("new", 30 * MiB)
    assert model.active["new"].addr < model.active["old"].addr
    model.free("old"); model.free("new")
    model.malloc("again", 30 * MiB)
    assert model.active["again"].segment == model.active["again"].addr and model.active["again"].addr == min(model.segment_sizes)
