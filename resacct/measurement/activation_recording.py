"""Recording activation memory: what autograd saves, per module, and what the allocator holds.

- :func:`record_saved_activations` — every tensor autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), deduplicated by storage, each attributed to
  the module whose forward saved it (a module stack kept by forward pre/post hooks).
  Saved parameters (a Linear keeps its weight) are flagged apart: they are not activations.
- :func:`trace_allocations` — the CPU allocator's own record of every allocation and free in a
  block (``torch.profiler`` with ``profile_memory=True``): bytes held at the end and the peak,
  both relative to the start. It sees what saved-tensor hooks cannot: kernel temporaries, the
  optimizer's scratch tensors, and what ``checkpoint`` keeps.

Storages are told apart by ``untyped_storage().data_ptr()``; on the meta device, where every
pointer is 0, by the storage object's identity — so a GPT-2-sized forward can be measured there
without allocating. Re-exported by :mod:`resacct.measurement.activations`.

>>> import torch
>>> layer = torch.nn.Linear(3, 2)
>>> with record_saved_activations(layer) as saved:
...     y = layer(torch.ones(4, 3, requires_grad=True))
>>> saved.activation_bytes, saved.parameter_bytes  # the input x (4×3 float32); the weight (2×3)
(48, 24)
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, no_type_check

import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.measurement.memory import storage_key

__all__ = [
    "SavedActivation",
    "SavedActivations",
    "module_stack",
    "record_saved_activations",
    "AllocationTrace",
    "trace_allocations",
    "MODEL_SCOPE",
    "OUTSIDE_SCOPE",
]

MODEL_SCOPE = "(model)"  # the root module's own forward
OUTSIDE_SCOPE = "(loss)"  # saved outside every module's forward (the loss, usually)


@dataclass(frozen=True)
class SavedActivation:
    """One distinct storage autograd saved for backward."""

    module: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    is_parameter: bool


@dataclass
class SavedActivations:
    """What autograd saved inside :func:`record_saved_activations`, one entry per storage."""

    entries: list[SavedActivation] = field(default_factory=list)
    saves: int = 0  # pack-hook calls, repeats included

    @property
    def activation_bytes(self) -> int:
        """Bytes of the distinct saved storages that are not parameters."""
        return sum(entry.bytes for entry in self.entries if not entry.is_parameter)

    @property
    def parameter_bytes(self) -> int:
        """Bytes of saved parameters (weights kept for the input gradient): no extra memory."""
        return sum(entry.bytes for entry in self.entries if entry.is_parameter)

    def by_module(self, *, parameters: bool = False) -> dict[str, int]:
        """Saved bytes per module (the innermost module running when it was saved), in order."""
        totals: dict[str, int] = defaultdict(int)
        for entry in self.entries:
            if entry.is_parameter == parameters:
                totals[entry.module] += entry.bytes
        return dict(totals)


# module_stack's hooks: module-level functions under a functools.partial, not defs in module_stack, so the
# type-checking hook decorates them once, not at each call (docs/suite_time.md, session 7).
@no_type_check  # one call per module forward, on torch's arguments: not checked (it was a nested def under no_type_check)
def _enter_scope(stack: list[str], name: str, module: nn.Module, args: Any) -> None:
    stack.append(name or MODEL_SCOPE)


def _leave_scope(stack: list[str], module: nn.Module, args: Any, output: Any) -> None:
    stack.pop()


@contextlib.contextmanager
def module_stack(model: nn.Module) -> Iterator[list[str]]:
    """A list whose last item is the path of the module whose forward is running
    (``"blocks.0.attention"``; the root is :data:`MODEL_SCOPE`, outside all: :data:`OUTSIDE_SCOPE`)."""
    stack = [OUTSIDE_SCOPE]
    handles = []
    leave = functools.partial(_leave_scope, stack)
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(functools.partial(_enter_scope, stack, name)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def record_saved_activations(model: nn.Module) -> Iterator[SavedActivations]:
    """Record every tensor autograd saves for backward in the block, by module and storage.

    The saved tensors are kept alive until the block ends (so storages cannot be reused and
    miscounted), then reduced to one :class:`SavedActivation` per distinct storage.
    ``torch.utils.checkpoint`` installs its own hooks inside a segment: what it saves there is
    invisible here (use :func:`trace_allocations` for checkpointed forwards).
    """
    result = SavedActivations()
    parameter_keys = {storage_key(p) for p in model.parameters()}
    recorded: list[tuple[torch.Tensor, str]] = []
    with module_stack(model) as stack:

        @no_type_check  # decorated anew at every call of the function around it: the hook's cost, not a check (docs/suite_time.md)
        def pack(tensor: torch.Tensor) -> torch.Tensor:
            recorded.append((tensor, stack[-1]))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield result
    seen: set[tuple[str, int]] = set()
    for tensor, module in recorded:
        key = storage_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        result.entries.append(
            SavedActivation(
                module=module,
                shape=tuple(tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                bytes=tensor.untyped_storage().nbytes(),
                is_parameter=key in parameter_keys,
            )
        )
    result.saves = len(recorded)


@dataclass
class AllocationTrace:
    """Bytes the CPU allocator handed out in a block, relative to its start: held at the end
    (``end_bytes``), the most held at once (``peak_bytes``), and the allocation count."""

    end_bytes: int = 0
    peak_bytes: int = 0
    allocations: int = 0


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Around a profiler's start or stop: kineto's ``profiler_start``/``profiler_stop`` lines on
    file descriptor 2 are dropped, anything else written there is kept
    (:func:`resacct.measurement.native_stderr.kineto_start_stop_lines_dropped`; this sent all of
    file descriptor 2 to /dev/null, real errors included)."""
    from resacct.measurement.native_stderr import kineto_start_stop_lines_dropped

    with kineto_start_stop_lines_dropped():
        yield


@contextlib.contextmanager
def trace_allocations() -> Iterator[AllocationTrace]:
    """Trace every CPU allocation and free in the block with ``torch.profiler``
    (``profile_memory=True``): the allocator reports each one; their running sum is what the
    block holds above what existed before it. Kernel-internal temporaries are included.

    >>> with trace_allocations() as trace:
    ...     a = torch.ones(1000)            # 4000 bytes, kept
    ...     b = (a * 2).sum()               # a temporary of 4000 bytes, then a scalar
    >>> trace.end_bytes >= 4004, trace.peak_bytes >= 8000
    (True, True)
    """
    from torch.profiler import ProfilerActivity, profile

    trace = AllocationTrace()
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():  # kineto prints "profiler_start"/"profiler_stop" lines to fd 2
        profiler.start()
    try:
        yield trace
    finally:
        with _native_stderr_silenced():
            profiler.stop()
    events = [event for event in profiler.profiler.kineto_results.events() if event.name() == "[memory]"]
    events = [event for event in events if event.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda event: event.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    trace.end_bytes, trace.peak_bytes = held, peak
    trace.allocations = sum(1 for event in events if event.nbytes() > 0)
    if not events:
        raise ResacctError("torch.profiler recorded no CPU allocations in the block; expected at least one (is this a CPU run?)")
