"""``resacct shard --device BOARD``: each rank's step under ZeRO-1/2/3 (FSDP2) as the CUDA caching
allocator would hold it — predicted allocated and reserved peaks per rank, no GPU.

The same engine as ``shard`` (:mod:`resacct.account.peak.sharded`: the model built on meta, each rank
on fake CPU tensors under torch's fake process group, in a child process), with two CUDA choices and
one more listener:

- :class:`CudaShardedTracker` sends every storage the rank's step makes and frees — FSDP's
  ``UntypedStorage.resize_`` of its unsharded parameters included (a resize up is an allocation, a
  resize to 0 a free) — to :class:`~resacct.account.gpu.allocator.cuda_allocator.CachingAllocatorModel`;
  collective buffers are those the caller makes through the dispatcher (NCCL's own buffers live
  outside the caching allocator); the window (``reset_peak_memory_stats``) starts at the forward,
  after the optimizer's state exists;
- the optimizer takes its foreach implementation, CUDA's default (fake CPU tensors would get the
  for-loop); sdpa is routed to the flash kernel for 16-bit inputs, the efficient one otherwise, and where
  that kernel refuses a call (grouped-query attention off flash) to sdpa's **math path** as a GPU falls to
  it — forced (``sdpa_kernel(MATH)``): on fake CPU tensors sdpa's own choice is the CPU's flash kernel;
- each op allocates as CUDA's kernel does (:mod:`~resacct.account.gpu.tracing.cuda_composites`, the forms
  :class:`~resacct.account.gpu.tracing.allocation_trace.AllocationRecorder` takes on meta): ``_safe_softmax``'s
  temporaries, the math path's mask added in place (the scores' block), the efficient kernel's philox
  seed and offset on the host;
- each rank is its own process, so it takes the cuBLAS/cuBLASLt workspaces of
  :func:`~resacct.account.gpu.allocator.library_workspaces.step_workspaces` (from PyTorch's source, confirmed on
  an H200 for sm90) as a one-process step does: one for the forward's thread, one for autograd's backward thread,
  a cuBLASLt one where a ``Linear`` has a bias — allocated once the engine has wrapped the model, before
  the optimizer's state, and kept: in both peaks of every rank.

**Not modelled**: FSDP2 issues its all-gathers and reduce-scatters on their own CUDA streams, whose
blocks the caching allocator keeps apart (a block freed on one stream is not reused by another);
here every allocation is on one stream, so the reserved peak is a lower bound for FSDP2.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, no_type_check

from torch.utils.weak import WeakIdKeyDictionary

from resacct.account.gpu.allocator.cuda_allocator import CachingAllocatorModel
from resacct.account.gpu.tracing.cuda_composites import (accumulated_in_place, cuda_composite, host_outputs, mask_added_in_place,
                                                        measure_sole_buffer_counts, note_accumulating_add)
from resacct.account.gpu.tracing.cuda_scratch import kernel_scratch, take_scratch
from resacct.account.peak.dtensor_propagation import propagating
from resacct.account.peak.sharded import ShardedStorageTracker
from resacct.account.peak.tracker import KIND_BY_PHASE
from resacct.errors import ResacctError

__all__ = ["CudaShardedTracker", "predict_sharded_cuda_peaks", "STREAMS_NOTE", "workspaces_lines"]

STREAMS_NOTE = ("every allocation on one stream: FSDP2's all-gather and reduce-scatter streams keep their blocks apart on a GPU, "
                "so its reserved peak is a lower bound")


class CudaShardedTracker(ShardedStorageTracker):
    """:class:`~resacct.account.peak.sharded.ShardedStorageTracker` whose storages are also
    allocations of a caching allocator model (``allocator``), each op allocating as CUDA's kernel does
    (:mod:`~resacct.account.gpu.tracing.cuda_composites`, as :class:`~resacct.account.gpu.tracing.allocation_trace.AllocationRecorder`
    on meta): a composite's temporaries, outputs CUDA keeps on the host, sdpa's math path adding the mask in place, autograd
    summing a second gradient into a first that its buffer alone holds (the use counts that tell it measured on this very
    class under fake tensors: :func:`tracker_sole_counts`), the kernels' scratch."""

    def __init__(self, *, measuring_counts: bool = False, reductions: Any = None) -> None:
        """``measuring_counts``: this tracker is :func:`tracker_sole_counts`'s probe — it measures the counts, so it does
        not ask for them (no in-place sums while it runs). ``reductions``: the board's
        :class:`~resacct.account.gpu.tracing.cuda_scratch.ReductionBoard` (None: reductions' staging not predicted)."""
        super().__init__()
        self.reductions = reductions
        self.allocator = CachingAllocatorModel()
        self._owners: dict[int, int] = {}  # id(the tracker's entry) -> the allocator's owner (-1: on the host)
        self._holders: dict[int, int] = {}  # per owner, the entries that hold its block (one, but where an op ran in place)
        self._preset: WeakIdKeyDictionary = WeakIdKeyDictionary()  # a storage the last op made -> the owner it takes (-1: host)
        self._ids = itertools.count()
        self.window: tuple[int, int] | None = None  # allocated and reserved bytes when the forward began
        self._sole_counts = None if measuring_counts else tracker_sole_counts()  # measured here, outside any dispatch

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """The op as the sharded tracker runs it (its outputs allocated), then the blocks CUDA's kernel takes inside it
        (:func:`~resacct.account.gpu.tracing.cuda_scratch.kernel_scratch`: the attention backwards' workspaces, reductions'
        staging where the board's multiprocessors are known) — as the recorder on meta takes them."""
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and not propagating():
            take_scratch(self.allocator, kernel_scratch(func, args, kwargs or {}, self.reductions), self._ids)
        return out

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def _call(self, func: Any, args: Any, kwargs: Any) -> Any:
        composite = cuda_composite(func)
        if composite is not None:
            return composite(args, kwargs, self._temporary)
        accumulating = accumulated_in_place(func, args, self._sole_counts)  # on a GPU: the sum takes the first's block
        out = func(*args, **kwargs)
        if accumulating or mask_added_in_place(func, args, out):
            owner = self._owner_of(args[0].untyped_storage())
            if owner is not None and owner != -1:
                self._preset[out.untyped_storage()] = owner
        for index in host_outputs(func):
            self._preset[out[index].untyped_storage()] = -1
        return out

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def _temporary(self, tensor: Any) -> None:
        """A tensor a composite made (its output or a temporary): allocated now, freed when it dies."""
        storage = tensor.untyped_storage()
        if storage not in self._live and storage.nbytes() > 0:
            self._add(storage, KIND_BY_PHASE.get(self.phase, "other"))

    def _owner_of(self, storage: Any) -> int | None:
        entry = self._live.get(storage)
        return None if entry is None else self._owners.get(id(entry))

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def _malloc(self, entry: list) -> None:
        if entry[0] > 0 and id(entry) not in self._owners:
            owner = next(self._ids)
            self._owners[id(entry)] = owner
            self._holders[owner] = 1
            self.allocator.malloc(owner, int(entry[0]))

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def _release(self, entry: list | None, *, dying: bool = False) -> None:
        """The entry's hold on its block given back (the block freed once no entry holds it); a host tensor's entry
        (owner -1) stays marked until it dies."""
        owner = None if entry is None else self._owners.get(id(entry))
        if owner is None or (owner == -1 and not dying):
            return
        del self._owners[id(entry)]  # type: ignore[arg-type]
        if owner == -1:
            return
        self._holders[owner] -= 1
        if self._holders[owner] == 0:
            del self._holders[owner]
            if owner in self.allocator.active:
                self.allocator.free(owner)

    @no_type_check  # per op of a rank's step (docs/suite_time.md, session 24)
    def _add(self, storage: Any, kind: str, nbytes: int | None = None) -> None:
        super()._add(storage, kind, nbytes)
        entry = self._live[storage]
        preset = self._preset.pop(storage, None)
        if preset is not None and (preset == -1 or preset in self._holders):  # on the host, or the scores' block (the mask added in place)
            self._owners[id(entry)] = preset
            if preset != -1:
                self._holders[preset] += 1
        else:
            self._malloc(entry)

    def _drop(self, entry: list) -> None:
        self._release(entry, dying=True)
        super()._drop(entry)

    def storage_resized(self, storage: Any, before_bytes: int, after_bytes: int, grown_kind: str) -> None:
        self._release(self._live.get(storage))  # the old block goes back; a resize up is a new allocation
        super().storage_resized(storage, before_bytes, after_bytes, grown_kind)
        entry = self._live.get(storage)
        if entry is not None:
            self._malloc(entry)

    def on_host(self, tensors: Any) -> None:
        """Tensors CUDA keeps on the CPU (AdamW's step counts): out of the allocator model, counted as before by the tracker."""
        for tensor in tensors:
            entry = self._live.get(tensor.untyped_storage())
            if entry is not None:
                self._release(entry)
                self._owners[id(entry)] = -1  # never allocated again on the device: its death frees nothing there

    def mark(self, phase: str) -> None:
        if phase == "forward" and self.window is None:  # reset_peak_memory_stats: the steady step starts here
            self.allocator.reset_peaks()
            self.window = (self.allocator.allocated_bytes, self.allocator.reserved_bytes)
        super().mark(phase)


