"""The scratch CUDA kernels take from the caching allocator inside one op, which one op on meta tensors hides (issue 31):
Reduce.cuh's global staging buffer, the backward workspaces of flash and memory-efficient attention, and softmax's
backward's product.

Softmax's backward on CUDA (``softmax_backward_cuda_out`` in aten/src/ATen/native/cuda/SoftMax.cu) computes
``Tensor tmp = grad * output;`` after its output and hands ``tmp`` to the kernel: one more block of the scores' size (in
the product's dtype), freed when the op returns. The H200 record's math-path steps show it in every layer's backward
(gpt2-small/fp32/math: ``alloc 201326592`` twice, then the first free, for batch 4 × 12 heads × 1,024² float32;
gqa-llama/fp32/math: 268,435,456).

A sum over many rows (a ``Linear``'s bias gradient: ``grad.sum(0)`` of a ``[tokens, outputs]`` tensor; RMSNorm's weight
gradient: a sum over the batch and sequence) runs ``gpu_reduce_kernel``, which splits each output's rows over several
blocks when there are many and stages their partial sums in global memory: it allocates ``config.global_memory_size()``
bytes and ``config.semaphore_size()`` bytes from the caching allocator after the op's output, and frees both (the
semaphores first) when the kernel is launched. One op on meta tensors shows only the output. The H200 record of
2026-11-30 (torch 2.11, 132 SMs) shows it per ``Linear`` of every step: ``alloc 25165824`` and ``alloc 24`` for a
768-wide bias over 4,096 rows, ``alloc 75497472``/``alloc 72`` for 2,304, ``alloc 100663296``/``alloc 96`` for 3,072,
each freed at once (``tests/test_cuda_scratch.py``).

:func:`reduction_scratch_bytes` follows ``setReduceConfig`` (aten/src/ATen/native/cuda/Reduce.cuh) for the case that
stages: the reduced dimensions outside the kept ones (a contiguous input reduced over its leading dimensions: the kept
dimensions are the fastest-moving), where each thread block takes ``block_width × output_vec_size`` outputs and the rows
are split over ``ctas_per_output`` blocks. The board enters through its multiprocessor count (a record's
``multi_processor_count``; a ``--device`` answer's: the datasheet entry's ``multiprocessors``) and its threads per
multiprocessor (2,048 on sm_70/80/90/100, 1,024 on sm_75, 1,536 on sm_86/89/120: :data:`MAX_THREADS_PER_MULTIPROCESSOR`). Reductions over the fastest-moving dimension (a row's mean) stage at most
a few KiB when they stage at all: not modelled; nor are inputs that are not contiguous, or over 2³¹ elements (split
into sub-iterators on a GPU).

Flash attention's backward (``mha_bwd`` in aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp, FlashAttention
2 as PyTorch vendors it) allocates after its gradients: ``softmax_d`` (float32, batch × heads × the query length rounded
up to 128), ``dq_accum`` (float32, batch × rounded query length × heads × the head size rounded up to 32; ``loop`` is
always true there), and with grouped-query attention ``dk_expanded`` and ``dv_expanded`` (the query's dtype, batch × key
length × query heads × head size) that it sums into the key/value heads' gradients — all four freed, the last first,
when it returns. The H200 record's gqa-llama/bf16/flash step shows them in every layer's backward: ``alloc 262144``,
``alloc 16777216``, two ``alloc 8388608``, then their frees in reverse (batch 4 × 1,024, 16 query and 4 key/value heads
of 64). Deterministic mode's per-split ``dq_accum`` is not modelled.

The memory-efficient kernel's backward (``_efficient_attention_backward`` in
aten/src/ATen/native/transformers/cuda/attention_backward.cu, its kernel ``AttentionBackwardKernel`` in
mem_eff_attention/kernel_backward.h) allocates after its gradients: where the kernel does not compute ``delta`` itself
(float32: ``kKernelComputesDelta`` is true for 16-bit types only), ``(grad_out.to(float) * out.to(float)).sum(-1)
.transpose(-2, -1).contiguous()`` — the product (batch × query length × heads × the value's head size, float32: the
casts are no-ops), its sum and the contiguous ``delta`` (batch × heads × query length, float32), the
expression's temporaries freed last first — else ``delta`` alone; then the kernel's ``workspace`` (``workspace_size()``:
batch × heads × ``workspace_strideBH()`` floats, where the grad-query accumulators — always needed since split keys
were enabled — are ``ceil(M / kBlockSizeI) × ceil(K / kBlockSizeJ)`` tiles of ``kBlockSizeI × kBlockSizeJ`` floats and
16 bytes of lock); ``delta`` is freed when the launch returns, the workspace when the op does. A ``grad_out`` that is not
contiguous in the kernel's (batch, length, heads, head size) layout is copied first (allocated here after the gradients,
bytes exact, order approximate). The tiles are those the sm80 kernels dispatch to for a head size up to 64 (64 × 64, the
first kernel of ``dispatch_cutlassB_{f32,bf16,f16}_sm80`` to take it; the recorded boards are sm90, which runs them);
larger head sizes take other tiles, not modelled. The H200 record's fp32 steps show it in every layer's backward
(hf-gpt2/fp32/efficient, batch 4 × 1,024, 12 heads of 64: ``alloc 12582912``, ``alloc 196608`` twice, their frees, then
``alloc 12595200`` — 48 × 16 × (64 × 64 + 4) floats — and the frees; ``tests/test_cuda_scratch.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from typing import Any, no_type_check

import torch

__all__ = ["ReductionBoard", "MAX_THREADS_PER_MULTIPROCESSOR", "reduction_gap", "ScratchPlan", "reduction_scratch_bytes", "flash_backward_scratch_bytes", "efficient_backward_scratch",
           "softmax_backward_scratch", "kernel_scratch", "take_scratch"]

#: a kernel's scratch in order: ``("alloc", bytes)`` takes a new block, ``("free", n)`` frees the n-th block it took (from 0)
ScratchPlan = tuple[tuple[str, int], ...]

_MAX_NUM_THREADS = 512
_WARP_SIZE = 32
_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_INT_BYTES = 4


#: resident threads per multiprocessor by compute capability (CUDA C++ Programming Guide, "Technical Specifications per
#: Compute Capability": maximum number of resident threads per SM) — the capabilities of the boards resacct lists
MAX_THREADS_PER_MULTIPROCESSOR = {(7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 7): 2048, (8, 9): 1536,
                                  (9, 0): 2048, (10, 0): 2048, (12, 0): 1536}


@dataclass(frozen=True)
class ReductionBoard:
    """What ``setReduceConfig`` asks of the device: its multiprocessor count and threads per multiprocessor."""

    multiprocessors: int
    max_threads_per_multiprocessor: int = 2048

    @classmethod
    def sized(cls, multiprocessors: int | None, capability: tuple[int, int] | None) -> ReductionBoard | None:
        """A board of ``multiprocessors`` and compute ``capability`` (its threads per multiprocessor from
        :data:`MAX_THREADS_PER_MULTIPROCESSOR`); None where either is unknown: the staging is then not predicted."""
        threads = MAX_THREADS_PER_MULTIPROCESSOR.get(capability)  # type: ignore[arg-type]
        return None if not multiprocessors or threads is None else cls(multiprocessors, threads)

    @classmethod
    def of(cls, board: Any) -> ReductionBoard | None:
        """The reduction kernels' view of ``board`` (an :class:`~resacct.facts.hardware.Accelerator`): its datasheet
        entry's multiprocessors and compute capability (:meth:`sized`; :func:`reduction_gap` says why there is none)."""
        return cls.sized(getattr(board, "multiprocessors", None), getattr(board, "compute_capability", None))

    def text(self) -> str:
        """One line: what the reduction kernels are sized by."""
        return f"{self.multiprocessors} multiprocessors × {self.max_threads_per_multiprocessor:,} threads"


