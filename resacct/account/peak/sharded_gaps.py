"""What this torch's sharded engines cannot be traced for, per engine (:mod:`resacct.account.peak.sharded`): a line
saying why, or None. The checks skip with it (:mod:`resacct.checks.peak_sharded`) and ``resacct shard`` refuses with it.

Measured 2026-11-30 (resacct/specs/peak_sharded.claims.yaml, every rank's prediction against its CPU allocator on gloo
ranks): every engine is traced to the byte on torch 2.7.1, 2.8.0, 2.9.1, 2.10, 2.11, 2.12.1, 2.13 and 2.14.1 — FSDP2's
collectives under their pre-2.13 names, and the collectives torch 2.10 and older cannot run on fake tensors stood in for
(:mod:`resacct.account.peak.sharded_collectives`). On torch 2.6 neither runs as traced: its FSDP2 cannot step CPU tensors
(``'Stream' object has no attribute 'record_event'`` on the gloo ranks) and its ``DistributedDataParallel`` has no
``init_sync``.
"""

from __future__ import annotations

import inspect

import torch

__all__ = ["engine_gap", "fsdp_collective_names", "fsdp_gap"]

#: The oldest torch whose FSDP2 steps CPU tensors over gloo ranks (2.6.0 raises "'Stream' object has no attribute
#: 'record_event'" in the step), all of it measured against the prediction to the byte (2.7.1, 2026-11-30).
FSDP_TRACED_FROM = (2, 7)


def fsdp_collective_names() -> tuple[str, str]:
    """The ``torch.distributed`` functions FSDP2 gathers and reduce-scatters with on this torch: ``all_gather_single`` and
    ``reduce_scatter_single`` from torch 2.13, ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` before (the same
    arguments, the same gloo kernels)."""
    import torch.distributed as dist

    if hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single"):
        return "all_gather_single", "reduce_scatter_single"
    return "all_gather_into_tensor", "reduce_scatter_tensor"


def fsdp_gap() -> str | None:
    """Why this torch's FSDP2 (``fully_shard``) step cannot be traced by the sharded peak, or None."""
    if torch.torch_version.TorchVersion(torch.__version__) >= FSDP_TRACED_FROM:
        return None
    return (f"torch {torch.__version__}'s FSDP2 cannot step CPU tensors (its CPU stream has no record_event), which resacct's "
            f"sharded peak traces and measures; expected torch {'.'.join(map(str, FSDP_TRACED_FROM))} or later")


def engine_gap(engine: str) -> str | None:
    """Why this torch's ``engine`` step cannot be traced by the sharded peak, or None. Every engine but ZeRO-1 is FSDP's
    ``fully_shard`` (:data:`~resacct.account.peak.sharded.FSDP_OPTIONS`): :func:`fsdp_gap`. ZeRO-1 builds DDP with
    ``init_sync=False`` (the ranks built the same model: nothing to broadcast at construction), which torch 2.6's
    ``DistributedDataParallel`` lacks."""
    if engine != "zero1":
        return fsdp_gap()
    from torch.nn.parallel import DistributedDataParallel

    if "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return None
    return (f"torch {torch.__version__}'s DistributedDataParallel has no init_sync, which {engine}'s traced step passes "
            "(init_sync=False); expected torch 2.7 or later")
