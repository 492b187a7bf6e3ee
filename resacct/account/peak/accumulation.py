"""Gradient accumulation as one training step: ``k`` micro-steps (forward, ``(loss / k).backward()``)
whose gradients add up in ``.grad`` — they persist from the first micro-step's backward to
``zero_grad`` — then one ``optimizer.step()`` and ``zero_grad``. The same program runs on fake
tensors for the prediction (:func:`resacct.account.peak.step_peak.predict_step_peak` with ``micro_batches``)
and for real under the CPU allocator's eye (:func:`measure_accumulated_step_memory`).

Each micro-step reads the same input tensors (one micro-batch's memory, as a loop that loads each
micro-batch in place of the last holds). The timeline's phases repeat: ``forward``, ``backward``
once per micro-step, then ``optimizer step`` and ``zero_grad``.

>>> import torch
>>> model = torch.nn.Linear(4, 2)
>>> sgd = lambda parameters: torch.optim.SGD(parameters, lr=0.1)
>>> timeline = measure_accumulated_step_memory(model, torch.ones(3, 4), lambda m, x: m(x).sum(), sgd, micro_batches=2)
>>> timeline.phases.count("forward") > 1, timeline.start_bytes       # weight 32 + bias 8 + input 48
(True, 88)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.measurement.memory_timeline import STEP_PHASES, LossFn, MakeOptimizer, MemoryTimeline, phase_ranges, record_step_events

__all__ = ["run_accumulated_step", "measure_accumulated_step_memory", "check_micro_batches"]


def check_micro_batches(micro_batches: object) -> int:
    """``micro_batches`` as a whole number ≥ 1, else one line naming what is allowed."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ResacctError(f"gradient accumulation micro-batches {micro_batches!r}: expected a whole number ≥ 1")
    return micro_batches


def run_accumulated_step(model: nn.Module, inputs: Any, loss_fn: LossFn, optimizer: torch.optim.Optimizer, micro_batches: int,
                         mark: Callable[[str], None] = lambda phase: None) -> None:
    """``micro_batches`` forward/backward micro-steps on ``inputs`` (the loss divided by their
    number, as an accumulating loop does), then the optimizer step and ``zero_grad``; ``mark(phase)``
    as each phase begins and ``mark("end")`` after the last."""
    for _ in range(micro_batches):
        mark("forward")
        loss = loss_fn(model, inputs) / micro_batches
        mark("backward")
        loss.backward()
        del loss
    mark("optimizer step")
    optimizer.step()
    mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    mark("end")


def measure_accumulated_step_memory(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: MakeOptimizer, *,
                                    micro_batches: int) -> MemoryTimeline:
    """The CPU allocator's timeline (``torch.profiler``, ``profile_memory=True``) of one steady
    accumulated step of a copy of ``model`` (its optimizer state made beforehand), as
    :func:`resacct.measurement.memory_timeline.measure_step_memory` measures a plain step."""
    check_micro_batches(micro_batches)
    events = record_step_events(model, inputs, make_optimizer,
                                lambda work, work_inputs, step, mark: run_accumulated_step(work, work_inputs, loss_fn, step, micro_batches, mark))
    return _timeline_of(events, micro_batches)


def _timeline_of(events: Any, micro_batches: int) -> MemoryTimeline:
    """The running sum of the allocator's events, each placed in the phase range containing it."""
    memory = sorted((e for e in events if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU), key=lambda e: e.start_ns())
    ranges = phase_ranges(events)
    expected = ["forward", "backward"] * micro_batches + list(STEP_PHASES[2:])
    if [name for _, _, name in ranges] != expected:
        raise ResacctError(f"the profiler recorded the phases {[name for _, _, name in ranges]}; expected {expected}")
    held, start, phases, values, current = 0, None, [], [], -1
    for event in memory:
        inside = [index for index, (begin, end, _) in enumerate(ranges) if begin <= event.start_ns() <= end]
        if inside and start is None:
            start = held
        if inside and inside[0] != current:  # what the phase starts with
            current = inside[0]
            phases.append(ranges[current][2])
            values.append(held)
        held += event.nbytes()
        if inside:
            phases.append(ranges[inside[0]][2])
            values.append(held)
    if start is None:
        raise ResacctError("torch.profiler recorded no CPU allocation during the step; expected some (is this a CPU run?)")
    peak = max(values)
    return MemoryTimeline(phases=tuple(phases), bytes_held=tuple(values), start_bytes=start, peak_bytes=peak,
                          peak_phase=phases[values.index(peak)], source=f"CPU allocator (torch.profiler, profile_memory=True), {micro_batches} micro-batches")
