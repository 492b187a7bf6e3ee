"""Broadcasts of meta tensors under torch's fake process group, on every torch that has the group.

The fake process group (``torch.testing._internal.distributed.fake_pg``) communicates nothing: its
collectives return at once and leave every tensor as it was. On meta tensors torch 2.11 and later
run them so; torch 2.10 and older stop earlier, in the dispatcher — ``c10d::broadcast_`` has no Meta
kernel there ("attempted to run this operator with Meta tensors, but there was no fake impl or Meta
kernel registered"; measured 2026-11-30 on 2.10.0; 2.11.0 runs it). ``ZeroRedundancyOptimizer.step``
broadcasts each rank's updated parameters, so the ZeRO paper's 7.5B state on meta tensors
(:mod:`resacct.checks.sharding_runs`) could not be measured there.

:func:`meta_broadcasts_as_the_fake_group_does` probes the group once: where a meta broadcast runs,
torch's own path is kept; where it raises that error, ``torch.distributed.broadcast`` of a meta tensor
within the block returns as the fake group would (nothing written, a finished work for ``async_op``),
and every other call goes to torch. The bytes each rank holds come from torch's engines either way:
on torch 2.13 the block with the broadcast skipped gives the same figures as torch's own path
(tests/test_sharding_distributed.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Shaped

__all__ = ["FinishedWork", "meta_broadcasts_as_the_fake_group_does", "meta_broadcast_runs"]


class FinishedWork:
    """What an ``async_op`` collective of the fake group returns: already done."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def meta_broadcast_runs() -> bool:
    """Whether this torch broadcasts a meta tensor under the process group now initialised (the fake one)."""
    import torch.distributed as dist

    try:
        dist.broadcast(torch.empty(1, device="meta"), src=0)
    except NotImplementedError as error:
        if "Meta" not in str(error):
            raise
        return False
    return True


@contextlib.contextmanager
def meta_broadcasts_as_the_fake_group_does(*, force: bool = False) -> Iterator[bool]:
    """Within the block, a meta tensor's ``torch.distributed.broadcast`` returns as the fake group's does, where this
    torch cannot dispatch it (``force``: skip the probe and do so anyway, for the test beside torch's own path).
    Call it with the fake process group initialised. Yields whether the broadcasts are stood in for."""
    import torch.distributed as dist

    if not force and meta_broadcast_runs():
        yield False
        return
    torchs = dist.broadcast

    def broadcast(tensor: Shaped[torch.Tensor, "..."], src: int | None = None, group: Any = None, async_op: bool = False, **kwargs: Any) -> Any:
        if tensor.is_meta:
            return FinishedWork() if async_op else None
        return torchs(tensor, src=src, group=group, async_op=async_op, **kwargs)

    dist.broadcast = broadcast
    try:
        yield True
    finally:
        dist.broadcast = torchs
