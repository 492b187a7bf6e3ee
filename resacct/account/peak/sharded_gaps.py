"""What this torch's sharded engines cannot be traced for, per engine (:mod:`resacct.account.peak.sharded`): a line
saying why, or None. The checks skip with it (:mod:`resacct.checks.peak_sharded`) and ``resacct shard`` refuses with it."""

from __future__ import annotations

import torch

__all__ = ["engine_gap", "named_collectives_gap"]


def named_collectives_gap() -> str | None:
    """Why this torch's FSDP2 cannot be traced by the sharded peak, or None: it names the buffers of FSDP2's
    ``dist.all_gather_single`` / ``dist.reduce_scatter_single``, which FSDP2 calls from torch 2.13 (2.12.1 and older do not)."""
    import torch.distributed as dist

    if hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single"):
        return None
    return (f"torch {torch.__version__}'s FSDP2 does not call dist.all_gather_single / reduce_scatter_single, whose buffers "
            "resacct's sharded peak names; expected torch 2.13 or later")


def engine_gap(engine: str) -> str | None:
    """Why this torch's ``engine`` step cannot be traced by the sharded peak, or None. Every engine but ZeRO-1 is FSDP's
    ``fully_shard`` (:data:`~resacct.account.peak.sharded.FSDP_OPTIONS`): :func:`named_collectives_gap`. ZeRO-1 (DDP +
    ZeroRedundancyOptimizer) calls neither of those collectives, but both broadcast, and before torch 2.11 the fake process
    group cannot broadcast fake tensors (``c10d::broadcast_`` has no Meta kernel: measured on 2.9.1 and 2.10; 2.6's DDP
    has no ``init_sync`` either); 2.11 and 2.12.1 trace it exactly (measured 2026-11-30)."""
    if engine != "zero1":
        return named_collectives_gap()
    if torch.torch_version.TorchVersion(torch.__version__) >= (2, 11):
        return None
    return (f"torch {torch.__version__}'s fake process group cannot broadcast fake tensors (c10d::broadcast_ has no Meta kernel), "
            f"which {engine}'s DDP and ZeroRedundancyOptimizer call; expected torch 2.11 or later")
