"""The memory of one training step over time, as the CPU allocator records it — the measured side
of resacct's predicted peak (:mod:`resacct.account.peak.step_peak`).

One training step is one Python program, :func:`run_training_step`: forward (``loss_fn``),
backward, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``, with the optimizer's
state made beforehand by :func:`make_optimizer_state` (one step on zero gradients: a steady step,
not the first). resacct runs that same program on fake tensors to predict the peak; here it runs
for real under ``torch.profiler.profile(profile_memory=True)``, which reports every allocation
and free of the c10 CPU allocator with its size in bytes. Their running sum, from before the
model's copy is made, is what the step holds: parameters, inputs and optimizer state included,
kernel-internal temporaries too (the allocator, not a tensor census). Each allocation is placed
in the phase whose ``record_function`` range contains it.

>>> import torch
>>> model = torch.nn.Linear(4, 2)
>>> sgd = lambda parameters: torch.optim.SGD(parameters, lr=0.1)
>>> timeline = measure_step_memory(model, torch.ones(3, 4), lambda m, x: m(x).sum(), sgd)
>>> timeline.start_bytes                        # weight 32 + bias 8 + input 48, before the step
88
>>> timeline.peak_phase in STEP_PHASES, timeline.peak_bytes >= timeline.start_bytes + 40   # + the gradients
(True, True)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from resacct.errors import ResacctError

__all__ = [
    "allocator_recording",
    "STEP_PHASES",
    "MemoryTimeline",
    "run_training_step",
    "make_optimizer_state",
    "copy_inputs",
    "gc_paused",
    "measure_step_memory",
    "record_step_events",
    "phase_ranges",
]

#: The phases of one training step, in order.
STEP_PHASES = ("forward", "backward", "optimizer step", "zero_grad")

LossFn = Callable[[nn.Module, Any], torch.Tensor]
MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class MemoryTimeline:
    """Bytes held over one step: ``bytes_held[i]`` after event ``i``, in phase ``phases[i]``.

    ``start_bytes``: held when the step starts (parameters, inputs, optimizer state, anything
    else alive); ``peak_bytes``: the most held at once during the step, in ``peak_phase``;
    ``source``: who counted (the allocator, or resacct's tracker of fake storages)."""

    phases: tuple[str, ...]
    bytes_held: tuple[int, ...]
    start_bytes: int
    peak_bytes: int
    peak_phase: str
    source: str

    def peak_of_phase(self, phase: str) -> int:
        """The most held during ``phase`` (the start when the phase recorded nothing)."""
        values = [held for name, held in zip(self.phases, self.bytes_held) if name == phase]
        return max(values, default=self.start_bytes)


def run_training_step(model: nn.Module, inputs: Any, loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                      mark: Callable[[str], None] = lambda phase: None) -> None:
    """One training step, ``mark(phase)`` called as each phase of :data:`STEP_PHASES` begins and
    ``mark("end")`` after the last. The loss is dropped after backward, as a training loop that
    keeps ``loss.item()`` does."""
    mark("forward")
    loss = loss_fn(model, inputs)
    mark("backward")
    loss.backward()
    del loss
    mark("optimizer step")
    optimizer.step()
    mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    mark("end")


def make_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s state as a first step would: one step on zero gradients, then
    ``zero_grad``. The step measured next is then a steady one (its state exists before it)."""
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def copy_inputs(inputs: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``inputs`` (a tensor, a tuple, or a mapping of tensors) with each distinct tensor replaced
    by ``make(tensor)`` once — two names for one tensor (``input_ids`` and ``labels``) stay one."""
    one = functools.partial(_copy_one, {}, make)
    if isinstance(inputs, dict):
        return {name: one(value) for name, value in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(one(value) for value in inputs)
    return one(inputs)


def _copy_one(made: dict[int, torch.Tensor], make: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
    """``value``'s copy for :func:`copy_inputs` (``make(value)`` once per tensor, kept in ``made``; anything else as it is).
    A module-level function, not a def in copy_inputs: the type-checking hook decorates it once (docs/suite_time.md, session 7)."""
    if not isinstance(value, torch.Tensor):
        return value
    if id(value) not in made:
        made[id(value)] = make(value)
    return made[id(value)]


@contextlib.contextmanager
def gc_paused(*, collect: bool = True) -> Iterator[None]:
    """Collect (unless ``collect=False``), then pause Python's cyclic garbage collector for the
    block: frees then follow reference counts alone, the same in a real run and in a fake one."""
    if collect:
        gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def allocator_recording() -> Iterator[tuple[Callable[[str], None], list[Any]]]:
    """The CPU allocator's events over the block (``torch.profiler``, ``profile_memory=True``,
    Python's cyclic collector paused): yields ``(mark, events)``; ``mark(phase)`` opens the range
    ``resacct:<phase>`` (closing the last; ``"end"`` only closes) and ``events`` is filled when the
    profiler has stopped. Free what the block made *after* it, or the frees land in the record."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from resacct.measurement.activation_recording import _native_stderr_silenced

    ranges = contextlib.ExitStack()

    def mark(phase: str) -> None:
        ranges.close()
        if phase != "end":
            ranges.enter_context(record_function(f"resacct:{phase}"))

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    events: list[Any] = []
    # no collection first: with the collector paused for the whole record, garbage made before it cannot
    # be freed inside it, and a full collection costs ~0.2 CPU s once transformers is imported
    with gc_paused(collect=False):
        with _native_stderr_silenced():
            profiler.start()
        try:
            yield mark, events
        finally:
            ranges.close()
            with _native_stderr_silenced():
                profiler.stop()
    events.extend(profiler.profiler.kineto_results.events())


def measure_step_memory(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: MakeOptimizer) -> MemoryTimeline:
    """Run one steady training step of a copy of ``model`` on a copy of ``inputs`` (both made
    inside the trace, so their bytes count) with the optimizer ``make_optimizer(parameters)``
    builds (e.g. :func:`resacct.account.load.optimizers.build_optimizer` with torch's default
    implementation for the device) and return the CPU allocator's timeline of it.
    ``loss_fn(model, inputs)`` returns a scalar loss. The model must be on the CPU."""
    return _timeline_of(record_step_events(model, inputs, make_optimizer,
                                           lambda work, work_inputs, step, mark: run_training_step(work, work_inputs, loss_fn, step, mark)))


def record_step_events(model: nn.Module, inputs: Any, make_optimizer: MakeOptimizer, run: Callable[[nn.Module, Any, Any, Callable[[str], None]], None]) -> list[Any]:
    """The CPU allocator's events while ``run(work, work_inputs, optimizer, mark)`` steps copies of
    ``model`` and ``inputs`` made inside the record (their bytes count), the optimizer's state made
    beforehand (a steady step); freed after the record. The model must be on the CPU."""
    devices = {parameter.device.type for parameter in model.parameters()}
    if devices != {"cpu"}:
        raise ResacctError(f"the allocator timeline is measured on the CPU; the model's parameters are on {sorted(devices)}")
    with allocator_recording() as (mark, events):
        work = copy.deepcopy(model)
        work_inputs = copy_inputs(inputs, torch.clone)
        step = make_optimizer([p for p in work.parameters() if p.requires_grad])
        make_optimizer_state(work, step)
        run(work, work_inputs, step, mark)
    del work, work_inputs, step
    return events


def phase_ranges(events: Any) -> list[tuple[int, int, str]]:
    """``(start_ns, end_ns, phase)`` of each ``resacct:<phase>`` range the profiler recorded, in order.
    The end is start + duration: torch 2.4's ``_KinetoEvent`` has ``duration_ns`` but no ``end_ns``."""
    return sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name().removeprefix("resacct:")) for e in events if e.name().startswith("resacct:"))


def _timeline_of(events: Any) -> MemoryTimeline:
    memory = sorted((e for e in events if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU), key=lambda e: e.start_ns())
    ranges = phase_ranges(events)
    if [name for _, _, name in ranges] != list(STEP_PHASES):
        raise ResacctError(f"the profiler recorded the phases {[name for _, _, name in ranges]}; expected {list(STEP_PHASES)}")
    held, start, phases, values = 0, None, [], []
    for event in memory:
        inside = [name for begin, end, name in ranges if begin <= event.start_ns() <= end]
        if inside and start is None:
            start = held
        if inside and (not phases or phases[-1] != inside[0]):  # what the phase starts with
            phases.append(inside[0])
            values.append(held)
        held += event.nbytes()
        if inside:
            phases.append(inside[0])
            values.append(held)
    if start is None:
        raise ResacctError("torch.profiler recorded no CPU allocation during the step; expected some (is this a CPU run?)")
    peak = max(values)
    return MemoryTimeline(phases=tuple(phases), bytes_held=tuple(values), start_bytes=start, peak_bytes=peak,
                          peak_phase=phases[values.index(peak)], source="CPU allocator (torch.profiler, profile_memory=True)")
