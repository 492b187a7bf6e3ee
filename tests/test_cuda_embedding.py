"""An embedding's backward as CUDA runs it (resacct/account/gpu/tracing/cuda_embedding.py), against the H200 record: the
board's own allocator events of the op in each recorded step are the truth the composite's events are compared with."""

from __future__ import annotations

import pytest
import torch

from resacct.account.gpu.records.board_record import read_board_record
from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.tracing.cuda_embedding import SORT_ABOVE_INDICES, partial_segments_bound, radix_sort_pairs_temp_bytes, scan_temp_bytes

H200_RECORD = "docs/gpu/2026-11-30-h200-record.json.gz"
_COMPARED = ("alloc", "free_completed")


def _model_events(tokens: int, width: int, vocab: int, dtype: torch.dtype) -> list[tuple[str, int]]:
    """The allocator events of one ``embedding_dense_backward`` over ``tokens`` int64 indices, traced on meta with CUDA's
    kernels; its output's block is kept (a step's gradient), the rest freed in the op."""
    grad = torch.empty(tokens, width, device="meta", dtype=dtype)
    indices = torch.empty(tokens, device="meta", dtype=torch.long)
    recorder = AllocationRecorder(device="meta")
    with recorder:
        start = len(recorder.allocator.events)
        out = torch.ops.aten.embedding_dense_backward.default(grad, indices, vocab, -1, False)
    assert out.shape == (vocab, width)
    return [(event.action, event.size) for event in recorder.allocator.events[start:] if event.action in _COMPARED]


def _board_embedding_backward(entry: dict, tokens: int, gradient_bytes: int, events: int) -> list[tuple[str, int]]:
    """The board's events of the measured step's embedding backward, found by its shapes alone: three allocations of the
    int64 indices' size in a row (sorted, original, positions) and, six events on, the gradient's; ``events`` of them
    from there (none where the step has no such run)."""
    board = [(row[0], row[2]) for row in entry["trace"][entry["window_start"]:] if row[0] in _COMPARED]
    for at in range(len(board) - 6):
        if board[at] == board[at + 1] == board[at + 2] == ("alloc", tokens * 8) and board[at + 6] == ("alloc", gradient_bytes):
            return board[at:at + events]
    return []


def _steps_with_tokens() -> list[tuple[str, int, int, int, torch.dtype]]:
    data = read_board_record(H200_RECORD)
    steps = []
    for entry in data["steps"]:
        if "error" in entry or entry["name"].startswith("llama-3.2-1b-lora"):  # the LoRA step's embedding is frozen: no backward
            continue
        config = entry["model_config"]
        width = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")  # transformers' names, resacct's GPT's
        dtype = torch.bfloat16 if entry["recipe"] == "bf16" else torch.float32  # autocast and fp32 master: float32 embedding grads
        steps.append((entry["name"], entry["batch"] * entry["seq"], width, config["vocab_size"], dtype))
    return steps


@pytest.mark.parametrize(("name", "tokens", "width", "vocab", "dtype"), _steps_with_tokens(), ids=lambda value: str(value))
def test_each_recorded_embedding_backward_is_the_boards_event_for_event(name: str, tokens: int, width: int, vocab: int,
                                                                         dtype: torch.dtype) -> None:
    """Above 3,072 indices the board sorted them and summed partial segments around the output — 28 events besides the
    output's allocation, each the model's in size and order; at or below it (2,048 tokens) the board made no such sort."""
    data = read_board_record(H200_RECORD)
    entry = next(step for step in data["steps"] if step["name"] == name)
    ours = _model_events(tokens, width, vocab, dtype)
    gradient_bytes = vocab * width * dtype.itemsize
    board = _board_embedding_backward(entry, tokens, gradient_bytes, len(ours))
    if tokens > SORT_ABOVE_INDICES:
        assert len(ours) == 29 and board == ours
    else:
        assert ours == [("alloc", gradient_bytes)] and board == []
        assert ("alloc", gradient_bytes) in [(row[0], row[2]) for row in entry["trace"][entry["window_start"]:]]  # the gradient alone


def test_the_sizes_at_4096_indices_are_the_records() -> None:
    """The sort's storage, the scans', the partial segments' bound and their sums: the sizes the H200 record shows for
    4,096 int64 indices of a 768-wide float32 gradient (the test above finds them in order)."""
    assert radix_sort_pairs_temp_bytes(4096, 8, 8) == 83_455 and scan_temp_bytes(4096) == 1_279
    assert partial_segments_bound(4096) * 8 == 36_040 and partial_segments_bound(4096) * 768 * 4 == 13_839_360


def test_a_long_sequence_holds_its_partial_sums_beside_the_gradient() -> None:
    """What the op adds for a 7B-sized embedding over 8 × 4,096 tokens: the partial sums alone are 590 MB, float32 (what a
    step's peak on a GPU can meet at the backward's end), beside the 524 MB bf16 gradient."""
    events = _model_events(8 * 4096, 4096, 32000, torch.bfloat16)
    allocated = [size for action, size in events if action == "alloc"]
    assert allocated[3] == radix_sort_pairs_temp_bytes(32768, 8, 8) and allocated[4] == 32000 * 4096 * 2
    assert max(allocated[5:]) == (32768 // 10 + 32768) * 4096 * 4 == 590_544_896
