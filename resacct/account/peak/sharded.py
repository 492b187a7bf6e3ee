"""Will it fit, sharded: the peak of one training step **on each rank** under ZeRO-1 (DDP +
``ZeroRedundancyOptimizer``), ZeRO-2 (FSDP2 ``fully_shard(reshard_after_forward=False)``, FSDP's
SHARD_GRAD_OP) and ZeRO-3 (FSDP2 ``fully_shard``, also with a bf16 ``MixedPrecisionPolicy``),
predicted before it runs (:data:`ENGINES`).

The prediction runs the engine itself — the same ``DistributedDataParallel``,
``ZeroRedundancyOptimizer`` or ``fully_shard`` — on fake CPU tensors (``FakeTensorMode``) under
torch's fake process group (``init_process_group("fake")``: every collective returns at once,
nothing is sent), one rank at a time in a child process, under
:class:`ShardedStorageTracker` (resacct's live-storage tracker that also sees DTensor shards and
FSDP's storage resizes). Nothing is allocated. :mod:`resacct.checks.peak_sharded` runs the same
step (:func:`sharded_step`) for real on N local gloo ranks, counted per rank by the CPU allocator
(``torch.profiler``, ``profile_memory=True``) and, for what is live at the peak, by the same
tracker over the real tensors (the *census*).

What the dispatcher never shows is added from the backends' source (torch 2.13; the same from 2.7, measured:
:mod:`resacct.account.peak.sharded_collectives`), as the fake process group does nothing: for the allocator (``backend="allocator"``) gloo's
``all_gather_into_tensor`` makes a flat copy of its output while it runs; its
``reduce_scatter_tensor`` clones its input for the call (an all-reduce of the clone, then a copy of
this rank's chunk) and, from torch 2.9, divides the clone for ``ReduceOp.AVG`` (the divisor wrapped in an 8-byte
tensor and cast to the dtype); DDP's reducer, without a comm hook, divides each gradient by N while
copying it into its bucket (``mul_out`` with 1/N wrapped in an 8-byte double tensor). gloo's own
transport buffers (``malloc`` inside gloo) are outside the c10 allocator, as NCCL's are outside
CUDA's caching allocator: neither side counts them. For the census (``backend="dispatcher"``) only
the reduce-scatter's clone: the rest is made on gloo's worker thread or beside the dispatcher.

The step is :func:`resacct.measurement.memory_timeline.run_training_step` with the optimizer's state
made beforehand (a steady step). Every rank trains on a batch of ``batch`` (the same data on each:
memory does not depend on the values). The claims: ``resacct/specs/peak_sharded.claims.yaml``.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from resacct.account.peak.dtensor_propagation import dtensor_among, propagating, propagation_unrecorded
from resacct.account.peak.sharded_collectives import BACKEND_KIND as _BACKEND
from resacct.account.peak.sharded_collectives import collectives_named
from resacct.account.peak.sharded_gaps import engine_gap, fsdp_gap  # re-exported: what this torch cannot trace
from resacct.account.peak.tracker import LiveStorageTracker
from resacct.errors import ResacctError
from resacct.measurement.memory_timeline import STEP_PHASES, copy_inputs, gc_paused, make_optimizer_state, run_training_step

__all__ = ["ENGINES", "FSDP_OPTIONS", "KINDS", "engine_gap", "fsdp_gap", "ShardedStorageTracker", "build_peak_model", "engine_mesh", "fsdp_units", "local_tensor",
           "local_optimizer_state", "step_copies", "sharded_step", "step_summary", "predict_rank_summaries", "predict_sharded_step_peaks_in_process"]

#: The engines, each with what it runs.
ENGINES = {
    "zero1": "DistributedDataParallel(gradient_as_bucket_view=True, init_sync=False) + ZeroRedundancyOptimizer(AdamW)",
    "fsdp2": "fully_shard on every block (a GPT's blocks, a transformers model's decoder layers; else every nn.Linear) and on the root, "
             "AdamW on the DTensor shards",
    "zero2": "fsdp2 with reshard_after_forward=False (FSDP's SHARD_GRAD_OP): each unit gathered once in forward and kept to its backward",
    "fsdp2-bf16": "fsdp2 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): bf16 gathered parameters and compute, fp32 shards and reduce-scatter",
}
#: The ``fully_shard`` options of each FSDP engine (the policy's dtypes named, built where FSDP is imported).
FSDP_OPTIONS: dict[str, dict[str, Any]] = {"fsdp2": {}, "zero2": {"reshard_after_forward": False},
                                          "fsdp2-bf16": {"mp_policy": ("bfloat16", "float32")}}
LEARNING_RATE = 1e-3
#: What a live storage is, beyond :data:`resacct.account.peak.tracker.KIND_BY_PHASE`.
KINDS = {
    "parameters": "the full parameters every ZeRO-1 rank keeps",
    "parameter shards": "this rank's padded FSDP shards (the DTensors' local storages)",
    "all-gathered parameters": "FSDP's unsharded parameters (storages it resizes up before a layer runs and down after)",
    "gradient buckets (DDP)": "the flat buckets DDP's reducer made at construction; the gradients are views of them",
    "gradient shards": "FSDP's reduce-scattered gradients (this rank's rows)",
    "optimizer state shard": "the AdamW state of the tensors (ZeRO-1) or rows (FSDP2) this rank owns",
    "all-gather buffers": "FSDP's flat all-gather outputs",
    "reduce-scatter buffers": "FSDP's flat reduce-scatter inputs",
    _BACKEND: "what gloo and DDP's reducer allocate inside their C++ (see the module docstring)",
}
_GATHERED = "all-gathered parameters"


class ShardedStorageTracker(LiveStorageTracker):
    """:class:`~resacct.account.peak.tracker.LiveStorageTracker` for sharded engines:

    - an op on a DTensor is left to the DTensor (``NotImplemented``), so the tracker sees the
      ops on the local shards it runs, and counts their storages, not the DTensor wrapper's
      (whose "storage" is the global size);
    - ``UntypedStorage.resize_`` — how FSDP allocates and frees its unsharded parameters — is
      counted: the allocator sees a resize to 0 as a free and a resize up as an allocation;
    - ``bytes_freed_elsewhere``: storages whose last reference a gloo worker thread dropped; over
      real tensors their free waits for that thread to get the GIL, so the census is late there.
    """

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()
        self.bytes_freed_elsewhere = 0  # freed on another thread (a gloo worker): counted when it got the GIL

    def storage_freed(self, nbytes: int, kind: str) -> None:
        if threading.get_ident() != self._thread:
            self.bytes_freed_elsewhere += nbytes

    def __enter__(self) -> Any:
        self._resize = torch.UntypedStorage.resize_
        original, tracker = self._resize, self

        def resize_(storage: Any, size: int) -> Any:
            before = storage.nbytes()
            result = original(storage, size)
            tracker.storage_resized(storage, before, storage.nbytes(), _GATHERED)  # FSDP resizes up only its unsharded parameters
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        self._propagation = propagation_unrecorded()  # imports DTensor's propagator: every engine's imports do anyway (DDP's too)
        self._propagation.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
            self._propagation.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> Any:
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        self._propagation.__exit__(None, None, None)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if propagating():  # DTensor working out an output's global shape on fake tensors: not the step's (dtensor_propagation)
            return func(*args, **(kwargs or {}))
        if dtensor_among(types):
            return NotImplemented
        return super().__torch_dispatch__(func, types, args, kwargs)


class _OutputsOf(TorchDispatchMode):
    """Collects the tensors every op returns while active (to name what a constructor allocated)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.outputs += [value for value in tree_flatten(out)[0] if isinstance(value, torch.Tensor)]
        return out