def _on_cuda(optimizer: Any) -> None:
    """CUDA's foreach default, for a ZeroRedundancyOptimizer's inner optimizer (``.optim``) too."""
    from resacct.account.gpu.tracing.cuda_step import _as_on_cuda

    for each in (optimizer, getattr(optimizer, "optim", None)):
        if each is not None:
            _as_on_cuda(each)


def _step_counts(optimizer: Any) -> list[Any]:
    """AdamW's ``step`` tensors (a ZeroRedundancyOptimizer's inner optimizer's too): CUDA keeps them on
    the CPU unless the optimizer is fused or capturable."""
    inner = getattr(optimizer, "optim", optimizer)
    return [state["step"] for state in inner.state.values() if hasattr(state.get("step"), "untyped_storage")]


def _rank_step(engine: str, work: Any, work_inputs: Any, loss_fn: Any, world_size: int, tracker: CudaShardedTracker, mesh: Any,
               costs: Any = None, workspaces: tuple[int, ...] = ()) -> None:
    """:func:`resacct.account.peak.sharded.sharded_step` with the optimizer as CUDA runs it; ``workspaces``
    (bytes) allocated after the engine wrapped the model, before the optimizer's state, and kept."""
    from resacct.account.peak.sharded import _wrap
    from resacct.account.peak.sharded_collectives import collectives_named
    from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step

    with collectives_named(tracker, world_size, backend="dispatcher", engine=engine):
        wrapped, optimizer = _wrap(engine, work, tracker, mesh, fake=True, backend="dispatcher")
        _on_cuda(optimizer)
        for index, size in enumerate(workspaces):  # the first step's first matmuls, before its optimizer.step()
            tracker.allocator.malloc(("library workspace", index), size)
        make_optimizer_state(wrapped, optimizer)
        tracker.on_host(_step_counts(optimizer))
        with costs if costs is not None else contextlib.nullcontext():  # the step's ops (forward, backward, optimizer step, zero_grad)
            run_training_step(wrapped, work_inputs, loss_fn, optimizer, tracker.mark)


