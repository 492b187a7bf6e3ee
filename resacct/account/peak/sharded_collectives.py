"""The collectives of a sharded step with their buffers named for the sharded peak's tracker, and, where this torch's fake
process group cannot run a collective on fake tensors, that collective returning as the fake group's does.

FSDP2 gathers with ``dist.all_gather_single`` and reduce-scatters with ``dist.reduce_scatter_single`` from torch 2.13, with
``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor`` before (the same arguments and the same gloo kernels:
:func:`~resacct.account.peak.sharded_gaps.fsdp_collective_names`). :func:`collectives_named` names their buffers, and what
gloo allocates inside them (:mod:`resacct.account.peak.sharded`'s module docstring).

Under the fake process group, torch 2.11 and later run a collective on fake tensors and return at once, leaving every tensor
as it was. torch 2.10 and older stop in FakeTensorMode instead (``UnsupportedOperatorException: c10d._allgather_base_``,
``c10d.broadcast_``: no fake kernel; measured 2026-11-30 on 2.7.1, 2.8.0, 2.9.1 and 2.10.0). There the call returns as it
does on 2.11 — nothing written, a finished work for ``async_op`` — so FSDP2's and ZeroRedundancyOptimizer's own tensors, and
the bytes each rank holds, are the engines' as on any torch (on 2.13, a step with every fake collective stood in for has
the same peaks as torch's own: tests/test_peak_sharded.py).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from jaxtyping import Shaped

from resacct.account.peak import sharded_gaps
from resacct.account.peak.tracker import LiveStorageTracker
from resacct.errors import ResacctError
from resacct.measurement.fake_group_broadcast import FinishedWork

__all__ = ["BACKEND_KIND", "collectives_named", "gloo_divides_for_avg"]

#: The kind (:data:`resacct.account.peak.sharded.KINDS`) of what gloo and DDP's reducer allocate inside their C++.
BACKEND_KIND = "backend buffers (gloo, DDP reducer)"


def gloo_divides_for_avg() -> bool:
    """Whether gloo's reduce-scatter divides its clone by the world size for ``ReduceOp.AVG`` (a wrapped 8-byte divisor and
    its copy in the tensor's dtype): from torch 2.9. torch 2.7.1 and 2.8.0 sum instead (measured 2026-11-30: their allocators
    peak 12 bytes under 2.9.1's on the 2-rank FSDP2 steps of resacct/specs/peak_sharded.claims.yaml, and FSDP2's gradients
    come out world-size times too large: sharding.claims.yaml's ``fsdp2-trains-like-one-process-*``)."""
    return torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)


class _FakeCollectives:
    """Calls a collective on ``tensor`` (and the rest of its arguments); where torch cannot run it on fake tensors (or
    ``always``), returns as the fake group's does: None, or a finished work for ``async_op=True``."""

    def __init__(self, always: bool) -> None:
        self.standing_in = always

    def __call__(self, collective: Callable[..., Any], tensor: Shaped[torch.Tensor, "..."], *args: Any, **kwargs: Any) -> Any:
        return self.run(collective, tensor, *args, **kwargs)[1]

    def run(self, collective: Callable[..., Any], tensor: Shaped[torch.Tensor, "..."], *args: Any, **kwargs: Any) -> tuple[str, Any]:
        """(how: ``"torch"`` ran it, ``"stopped"`` — torch ran it up to its collective op, which raised — or ``"skipped"``;
        what the call returned)."""
        from torch._subclasses.fake_tensor import UnsupportedOperatorException, is_fake

        finished = FinishedWork() if kwargs.get("async_op") else None
        if self.standing_in and is_fake(tensor):
            return "skipped", finished
        try:
            return "torch", collective(*args, **kwargs)
        except UnsupportedOperatorException as error:
            if not (is_fake(tensor) and str(error.args[0] if error.args else "").startswith("c10d.")):
                raise
            self.standing_in = True  # torch <= 2.10: no fake kernel for c10d's collectives (the op never ran)
            return "stopped", finished


