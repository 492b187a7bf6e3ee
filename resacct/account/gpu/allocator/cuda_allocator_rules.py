"""The CUDA caching allocator's rules and data, as c10/cuda/CUDACachingAllocator.cpp has them
(pytorch/pytorch, read at commit 001074d2): the size constants, ``round_size``,
``get_allocation_size``, the ``Block`` a segment is cut into, a ``BlockPool``, the settings of
``PYTORCH_CUDA_ALLOC_CONF`` the model follows. The model that uses them:
:mod:`resacct.account.gpu.allocator.cuda_allocator`.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass
from typing import no_type_check

from resacct.errors import ResacctError

__all__ = ["AllocatorConfig", "Block", "BlockPool", "CudaOutOfMemory", "TraceEvent", "round_size", "allocation_size", "UNLIMITED",
           "KMIN_BLOCK_BYTES", "KSMALL_SIZE_BYTES", "KSMALL_BUFFER_BYTES", "KLARGE_BUFFER_BYTES", "KMIN_LARGE_ALLOC_BYTES", "KROUND_LARGE_BYTES"]

KMIN_BLOCK_BYTES = 512  # all sizes are rounded to at least 512 bytes
KSMALL_SIZE_BYTES = 1 << 20  # largest "small" allocation is 1 MiB
KSMALL_BUFFER_BYTES = 2 << 20  # "small" allocations are packed in 2 MiB blocks
KLARGE_BUFFER_BYTES = 20 << 20  # "large" allocations may be packed in 20 MiB blocks
KMIN_LARGE_ALLOC_BYTES = 10 << 20  # allocations between 1 and 10 MiB may use kLargeBuffer
KROUND_LARGE_BYTES = 2 << 20  # round up large allocations to 2 MiB
UNLIMITED = 2**64 - 1  # max_split_size's default: SIZE_MAX


class CudaOutOfMemory(ResacctError):
    """The modelled device's ``capacity_bytes`` cannot hold the request, after freeing the cache."""


@dataclass(frozen=True)
class AllocatorConfig:
    """``PYTORCH_CUDA_ALLOC_CONF``'s settings the model follows; ``capacity_bytes`` is what
    ``cudaMalloc`` may hand out in all (None: unlimited)."""

    max_split_size_bytes: int | None = None
    expandable_segments: bool = False
    capacity_bytes: int | None = None
    expandable_small_page_bytes: int = KSMALL_BUFFER_BYTES
    expandable_large_page_bytes: int = KLARGE_BUFFER_BYTES

    @property
    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def max_split(self) -> int:
        return UNLIMITED if self.max_split_size_bytes is None else self.max_split_size_bytes


@no_type_check  # made per block, event or op of a traced step (docs/suite_time.md, session 24)
@dataclass(eq=False)
class Block:
    """A range of a segment: handed out (``allocated``), cached free, or (expandable) unmapped."""

    addr: int
    size: int
    stream: int
    small: bool
    segment: int  # the address of the segment's first byte
    allocated: bool = False
    requested: int = 0
    mapped: bool = True
    expandable: bool = False
    prev: Block | None = None
    next: Block | None = None
    owner: Hashable = None

    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.addr)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@no_type_check  # made per block, event or op of a traced step (docs/suite_time.md, session 24)
@dataclass(frozen=True)
class TraceEvent:
    """One of ``record_trace``'s actions, as ``torch.cuda.memory._snapshot()['device_traces']`` has them."""

    action: str  # alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap
    addr: int
    size: int
    stream: int


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def round_size(size: int) -> int:
    """``round_size``: 512 bytes at least, else the next multiple of 512.

    >>> round_size(1), round_size(512), round_size(513), round_size(4000)
    (512, 512, 1024, 4096)
    """
    if size < 0:
        raise ResacctError(f"an allocation of {size} bytes: expected a size ≥ 0")
    return KMIN_BLOCK_BYTES if size < KMIN_BLOCK_BYTES else -(-size // KMIN_BLOCK_BYTES) * KMIN_BLOCK_BYTES


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def allocation_size(rounded: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` gets when no cached block fits.

    >>> [allocation_size(s) // 2**20 for s in (512, 2**20, 2**20 + 512, 10 * 2**20 - 512, 10 * 2**20, 11 * 2**20 + 1)]
    [2, 2, 20, 20, 10, 12]
    """
    if rounded <= KSMALL_SIZE_BYTES:
        return KSMALL_BUFFER_BYTES
    if rounded < KMIN_LARGE_ALLOC_BYTES:
        return KLARGE_BUFFER_BYTES
    return -(-rounded // KROUND_LARGE_BYTES) * KROUND_LARGE_BYTES


class BlockPool:
    """A ``BlockPool``: free mapped blocks ordered by (stream, size, address); unmapped by (stream, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.blocks: list[tuple[int, int, int]] = []
        self.by_key: dict[tuple[int, int, int], Block] = {}
        self.unmapped: list[tuple[int, int]] = []
        self.unmapped_by_key: dict[tuple[int, int], Block] = {}

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def insert(self, block: Block) -> None:
        key = block.key()
        bisect.insort(self.blocks, key)
        self.by_key[key] = block

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def erase(self, block: Block) -> None:
        key = block.key()
        del self.blocks[bisect.bisect_left(self.blocks, key)]
        del self.by_key[key]

    def insert_unmapped(self, block: Block) -> None:
        key = (block.stream, block.addr)
        bisect.insort(self.unmapped, key)
        self.unmapped_by_key[key] = block

    def erase_unmapped(self, block: Block) -> None:
        key = (block.stream, block.addr)
        del self.unmapped[bisect.bisect_left(self.unmapped, key)]
        del self.unmapped_by_key[key]