@functools.lru_cache(maxsize=1)
def tracker_sole_counts() -> tuple[int, int] | None:
    """The (tensor, storage) use counts the first operand of autograd's accumulating ``add`` shows to
    :class:`CudaShardedTracker` on fake CPU tensors when the engine's buffer alone holds it — measured once per process on
    this class itself (``lin1(x) + lin2(x)``'s backward), since fake tensors and the tracker's own references make them
    other than the meta recorder's (:func:`~resacct.account.gpu.tracing.cuda_composites.sole_buffer_counts`)."""
    seen: list[tuple[int, int]] = []

    class _Probe(CudaShardedTracker):
        def __init__(self) -> None:
            super().__init__(measuring_counts=True)

        def _call(self, func: Any, args: Any, kwargs: Any) -> Any:
            note_accumulating_add(func, args, seen)
            return super()._call(func, args, kwargs)

    return measure_sole_buffer_counts(_Probe, seen, fake=True)


def _compute_time(board: Any, dtype: Any, ops: list) -> dict[str, Any]:
    """A rank's compute alone (:func:`~resacct.account.gpu.timing.board_rates.step_seconds`: a board record's calibrated model,
    else the per-op roofline), or why there is none (the board has no peak in the step's format: a V100 has no bf16)."""
    from resacct.account.gpu.timing.board_rates import step_seconds
    from resacct.facts.hardware import peak_format

    try:
        step_sec, detail = step_seconds(ops, board, peak_format(dtype))
    except ResacctError as error:
        return {"compute_step_sec": None, "compute_step_basis": str(error)}
    lines = [*detail, "the rank's own ops, collectives not timed (a lower bound)"]
    return {"compute_step_sec": step_sec, "compute_step_basis": "; ".join(lines), "compute_step_detail": lines}


