"""A model of PyTorch's CUDA caching allocator, in pure Python: what ``memory_allocated`` and
``memory_reserved`` will be after a sequence of allocations and frees — no GPU needed.

The pipeline stage: a step's allocation sequence (recorded on a GPU by ``tools/gpu_record.py``, or
traced on meta tensors by :mod:`resacct.account.gpu.tracing.cuda_step`) goes in; allocated
and reserved over time, their peaks, the segments and what is live at the peak come out.

It follows ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch, read at commit 001074d2):

- ``round_size``: below ``kMinBlockSize`` (512) → 512, else up to a multiple of 512
  (``roundup_power2_divisions`` is off by default and not modelled);
- ``get_pool``: a rounded size ≤ ``kSmallSize`` (1 MiB) goes to the small pool, else the large one;
- ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for the small pool,
  ``kLargeBuffer`` (20 MiB) for sizes under ``kMinLargeAlloc`` (10 MiB), else the size rounded up
  to ``kRoundLarge`` (2 MiB);
- ``get_free_block``: best fit — the pool's free blocks are ordered by (stream, size, address),
  ``lower_bound`` takes the smallest that fits on the same stream; a request under
  ``max_split_size`` never takes an oversize block, an oversize request only one less than
  ``kLargeBuffer`` bigger;
- ``should_split``: small pool (or expandable segments) when the remainder is ≥ 512; large pool
  when the request is under ``max_split_size`` and the remainder is **> 1 MiB** — so a large block
  can be handed out whole, up to 1 MiB bigger than asked, and ``allocated_bytes`` counts the whole
  block (``alloc_found_block`` adds ``block->size``, not the request);
- ``free_block`` → ``try_merge_blocks``: a freed block merges with free neighbours of its segment
  (same mapped state), and goes back to its pool — reserved does not shrink;
- ``malloc``'s fallbacks when ``cudaMalloc`` fails (a ``capacity_bytes`` is given):
  ``release_available_cached_blocks`` (oversize blocks, only with a ``max_split_size``), then
  ``release_cached_blocks`` (every unsplit free segment) and retry, then out of memory;
- ``release_cached_blocks`` (``torch.cuda.empty_cache``): frees every segment that is one free
  block; with expandable segments, unmaps every whole free page (``unmap_block``);
- expandable segments (``expandable_segments:True``): one segment per stream and pool, mapped page
  by page (``find_expandable_block``, ``map_block``: pages of ``kSmallBuffer`` for the small pool,
  ``kLargeBuffer`` for the large one), split on any remainder ≥ 512.

Not modelled: cross-stream use (``record_stream`` events: a free completes at once), CUDA-graph
private pools, ``garbage_collection_threshold``, ``roundup_power2_divisions``.

>>> model = CachingAllocatorModel()
>>> model.malloc("a", 4 * 32 * 32); model.malloc("b", 36)       # 4096 B and a 3×3 float32
>>> model.allocated_bytes, model.reserved_bytes                   # 4096 + 512 in one 2 MiB small segment
(4608, 2097152)
>>> model.malloc("c", 3 * 2**20)                                  # 3 MiB: a 20 MiB segment, split
>>> model.free("c"); model.allocated_bytes, model.reserved_bytes, model.peak_allocated_bytes
(4608, 23068672, 3150336)
>>> model.free("a"); model.free("b"); model.empty_cache(); model.reserved_bytes
0
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable
from typing import no_type_check

from resacct.account.gpu.allocator.cuda_allocator_rules import (
    KLARGE_BUFFER_BYTES,
    KMIN_BLOCK_BYTES,
    KSMALL_BUFFER_BYTES,
    KSMALL_SIZE_BYTES,
    UNLIMITED,
    AllocatorConfig,
    Block,
    BlockPool,
    CudaOutOfMemory,
    TraceEvent,
    allocation_size,
    round_size,
)
from resacct.errors import ResacctError

__all__ = ["AllocatorConfig", "CachingAllocatorModel", "CudaOutOfMemory", "TraceEvent", "round_size", "allocation_size",
           "KLARGE_BUFFER_BYTES", "KSMALL_BUFFER_BYTES"]


@no_type_check  # per allocation and free of a traced step: ~10^5 checked calls a recorded step under the hook (docs/suite_time.md)
class CachingAllocatorModel:
    """The allocator of one device: ``malloc(owner, size, stream)``, ``free(owner)``, ``empty_cache()``;
    the stats ``memory_allocated``/``memory_reserved`` report and their peaks; ``events`` as
    ``device_traces`` records them; ``live_at_peak()``: what was allocated at the allocated peak."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.small_pool, self.large_pool = BlockPool(True), BlockPool(False)
        self.active: dict[Hashable, Block] = {}
        self.allocated_bytes = self.reserved_bytes = self.requested_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = self.peak_requested_bytes = 0
        self.events: list[TraceEvent] = []
        self.segment_sizes: dict[int, int] = {}  # non-expandable segments by address: their cudaMalloc'd size
        self._next_addr = 1 << 61  # new segments go downward from far above a device's addresses (_new_address)
        self.address_hints: list[int] = []  # where the next new segments start (a replay gives the recorded cudaMalloc's)
        self._history: list[tuple[Hashable, int]] = []  # (owner, +size / -size) of every alloc and free
        self._peak_index = -1
        self.timeline: list[tuple[int, int]] = []  # (allocated, reserved) after every malloc and free

    # ── stats ─────────────────────────────────────────────────────────────────────────────
    def _allocated(self, delta: int, owner: Hashable) -> None:
        self.allocated_bytes += delta
        self._history.append((owner, delta))
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes, self._peak_index = self.allocated_bytes, len(self._history)

    def _reserved(self, delta: int) -> None:
        self.reserved_bytes += delta
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peaks restart from the current values."""
        self.peak_allocated_bytes, self.peak_reserved_bytes = self.allocated_bytes, self.reserved_bytes
        self.peak_requested_bytes = self.requested_bytes
        self._peak_index = len(self._history)

    def live_at_peak(self) -> dict[Hashable, int]:
        """Each allocation live at the allocated peak, with its block's bytes (they sum to the peak)."""
        live: dict[Hashable, int] = {}
        for owner, delta in self._history[:self._peak_index]:
            if delta > 0:
                live[owner] = delta
            else:
                live.pop(owner, None)
        return live

    def segments(self) -> list[dict]:
        """Each mapped segment as ``_snapshot()['segments']`` lists it: address, total size, stream,
        pool, and its blocks (size, requested, allocated)."""
        heads: dict[int, Block] = {}
        for block in itertools.chain(self.active.values(), self.small_pool.by_key.values(), self.large_pool.by_key.values()):
            while block.prev is not None and block.prev.mapped:
                block = block.prev
            heads[block.addr] = block
        result = []
        for addr in sorted(heads):
            block, blocks = heads[addr], []
            while block is not None and block.mapped:
                blocks.append({"size": block.size, "requested_size": block.requested, "allocated": block.allocated})
                block = block.next
            head = heads[addr]
            result.append({"address": addr, "total_size": sum(b["size"] for b in blocks), "stream": head.stream,
                           "segment_type": "small" if head.small else "large", "expandable": head.expandable, "blocks": blocks})
        return result

    # ── malloc ────────────────────────────────────────────────────────────────────────────
    def malloc(self, owner: Hashable, size: int, stream: int = 0) -> None:
        """Allocate ``size`` bytes for ``owner`` (any hashable id, unique while live) on ``stream``.
        A size of 0 allocates nothing (``allocate`` returns a null pointer without calling malloc)."""
        if owner in self.active:
            raise ResacctError(f"allocation id {owner!r} is already live: expected a new id (free it first)")
        rounded = round_size(size)
        if size == 0:
            return
        pool = self.small_pool if rounded <= KSMALL_SIZE_BYTES else self.large_pool
        block = self._get_free_block(pool, rounded, stream)
        if block is None:
            block = (self._alloc_block(pool, rounded, stream)
                     or (self._release_available_cached_blocks(pool, rounded, stream) and self._alloc_block(pool, rounded, stream))
                     or (self._release_cached_blocks() and self._alloc_block(pool, rounded, stream)))
            if block is None:
                raise CudaOutOfMemory(f"out of memory: {size} bytes (rounded {rounded}) with {self.reserved_bytes} reserved "
                                      f"and {self.allocated_bytes} allocated; expected at most capacity_bytes={self.config.capacity_bytes}")
        self._alloc_found_block(pool, block, rounded, size, stream, owner)

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        index = bisect.bisect_left(pool.blocks, (stream, size, -1))
        if index == len(pool.blocks) or pool.blocks[index][0] != stream:
            return None
        block = pool.by_key[pool.blocks[index]]
        if block.expandable and self.config.expandable_segments:
            # best fit counts the unmapped pages behind a block as room it can grow into
            def room(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while index + 1 < len(pool.blocks) and pool.blocks[index + 1][0] == stream and block.expandable:
                following = pool.by_key[pool.blocks[index + 1]]
                if room(following) >= room(block):
                    break
                index, block = index + 1, following
        max_split = self.config.max_split
        if size < max_split and block.size >= max_split:
            return None  # do not return an oversized block for a smaller request
        if size >= max_split and block.size >= size + KLARGE_BUFFER_BYTES:
            return None  # an oversize block serves requests within kLargeBuffer of its size
        pool.erase(block)
        return block

    def _fits_capacity(self, nbytes: int) -> bool:
        return self.config.capacity_bytes is None or self.reserved_bytes + nbytes <= self.config.capacity_bytes

    def _alloc_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self.config.expandable_segments:
            return self._allocate_expandable_block(pool, size, stream)
        nbytes = allocation_size(size)
        if not self._fits_capacity(nbytes):
            return None
        addr = self._new_address(nbytes)
        self.segment_sizes[addr] = nbytes
        self._reserved(nbytes)
        self.events.append(TraceEvent("segment_alloc", addr, nbytes, stream))
        return Block(addr, nbytes, stream, pool.small, addr)

    def _new_address(self, nbytes: int) -> int:
        """Where a new segment starts: a replay's recorded ``cudaMalloc`` address, else below the last one made. Best fit
        breaks ties between equal free blocks by address, so the order matters: the H200 record's traces show CUDA
        returning most new segments below the previous one (379 of 469 on the Llama-1B fp32-master step, 49 of 50 on
        GPT-2 small's fp32 math step, 49 of 91 on gqa-llama/bf16/flash's). Placed so, 9 of the 13 recorded steps' allocated
        peaks are the board's to 512 bytes, where placing them upward left gpt2-small/fp32/math at 1.0012 and
        gqa-llama/bf16/flash at 0.9985, and the Llama-1B autocast step's reserved peak is within 0.4 % (was 3.1 %)."""
        if self.address_hints:
            return self.address_hints.pop(0)
        self._next_addr -= -(-nbytes // KLARGE_BUFFER_BYTES) * KLARGE_BUFFER_BYTES + KLARGE_BUFFER_BYTES
        return self._next_addr

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= KMIN_BLOCK_BYTES
        return size < self.config.max_split and remaining > KSMALL_SIZE_BYTES

    def _alloc_found_block(self, pool: BlockPool, block: Block, size: int, requested: int, stream: int, owner: Hashable) -> None:
        if self._should_split(block, size):
            front = Block(block.addr, size, stream, block.small, block.segment, expandable=block.expandable, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = front
            block.prev = front
            block.addr += size
            block.size -= size
            pool.insert(block)
            block = front
        block.allocated, block.requested, block.owner = True, requested, owner
        self.active[owner] = block
        self.requested_bytes += requested
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        self.events.append(TraceEvent("alloc", block.addr, requested, stream))
        self._allocated(block.size, owner)
        self.timeline.append((self.allocated_bytes, self.reserved_bytes))

    # ── free ──────────────────────────────────────────────────────────────────────────────
    def free(self, owner: Hashable) -> None:
        """Free ``owner``'s block: allocated drops at once (``free``), the block returns to its pool
        merged with free neighbours (``free_block``); reserved is unchanged."""
        block = self.active.pop(owner, None)
        if block is None:
            raise ResacctError(f"free of {owner!r}, which is not live: expected the id of a live allocation")
        block.allocated = False
        self._allocated(-block.size, owner)
        self.requested_bytes -= block.requested
        self.events.append(TraceEvent("free_requested", block.addr, block.requested, block.stream))
        self.events.append(TraceEvent("free_completed", block.addr, block.requested, block.stream))
        pool = self.small_pool if block.small else self.large_pool
        for neighbour in (block.prev, block.next):
            self._try_merge(block, neighbour, pool)
        block.owner, block.requested = None, 0
        pool.insert(block)
        self.timeline.append((self.allocated_bytes, self.reserved_bytes))

    def _try_merge(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ── giving memory back ────────────────────────────────────────────────────────────────
    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` → ``release_cached_blocks``."""
        self._release_cached_blocks()

    def _release_block(self, pool: BlockPool, block: Block) -> None:
        pool.erase(block)
        del self.segment_sizes[block.addr]
        self._reserved(-block.size)
        self.events.append(TraceEvent("segment_free", block.addr, block.size, block.stream))

    def _release_cached_blocks(self) -> bool:
        for pool in (self.large_pool, self.small_pool):
            to_unmap = []
            for key in list(pool.blocks):
                block = pool.by_key[key]
                if block.expandable:
                    to_unmap.append(block)
                elif not block.is_split():
                    self._release_block(pool, block)
            for block in to_unmap:
                self._unmap_block(pool, block)
                if not block.mapped and not block.is_split():
                    pool.erase_unmapped(block)  # release_expandable_segment
        return True

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        max_split = self.config.max_split
        if max_split == UNLIMITED:
            return False
        target = max(size, max_split)
        index = bisect.bisect_left(pool.blocks, (stream, target, -1))
        if index < len(pool.blocks) and pool.blocks[index][0] == stream:
            self._release_block(pool, pool.by_key[pool.blocks[index]])
            return True
        released = 0
        index -= 1  # the largest block of this stream, then down
        while released < target and index >= 0 and pool.blocks[index][0] == stream and pool.blocks[index][1] >= max_split:
            block = pool.by_key[pool.blocks[index]]
            released += block.size
            self._release_block(pool, block)
            index -= 1
        return released >= target

    # ── expandable segments ───────────────────────────────────────────────────────────────
    def _page(self, block: Block) -> int:
        return self.config.expandable_small_page_bytes if block.small else self.config.expandable_large_page_bytes

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        for key in pool.unmapped[bisect.bisect_left(pool.unmapped, (stream, -1)):]:
            if key[0] != stream:
                break
            candidate = pool.unmapped_by_key[key]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            room, block = 0, candidate
            while room < size and block is not None and not block.allocated:
                room, block = room + block.size, block.next
            if room >= size:
                return candidate
        space = (self.config.capacity_bytes or 1 << 40) * 9 // 8  # address space for 1⅛ of the device
        page = self.config.expandable_small_page_bytes if pool is self.small_pool else self.config.expandable_large_page_bytes
        space = -(-space // page) * page
        addr = self._new_address(space)
        block = Block(addr, space, stream, pool.small, addr, mapped=False, expandable=True)
        pool.insert_unmapped(block)
        return block

    def _map_block(self, pool: BlockPool, block: Block, size: int) -> bool:
        page = self._page(block)
        mapped = -(-size // page) * page
        if not self._fits_capacity(mapped):
            return False
        pool.erase_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.stream, block.small, block.segment,
                         mapped=False, expandable=True, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            pool.insert_unmapped(rest)
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        self._reserved(mapped)
        self.events.append(TraceEvent("segment_map", block.addr, mapped, block.stream))
        return True

    def _allocate_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if following is None or not self._map_block(pool, following, min(size - candidate.size, following.size)):
                return None
            candidate = following  # merged with the block before it
        pool.erase(candidate)
        return candidate

    def _unmap_block(self, pool: BlockPool, block: Block) -> None:
        page = self._page(block)
        offset = block.addr - block.segment
        begin = -(-offset // page) * page + block.segment
        end = (offset + block.size) // page * page + block.segment
        if begin >= end:
            return
        pool.erase(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.stream, block.small, block.segment, expandable=True, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.insert(before)
        if block.addr + block.size > end:
            after = Block(end, block.addr + block.size - end, block.stream, block.small, block.segment, expandable=True, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert_unmapped(block)
        self._reserved(-(end - begin))
        self.events.append(TraceEvent("segment_unmap", begin, end - begin, block.stream))
