"""The allocations and frees a piece of PyTorch code makes, seen from the dispatcher, fed to the
CUDA caching allocator model as they happen: the trace the allocator *would* record on a GPU.

:class:`AllocationRecorder` is a ``TorchDispatchMode``: every aten op's outputs that own a new
storage are one ``malloc`` of the storage's bytes, each storage's death (a weak reference, as
:class:`~resacct.account.peak.tracker.LiveStorageTracker` does) one ``free``; both go to a
:class:`~resacct.account.gpu.allocator.cuda_allocator.CachingAllocatorModel`. Over meta tensors
(:mod:`resacct.account.gpu.tracing.cuda_step`) it is a prediction; over real tensors on the CPU it is what the GPU recorder's
dry run writes (``tools/gpu_record.py --dry-run``), in ``torch.cuda.memory._snapshot()``'s format
(:meth:`AllocationRecorder.snapshot`).

What the dispatcher never shows is not in the trace: a kernel's workspace (cuBLAS, cuDNN), CUDA's
own context. On a GPU they are the record's to show.

>>> import torch
>>> with AllocationRecorder() as recorder:
...     a = torch.ones(1000)          # 4000 B → a 4096-byte block of a 2 MiB segment
...     b = a * 2
...     del a
>>> recorder.allocator.allocated_bytes, recorder.allocator.peak_allocated_bytes, recorder.allocator.reserved_bytes
(4096, 8192, 2097152)
>>> [entry["action"] for entry in recorder.snapshot()["device_traces"][0]]
['segment_alloc', 'alloc', 'alloc', 'free_requested', 'free_completed']
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, no_type_check

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from resacct.account.gpu.allocator.cuda_allocator import AllocatorConfig, CachingAllocatorModel
from resacct.account.gpu.tracing.cuda_composites import (accumulated_in_place, cuda_composite, host_outputs, mask_added_in_place,
                                                        sole_buffer_counts)
from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard, kernel_scratch, take_scratch
from resacct.measurement.meta_op_cache import shared_meta_cache

__all__ = ["AllocationRecorder"]


class AllocationRecorder(TorchDispatchMode):
    """Every new storage an op returns is allocated in ``allocator`` (a model of the CUDA caching
    allocator), freed when it dies. ``device`` (None: any) limits which storages count."""

    def __init__(self, config: AllocatorConfig | None = None, *, device: str | None = None, cuda_kernels: bool | None = None) -> None:
        super().__init__()
        self.allocator = CachingAllocatorModel(config)
        self.device = device
        #: allocate as CUDA's kernels do where one op hides it (:mod:`~resacct.account.gpu.tracing.cuda_composites`); by default on meta
        #: (a prediction), not over real tensors (what ran) — True there runs CPU tensors through CUDA's forms, to compare
        self.cuda_kernels = device == "meta" if cuda_kernels is None else cuda_kernels
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._ids = itertools.count()
        self._holders: dict[int, int] = {}  # per block, the storages that hold it (one, but where share_block gave it another)
        self.window_start = 0  # the trace entry where :meth:`start_window` was called
        # over meta tensors, a call seen before is answered without torch's Python meta kernel (the same storages made); the
        # process's one cache: the H200 record's 13 steps predicted in one process 22.0-22.5 → 17.8-20.6 CPU s (session 25)
        self.op_cache = shared_meta_cache() if device == "meta" else None
        #: when not None, told of every op with its outputs (:class:`~resacct.account.gpu.tracing.op_costs.OpCostCounter`: the step time's
        #: ops counted on this pass, without a dispatch mode of their own)
        self.costs: Any = None
        #: the board whose reduction kernels' staging buffers are allocated around each reduction
        #: (:mod:`~resacct.account.gpu.tracing.cuda_scratch`); None: not modelled (the board's multiprocessors unknown)
        self.reduction_board: ReductionBoard | None = None
        #: the use counts of a gradient autograd's buffer alone holds (cuda_composites.sole_buffer_counts), measured here, before any step
        self._sole_counts = sole_buffer_counts() if self.cuda_kernels else None

    @no_type_check  # per op (26,788 checks in the CI quick tier) of hints that are all Any: nothing checked (docs/suite_time.md, session 7)
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        composite = cuda_composite(func) if self.cuda_kernels else None  # CUDA's temporaries inside one op (a prediction)
        accumulating = self.cuda_kernels and accumulated_in_place(func, args, self._sole_counts)  # autograd's in-place sum on a GPU (cuda_composites)
        if composite is not None:
            out = composite(args, kwargs, self.track)
        else:
            out = func(*args, **kwargs) if self.op_cache is None else self.op_cache.call(func, args, kwargs)
        if self.costs is not None:
            self.costs.record(func, args, kwargs, out, None if self.op_cache is None or composite is not None else self.op_cache.last_key)
        if composite is None and self.cuda_kernels and (accumulating or mask_added_in_place(func, args, out)):
            self.share_block(args[0], out)  # a GPU's math path adds the mask in place, its engine accumulates in place (cuda_composites)
        on_host = host_outputs(func) if self.cuda_kernels else ()
        for index, value in enumerate((out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]):
            if isinstance(value, torch.Tensor) and (self.device is None or value.device.type == self.device) and index not in on_host:
                self.track(value)
        if self.cuda_kernels:  # blocks CUDA's kernel takes inside the op (cuda_scratch)
            take_scratch(self.allocator, kernel_scratch(func, args, kwargs, self.reduction_board), self._ids)
        return out

    @no_type_check
    def share_block(self, source: torch.Tensor, out: torch.Tensor) -> None:
        """``out``'s storage takes ``source``'s block (no allocation: the op ran in place on a GPU); the block is freed when
        both storages have died."""
        owner = self._seen.get(source.untyped_storage())
        storage = out.untyped_storage()
        if owner is None or storage in self._seen:
            return
        self._seen[storage] = owner
        self._holders[owner] += 1
        weakref.finalize(storage, self._free, owner)

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def track(self, tensor: torch.Tensor) -> None:
        """Allocate ``tensor``'s storage now (once), free it when it dies."""
        storage = tensor.untyped_storage()
        if storage in self._seen or storage.nbytes() == 0:
            return
        owner = next(self._ids)
        self._seen[storage] = owner
        self._holders[owner] = 1
        self.allocator.malloc(owner, storage.nbytes())
        weakref.finalize(storage, self._free, owner)

    @no_type_check  # per freed storage (14,902 checks): owner is track's next(itertools.count()) (docs/suite_time.md, session 7)
    def _free(self, owner: int) -> None:
        self._holders[owner] -= 1
        if self._holders[owner] == 0:
            del self._holders[owner]
            if owner in self.allocator.active:
                self.allocator.free(owner)

    def start_window(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: the peaks and the window start here."""
        self.allocator.reset_peaks()
        self.window_start = len(self.allocator.events)

    def snapshot(self) -> dict[str, Any]:
        """The model's trace and segments as ``torch.cuda.memory._snapshot()`` returns them (no frames)."""
        trace = [{"action": e.action, "addr": e.addr, "size": e.size, "stream": e.stream} for e in self.allocator.events]
        segments = []
        for segment in self.allocator.segments():
            address, blocks = segment["address"], []
            for block in segment["blocks"]:
                blocks.append({"address": address, "size": block["size"], "requested_size": block["requested_size"],
                               "state": "active_allocated" if block["allocated"] else "inactive"})
                address += block["size"]
            segments.append({"device": 0, "address": segment["address"], "total_size": segment["total_size"], "stream": segment["stream"],
                             "segment_type": segment["segment_type"], "blocks": blocks})
        return {"segments": segments, "device_traces": [trace]}