def _coalesced_around_the_broadcast(tensors: list[torch.Tensor], buffer_size_bytes: int) -> None:
    """What ``dist._broadcast_coalesced`` (c10d's comm.cpp; DDP's buffers, each forward) does around its broadcasts: the
    tensors in chunks of one dtype up to ``buffer_size_bytes``, each chunk flattened into one buffer (``aten.cat``; one
    tensor: a view) and, two chunks in flight at most, copied back (``aten.copy_``), the buffer then dropped — the ops and
    order of torch 2.13's under the fake group (measured 2026-11-30), less the broadcasts."""
    from torch._utils import _flatten_dense_tensors, _take_tensors, _unflatten_dense_tensors

    def finish(chunk: list[torch.Tensor], flat: torch.Tensor) -> None:
        for tensor, value in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
            tensor.copy_(value)

    in_flight: collections.deque[tuple[list[torch.Tensor], torch.Tensor]] = collections.deque()
    for chunk in _take_tensors(tensors, buffer_size_bytes):
        if len(in_flight) >= 2:
            finish(*in_flight.popleft())
        in_flight.append((chunk, _flatten_dense_tensors(chunk)))
    while in_flight:
        finish(*in_flight.popleft())


@contextlib.contextmanager
def collectives_named(tracker: LiveStorageTracker | None, world_size: int, *, backend: str | None, engine: str,
                      stand_in: bool = False) -> Iterator[None]:
    """FSDP's collectives (all-gather and reduce-scatter, called synchronously) with their buffers named for the tracker,
    and what gloo allocates inside them: all of it for ``backend="allocator"``, what its calling thread allocates through
    the dispatcher for ``"dispatcher"`` (what a tracker over real tensors sees), none for None (real collectives); ZeRO-1's
    broadcasts as they are. On fake tensors a collective this torch cannot run returns as the fake group's does
    (``stand_in``: every one, for the test beside torch's own). No tracker: the collectives as they are."""
    import torch.distributed as dist

    if tracker is None:
        yield
        return
    if (gap := sharded_gaps.engine_gap(engine)) is not None:
        raise ResacctError(gap)
    fake = _FakeCollectives(always=stand_in)
    if engine == "zero1":  # DDP + ZeroRedundancyOptimizer: it broadcasts (the module's buffers each forward, each rank's
        broadcast, coalesced = dist.broadcast, dist._broadcast_coalesced  # parameters after its step) and gathers nothing

        def zero_broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False, **kwargs: Any) -> Any:
            return fake(broadcast, tensor, tensor, src=src, group=group, async_op=async_op, **kwargs)

        def buffers_broadcast(process_group: Any, tensors: list[torch.Tensor], buffer_size: int, *args: Any, **kwargs: Any) -> Any:
            if not tensors:
                return coalesced(process_group, tensors, buffer_size, *args, **kwargs)
            how, returned = fake.run(coalesced, tensors[0], process_group, tensors, buffer_size, *args, **kwargs)
            if how == "skipped":  # the C++ not called: its flat buffer made and dropped here (where it stopped, it made it)
                _coalesced_around_the_broadcast(tensors, buffer_size)
            return returned

        dist.broadcast, dist._broadcast_coalesced = zero_broadcast, buffers_broadcast
        try:
            yield
        finally:
            dist.broadcast, dist._broadcast_coalesced = broadcast, coalesced
        return

    gather_name, scatter_name = sharded_gaps.fsdp_collective_names()
    gather, scatter = getattr(dist, gather_name), getattr(dist, scatter_name)

    def all_gather(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
        tracker.classify([output_tensor], "all-gather buffers")
        if backend == "allocator":  # gloo: a flat output made and freed inside the call, by the caller (not through the dispatcher), then by its worker
            staging = torch.empty_like(output_tensor)
            tracker.classify([staging], BACKEND_KIND)
            del staging
        return fake(gather, output_tensor, output_tensor, input_tensor, group=group, async_op=async_op)

    def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                       async_op: bool = False) -> Any:
        tracker.classify([input], "reduce-scatter buffers")
        tracker.classify([output], "gradient shards")
        staging = None
        if backend is not None:  # gloo: input.clone(), all-reduced, this rank's chunk copied out; AVG divides the clone
            staging = input.clone()
            tracker.classify([staging], BACKEND_KIND)
            if op == dist.ReduceOp.AVG and backend == "allocator" and gloo_divides_for_avg():  # on gloo's worker thread
                staging.div_(world_size)
        work = fake(scatter, output, output=output, input=input, op=op, group=group, async_op=async_op)
        del staging
        return work

    setattr(dist, gather_name, all_gather)
    setattr(dist, scatter_name, reduce_scatter)
    try:
        yield
    finally:
        setattr(dist, gather_name, gather)
        setattr(dist, scatter_name, scatter)