def _attention(kernel: str | None, capability: tuple[int, int] | None = None) -> Any:
    """sdpa routed to ``kernel`` as a board of compute ``capability`` runs it; None: left to its math path, its calls counted."""
    from resacct.account.gpu.tracing.cuda_step import sdpa_routing

    return sdpa_routing(kernel, capability)


def _op_costs() -> Any:
    """:mod:`~resacct.account.gpu.timing.step_time`'s per-op FLOPs and bytes, leaving DTensors to themselves
    (their local ops come through again: counted once, on the shards this rank runs) and DTensor's
    sharding propagation out (:mod:`resacct.account.peak.dtensor_propagation`)."""
    from resacct.account.gpu.tracing.op_costs import OpCosts
    from resacct.account.peak.dtensor_propagation import dtensor_among

    class _LocalOpCosts(OpCosts):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if propagating():  # DTensor's sharding propagation on global shapes: no op of the step
                return func(*args, **(kwargs or {}))
            if dtensor_among(types):
                return NotImplemented
            return super().__torch_dispatch__(func, types, args, kwargs)

    return _LocalOpCosts()


def _predict_cuda_in_child(model: Any, engine: str, world_size: int, ranks: tuple[int, ...], batch: int, seq: int | None,
                           kernel_for_dtype: dict[Any, str | None], board: Any = None) -> Any:
    """In the child: per rank, the allocator model's peaks (a list of dicts), or a one-line error."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard
    from resacct.account.peak.sharded import engine_mesh, step_copies
    from resacct.measurement.memory_timeline import gc_paused

    try:
        target = model.target()
        fixed_seq = seq if seq is not None else target.seq_limit
        net, inputs, loss_fn = target.model, target.make_inputs(batch, fixed_seq), target.loss_fn()
        dtype = torch.bfloat16 if engine == "fsdp2-bf16" else next((p.dtype for p in net.parameters()), torch.float32)
        kernel = kernel_for_dtype.get(dtype)  # another dtype (float64): no fused kernel takes it, sdpa's math path
        workspaces = _rank_workspaces(net, board)
        from resacct.account.peak.rank_classes import representative_ranks

        representatives = representative_ranks([tuple(p.shape) for p in net.parameters()], engine, world_size, ranks)
        traced: dict[int, dict[str, Any]] = {}
        for rank in dict.fromkeys(representatives.values()):  # one rank traced for those holding the same shards
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            try:
                mesh, tracker, costs = engine_mesh(engine, world_size), CudaShardedTracker(reductions=ReductionBoard.of(board)), _op_costs()
                routing = _attention(kernel, getattr(board, "compute_capability", None))
                with gc_paused(), FakeTensorMode(allow_non_fake_inputs=True):
                    work, work_inputs = step_copies(net, inputs, fake=True)
                    with tracker, routing:
                        _rank_step(engine, work, work_inputs, loss_fn, world_size, tracker, mesh, costs,
                                   workspaces.sizes if workspaces is not None else ())
                del work, work_inputs
                allocator = tracker.allocator
                answer = {"rank": rank, "peak_allocated_bytes": allocator.peak_allocated_bytes, "peak_reserved_bytes": allocator.peak_reserved_bytes,
                          "attention": (routing.label() if kernel else "math") if routing.calls else None, "start_allocated_bytes": (tracker.window or (0, 0))[0],
                          "compute_step_sec": None, "compute_step_basis": None, **_workspace_fields(workspaces)}
                if board is not None:
                    answer.update(_compute_time(board, dtype, costs.ops))
                traced[rank] = answer
            finally:
                dist.destroy_process_group()
        return [dict(traced[representatives[rank]], rank=rank) for rank in ranks]
    except ResacctError as error:
        return str(error)


def _rank_workspaces(model: Any, board: Any) -> Any:
    """The :class:`~resacct.account.gpu.allocator.library_workspaces.LibraryWorkspaces` of one rank's step of ``model`` on
    ``board`` (a training step: forward and backward threads), None without a board or off NVIDIA's families."""
    from resacct.account.gpu.allocator.library_workspaces import capability_major, step_workspaces

    if board is None or capability_major(board) is None:
        return None
    return step_workspaces(model, board=board, backward=True)


