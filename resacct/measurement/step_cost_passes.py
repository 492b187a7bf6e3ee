"""Costs of a training step that no single op shows, measured or derived over the whole step:

- **the optimizer's own cost per op** — ``optimizer.step()`` on a CPU wraps each of its kernels in
  Python (step counters, bias corrections, ``.item()``); a one-element add does not show it. It is
  measured on a stand-in of the same optimizer whose parameters have one element each: the same
  ops, no work (:func:`optimizer_op_overhead_sec`);
- **pages the kernel hands out** — a tensor allocated where the allocator has no free memory
  (glibc returns large freed blocks to the system) costs a page fault on the first write to each
  of its 4 KiB pages: :func:`minor_page_faults` counts them for this thread, while each op runs;
  :func:`page_fault_sec` measures one (a write to each page of a fresh anonymous mapping);
- **where an op's operands come from** — an op's tensors may each fit in the last-level cache and
  still come from DRAM, when the step touched more than the cache since they were last used (an
  optimizer walks all parameters, gradients and moments once a step). :func:`reuse_distances_bytes`
  gives, for every tensor an op touches, the bytes touched since that tensor was last touched —
  over the step taken as a cycle, since a step repeats.

Used by :mod:`resacct.measurement.runtime_model`; these functions know nothing of its cost model.

>>> reuse_distances_bytes([[(1, 100)], [(2, 50)], [(1, 100)]])
[[0.0], [200.0], [50.0]]
"""

from __future__ import annotations

import mmap
import resource
import statistics
from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "optimizer_op_overhead_sec", "reuse_distances_bytes", "minor_page_faults", "page_fault_sec"]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return func(*args, **(kwargs or {}))


def optimizer_op_overhead_sec(optimizer: torch.optim.Optimizer, clock: Callable[[], float], *, repeats: int = 7) -> float:
    """Seconds per op of ``optimizer.step()`` run by a stand-in of the same class and settings
    whose parameters have one element each (same count, dtypes and groups): the optimizer's own
    Python, its scalar bookkeeping and the dispatch of every op, with no work — the median of
    ``repeats`` steps on ``clock`` ÷ the ops one step dispatches. 0.0 when the class cannot be
    rebuilt from its parameter groups."""
    groups = [{**{key: value for key, value in group.items() if key != "params"},
               "params": [torch.zeros(1, dtype=param.dtype, requires_grad=True) for param in group["params"]]}
              for group in optimizer.param_groups]
    try:
        stand_in = type(optimizer)(groups)
    except (TypeError, ValueError):
        return 0.0
    for group in stand_in.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    stand_in.step()  # state
    with OpCounter() as counter:
        stand_in.step()
    seconds = []
    for _ in range(repeats):
        began = clock()
        stand_in.step()
        seconds.append(clock() - began)
    return statistics.median(seconds) / max(counter.calls, 1)


def reuse_distances_bytes(accesses: Sequence[Sequence[tuple[int, int]]]) -> list[list[float]]:
    """For each op's accesses ``(storage key, bytes)``, the bytes the step touched between this
    access and the previous one to the same storage (every access counted, an upper bound on the
    distinct bytes an LRU cache would hold). The step is a cycle: a storage's first access in the
    step counts from its last access, one step earlier; a storage touched once counts a whole step."""
    last_at: dict[int, float] = {}
    position = 0.0
    for op in accesses:  # first lap: where each storage was last touched
        for key, size in op:
            position += size
            last_at[key] = position
    step_bytes = position
    last_at = {key: at - step_bytes for key, at in last_at.items()}
    distances: list[list[float]] = []
    position = 0.0
    for op in accesses:
        row = []
        for key, size in op:
            row.append(position - last_at[key])
            position += size
            last_at[key] = position
        distances.append(row)
    return distances


def minor_page_faults() -> int:
    """Minor page faults of this thread so far (Linux ``getrusage(RUSAGE_THREAD)``; the process's
    count where there is no per-thread one)."""
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    return resource.getrusage(who).ru_minflt


def page_fault_sec(clock: Callable[[], float], *, pages: int = 2048, repeats: int = 7) -> float:
    """Seconds of one minor page fault: one byte written to each 4 KiB page of a fresh anonymous
    mapping (the kernel maps and zeroes a page per write), the median of ``repeats`` mappings."""
    seconds = []
    for _ in range(repeats):
        mapping = mmap.mmap(-1, pages * mmap.PAGESIZE)
        view = torch.frombuffer(mapping, dtype=torch.uint8)
        began = clock()
        view[:: mmap.PAGESIZE].fill_(1)
        seconds.append((clock() - began) / pages)
        del view
        mapping.close()
    return statistics.median(seconds)
