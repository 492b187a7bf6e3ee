"""resacct.measurement.fake_group_broadcast: the stand-in for a meta broadcast under the fake process group (torch <= 2.10
has no Meta kernel for ``c10d::broadcast_``). In this process, which joins no process group: ``force`` skips the probe."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from resacct.measurement.fake_group_broadcast import meta_broadcasts_as_the_fake_group_does


def test_a_meta_broadcast_returns_as_the_fake_group_does_and_anything_else_goes_to_torch() -> None:
    torchs = dist.broadcast
    meta = torch.empty(3, 5, device="meta")
    with meta_broadcasts_as_the_fake_group_does(force=True) as stood_in:
        assert stood_in and dist.broadcast is not torchs
        assert dist.broadcast(meta, src=0) is None
        work = dist.broadcast(tensor=meta, src=1, group=None, async_op=True)
        assert work.wait() is True and work.is_completed()
        assert meta.shape == (3, 5) and meta.is_meta
        with pytest.raises((ValueError, RuntimeError), match="process group"):  # a real tensor: torch's broadcast, no group here
            dist.broadcast(torch.zeros(2), src=0)
    assert dist.broadcast is torchs


def test_torchs_broadcast_is_put_back_when_the_block_raises() -> None:
    torchs = dist.broadcast
    with pytest.raises(KeyError), meta_broadcasts_as_the_fake_group_does(force=True):
        raise KeyError("inside")
    assert dist.broadcast is torchs