def _workspace_fields(workspaces: Any) -> dict[str, Any]:
    """A rank's ``--json`` fields for its workspaces, named as the other commands' ``gpu`` answers name them."""
    if workspaces is None:
        return {"library_workspace_bytes": None, "library_workspaces": None, "library_workspaces_basis": None, "library_workspaces_source": None}
    return {"library_workspace_bytes": workspaces.total_bytes, "library_workspaces": [{"what": what, "bytes": size} for what, size in workspaces.blocks],
            "library_workspaces_basis": workspaces.basis, "library_workspaces_source": workspaces.source}


def workspaces_lines(rank: dict[str, Any]) -> list[str]:
    """The workspaces lines the other ``--device`` commands print (:meth:`LibraryWorkspaces.lines`), for one
    rank's answer (every rank takes the same: each is its own process); none where it has none."""
    from resacct.account.gpu.allocator.library_workspaces import SOURCE, LibraryWorkspaces

    if rank.get("library_workspaces") is None:
        return []
    blocks = tuple((block["what"], block["bytes"]) for block in rank["library_workspaces"])
    source = rank.get("library_workspaces_source") or SOURCE
    return LibraryWorkspaces(blocks, rank["library_workspaces_basis"], source).lines(", on each rank (its own process)")


def predict_sharded_cuda_peaks(model: Any, *, engine: str, world_size: int, ranks: tuple[int, ...], batch: int, seq: int | None,
                               board: Any, timeout_seconds: float = 600.0) -> list[dict[str, Any]]:
    """For each of ``ranks``: the CUDA caching allocator's predicted allocated and reserved peaks of
    one steady ``engine`` step on ``board`` (``model``: a :class:`~resacct.account.fit.search.ModelSource`)."""
    from resacct.account.gpu.answers.device_answer import sdpa_kernel_for
    from resacct.measurement.distributed import run_isolated

    import torch

    kernels = {dtype: sdpa_kernel_for(board, dtype) for dtype in (torch.float32, torch.bfloat16, torch.float16)}
    answer = run_isolated(_predict_cuda_in_child, model, engine, world_size, tuple(ranks), batch, seq, kernels, board, timeout_seconds=timeout_seconds)
    if isinstance(answer, str):
        raise ResacctError(answer)
    return answer