def local_tensor(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _fake_all_reduce_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations other than its own
    """DDP's comm hook under the fake process group (whose work's future holds None, where DDP's
    default hook expects the bucket): the bucket, all-reduced in place, as gloo does."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps before the root: a GPT's ``blocks``; else the first list of
    repeated layers (a transformers model's decoder layers: ``model.layers``, ``transformer.h``);
    else every ``nn.Linear``."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        return list(blocks)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(layer) for layer in module}) == 1 \
                and any(True for _ in module[0].parameters()):
            return list(module)
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


def _wrap(engine: str, model: nn.Module, tracker: LiveStorageTracker | None, mesh: Any, *, fake: bool,
          backend: str | None) -> tuple[nn.Module, Any]:
    """(the module the step calls, the optimizer) for ``engine``, the storages it made named."""
    name = tracker.classify if tracker is not None else lambda tensors, kind: None
    if engine == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        if backend == "allocator":  # the reducer's 1/N, wrapped in a double (not through the dispatcher) while it copies each gradient
            def reducer_scalar(parameter: torch.Tensor) -> None:
                name([torch.empty((), dtype=torch.float64)], _BACKEND)

            for parameter in model.parameters():
                parameter.register_post_accumulate_grad_hook(reducer_scalar)
        collector = _OutputsOf() if tracker is not None else contextlib.nullcontext()
        with collector:  # DDP's constructor allocates its buckets (init_sync=False: the ranks built the same model)
            wrapped = DistributedDataParallel(model, gradient_as_bucket_view=True, init_sync=False)
        name(getattr(collector, "outputs", []), "gradient buckets (DDP)")
        del collector
        if fake:
            wrapped.register_comm_hook(None, _fake_all_reduce_hook)
        return wrapped, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LEARNING_RATE)
    if engine in FSDP_OPTIONS:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        options = dict(FSDP_OPTIONS[engine])
        if "mp_policy" in options:
            param_dtype, reduce_dtype = (getattr(torch, name) for name in options["mp_policy"])
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        for unit in fsdp_units(model):
            fully_shard(unit, mesh=mesh, **options)
        fully_shard(model, mesh=mesh, **options)
        return model, torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    raise ResacctError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")


def local_optimizer_state(optimizer: Any) -> list[Any]:
    owner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    return [local_tensor(value) for state in owner.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def _fake_model(model: nn.Module) -> nn.Module:
    """``model`` with every parameter and buffer a fake CPU tensor of its shape (under ``FakeTensorMode``)."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype)
        memo[id(tensor)] = nn.Parameter(made, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else made
    return copy.deepcopy(model, memo)


def step_copies(model: nn.Module, inputs: Any, *, fake: bool) -> tuple[nn.Module, Any]:
    """A copy of ``model`` and of ``inputs`` for one step: fake CPU tensors (under ``FakeTensorMode``)
    or real clones. Made before a tracker is entered (a deep copy under a dispatch mode makes a
    second storage per tensor): the tracker counts them when :func:`sharded_step` names them."""
    if fake:
        return _fake_model(model), copy_inputs(inputs, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype))
    return copy.deepcopy(model), copy_inputs(inputs, torch.clone)


def sharded_step(engine: str, work: nn.Module, work_inputs: Any, loss_fn: Any, world_size: int, tracker: LiveStorageTracker | None,
                 mesh: Any = None, *, fake: bool, backend: str | None = None, mark: Any = None, stand_in: bool = False) -> tuple[nn.Module, Any]:
    """One steady step of ``engine`` on ``work`` and ``work_inputs`` (:func:`step_copies`: the step
    changes them), with the storages named for ``tracker`` (None: nothing named, as the allocator's
    run); ``mark(phase)`` as :func:`~resacct.measurement.memory_timeline.run_training_step` calls it
    (default ``tracker.mark``). ``fake``: under ``FakeTensorMode`` and the fake process group, where
    ``backend`` ("allocator" or "dispatcher") adds the backends' buffers (:func:`~resacct.account.peak.sharded_collectives.collectives_named`;
    ``stand_in``: every collective on fake tensors returns as the fake group's does, as where torch cannot run it).
    Returns (the module the step called, its optimizer)."""
    backend = backend if fake else None
    with collectives_named(tracker, world_size, backend=backend, engine=engine, stand_in=stand_in):
        wrapped, optimizer = _wrap(engine, work, tracker, mesh, fake=fake, backend=backend)
        make_optimizer_state(wrapped, optimizer)
        if tracker is not None:
            tracker.classify([local_tensor(p) for p in work.parameters()], "parameters" if engine == "zero1" else "parameter shards")
            tracker.classify(local_optimizer_state(optimizer), "optimizer state shard")
            tracker.classify([local_tensor(b) for b in work.buffers()], "buffers")
            tracker.classify(tree_flatten(work_inputs)[0], "inputs")
            tracker.name_modules(work)
        run_training_step(wrapped, work_inputs, loss_fn, optimizer, mark or tracker.mark)  # type: ignore[union-attr]
    return wrapped, optimizer


def step_summary(tracker: LiveStorageTracker) -> dict[str, Any]:
    """The peak, what was live at it, and each phase's peak (picklable, for the parent process)."""
    if tracker.peak is None:
        raise ResacctError("the sharded step dispatched no aten op; expected a forward that computes something")
    start = next(held for phase, held in tracker.timeline if phase == "forward")
    phase_peaks = {phase: max((held for name, held in tracker.timeline if name == phase), default=start) for phase in STEP_PHASES}
    peak = tracker.peak
    return {"peak_bytes": peak.bytes, "phase": peak.phase, "op": peak.op, "where": peak.where, "bytes_by_kind": dict(peak.bytes_by_kind),
            "start_bytes": start, "phase_peak_bytes": phase_peaks, "unprobed_matmuls": tracker.unprobed_matmuls}


def engine_mesh(engine: str, world_size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,)) if engine in FSDP_OPTIONS else None  # a real tensor: made outside fake mode


