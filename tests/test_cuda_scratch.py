"""What a CUDA training step allocates that one op on meta hides, against the H200 record (issue 31):
Reduce.cuh's staging buffers (resacct/account/gpu/tracing/cuda_scratch.py) and autograd's in-place gradient
accumulation (resacct/account/gpu/tracing/cuda_composites.py).

The record (docs/gpu/2026-11-30-h200-record.json.gz, torch 2.11 on a 132-SM H200) is the truth for the sizes; the
accumulation's reference counts are torch's own, measured in this process."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.records.board_record import board_record_step, read_board_record
from resacct.account.gpu.tracing.cuda_composites import sole_buffer_counts
from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard, reduction_scratch_bytes

H200_RECORD = "docs/gpu/2026-11-30-h200-record.json.gz"
EXPANDABLE = "gpt2-small/fp32/efficient/expandable"  # resacct's GPT-2 small, fp32, batch 4 × 1024: 4,096 rows per bias gradient


def _allocs(events) -> list[int]:  # type: ignore[no-untyped-def]
    return [event.size for event in events if event.action == "alloc"]


def test_the_staging_buffers_are_the_boards_for_each_bias_width() -> None:
    """Each of the step's bias widths (768, 2,304, 3,072) over 4,096 rows: the staging buffer and semaphores the
    model gives are allocated right after each other on the board, as often as the step has such biases."""
    data = read_board_record(H200_RECORD)
    entry = board_record_step(H200_RECORD, data, EXPANDABLE)
    board = ReductionBoard(data["multi_processor_count"])
    sizes = [size for action, _, size, _ in entry["trace"] if action == "alloc"]
    pairs = Counter(zip(sizes, sizes[1:]))
    for width, per_layer in ((768, 2), (2304, 1), (3072, 1)):
        staging, semaphores = reduction_scratch_bytes((4096, width), (0,), 4, board)
        assert staging > 0 and pairs[(staging, semaphores)] == per_layer * 12 * 3, width  # 12 layers, 2 warm-up steps and the measured one
    assert reduction_scratch_bytes((4, 1024, 768), (0, 1), 4, board) == reduction_scratch_bytes((4096, 768), (0,), 4, board)


def test_a_reduction_that_does_not_stage_allocates_nothing_more() -> None:
    board = ReductionBoard(132)
    assert reduction_scratch_bytes((4096, 768), (1,), 4, board) == (0, 0)  # over the fastest-moving dimension: not modelled
    assert reduction_scratch_bytes((4096, 768), (0, 1), 4, board) == (0, 0)  # everything: not modelled
    assert reduction_scratch_bytes((8, 768), (0,), 4, board) == (0, 0)  # 8 rows: one block per output, no global reduction


def _linear_backward_allocs(board: ReductionBoard | None) -> list[int]:
    layer = torch.nn.Linear(768, 768, device="meta")
    inputs = torch.empty(4096, 768, device="meta", requires_grad=True)
    recorder = AllocationRecorder(device="meta")
    recorder.reduction_board = board
    with recorder:
        layer(inputs).pow(2).sum().backward()  # a contiguous gradient reaches the bias's sum (a plain .sum()'s is an expand)
    return _allocs(recorder.allocator.events)


def test_a_bias_gradient_allocates_the_staging_after_its_output_on_a_known_board_only() -> None:
    without, with_board = _linear_backward_allocs(None), _linear_backward_allocs(ReductionBoard(132))
    staging, semaphores = reduction_scratch_bytes((4096, 768), (0,), 4, ReductionBoard(132))
    at = with_board.index(staging)
    assert with_board[at - 1] == 768 * 4 and with_board[at + 1] == semaphores  # the bias gradient, then the staging, then the semaphores
    assert with_board[:at] + with_board[at + 2:] == without


def _residual_allocs(keep_a_gradient: bool) -> tuple[list[int], int]:
    first, second = torch.nn.Linear(256, 256, bias=False, device="meta"), torch.nn.Linear(256, 256, bias=False, device="meta")
    kept: list[torch.Tensor] = []

    class Keep(torch.autograd.Function):  # the identity, whose backward passes a view of the gradient and keeps the gradient
        @staticmethod
        def forward(ctx, tensor):  # type: ignore[no-untyped-def]
            return tensor.view_as(tensor)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            kept.append(grad)  # another tensor on the passed gradient's storage: the engine may not sum into it
            return grad.view_as(grad)

    x = torch.empty(64, 256, device="meta", requires_grad=True)
    recorder = AllocationRecorder(device="meta")
    with recorder:
        hidden = x * 2.0  # x's two gradients meet in the buffer of this mul's node (a non-leaf)
        through = Keep.apply if keep_a_gradient else (lambda tensor: tensor)  # both paths: whichever gradient arrives first is a kept one's view
        (first(through(hidden)) + second(through(hidden))).sum().backward()
    return _allocs(recorder.allocator.events), 64 * 256 * 4


@pytest.mark.skipif(sole_buffer_counts() is None, reason="this torch shows no accumulating add to measure the counts on")
def test_the_engines_sum_of_two_gradients_takes_the_first_ones_block_unless_another_holds_it() -> None:
    """input_buffer.cpp adds in place when it holds the first gradient alone: no block for the sum. A first gradient
    whose storage another tensor shares is summed out of place — one activation-sized block more (the board's tied
    embedding: its two gradients' sum allocates)."""
    alone, size = _residual_allocs(keep_a_gradient=False)
    held, _ = _residual_allocs(keep_a_gradient=True)
    assert held.count(size) == alone.count(size) + 1


def test_the_committed_expandable_steps_reserved_peak_is_predicted_to_the_byte() -> None:
    """The step whose reserved peak missed by 1.9 % before the accumulation was modelled (72 sums that allocated a block
    on meta, none on the board): now the board's to the byte."""
    pytest.importorskip("transformers")
    if torch.__version__ < "2.8":
        pytest.skip("the H200 record's predictions need torch >= 2.8")
    from resacct.account.gpu.records.record_models import predict_step_of_record

    data = read_board_record(H200_RECORD)
    entry = board_record_step(H200_RECORD, data, EXPANDABLE)
    window: list[tuple[str, int, str]] = []
    predicted = predict_step_of_record(data, entry, window=window)
    assert predicted.peak_reserved_bytes == entry["max_memory_reserved"]
    assert predicted.peak_allocated_bytes == entry["max_memory_allocated"]
    # event by event (tools/gpu_record.py --diff): the board's allocations and frees of the measured step are the
    # prediction's, every one in order — the memory-efficient backward's delta and workspace in every layer (session 27)
    # and the embedding backward's index sort and partial sums (session 29: they were the last 28 events apart)
    compared = ("alloc", "free_completed")
    board = [(row[0], row[2]) for row in entry["trace"][entry["window_start"]:] if row[0] in compared]
    ours = [event for event in window if event[0] in compared]
    assert [(action, size) for action, size, _ in ours] == board
    assert Counter(size for action, size, _ in ours if action == "alloc")[12595200] == 12  # each layer's workspace


GQA_FLASH = "gqa-llama/bf16/flash"  # batch 4 × 1,024, 16 query heads and 4 key/value heads of 64, bf16, 8 layers


def test_flash_backwards_workspaces_are_the_boards_in_every_layer() -> None:
    from resacct.account.gpu.tracing.cuda_scratch import flash_backward_scratch_bytes

    data = read_board_record(H200_RECORD)
    entry = board_record_step(H200_RECORD, data, GQA_FLASH)
    query = torch.empty(4, 16, 1024, 64, device="meta", dtype=torch.bfloat16)
    key = torch.empty(4, 4, 1024, 64, device="meta", dtype=torch.bfloat16)
    workspaces = list(flash_backward_scratch_bytes(query, key))
    assert workspaces == [262144, 16777216, 8388608, 8388608]  # softmax_d, dq_accum, dk and dv over the query heads
    sizes = [size for action, _, size, _ in entry["trace"] if action == "alloc"]
    runs = sum(sizes[index:index + 4] == workspaces for index in range(len(sizes)))
    assert runs == 8 * 3  # each layer's backward, in the two warm-up steps and the measured one
    assert flash_backward_scratch_bytes(query, query) == (262144, 16777216)  # no grouped-query heads: nothing expanded


@pytest.mark.skipif(torch.__version__ < "2.8", reason="CUDA's flash kernel has a meta kernel from torch 2.8")
def test_the_flash_backward_takes_its_workspaces_after_its_gradients_and_frees_them_last_first() -> None:
    from resacct.account.gpu.tracing.cuda_step import sdpa_routing

    query = torch.empty(4, 16, 1024, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    key_value = torch.empty(4, 4, 1024, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    recorder = AllocationRecorder(device="meta")
    with recorder, sdpa_routing("flash", (9, 0), forced=True):
        torch.nn.functional.scaled_dot_product_attention(query, key_value, key_value, is_causal=True, enable_gqa=True).sum().backward()
    events = [(event.action, event.size) for event in recorder.allocator.events if event.action in ("alloc", "free_completed")]
    start = events.index(("alloc", 262144), events.index(("alloc", 2097152)))  # after dq, dk, dv
    assert events[start:start + 8] == [("alloc", 262144), ("alloc", 16777216), ("alloc", 8388608), ("alloc", 8388608),
                                       ("free_completed", 8388608), ("free_completed", 8388608), ("free_completed", 16777216),
                                       ("free_completed", 262144)]


@pytest.mark.skipif(torch.__version__ < "2.8", reason="CUDA's flash kernel has a meta kernel from torch 2.8")
def test_flash_on_a_head_size_that_is_not_a_multiple_of_8_is_padded_as_sdpa_does_on_a_gpu() -> None:
    """attention.cpp pads query, key and value to a multiple of 8 before CUDA's flash kernel (each a copy), keeps the
    unpadded size's scale and slices the output: three more blocks of the padded size, and the same output shape."""
    from resacct.account.gpu.tracing.cuda_step import sdpa_routing

    def forward_allocs(head: int) -> tuple[list[int], tuple[int, ...]]:
        query = torch.empty(2, 8, 128, head, device="meta", dtype=torch.bfloat16)
        recorder = AllocationRecorder(device="meta")
        with recorder, sdpa_routing("flash", (9, 0), forced=True):
            out = torch.nn.functional.scaled_dot_product_attention(query, query, query, is_causal=True)
        return _allocs(recorder.allocator.events), tuple(out.shape)

    padded_bytes = 2 * 8 * 128 * 8 * 2
    four, shape = forward_allocs(4)
    eight, _ = forward_allocs(8)
    assert shape == (2, 8, 128, 4)
    assert four.count(padded_bytes) == eight.count(padded_bytes) + 3  # the three padded copies; the output is the padded size's


def test_the_efficient_backwards_delta_and_workspace_are_the_boards_in_every_layer() -> None:
    """hf-gpt2/fp32/efficient: batch 4 × 1,024, 12 heads of 64, fp32: the product, its sum, delta, the frees, the workspace."""
    from resacct.account.gpu.tracing.cuda_scratch import efficient_backward_scratch

    data = read_board_record(H200_RECORD)
    entry = board_record_step(H200_RECORD, data, "hf-gpt2/fp32/efficient")
    grad_out = torch.empty(4, 1024, 12, 64, device="meta").transpose(1, 2)  # the kernel's layout, seen as sdpa's
    query = torch.empty(4, 12, 1024, 64, device="meta")
    plan = efficient_backward_scratch(grad_out, query, query)
    assert plan == (("alloc", 12582912), ("alloc", 196608), ("alloc", 196608), ("free", 1), ("free", 0), ("alloc", 12595200),
                    ("free", 2), ("free", 3))
    allocated = [size for action, size in plan if action == "alloc"]
    sizes = [size for action, _, size, _ in entry["trace"] if action == "alloc"]
    runs = sum(sizes[index:index + 3] == allocated[:3] and 12595200 in sizes[index + 3:index + 6] for index in range(len(sizes)))
    assert runs == 12 * 3  # each layer's backward, in the two warm-up steps and the measured one


def test_the_efficient_backwards_scratch_for_16_bit_inputs_a_copied_grad_and_a_wide_head() -> None:
    """Pins the 16-bit rule as read from the kernel's source (kernel_backward.h), **not evidence**: no recorded step ran a
    16-bit efficient backward. The next record's ``hf-gpt2/bf16-autocast/efficient`` decides it (tools/gpu_record.py --diff);
    the fp32 rule above is the board's."""
    from resacct.account.gpu.tracing.cuda_scratch import efficient_backward_scratch

    query = torch.empty(2, 8, 100, 32, device="meta", dtype=torch.bfloat16)
    grad_out = torch.empty(2, 100, 8, 32, device="meta", dtype=torch.bfloat16).transpose(1, 2)
    # 16-bit: the kernel computes delta; 2 query tiles × 1 column tile of 64 × 64 floats and a lock, per (batch, head)
    workspace = 2 * 8 * 2 * (64 * 64 + 4) * 4
    assert efficient_backward_scratch(grad_out, query, query) == (("alloc", 2 * 8 * 100 * 4), ("alloc", workspace), ("free", 0), ("free", 1))
    contiguous = torch.empty(2, 8, 100, 32, device="meta", dtype=torch.bfloat16)  # not the kernel's layout: copied first, freed last
    plan = efficient_backward_scratch(contiguous, query, query)
    assert plan[0] == ("alloc", contiguous.numel() * 2) and plan[-1] == ("free", 0) and len(plan) == 6
    wide = torch.empty(2, 8, 100, 128, device="meta", dtype=torch.bfloat16)
    assert efficient_backward_scratch(wide, wide, wide) == ()  # other tiles: not modelled


def test_softmaxs_backward_takes_the_product_of_its_grad_and_output_in_every_math_layer() -> None:
    """SoftMax.cu's ``Tensor tmp = grad * output;``: one more scores-sized block after the op's output, freed as it returns."""
    from resacct.account.gpu.tracing.cuda_scratch import kernel_scratch

    scores = torch.empty(4, 12, 1024, 1024, device="meta")
    backward = torch.ops.aten._softmax_backward_data.default
    assert kernel_scratch(backward, (scores, scores, -1, torch.float32), {}, None) == (("alloc", 201326592), ("free", 0))
    half = torch.empty(2, 3, 8, 8, device="meta", dtype=torch.float16)
    assert kernel_scratch(backward, (half.float(), half, -1, torch.float16), {}, None) == (("alloc", 2 * 3 * 8 * 8 * 4), ("free", 0))
    data = read_board_record(H200_RECORD)
    trace = board_record_step(H200_RECORD, data, "gpt2-small/fp32/math")["trace"]
    events = [(action, size) for action, _, size, _ in trace if action in ("alloc", "free_completed")]
    # the gradient, tmp, tmp freed as the op returns, then autograd frees the incoming gradient and the saved output
    run = [("alloc", 201326592)] * 2 + [("free_completed", 201326592)] * 3
    assert sum(events[index:index + 5] == run for index in range(len(events))) == 12 * 3  # every layer, two warm-ups and the step


def test_a_scalars_reduction_takes_no_staging_and_raises_nothing() -> None:
    """``x.sum(0)`` of a 0-d tensor (torch accepts it): one element, no staging buffer — it used to divide by its rank."""
    from resacct.account.gpu.tracing.cuda_scratch import kernel_scratch

    scalar = torch.empty((), device="meta")
    assert tuple(kernel_scratch(torch.ops.aten.sum.dim_IntList, (scalar, [0]), {}, ReductionBoard(132))) == ()
    recorder = AllocationRecorder(device="meta")
    recorder.reduction_board = ReductionBoard(132)
    with recorder:
        total = scalar.sum(0)
    assert total.shape == () and [event.action for event in recorder.allocator.events] == ["segment_alloc", "alloc"]