def reduction_gap(board: Any) -> str | None:
    """Why ``board``'s reduction kernels' staging is not predicted (None: it is): the datasheet gives no
    multiprocessor count, or its compute capability is not in :data:`MAX_THREADS_PER_MULTIPROCESSOR`."""
    if getattr(board, "multiprocessors", None) is None:
        return f"no multiprocessor count for {board.name} in resacct's datasheet"
    capability = getattr(board, "compute_capability", None)
    if MAX_THREADS_PER_MULTIPROCESSOR.get(capability) is None:
        shown = "none" if capability is None else "{}.{}".format(*capability)
        return f"compute capability {shown} of {board.name}: its threads per multiprocessor are not in resacct's table"
    return None


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


@no_type_check  # per reduction of a traced step
def reduction_scratch_bytes(shape: tuple[int, ...], reduced: tuple[int, ...], accumulate_bytes: int, board: ReductionBoard, *,
                            storage_offset: int = 0) -> tuple[int, int]:
    """The staging buffer's and the semaphores' bytes (``(0, 0)``: none) of a sum or mean of a contiguous tensor of
    ``shape`` over the dimensions ``reduced``, accumulated in ``accumulate_bytes`` per value (float32's 4 for every
    16-bit or 32-bit float), its first element ``storage_offset`` elements into its storage (the vector width's alignment)."""
    dims = [(size, index in reduced) for index, size in enumerate(shape) if size != 1]
    if not dims or all(is_reduced for _, is_reduced in dims) or not any(is_reduced for _, is_reduced in dims):
        return 0, 0  # a full reduction or none: over the fastest-moving dimension, not modelled
    # coalesced as TensorIterator does on a contiguous input: a run of reduced dimensions outside a run of kept ones
    flags = [is_reduced for _, is_reduced in dims]
    first_kept = flags.index(False)
    if any(flags[first_kept:]) or not any(flags[:first_kept]):
        return 0, 0  # kept dimensions outside reduced ones (the reduction is the fastest-moving): not modelled
    inputs_per_output = prod(size for size, is_reduced in dims if is_reduced)
    kept = [size for size, is_reduced in dims if not is_reduced]
    num_outputs = prod(kept)
    row_stride = num_outputs  # elements between two reduced rows
    vec = 4  # get_output_vec_size: 4, halved until the input's address, the outputs' size and the strides divide by it
    for value in (storage_offset, num_outputs, row_stride):
        while value % vec:
            vec //= 2
    max_threads = _MAX_NUM_THREADS // vec
    dim0, dim1 = max(num_outputs // vec, 1), inputs_per_output
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, _WARP_SIZE)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    step_output = block_width  # output_mult[0] = split_output(block_width)
    step_input = 1
    if _div_up(inputs_per_output, step_input) < min(block_height * 16, _MAX_VALUES_PER_THREAD):
        return 0, 0  # not split across warps: no global reduction
    step_input *= block_height  # input_mult[1] = split_input(block_height)
    values_per_thread = _div_up(inputs_per_output, step_input)
    grid_x = _div_up(num_outputs // vec, step_output)
    target_grid_size = board.multiprocessors * (board.max_threads_per_multiprocessor // num_threads)
    if values_per_thread < _MAX_VALUES_PER_THREAD or grid_x > target_grid_size:
        return 0, 0
    ctas_per_output = max(min(_div_up(target_grid_size, grid_x), _div_up(values_per_thread, _MIN_VALUES_PER_THREAD)),
                          _div_up(values_per_thread, _MAX_VALUES_PER_THREAD))
    if ctas_per_output <= 1:
        return 0, 0
    return accumulate_bytes * num_outputs * ctas_per_output * block_width * vec, _INT_BYTES * grid_x


_FLOATING_ACCUMULATE_BYTES = {torch.float32: 4, torch.float16: 4, torch.bfloat16: 4, torch.float64: 8}
_REDUCTIONS = {torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim}


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@no_type_check  # per attention layer of a traced step
def flash_backward_scratch_bytes(query: torch.Tensor, key: torch.Tensor) -> tuple[int, ...]:
    """The workspaces flash attention's backward allocates after its gradients, for sdpa-layout ``query`` (batch, heads,
    length, head size) and ``key``: ``softmax_d``, ``dq_accum`` and, where the key has fewer heads, ``dk``/``dv`` expanded."""
    batch, heads, query_length, head_size = query.shape
    key_heads, key_length = key.shape[1], key.shape[2]
    query_rounded = _round_up(query_length, 128)
    head_rounded = _round_up(head_size, 32) if head_size <= 192 else 256
    sizes = [batch * heads * query_rounded * 4, batch * query_rounded * heads * head_rounded * 4]
    if key_heads != heads:
        sizes += [batch * key_length * heads * head_size * query.element_size()] * 2
    return tuple(sizes)


def _last_first(sizes: tuple[int, ...]) -> ScratchPlan:
    """Blocks taken in order and freed in the reverse (the kernels' local workspaces going out of scope)."""
    return tuple(("alloc", size) for size in sizes) + tuple(("free", index) for index in reversed(range(len(sizes))))


_EFFICIENT_TILE = 64  # kBlockSizeI = kBlockSizeJ of the sm80 kernels that take a head size up to 64
_EFFICIENT_MAX_HEAD = 64
_GRAD_Q_LOCK_FLOATS = 4  # GradQTempStorage's lock, counter and padding to 128 bits


@no_type_check  # per attention layer of a traced step
def efficient_backward_scratch(grad_out: torch.Tensor, query: torch.Tensor, value: torch.Tensor) -> ScratchPlan:
    """The memory-efficient backward's scratch for sdpa-layout (batch, heads, length, head size) ``grad_out``, ``query``
    and ``value`` (the module doc); none for a head size over 64 (other tiles: not modelled)."""
    batch, heads, queries, head_size = query.shape
    value_size = value.shape[-1]
    if max(head_size, value_size) > _EFFICIENT_MAX_HEAD:
        return ()
    plan: list[tuple[str, int]] = []
    taken = 0

    def alloc(size: int) -> int:
        nonlocal taken
        plan.append(("alloc", size))
        taken += 1
        return taken - 1

    copied = None if grad_out.transpose(1, 2).is_contiguous() else alloc(grad_out.numel() * grad_out.element_size())
    rows = batch * heads * queries
    if query.dtype == torch.float32:  # delta from the product's sum: the product, the sum, the contiguous delta
        product, row_sum, delta = alloc(rows * value_size * 4), alloc(rows * 4), alloc(rows * 4)
        plan += [("free", row_sum), ("free", product)]
    elif query.dtype in (torch.float16, torch.bfloat16):
        delta = alloc(rows * 4)  # the kernel computes delta into it
    else:
        return ()
    tiles = -(-queries // _EFFICIENT_TILE) * -(-head_size // _EFFICIENT_TILE)
    workspace = alloc(batch * heads * _round_up(tiles * (_EFFICIENT_TILE * _EFFICIENT_TILE + _GRAD_Q_LOCK_FLOATS), 4) * 4)
    plan += [("free", delta), ("free", workspace)] + ([] if copied is None else [("free", copied)])
    return tuple(plan)


_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_backward", None)
_FLASH_BACKWARD_OP = None if _FLASH_BACKWARD is None else _FLASH_BACKWARD.default
_EFFICIENT_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention_backward", None)
_EFFICIENT_BACKWARD_OP = None if _EFFICIENT_BACKWARD is None else _EFFICIENT_BACKWARD.default
_SOFTMAX_BACKWARD_OP = torch.ops.aten._softmax_backward_data.default


@no_type_check  # per softmax of a traced step
def softmax_backward_scratch(grad: torch.Tensor, output: torch.Tensor) -> ScratchPlan:
    """``tmp = grad * output``, taken after the op's output and freed when it returns (the module doc)."""
    dtype = torch.promote_types(grad.dtype, output.dtype)
    size = max(grad.numel(), output.numel()) * dtype.itemsize
    return _last_first((size,)) if size else ()


@no_type_check  # per op of a traced step
def kernel_scratch(func: Any, args: tuple, kwargs: dict, board: ReductionBoard | None) -> ScratchPlan:
    """The blocks ``func``'s CUDA kernel takes after its outputs and frees before it returns, as a :data:`ScratchPlan`, on
    ``board`` (None: the board's multiprocessors unknown, reductions left out); none where the op takes none."""
    if func is _FLASH_BACKWARD_OP:  # (grad_out, query, key, value, out, logsumexp, ...)
        return _last_first(flash_backward_scratch_bytes(args[1], args[2]))
    if func is _EFFICIENT_BACKWARD_OP:  # (grad_out, query, key, value, attn_bias, out, logsumexp, ...)
        return efficient_backward_scratch(args[0], args[1], args[3])
    if func is _SOFTMAX_BACKWARD_OP:  # (grad_output, output, dim, input_dtype)
        return softmax_backward_scratch(args[0], args[1])
    if board is None or func not in _REDUCTIONS:
        return ()
    source = args[0]
    if not isinstance(source, torch.Tensor) or source.dtype not in _FLOATING_ACCUMULATE_BYTES or not source.is_contiguous():
        return ()
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if not dims:
        return ()
    rank = source.dim()
    if rank == 0:  # a scalar's sum: one element, no staging
        return ()
    reduced = tuple(sorted({int(d) % rank for d in dims}))
    staging, semaphores = reduction_scratch_bytes(tuple(source.shape), reduced, _FLOATING_ACCUMULATE_BYTES[source.dtype], board,
                                                  storage_offset=source.storage_offset())
    return _last_first((staging, semaphores)) if staging else ()


@no_type_check  # per op of a traced step
def take_scratch(allocator: Any, plan: ScratchPlan, ids: Iterator[int]) -> None:
    """Run ``plan`` on ``allocator`` (a caching allocator model): each block it takes owned by ``("kernel scratch", next(ids))``."""
    owners: list[tuple[str, int]] = []
    for action, value in plan:
        if action == "alloc":
            owners.append(("kernel scratch", next(ids)))
            allocator.malloc(owners[-1], value)
        else:
            allocator.free(owners[value])