def build_peak_model(model_name: str, batch: int, seq: int) -> tuple[nn.Module, Any, Any]:
    from resacct.account.peak.models import peak_model

    return peak_model(model_name, batch=batch, seq=seq)


def predict_rank_summaries(model: nn.Module, inputs: Any, loss_fn: Any, engine: str, world_size: int, ranks: tuple[int, ...], *,
                           backends: tuple[str, ...] = ("allocator",), on_rank: Any = None, stand_in: bool = False) -> list[dict[str, Any]]:
    """For each of ``ranks``: ``{backend: step_summary}`` of one steady step of ``engine`` on fake
    copies of ``model`` and ``inputs`` (any device: only shapes are read), each rank in torch's fake
    process group — ``"allocator"``: every backend buffer (what the CPU allocator sees), ``"census"``:
    those the calling thread makes through the dispatcher (what the tracker over real tensors sees).
    Joins the fake process group once per rank: run it in a child process
    (:func:`resacct.measurement.distributed.run_isolated`), never where a group exists.
    ``on_rank(rank)`` is called before each rank (a progress line); ``stand_in``: see :func:`sharded_step`."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from resacct.account.peak.layer_segments import mark_layer_segments, segmenting_layers
    from resacct.account.peak.step_peak import prediction_of_tracker

    if engine not in ENGINES:
        raise ResacctError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    layers = segmenting_layers()  # inside layer_segments.segmenting: each report also has its predictions, segments marked
    summaries = []
    for rank in ranks:
        if on_rank is not None:
            on_rank(rank)
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            mesh, report = engine_mesh(engine, world_size), {}
            for backend in backends:
                tracker = ShardedStorageTracker()
                with gc_paused(), FakeTensorMode(allow_non_fake_inputs=True):
                    work, work_inputs = step_copies(model, inputs, fake=True)
                    hooks = [] if layers is None else mark_layer_segments(work, tracker, layers)
                    with tracker:
                        sharded_step(engine, work, work_inputs, loss_fn, world_size, tracker, mesh, fake=True,
                                     backend="dispatcher" if backend == "census" else backend, stand_in=stand_in)
                    for hook in hooks:
                        hook.remove()
                del work, work_inputs, hooks
                report[backend] = step_summary(tracker)
                if layers is not None:
                    report.setdefault("predictions", {})[backend] = prediction_of_tracker(tracker)
            summaries.append(report)
        finally:
            dist.destroy_process_group()
    return summaries


def predict_sharded_step_peaks_in_process(engines: tuple[str, ...], model_name: str, batch: int, seq: int, world_size: int,
                                          ranks: tuple[int, ...], census: tuple[str, ...] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per engine, for each of ``ranks``: the predicted step peak on a
    :data:`~resacct.account.peak.models.PEAK_MODELS` model, ``{"allocator": …, "census": …}``
    (:func:`predict_rank_summaries`; the census, a second fake pass, only for the engines of
    ``census``, default every engine): run it in a child process."""
    model, inputs, loss_fn = build_peak_model(model_name, batch, seq)
    return {engine: predict_rank_summaries(model, inputs, loss_fn, engine, world_size, ranks,
                                           backends=("allocator", "census") if census is None or engine in census else ("allocator",))
            for engine in engines}
