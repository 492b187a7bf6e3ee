"""resacct's tracker of live tensor storages: the engine of the predicted peak (:mod:`resacct.account.peak.step_peak`).

:class:`LiveStorageTracker` is a ``TorchDispatchMode``: every aten op's outputs that own a new
storage are added with their bytes, each storage is dropped when it dies (a weak reference to
it), and after every op the total is compared with the peak. Run over fake tensors
(``FakeTensorMode``) it predicts what the CPU allocator will hold, without allocating: the
kernels chosen are the CPU's (fake CPU tensors), only their arithmetic is skipped.

What it knows beyond a total (the breakdown at the peak):

- **what** each live storage is — parameters, buffers, inputs, optimizer state, gradients (a
  parameter's ``.grad``), activations still held from forward (what autograd saved, and the
  outputs the caller holds), backward temporaries (activation gradients), optimizer temporaries;
- **when** — the phase (forward, backward, optimizer step, zero_grad), the aten op whose outputs
  made the peak, and the module (forward) or autograd node (backward) running it;
- **kernel workspaces** the dispatcher never shows either: the CPU flash-attention kernels'
  per-thread buffers (:mod:`resacct.account.peak.kernel_workspace`), and oneDNN's scratchpad for 16-bit
  matmuls, measured once per distinct matmul on this CPU (:mod:`resacct.measurement.kernel_probe`;
  ``unprobed_matmuls`` counts those too large to run, whose scratchpad is left out);
- **Python numbers** an op receives where its schema takes a tensor (``x * 0.5``): torch wraps
  each in an 8-byte CPU tensor the dispatcher never shows (alive while the op runs, and kept
  when autograd saves it: ``mul``/``div`` keep their scalar operand for the gradient).

>>> import torch
>>> tracker = LiveStorageTracker()
>>> with tracker:
...     tracker.mark("forward")
...     a = torch.ones(256)                  # 1024 bytes
...     b = a * 2.0                          # 1024 more; the 2.0 wrapped (8 bytes) and copied to float32 (4) during the op
...     del a
...     c = b.sum()                          # 4 bytes
>>> tracker.peak_bytes, tracker.peak_phase, tracker.peak_op, tracker.total_bytes
(2060, 'forward', 'aten.mul.Tensor', 1028)
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, no_type_check

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from resacct.account.peak.kernel_workspace import (
    SIZED_OUTPUT_OPS,
    WORKSPACE_OPS,
    WRAPPED_NUMBER_BYTES,
    kernel_workspace_bytes,
    op_name,
    output_storage_bytes,
    wrapped_number_bytes,
)
from resacct.measurement.flop_tracing import dispatched_call
from resacct.measurement.kernel_probe import PROBED_OPS, matmul_scratchpad_bytes

__all__ = ["LiveStorageTracker", "PeakMoment", "KIND_BY_PHASE", "WORKSPACE_KIND", "SCRATCHPAD_KIND"]

#: What a storage created in each phase is, until it is known better (a gradient, a state tensor).
KIND_BY_PHASE = {"setup": "other", "forward": "activations held from forward", "backward": "backward temporaries",
                 "optimizer step": "optimizer temporaries", "zero_grad": "optimizer temporaries"}

#: Ops whose backward keeps their (wrapped) scalar operand: grad·other, grad/other.
_SAVES_SCALAR_OPERAND = frozenset({"aten.mul.Tensor", "aten.div.Tensor"})

WRAPPED_KIND = "scalars autograd keeps"
WRAPPED_TRANSIENT_KIND = "scalars inside the op"
WORKSPACE_KIND = "kernel workspace (attention)"
SCRATCHPAD_KIND = "kernel workspace (oneDNN matmul)"


@dataclass(frozen=True)
class PeakMoment:
    """The most bytes live at once, and what they were: ``bytes_by_kind`` sums to ``bytes``."""

    bytes: int
    phase: str
    op: str
    where: str
    bytes_by_kind: dict[str, int]


class LiveStorageTracker(TorchDispatchMode):
    """Live storages by kind, their total after every op, the peak and what was live at it.

    ``mark(phase)`` starts a phase (the timeline and the peak count from the first mark);
    ``classify(tensors, kind)`` names what existing storages are (parameters, inputs …);
    ``timeline`` holds ``(phase, bytes)`` after every op and at every mark."""

    def __init__(self) -> None:
        super().__init__()
        self._live: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes, kind]
        self.bytes_by_kind: Counter[str] = Counter()
        self.total_bytes = 0
        self.phase = "setup"
        self.timeline: list[tuple[str, int]] = []
        self.peak: PeakMoment | None = None
        self.ops_seen: Counter[str] = Counter()
        self.where = ""
        self._pending_scalars: list[tuple[weakref.ref, int]] = []
        self._module_names: dict[int, str] = {}
        self._module_stack: list[str] = []
        self._hooks: list[Any] = []
        self.unprobed_matmuls = 0  # 16-bit oneDNN matmuls too large to probe: their scratchpad is not counted
        #: when not None: one ``[key, phase, first timeline index, peak moment or None]`` per segment
        #: (:meth:`begin_segment`; every mark begins one) — :mod:`resacct.account.peak.layer_segments`
        self.segments: list[list[Any]] | None = None
        self.segment_path = ""
        self.segment_prefix = 0  # the layers before the repeated ones, built apart (layer_segments.LayerStack)
        self.segment_period = 1  # the layers of one repeated unit
        self._skip_detach_of: int | None = None  # id of the storage whose detach is the next op's to skip (:meth:`skip_next_detach`)
        #: when not None, told of every event that moves the count (:mod:`resacct.account.peak.optimizer_replay`)
        self.event_log: Any = None
        #: when not None, an object whose ``calls`` list gets each op the tracker hands down, as a
        #: :class:`~resacct.measurement.flop_tracing.DispatchedOps` right below it would record it (one mode fewer)
        self.op_record: Any = None

    # ── what is live ──────────────────────────────────────────────────────────────────────
    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _add(self, storage: Any, kind: str, nbytes: int | None = None) -> None:
        nbytes = storage.nbytes() if nbytes is None else nbytes
        entry = [nbytes, kind]
        if self.event_log is not None:
            self.event_log.added(entry)
        self._live[storage] = entry
        weakref.finalize(storage, self._drop, entry)
        self.bytes_by_kind[kind] += nbytes
        self.total_bytes += nbytes

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _drop(self, entry: list) -> None:
        if self.event_log is not None:
            self.event_log.dropped(entry)
        self.bytes_by_kind[entry[1]] -= entry[0]
        self.total_bytes -= entry[0]
        self.storage_freed(entry[0], entry[1])
        if self.phase != "setup" and self.phase in KIND_BY_PHASE:
            self.timeline.append((self.phase, self.total_bytes))

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _change(self, amount: int, kind: str) -> None:
        if self.event_log is not None:
            self.event_log.changed("a storage's bytes or kind changed")
        self.bytes_by_kind[kind] += amount
        self.total_bytes += amount

    # ── hooks for engines that allocate beside the dispatcher (FSDP's storage resizes) ────────
    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def storage_freed(self, nbytes: int, kind: str) -> None:
        """Called when a tracked storage dies (on whatever thread drops it); override to see frees."""

    def storage_resized(self, storage: Any, before_bytes: int, after_bytes: int, grown_kind: str) -> None:
        """A storage resized in place (``UntypedStorage.resize_``), which the dispatcher never sees:
        the allocator counts a resize up as an allocation and one to 0 as a free. An untracked
        storage is added at ``after_bytes``; one that grows becomes ``grown_kind``."""
        entry = self._live.get(storage)
        if entry is None:
            self._add(storage, grown_kind, after_bytes)
        else:
            self._change(after_bytes - before_bytes, entry[1])
            entry[0] = after_bytes
            if after_bytes > before_bytes and entry[1] != grown_kind:
                self._change(-after_bytes, entry[1])
                self._change(after_bytes, grown_kind)
                entry[1] = grown_kind
        if self.phase in KIND_BY_PHASE and self.phase != "setup":
            self._observe(f"{type(storage).__name__}.resize_", 0, 0)

    def classify(self, tensors: Iterable[Any], kind: str) -> None:
        """Name the storages of ``tensors`` (None skipped) as ``kind``; unseen ones are added."""
        if self.event_log is not None:
            self.event_log.changed(f"storages classified as {kind}")
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            entry = self._live.get(storage)
            if entry is None:
                self._add(storage, kind)
            elif entry[1] != kind:
                self.bytes_by_kind[entry[1]] -= entry[0]
                self.bytes_by_kind[kind] += entry[0]
                entry[1] = kind

    # ── when ──────────────────────────────────────────────────────────────────────────────
    def mark(self, phase: str) -> None:
        """Begin ``phase`` (``"end"`` closes the last one)."""
        self._resolve_pending_scalars(final=True)
        self.phase = phase
        self.begin_segment(("phase", phase))
        self.timeline.append((phase, self.total_bytes))

    def begin_segment(self, key: tuple[Any, ...]) -> None:
        """Begin a segment of the timeline named ``key`` (kept only when :attr:`segments` is a list):
        its peak moment is kept beside the step's."""
        if self.segments is not None:
            self.segments.append([key, self.phase, len(self.timeline), None])

    def name_modules(self, model: torch.nn.Module) -> None:
        """Attribute forward ops to ``model``'s submodules by name (forward hooks, removed on exit)."""
        self._module_names = {id(module): name or type(model).__name__ for name, module in model.named_modules()}
        self._hooks = [torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
                       torch.nn.modules.module.register_module_forward_hook(self._leave_module)]

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _enter_module(self, module: Any, args: Any) -> None:
        self._module_stack.append(self._module_names.get(id(module), type(module).__name__))

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _leave_module(self, module: Any, args: Any, output: Any) -> None:
        if self._module_stack:
            self._module_stack.pop()

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _location(self) -> str:
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            return "" if node is None else node.name()
        return self._module_stack[-1] if self._module_stack else ""

    # ── the dispatch ──────────────────────────────────────────────────────────────────────
    def __exit__(self, *exc: Any) -> Any:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        return super().__exit__(*exc)

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _DEVICE_QUERY:  # tensor.device on a fake tensor: over half of a fake step's dispatches, nothing made
            return self._device_query(func, args, kwargs)
        kwargs = kwargs or {}
        if self._skip_detach_of is not None:
            skipped, self._skip_detach_of = self._skip_detach_of, None
            if func is _DETACH and id(args[0].untyped_storage()) == skipped:
                out = func(*args, **kwargs)
                if self.op_record is not None:
                    self.op_record.calls.append(dispatched_call(func, args, out))
                return out
        out = self._call(func, args, kwargs)
        if self.op_record is not None:
            self.op_record.calls.append(dispatched_call(func, args, out))
        if self._pending_scalars:
            self._resolve_pending_scalars()
        _, name, sized_output, workspace_op, probed_op = _facts_of(func)
        self.ops_seen[name] += 1
        if self.event_log is not None:
            self.event_log.op(name, args, kwargs)
        real_bytes = output_storage_bytes(func, args, kwargs) if sized_output else None  # a kernel that returns its output in a larger storage
        if isinstance(out, torch.Tensor):
            storage = out.untyped_storage()
            if storage not in self._live:
                self._add(storage, KIND_BY_PHASE.get(self.phase, "other"), real_bytes)
        elif isinstance(out, (tuple, list, dict)):
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor):
                    storage = value.untyped_storage()
                    if storage not in self._live:
                        self._add(storage, KIND_BY_PHASE.get(self.phase, "other"), real_bytes)
        wrapped = wrapped_number_bytes(func, args, out)
        # Saved in forward: kept until its node runs. Saved while recomputing a checkpointed segment in
        # backward: the recomputed graph is dropped as soon as its tensors are unpacked, scalars with it.
        if wrapped and name in _SAVES_SCALAR_OPERAND and self.phase != "backward" and torch.is_grad_enabled() and _any_requires_grad(args):
            kept = sum(WRAPPED_NUMBER_BYTES[type(value)] for value in args if isinstance(value, (bool, int, float, complex)))
            self._pending_scalars += [(weakref.ref(value), kept) for value in tree_flatten(out)[0] if isinstance(value, torch.Tensor)][:1]
        if self.phase in _OBSERVED_PHASES:
            workspace = kernel_workspace_bytes(func, args, kwargs) if workspace_op else 0
            scratchpad = matmul_scratchpad_bytes(func, args, kwargs) if probed_op else 0
            if scratchpad is None:
                self.unprobed_matmuls += 1
                if self.event_log is not None:
                    self.event_log.changed("a matmul too large to probe")
            self._observe(name, wrapped, workspace, scratchpad or 0)
        return out

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _call(self, func: Any, args: Any, kwargs: Any) -> Any:
        """Run one op of the step (a subclass may run it as another device's kernel does: ``shard --device``'s CUDA forms)."""
        return func(*args, **kwargs)

    def skip_next_detach(self, tensor: torch.Tensor) -> None:
        """Leave out the next op when it detaches ``tensor``'s storage: autograd detaches what a
        saved-tensor unpack hook returns — an op of the hook, not of the step (a view: no storage, no
        bytes) — so a step recorded by hooks (:mod:`resacct.account.trace.fake_pass`) keeps the
        timeline and ops it has without them."""
        self._skip_detach_of = id(tensor.untyped_storage())

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _device_query(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``prim.device`` (a fake tensor's ``.device``): answered as ``FakeTensor`` answers it (its
        ``fake_device``; meta inside a kernel) without the fake mode's dispatch, then counted and observed
        as any op is (no storage, no number, no workspace: the same timeline point, the same peak)."""
        tensor = args[0] if len(args) == 1 and not kwargs else None
        fake_mode = getattr(tensor, "fake_mode", None)
        if fake_mode is None or not hasattr(tensor, "fake_device"):
            out = func(*args, **(kwargs or {}))
            if self.op_record is not None:
                self.op_record.calls.append(dispatched_call(func, args, out))
        else:
            out = torch.device("meta") if fake_mode.in_kernel_invocation else tensor.fake_device
        if self._pending_scalars:
            self._resolve_pending_scalars()
        self.ops_seen[_DEVICE_QUERY_NAME] += 1
        if self.event_log is not None:
            self.event_log.op(_DEVICE_QUERY_NAME, args, kwargs)
        if self.phase in _OBSERVED_PHASES:
            self._observe(_DEVICE_QUERY_NAME, 0, 0)
        return out

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _observe(self, op: str, transient_bytes: int, workspace_bytes: int, scratchpad_bytes: int = 0) -> None:
        if self.event_log is not None:
            self.event_log.observed(op, transient_bytes, workspace_bytes, scratchpad_bytes)
        candidate = self.total_bytes + transient_bytes + workspace_bytes + scratchpad_bytes
        self.timeline.append((self.phase, candidate))
        segment = self.segments[-1] if self.segments else None
        new_peak = self.peak is None or candidate > self.peak.bytes
        if new_peak or (segment is not None and (segment[3] is None or candidate > segment[3].bytes)):
            kinds = {kind: value for kind, value in self.bytes_by_kind.items() if value}
            for kind, value in ((WRAPPED_TRANSIENT_KIND, transient_bytes), (WORKSPACE_KIND, workspace_bytes), (SCRATCHPAD_KIND, scratchpad_bytes)):
                if value:
                    kinds[kind] = value
            moment = PeakMoment(bytes=candidate, phase=self.phase, op=op, where=self._location(), bytes_by_kind=kinds)
            if new_peak:
                self.peak = moment
            if segment is not None and (segment[3] is None or candidate > segment[3].bytes):
                segment[3] = moment

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def _resolve_pending_scalars(self, *, final: bool = False) -> None:
        """A Python number autograd saved (``x * 0.5`` keeps the 0.5): counted from when its node
        exists (autograd attaches it after the op returns) until the node has run in backward."""
        pending, self._pending_scalars = self._pending_scalars, []
        for reference, nbytes in pending:
            output = reference()
            node = None if output is None else output.grad_fn
            if node is None:
                if output is not None and not final:
                    self._pending_scalars.append((reference, nbytes))
                continue
            self._change(nbytes, WRAPPED_KIND)
            node.register_hook(lambda grad_inputs, grad_outputs, nbytes=nbytes: self._change(-nbytes, WRAPPED_KIND))

    @property
    def peak_bytes(self) -> int:
        return 0 if self.peak is None else self.peak.bytes

    @property
    def peak_phase(self) -> str:
        return "" if self.peak is None else self.peak.phase

    @property
    def peak_op(self) -> str:
        return "" if self.peak is None else self.peak.op


_OBSERVED_PHASES = frozenset(KIND_BY_PHASE) - {"setup"}
_DEVICE_QUERY = torch.ops.prim.device.default
_DEVICE_QUERY_NAME = op_name(_DEVICE_QUERY)
_DETACH = torch.ops.aten.detach.default
_OP_FACTS: dict[int, tuple[Any, str, bool, bool, bool]] = {}  # id(op) -> (op, name, sized output?, workspace?, probed matmul?)


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _facts_of(func: Any) -> tuple[Any, str, bool, bool, bool]:
    """What the tracker asks of every call of ``func``, worked out once per op (most calls are ops
    with nothing to add — ``prim.device`` alone is over half of a fake step's dispatches): its
    name, whether its kernel may return a larger storage (:func:`output_storage_bytes`), may allocate
    a workspace (:func:`kernel_workspace_bytes`), or is a matmul whose oneDNN scratchpad is probed."""
    known = _OP_FACTS.get(id(func))
    if known is None or known[0] is not func:
        name = op_name(func)
        known = _OP_FACTS[id(func)] = (func, name, name in SIZED_OUTPUT_OPS, name in WORKSPACE_OPS, name in PROBED_OPS)
    return known


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _any_requires_grad(args: Any) -> bool:
    return any(isinstance(value, torch.Tensor) and value.requires_grad for value in tree_flatten(args)[0])
