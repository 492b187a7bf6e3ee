"""tools/gpu_record.py --diff (tools/gpu_record_diff.py): a recorded step's allocator events, the board's beside the
prediction's with the op of each, against the committed H200 record (issue 31)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import gpu_record  # noqa: E402
import gpu_record_diff  # noqa: E402

H200_RECORD = REPO / "docs" / "gpu" / "2026-11-30-h200-record.json.gz"


def test_aligned_differences_name_the_boards_event_and_the_predicted_op() -> None:
    board = [("alloc", 512), ("alloc", 1024), ("free_completed", 512)]
    ours = [("alloc", 512, "mm"), ("alloc", 2048, "add"), ("free_completed", 512, "add")]
    assert gpu_record_diff._aligned_differences(board, ours, limit=5) == ["  event 1: board alloc 1,024 | predicted alloc 2,048 (add)"]
    assert gpu_record_diff._aligned_differences(board, [(action, size, "op") for action, size in board], limit=5) == []
    board = [("alloc", 8), ("alloc", 1), ("alloc", 8), ("alloc", 1), ("alloc", 8)]
    ours = [("alloc", 16, "x"), ("alloc", 1, "y"), ("alloc", 16, "x"), ("alloc", 1, "y"), ("alloc", 16, "x")]
    assert len(gpu_record_diff._aligned_differences(board, ours, limit=5)) == 3  # three runs apart
    assert gpu_record_diff._aligned_differences(board, ours, limit=1)[1:] == ["  … and more (--diff prints the first 1)"]


def test_an_unknown_step_or_a_missing_record_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert gpu_record.main(["--diff", str(H200_RECORD), "--only", "no-such-step"]) == 2
    err = capsys.readouterr().err
    assert "--diff: no recorded training step 'no-such-step'" in err and "gpt2-small/fp32/math" in err
    assert gpu_record.main(["--diff", str(tmp_path / "absent.json.gz")]) == 2
    assert capsys.readouterr().err.startswith("gpu_record.py: ")


@pytest.mark.slow  # the step predicted on meta (4.5 s)
@pytest.mark.skipif(torch.__version__ < "2.8", reason="the H200 record's predictions need torch >= 2.8")
def test_the_diff_of_a_recorded_step_shows_what_the_prediction_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    """hf-gpt2/fp32/efficient: one 512-byte block the board had live at its peak that the prediction lacks (the 4-byte
    block every transformers process began with, kept from before the step) — and every event of the step the board's,
    in order (until session 29 the embedding backward's sort buffers were two runs the board alone had)."""
    pytest.importorskip("transformers")
    assert gpu_record.main(["--diff", str(H200_RECORD), "--only", "hf-gpt2/fp32/efficient"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("NVIDIA H200 · torch 2.11.0+cu130")
    assert "allocated peak predicted 8,609,592,832, board 8,609,593,344 (-512)" in out[2]
    assert "  live at the allocated peak, board only: 512; predicted only: none" in out
    assert "  the step's events: board 1,984 (992 allocs, 0 new segments), predicted 1,984 (992 allocs, 0 new segments)" in out
    assert out[-1] == "  the event sequences are the same"
