"""The record format and its replay (resacct/account/gpu/records/record.py), on a record built by hand.

No board has recorded a trace yet, so the record here is synthetic: what
``torch.cuda.memory._snapshot()`` returns (the format of its docstring in torch/cuda/memory.py,
and of https://pytorch.org/docs/stable/torch_cuda_memory.html: ``segments`` and ``device_traces``
with actions alloc / free_requested / free_completed / segment_alloc / segment_free) for a short
sequence whose every segment follows the rules PyTorch documents — "CUDA semantics, memory
management" (https://pytorch.org/docs/stable/notes/cuda.html#memory-management: small requests in
2 MiB blocks, 1–10 MiB requests split a 20 MiB block, larger ones get their own) and the comment
at the top of c10/cuda/CUDACachingAllocator.cpp. Its peaks are worked out by hand in the comments.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from resacct.account.gpu.records.record import RECORD_FORMAT, check_record_layout, compact_snapshot, recorded_reserved_peak_bytes, replay_step
from resacct.errors import ResacctError

MiB = 2**20
S1, S2, S3 = 0x7F0000000000, 0x7F0002000000, 0x7F0004000000
FRAMES = [{"filename": "train.py", "line": 3, "name": "step"}]


def _entry(action: str, addr: int, size: int, stream: int = 0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": FRAMES}


def _synthetic_snapshot() -> tuple[dict, int]:
    trace = [
        _entry("segment_alloc", S1, 2 * MiB),          # a 3×3 float32 (36 B): a 2 MiB small segment
        _entry("alloc", S1, 36),                        #   its block: 512 B
        _entry("alloc", S1 + 512, 4000),                # 1000 floats: 4096 B, split from the same segment
        _entry("free_requested", S1, 36),
        _entry("free_completed", S1, 36),               # allocated 4096, reserved 2 MiB ← the window starts here
        _entry("segment_alloc", S2, 20 * MiB),          # 3 MiB: a 20 MiB segment, split
        _entry("alloc", S2, 3 * MiB),
        _entry("alloc", S2 + 3 * MiB, 5 * MiB),         # 5 MiB: from its 17 MiB remainder
        _entry("alloc", S1, 100),                       # 100 B: best fit, the freed 512-byte block
        _entry("free_requested", S2, 3 * MiB), _entry("free_completed", S2, 3 * MiB),
        _entry("free_requested", S2 + 3 * MiB, 5 * MiB), _entry("free_completed", S2 + 3 * MiB, 5 * MiB),
        # 25 MiB + 1: the free 20 MiB block is too small (an 11 MiB request would have split it: best fit),
        _entry("segment_alloc", S3, 26 * MiB),          # so its own segment, rounded to 2 MiB,
        _entry("alloc", S3, 25 * MiB + 1),              # handed out whole (remainder 1 MiB - 512 ≤ 1 MiB): 26 MiB allocated
        {"action": "snapshot", "addr": 0, "size": 26 * MiB + 4608, "stream": 0, "frames": []},
    ]
    segments = [
        {"device": 0, "address": S1, "total_size": 2 * MiB, "stream": 0, "segment_type": "small", "allocated_size": 4608,
         "active_size": 4608, "blocks": [{"address": S1, "size": 512, "requested_size": 100, "state": "active_allocated", "frames": FRAMES},
                                         {"address": S1 + 512, "size": 4096, "requested_size": 4000, "state": "active_allocated", "frames": FRAMES},
                                         {"address": S1 + 4608, "size": 2 * MiB - 4608, "requested_size": 0, "state": "inactive", "frames": []}]},
        {"device": 0, "address": S2, "total_size": 20 * MiB, "stream": 0, "segment_type": "large", "allocated_size": 0,
         "active_size": 0, "blocks": [{"address": S2, "size": 20 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]},
        {"device": 0, "address": S3, "total_size": 26 * MiB, "stream": 0, "segment_type": "large", "allocated_size": 26 * MiB,
         "active_size": 26 * MiB, "blocks": [{"address": S3, "size": 26 * MiB, "requested_size": 25 * MiB + 1, "state": "active_allocated", "frames": FRAMES}]},
    ]
    return {"segments": segments, "device_traces": [trace]}, 5


#: by hand: in the window the most allocated is at the end, 512 + 4096 + 26 MiB; reserved 2 + 20 + 26 MiB
PEAK_ALLOCATED = 512 + 4096 + 26 * MiB
PEAK_RESERVED = 48 * MiB


def _step() -> dict:
    snapshot, window_start = _synthetic_snapshot()
    step = compact_snapshot(snapshot, window_start=window_start)
    step.update(name="synthetic", max_memory_allocated=PEAK_ALLOCATED, max_memory_reserved=PEAK_RESERVED)
    return step


def test_compacting_drops_frames_and_keeps_address_offsets() -> None:
    step = _step()
    assert step["address_base"] == S1
    assert step["trace"][0] == ["segment_alloc", 0, 2 * MiB, 0]
    assert step["trace"][2] == ["alloc", 512, 4000, 0]
    assert step["trace"][8] == ["alloc", 0, 100, 0]  # S1 again
    assert "frames" not in repr(step) and str(S3) not in repr(step)
    assert [s["address"] for s in step["segments_end"]] == [0, S2 - S1, S3 - S1]
    assert [s["total_size"] for s in step["segments_end"]] == [2 * MiB, 20 * MiB, 26 * MiB]
    assert step["segments_end"][0]["blocks"][0] == [512, 100, "active_allocated"]


def test_replay_reproduces_the_hand_worked_record() -> None:
    result = replay_step(_step())
    assert result.first_segment_mismatch is None and result.segment_events == 3
    assert (result.peak_allocated_bytes, result.peak_reserved_bytes) == (PEAK_ALLOCATED, PEAK_RESERVED)
    assert result.recorded_reserved_peak_bytes == PEAK_RESERVED  # from the segment events alone
    assert result.holds
    assert sorted(result.live_at_peak_bytes.values()) == [512, 4096, 26 * MiB]


def test_replay_finds_a_segment_the_allocator_would_not_have_made() -> None:
    step = _step()
    step["trace"][13][2] = 25 * MiB + 512  # a segment of the request's size: not what get_allocation_size gives
    result = replay_step(step)
    assert not result.holds
    assert result.first_segment_mismatch == f"segment event 2: recorded ('segment_alloc', {25 * MiB + 512}, 0), the model ('segment_alloc', {26 * MiB}, 0)"


def test_replay_finds_a_segment_where_best_fit_reuses_a_cached_block() -> None:
    """A record that cudaMallocs a 12 MiB segment for 11 MiB + 1 while a free 20 MiB block is cached: the
    real allocator would have split the cached block (get_free_block before alloc_block)."""
    step = _step()
    step["trace"][13][2], step["trace"][14][2] = 12 * MiB, 11 * MiB + 1
    result = replay_step(step)
    assert result.first_segment_mismatch == "3 segment events recorded, the model made 2"


def test_replay_finds_a_block_placed_elsewhere() -> None:
    """The 100-byte request goes to the freed 512-byte block at the segment's start (best fit: the
    smallest free block that fits), not after the 4096-byte one; a record saying otherwise is caught."""
    step = _step()
    assert replay_step(step).misplaced_blocks == 0
    step["trace"][8][1] = 4608  # the device (as this record says) put it after the 4096-byte block
    result = replay_step(step)
    assert result.misplaced_blocks == 1 and not result.holds
    assert result.first_misplaced_block == "trace entry 8: 100 bytes placed at 0, the device at 4608"


def test_replay_fails_a_record_whose_peak_the_model_does_not_reach() -> None:
    step = _step()
    step["max_memory_allocated"] = 512 + 4096 + 25 * MiB + 512  # the requests rounded, as if blocks were never handed out whole
    assert not replay_step(step).holds


def test_window_start_excludes_what_came_before() -> None:
    step = _step()
    step["trace"] = step["trace"][:5] + [["alloc", 9, 2000, 0]]  # 36 + 4000 live (4608), 36 freed (4096), then 2048 more
    step["window_start"] = 5
    assert replay_step(step).peak_allocated_bytes == 4096 + 2048  # the window's own peak
    step["trace"][5][2] = 100                                     # 512 more only: the window's peak is 4608 too
    assert replay_step(step).peak_allocated_bytes == 4608
    step["trace"] = step["trace"][:5]                              # nothing in the window: what was live at its start
    assert replay_step(step).peak_allocated_bytes == 4096
    step["window_start"] = 0
    assert replay_step(step).peak_allocated_bytes == 4608
    assert recorded_reserved_peak_bytes(step["trace"], 5) == 2 * MiB


def test_a_trace_that_begins_late_is_an_error() -> None:
    step = _step()
    step["trace"] = step["trace"][3:]  # the free of an allocation the trace never saw
    with pytest.raises(ResacctError, match="never allocated"):
        replay_step(step)


def test_compacting_rejects_unknown_actions_and_windows() -> None:
    snapshot, _ = _synthetic_snapshot()
    with pytest.raises(ResacctError, match="window_start 99"):
        compact_snapshot(snapshot, window_start=99)
    bad = copy.deepcopy(snapshot)
    bad["device_traces"][0][0]["action"] = "teleport"
    with pytest.raises(ResacctError, match="'teleport'"):
        compact_snapshot(bad, window_start=0)


def test_layout_check_names_what_is_missing() -> None:
    record = {"format": RECORD_FORMAT, "board": "b", "torch": "t", "when": "w", "allocator_settings": {}, "ceilings": {}, "steps": [_step()]}
    problems = check_record_layout(record)
    assert problems == ["step synthetic: no 'step_time_sec'", "step synthetic: no 'ops'"]
    record["steps"][0].update(step_time_sec={"median": 0.1}, ops=[])
    assert check_record_layout(record) == []
    assert check_record_layout({"format": "x"})[0] == "format 'x': expected 'resacct-gpu-record/1'"


REPO = Path(__file__).resolve().parents[1]
BOARD_RECORDS = sorted((REPO / "docs" / "gpu").glob("*-record.json.gz"))


@pytest.mark.parametrize("path", BOARD_RECORDS or [None], ids=lambda p: p.name if p else "none-yet")
@pytest.mark.slow  # 2.1 s; the quick tier's replay claims replay the H200 record in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_every_committed_board_record_replays_exactly(path: Path | None) -> None:
    """Issue 31's bar: the model reproduces every recorded step's segments, block places and both
    peaks. A record committed under docs/gpu/ is decided here on every CPU run."""
    if path is None:
        pytest.skip("no board record committed yet (docs/gpu/*-record.json.gz): run tools/gpu_record.py on a GPU (docs/gpu.md)")
    record = json.loads(gzip.open(path, "rt").read())
    assert record["format"] == "resacct-gpu-record/1" and not record["dry_run"], "a dry run's record is not a board's"
    steps = [step for step in record["steps"] if "error" not in step and step["trace_complete"]]
    assert steps, f"{path.name} has no complete step"
    differing = {step["name"]: replay_step(step) for step in steps}
    differing = {name: (r.first_segment_mismatch or r.first_misplaced_block or f"peaks {r.peak_allocated_bytes}/{r.peak_reserved_bytes} vs "
                        f"{r.recorded_max_allocated_bytes}/{r.recorded_max_reserved_bytes}") for name, r in differing.items() if not r.holds}
    assert not differing, differing


@pytest.mark.parametrize("path", BOARD_RECORDS or [None], ids=lambda p: p.name if p else "none-yet")
def test_every_committed_board_record_has_its_summary_here_and_shipped(path: Path | None) -> None:
    """The ``--device`` commands read a record's summary, not the record (resacct.account.gpu.records.board_record): each record
    committed under docs/gpu/ has its summary beside it, the record's own ceilings in brief, and a copy an installed
    resacct ships (resacct/specs/gpu_records/), and every claim the record deserves is in the spec (tools/gpu_record.py --claims)."""
    if path is None:
        pytest.skip("no board record committed yet (docs/gpu/*-record.json.gz): run tools/gpu_record.py on a GPU (docs/gpu.md)")
    from resacct.account.gpu.records.board_record import PACKAGED_RECORDS, ceilings_in_brief, summary_name_of

    record = json.loads(gzip.open(path, "rt").read())
    summary_path = path.with_name(summary_name_of(path.name))
    assert summary_path.is_file(), f"commit {summary_path.name} (the recorder's gpu-record-summary.json) beside {path.name}"
    summary = json.loads(summary_path.read_text())
    assert summary["ceilings"] == ceilings_in_brief(record["ceilings"]) and summary["board"] == record["board"] and summary["when"] == record["when"]
    assert (PACKAGED_RECORDS / summary_path.name).read_bytes() == summary_path.read_bytes(), "resacct/specs/gpu_records/ must hold a copy"
    # the record too: an installed resacct (no docs/gpu/) decides the record's claims from its own copy
    assert (PACKAGED_RECORDS / path.name).read_bytes() == path.read_bytes(), f"copy {path.name} into resacct/specs/gpu_records/"
    spec = (Path(__file__).resolve().parents[1] / "resacct" / "specs" / "gpu_recorded.claims.yaml").read_text()
    name = f"docs/gpu/{path.name}"
    recorded = [step["name"] for step in record["steps"] if "error" not in step]
    assert spec.count(name) >= 5 * len(recorded), f"claims of {name} missing: append `python tools/gpu_record.py --claims {name}`"
