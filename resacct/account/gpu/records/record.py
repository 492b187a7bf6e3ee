"""The record a GPU run leaves (``tools/gpu_record.py``) and its replay through the allocator model.

A **record** is JSON: the board, torch's version, the allocator's settings, the board's measured
ceilings, and per training step (``steps``) what the CUDA caching allocator did in a fresh process
from its first allocation — ``torch.cuda.memory._record_memory_history(context=None)`` then
``_snapshot()``, compacted by :func:`compact_snapshot`: every trace entry as
``[action, address, size, stream id]`` (no stack frames; addresses less the lowest, streams
renumbered in order of first use), ``window_start`` (the entry where the measured step began, after
``reset_peak_memory_stats``), ``max_memory_allocated`` / ``max_memory_reserved`` over that step,
the segments at the end; plus the step's time and its aten ops (the recorder's business).

:func:`replay_step` runs the trace's allocations and frees through
:class:`~resacct.account.gpu.allocator.cuda_allocator.CachingAllocatorModel` and compares what the model
does with what the allocator did: every ``segment_alloc`` / ``segment_free`` (size and order),
where each block was placed (a new segment starts where the device's did: best fit breaks ties
by address), and the allocated and reserved peaks of the window against ``max_memory_*``. The reserved peak is
also summed from the recorded segment events alone (no model), a check of the record itself.

Trace sizes are the **requested** bytes (``record_trace(ALLOC, ptr, orig_size, …)``); the block
sizes ``memory_allocated`` counts are the model's to work out.

>>> step = {"trace": [["segment_alloc", 0, 2097152, 0], ["alloc", 0, 36, 0], ["alloc", 512, 4000, 0],
...                   ["free_requested", 0, 36, 0], ["free_completed", 0, 36, 0]],
...         "window_start": 0, "max_memory_allocated": 4608, "max_memory_reserved": 2097152}
>>> result = replay_step(step)
>>> result.peak_allocated_bytes, result.peak_reserved_bytes, result.holds
(4608, 2097152, True)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from resacct.account.gpu.allocator.cuda_allocator import AllocatorConfig, CachingAllocatorModel
from resacct.errors import ResacctError

__all__ = ["RECORD_FORMAT", "SEGMENT_ACTIONS", "COMPARED_EVENTS", "EventDifferences", "event_differences", "ReplayResult", "compact_snapshot", "replay_step", "recorded_reserved_peak_bytes",
           "allocator_config_of", "check_record_layout"]

RECORD_FORMAT = "resacct-gpu-record/1"
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
_ALLOCATION_ACTIONS = ("alloc", "free_requested", "free_completed")
_KNOWN_ACTIONS = _ALLOCATION_ACTIONS + SEGMENT_ACTIONS + ("snapshot", "oom", "user_defined")


def compact_snapshot(snapshot: dict[str, Any], *, window_start: int, device: int = 0) -> dict[str, Any]:
    """The record of one step from ``torch.cuda.memory._snapshot()``: trace entries as
    ``[action, address, size, stream id]`` (addresses less the lowest one, ``address_base``: their
    order and offsets kept, which best fit's ties depend on) and the segments at the end, frames dropped.
    ``window_start`` counts trace entries (the length of the trace when the measured step began)."""
    traces = snapshot.get("device_traces") or [[]]
    if device >= len(traces):
        raise ResacctError(f"device {device}: the snapshot has traces for {len(traces)} device(s); expected device < {len(traces)}")
    streams: dict[int, int] = {}
    trace = []
    for entry in traces[device]:
        if entry["action"] not in _KNOWN_ACTIONS:
            raise ResacctError(f"trace action {entry['action']!r}: expected one of {', '.join(_KNOWN_ACTIONS)}")
    located = [e for e in traces[device] if e["action"] not in ("snapshot", "user_defined", "oom")]
    base = min([int(e["addr"]) for e in located] + [int(s["address"]) for s in snapshot.get("segments", [])], default=0)
    for entry in traces[device]:
        action = entry["action"]
        if action in ("snapshot", "user_defined", "oom"):
            trace.append([action, -1, int(entry.get("size", 0)), -1])
            continue
        stream = streams.setdefault(int(entry.get("stream", 0)), len(streams))
        trace.append([action, int(entry["addr"]) - base, int(entry["size"]), stream])
    segments = []
    for segment in snapshot.get("segments", []):
        if segment.get("device", device) != device:
            continue
        segments.append({"address": int(segment["address"]) - base, "total_size": int(segment["total_size"]),
                         "stream": streams.get(int(segment.get("stream", 0)), -1), "segment_type": segment.get("segment_type", ""),
                         "blocks": [[int(b["size"]), int(b.get("requested_size", 0)), b["state"]] for b in segment["blocks"]]})
    if not 0 <= window_start <= len(trace):
        raise ResacctError(f"window_start {window_start}: expected 0 ≤ it ≤ the trace's {len(trace)} entries")
    return {"trace": trace, "window_start": window_start, "segments_end": segments, "address_base": base}


def allocator_config_of(settings: dict[str, Any] | None) -> AllocatorConfig:
    """The model's settings from a record's ``allocator_settings`` (``_snapshot()['allocator_settings']``)."""
    settings = settings or {}
    max_split = settings.get("max_split_size")
    if max_split is not None and (max_split <= 0 or max_split >= 2**63):
        max_split = None  # SIZE_MAX (or -1 as some versions print it): unlimited
    return AllocatorConfig(max_split_size_bytes=max_split, expandable_segments=bool(settings.get("expandable_segments", False)))


@dataclass(frozen=True)
class ReplayResult:
    """The model's peaks over a recorded step's window beside the recorded ones, and whether the
    model made the same segments in the same order (``first_segment_mismatch`` says where not)."""

    name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    recorded_max_allocated_bytes: int | None
    recorded_max_reserved_bytes: int | None
    recorded_reserved_peak_bytes: int  # summed from the recorded segment events alone, no model
    segment_events: int
    first_segment_mismatch: str | None
    misplaced_blocks: int = 0  # allocations the model put at another address than the device did
    first_misplaced_block: str | None = None
    live_at_peak_bytes: dict[Any, int] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """Every segment event, every block's place and both peaks exactly as recorded."""
        return (self.first_segment_mismatch is None and self.misplaced_blocks == 0 and self.recorded_max_allocated_bytes == self.peak_allocated_bytes
                and self.recorded_max_reserved_bytes == self.peak_reserved_bytes)


def recorded_reserved_peak_bytes(trace: Iterable[list], window_start: int = 0) -> int:
    """The reserved peak of the window from the recorded segment events alone (map adds, unmap and free subtract)."""
    reserved = peak = 0
    trace = list(trace)
    for index, (action, _address, size, _stream) in enumerate(trace):
        if index == window_start:
            peak = reserved
        if action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        if index >= window_start:
            peak = max(peak, reserved)
    return peak if window_start < len(trace) else reserved


def replay_step(step: dict[str, Any], settings: dict[str, Any] | None = None, *, name: str = "") -> ReplayResult:
    """Replay one recorded step (``trace``, ``window_start``, ``max_memory_*``) through the model."""
    trace = step["trace"]
    window_start = int(step.get("window_start", 0))
    model = CachingAllocatorModel(allocator_config_of(settings if settings is not None else step.get("allocator_settings")))
    recorded_segments: list[tuple[str, int, int]] = []
    misplaced, first_misplaced = 0, None
    for index, (action, address, size, stream) in enumerate(trace):
        if index == window_start:
            model.reset_peaks()
        if action == "alloc":
            model.malloc(address, size, stream)
            model.address_hints.clear()
            placed = model.active[address].addr if address in model.active else None
            if placed is not None and placed != address:
                misplaced += 1
                first_misplaced = first_misplaced or f"trace entry {index}: {size} bytes placed at {placed}, the device at {address}"
        elif action == "free_requested":
            if address not in model.active:
                raise ResacctError(f"trace entry {index}: free of address {address} that the trace never allocated "
                                   "(the record began after it, or the ring buffer wrapped): expected a trace from the first allocation")
            model.free(address)
        elif action in SEGMENT_ACTIONS:
            recorded_segments.append((action, size, stream))
            if action in ("segment_alloc", "segment_map"):
                model.address_hints.append(address)  # a new segment made for the next alloc starts where the device's did
    if window_start >= len(trace):
        model.reset_peaks()
    made = [(e.action, e.size, e.stream) for e in model.events if e.action in SEGMENT_ACTIONS]
    mismatch = None
    for position, (recorded, modelled) in enumerate(zip(recorded_segments, made)):
        if recorded != modelled:
            mismatch = f"segment event {position}: recorded {recorded}, the model {modelled}"
            break
    if mismatch is None and len(recorded_segments) != len(made):
        mismatch = f"{len(recorded_segments)} segment events recorded, the model made {len(made)}"
    return ReplayResult(name=name or step.get("name", ""), peak_allocated_bytes=model.peak_allocated_bytes,
                        peak_reserved_bytes=model.peak_reserved_bytes, recorded_max_allocated_bytes=step.get("max_memory_allocated"),
                        recorded_max_reserved_bytes=step.get("max_memory_reserved"),
                        recorded_reserved_peak_bytes=recorded_reserved_peak_bytes(trace, window_start),
                        segment_events=len(recorded_segments), first_segment_mismatch=mismatch, misplaced_blocks=misplaced,
                        first_misplaced_block=first_misplaced, live_at_peak_bytes=model.live_at_peak())


def check_record_layout(record: dict[str, Any]) -> list[str]:
    """What a record lacks (empty: the layout is whole): the format tag, the board, the steps
    with their trace, window and peaks, the ceilings."""
    problems = []
    if record.get("format") != RECORD_FORMAT:
        problems.append(f"format {record.get('format')!r}: expected {RECORD_FORMAT!r}")
    for key in ("board", "torch", "when", "allocator_settings", "steps", "ceilings"):
        if key not in record:
            problems.append(f"no {key!r}")
    for step in record.get("steps", []):
        if "error" in step:
            continue
        for key in ("name", "trace", "window_start", "max_memory_allocated", "max_memory_reserved", "step_time_sec", "ops"):
            if key not in step:
                problems.append(f"step {step.get('name', '?')}: no {key!r}")
        for row in step.get("trace", [])[:1]:
            if len(row) != 4 or row[0] not in _KNOWN_ACTIONS:
                problems.append(f"step {step.get('name', '?')}: trace row {row!r} is not [action, address, size, stream id]")
    for entry in record.get("serving", []):  # optional: records before the recorder served models have none
        if "error" in entry:
            continue
        for key in ("name", "model_config", "weights", "attention", "batch", "context", "trace", "window_start", "max_memory_allocated",
                    "max_memory_reserved", "prefill_sec", "decode_sec_per_token", "ops"):
            if key not in entry:
                problems.append(f"serving {entry.get('name', '?')}: no {key!r}")
    return problems


#: the allocator events a step's prediction is compared with the board's by: each allocation and each completed free
COMPARED_EVENTS = ("alloc", "free_completed")


@dataclass(frozen=True)
class EventDifferences:
    """Two ``(action, size)`` sequences aligned (difflib, no junk heuristic): the runs where they part
    (``(board_from, board_to, ours_from, ours_to)``) and how many events each side has that the other lacks."""

    runs: tuple[tuple[int, int, int, int], ...]
    board_only: int
    ours_only: int


def event_differences(board: list[tuple[str, int]], ours: list[tuple[str, int]]) -> EventDifferences:
    """Where the board's events and the prediction's part: the same sequence gives no runs and 0 on each side.

    >>> event_differences([("alloc", 512), ("alloc", 1024), ("free_completed", 512)], [("alloc", 512), ("free_completed", 512)])
    EventDifferences(runs=((1, 2, 1, 1),), board_only=1, ours_only=0)
    """
    import difflib

    matcher = difflib.SequenceMatcher(None, board, ours, autojunk=False)
    runs = tuple((board_from, board_to, ours_from, ours_to) for tag, board_from, board_to, ours_from, ours_to in matcher.get_opcodes()
                 if tag != "equal")
    return EventDifferences(runs, sum(b_to - b_from for b_from, b_to, _, _ in runs), sum(o_to - o_from for _, _, o_from, o_to in runs))
