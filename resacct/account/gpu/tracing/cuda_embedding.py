"""An embedding's backward as CUDA runs it: the index sort and per-segment partial sums it allocates around its output,
which one op on meta tensors hides (issue 31).

``embedding_dense_backward_cuda`` (aten/src/ATen/native/cuda/Embedding.cu) runs a feature kernel into its output alone
for up to 3,072 indices (without ``scale_grad_by_freq``); above that it sorts the indices with their positions
(``sorted_indices`` and ``orig_indices``, each as large as the indices; an ``arange`` of the positions and cub's radix
sort's temporary storage, both freed at once), then ``embedding_backward_cuda_kernel``
(EmbeddingBackwardKernel.cu) allocates the output (``grad_weight``, zeros) and, in order: ``segment_offsets`` (as large
as the indices), an 8-byte count of segments, cub's ``unique_by_key`` (its keys' output, which PyTorch's wrapper
allocates because the call passes none, and its temporary storage — both freed as it returns), ``partials_per_segment``
and its offsets (each as large as the indices), cub's ``exclusive_sum`` temporary storage (freed), an 8-byte count of
partial segments, ``partial_segment_offset`` (``n ÷ 10 + n`` indices: the bound on the partial segments, rows split in
tens) and ``grad_weight_per_segment`` (that bound × the embedding width, in the gradient's accumulate type: float32 for
16- and 32-bit floats); then frees everything but the output, the last made first, the sort's two buffers last.

The H200 record of 2026-11-30 (torch 2.11) shows it in every step with 4,096 tokens (gpt2-small, hf-gpt2, gqa-llama;
``tests/test_cuda_embedding.py``): ``alloc 32768`` three times, ``alloc 83455`` (the sort's storage), the output, ... ,
``alloc 36040`` (4,505 int64), ``alloc 13839360`` (4,505 × 768 × 4) — the 28 events of the embedding backward that were
the expandable step's only difference from the board.

cub's temporary storage is sized as cub's dispatch sizes it: its parts each rounded up to 256 bytes, plus 255 for the
base's alignment. The radix sort (``DeviceRadixSort::SortPairs`` over all the key's bits: 8 passes of 8 bits for int64
indices, 64-bit offsets): the digit histograms (passes × 256 × 8 bytes), the look-back states (256 × 4 bytes per tile of
384 × 21 keys, the onesweep policy of sm80 and later), the keys' and values' second buffers, a 4-byte counter per pass —
83,455 bytes for 4,096 int64 indices, the record's. The scans' (``unique_by_key``, ``exclusive_sum``): 1,279 bytes for
4,096 indices in the record; other counts are sized as decoupled look-back tile states (16 bytes per tile of 128 items,
32 tiles of padding: any tile of 128 to 240 items gives the record's size) — a reading of cub consistent with the
record's one size, not checked at another (a few KiB at most, in the small pool). ``scale_grad_by_freq`` (its counts, another sort) is not modelled: its output alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, no_type_check

import torch

__all__ = ["SORT_ABOVE_INDICES", "embedding_dense_backward", "radix_sort_pairs_temp_bytes", "scan_temp_bytes", "partial_segments_bound"]

#: Embedding.cu: up to this many indices (without scale_grad_by_freq) the backward runs its feature kernel, no sort
SORT_ABOVE_INDICES = 3072
_NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu: rows per partial segment
_ALIGN = 256  # cub's AliasTemporaries: each part aligned to 256 bytes, 255 more for the base
_RADIX_DIGITS = 256  # 8 bits a pass
_ONESWEEP_TILE_ITEMS = 384 * 21
_SCAN_TILE_ITEMS = 128
_SCAN_TILE_PADDING = 32
_SCAN_TILE_STATE_BYTES = 16
_COUNT_BYTES = 8  # num_of_segments, num_of_partial_segments: int64 scalars


def _aligned(parts: tuple[int, ...]) -> int:
    return _ALIGN - 1 + sum(-(-part // _ALIGN) * _ALIGN for part in parts)


def radix_sort_pairs_temp_bytes(items: int, key_bytes: int, value_bytes: int) -> int:
    """cub's temporary storage for sorting ``items`` key-value pairs over all the key's bits (the module doc)."""
    passes = key_bytes  # 8 bits a pass
    tiles = -(-items // _ONESWEEP_TILE_ITEMS)
    return _aligned((passes * _RADIX_DIGITS * 8, tiles * _RADIX_DIGITS * 4, items * key_bytes, items * value_bytes, passes * 4))


def scan_temp_bytes(items: int) -> int:
    """cub's temporary storage for a scan or ``unique_by_key`` over ``items`` (the module doc: 1,279 at 4,096)."""
    return _aligned(((-(-items // _SCAN_TILE_ITEMS) + _SCAN_TILE_PADDING) * _SCAN_TILE_STATE_BYTES,))


def partial_segments_bound(indices: int) -> int:
    """``partial_segment_offset``'s length: each index's own segment, plus the rows split in tens."""
    return indices // _NROWS_PER_THREAD + indices


@no_type_check  # per embedding backward of a traced step
def embedding_dense_backward(args: tuple, kwargs: dict, track: Callable[[torch.Tensor], None]) -> Any:
    """``aten.embedding_dense_backward`` as CUDA runs it, each temporary given to ``track`` as it is made (the module doc)."""
    names = ("grad_output", "indices", "num_weights", "padding_idx", "scale_grad_by_freq")
    given = dict(zip(names, args)) | kwargs
    grad, indices = given["grad_output"], given["indices"]
    count = indices.numel()
    if count <= SORT_ABOVE_INDICES or given.get("scale_grad_by_freq"):
        out = torch.ops.aten.embedding_dense_backward.default(*args, **kwargs)
        track(out)
        return out
    index_bytes = indices.element_size()

    def block(nbytes: int) -> torch.Tensor:
        made = torch.empty(nbytes, dtype=torch.uint8, device=grad.device)
        track(made)
        return made

    sorted_indices, orig_indices = block(count * index_bytes), block(count * index_bytes)
    positions = block(count * index_bytes)
    sort_storage = block(radix_sort_pairs_temp_bytes(count, index_bytes, index_bytes))
    del sort_storage, positions
    out = torch.ops.aten.embedding_dense_backward.default(*args, **kwargs)
    track(out)
    segment_offsets, segments = block(count * index_bytes), block(_COUNT_BYTES)
    unique_keys = block(count * index_bytes)
    unique_storage = block(scan_temp_bytes(count))
    del unique_storage, unique_keys
    partials, partials_offsets = block(count * index_bytes), block(count * index_bytes)
    scan_storage = block(scan_temp_bytes(count))
    del scan_storage
    partial_segments = block(_COUNT_BYTES)
    bound = partial_segments_bound(count)
    partial_offsets = block(bound * index_bytes)
    accumulate_bytes = 8 if grad.dtype == torch.float64 else 4  # acc_type: float for half, bfloat16 and float
    per_segment = block(bound * grad.shape[-1] * accumulate_bytes)
    del per_segment, partial_offsets, partial_segments, partials_offsets, partials, segments, segment_offsets
    del orig_indices, sorted_indices
    return out
