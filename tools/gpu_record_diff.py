"""tools/gpu_record.py's ``--diff RECORD [--only STEP,…]`` (issue 31): where a recorded training step's prediction parts
from the board, event by event.

For each step: the measured step's allocator events as the board recorded them (from ``window_start``) beside the ones
the prediction made on meta (:func:`~resacct.account.gpu.records.record_models.predict_step_of_record`, each event with
the aten op during which it happened), aligned as ``(action, size)`` sequences (``difflib``; a free is matched by its
block's requested size); then the blocks live at each side's allocated peak that the other lacks (sizes; the board's
from the allocator model's replay of the record, which is exact), and the new segments' sizes each side made. The first
differences are where a modelling change starts: session 26 found autograd's in-place accumulation, Reduce.cuh's
staging buffers and flash's backward workspaces by reading exactly these (with one-off probes).

>>> _aligned_differences([("alloc", 512), ("alloc", 1024), ("free_completed", 512)],
...                      [("alloc", 512, "mm"), ("alloc", 2048, "add"), ("free_completed", 512, "add")], limit=5)
['  event 1: board alloc 1,024 | predicted alloc 2,048 (add)']
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from resacct.account.gpu.records.record import COMPARED_EVENTS, event_differences

__all__ = ["diff_record"]

_COMPARED = ("alloc", "free_completed", "segment_alloc", "segment_map", "segment_unmap", "segment_free")


def diff_record(path: Path, only: list[str], limit: int = 12) -> int:
    """Print each chosen step's differences (every training step of the record when ``only`` is empty); exit status 2 for
    an unreadable record or an unknown step."""
    from gpu_record_replay import read_record

    from resacct.account.gpu.records.record import replay_step
    from resacct.account.gpu.records.record_models import predict_step_of_record
    from resacct.errors import ResacctError

    record = read_record(path)
    if record is None:
        return 2
    steps = {step["name"]: step for step in record["steps"] if "error" not in step}
    unknown = [name for name in only if name not in steps]
    if unknown:
        print(f"gpu_record.py: --diff: no recorded training step {unknown[0]!r} in {path}; expected one of: {', '.join(steps)}", file=sys.stderr)
        return 2
    print(f"{record['board']} · torch {record['torch']} · {record['when']}{' · DRY RUN' if record.get('dry_run') else ''}")
    for name in only or list(steps):
        step = steps[name]
        window: list[tuple[str, int, str]] = []
        try:
            predicted = predict_step_of_record(record, step, window=window)
        except (ResacctError, RuntimeError, ImportError) as error:
            print(f"\n{name}: cannot predict: {str(error).splitlines()[0][:160]}")
            continue
        try:
            replayed = replay_step(step, name=name)
        except ResacctError as error:  # a trace the allocator model cannot replay (its ring buffer wrapped …)
            print(f"\n{name}: cannot replay the board's trace: {str(error).splitlines()[0][:160]}")
            continue
        board = [(row[0], row[2]) for row in step["trace"][int(step.get("window_start", 0)):] if row[0] in _COMPARED]
        ours = [event for event in window if event[0] in _COMPARED]
        for line in _step_lines(name, step, predicted, replayed, board, ours, limit):
            print(line)
    return 0


def _step_lines(name: str, step: dict[str, Any], predicted: Any, replayed: Any, board: list[tuple[str, int]],
                ours: list[tuple[str, int, str]], limit: int) -> list[str]:
    allocated, reserved = step["max_memory_allocated"], step["max_memory_reserved"]
    lines = [f"\n{name}: allocated peak predicted {predicted.peak_allocated_bytes:,}, board {allocated:,} "
             f"({predicted.peak_allocated_bytes - allocated:+,}); reserved predicted {predicted.peak_reserved_bytes:,}, board {reserved:,} "
             f"({predicted.peak_reserved_bytes - reserved:+,})",
             f"  the step's events: board {len(board):,} ({_count(board, 'alloc'):,} allocs, {_count(board, 'segment_alloc')} new segments), "
             f"predicted {len(ours):,} ({_count(ours, 'alloc'):,} allocs, {_count(ours, 'segment_alloc')} new segments)"]
    board_live, our_live = Counter(replayed.live_at_peak_bytes.values()), Counter(predicted.live_at_peak_bytes)
    lines.append(f"  live at the allocated peak, board only: {_sizes(board_live - our_live)}; predicted only: {_sizes(our_live - board_live)}")
    board_segments = Counter(size for action, size in board if action in ("segment_alloc", "segment_map"))
    our_segments = Counter(size for action, size, _ in ours if action in ("segment_alloc", "segment_map"))
    lines.append(f"  new segments, board only: {_sizes(board_segments - our_segments)}; predicted only: {_sizes(our_segments - board_segments)}")
    compared = [event for event in board if event[0] in COMPARED_EVENTS]
    apart = event_differences(compared, [(action, size) for action, size, _ in ours if action in COMPARED_EVENTS])
    lines.append(f"  allocations and completed frees apart (gpu_recorded.board_step_events): board {apart.board_only:,} / predicted "
                 f"{apart.ours_only:,} of the board's {len(compared):,}")
    differences = _aligned_differences(board, ours, limit)
    lines += ["  the event sequences differ at (board | predicted, with the op):", *differences] if differences else ["  the event sequences are the same"]
    return lines


def _aligned_differences(board: list[tuple[str, int]], ours: list[tuple[str, int, str]], limit: int) -> list[str]:
    """The first ``limit`` differing runs of the two ``(action, size)`` sequences, each line naming the board's event index."""
    lines: list[str] = []
    for board_from, board_to, our_from, our_to in event_differences(board, [(action, size) for action, size, _ in ours]).runs:
        if len(lines) >= limit:
            lines.append(f"  … and more (--diff prints the first {limit})")
            break
        theirs = "; ".join(f"{action} {size:,}" for action, size in board[board_from:board_to][:4]) or "nothing"
        mine = "; ".join(f"{action} {size:,} ({op})" for action, size, op in ours[our_from:our_to][:4]) or "nothing"
        more = max(board_to - board_from, our_to - our_from) - 4
        lines.append(f"  event {board_from}: board {theirs} | predicted {mine}" + (f" (+{more} more)" if more > 0 else ""))
    return lines


def _count(events: list[Any], action: str) -> int:
    return sum(event[0] == action for event in events)


def _sizes(counts: Counter) -> str:
    if not counts:
        return "none"
    shown = [f"{size:,}" + (f" ×{count}" if count > 1 else "") for size, count in sorted(counts.items(), reverse=True)[:8]]
    return ", ".join(shown) + (f", … ({sum(counts.values())} blocks)" if len(counts) > 8 else "")
