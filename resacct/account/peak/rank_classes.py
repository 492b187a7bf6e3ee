"""Ranks that run the same step, traced once (``resacct shard``).

Under ``fully_shard`` (ZeRO-2, FSDP2, FSDP2 with bf16 compute) each rank holds dim 0 of every
parameter chunked as ``torch.chunk`` chunks it — ⌈d/N⌉ rows, the last ranks fewer or none — and the
inputs are the same on every rank. Ranks whose every parameter keeps the same number of rows run the
same ops on tensors of the same shapes in torch's fake process group, so one of them is traced and its
peak is theirs (llama-2-7b on 8 ranks: every dimension divides by 8 — rank 0 traced for all eight: one
trace instead of eight). The first rank a process traces is no different from the later ones since DTensor's
sharding propagation is left out of the trace (:mod:`resacct.account.peak.dtensor_propagation`; before,
its global-shape tensors made the first traced rank's figures its own).
ZeRO-1 (``ZeroRedundancyOptimizer``) hands out whole tensors by a greedy partition: each rank is its own.
``tests/test_rank_classes.py`` checks a model with uneven rows: each rank traced alone gives what its
class's trace gave. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["SHARDED_BY_ROWS", "local_rows", "representative_ranks", "same_shards_note"]

#: The engines that shard every parameter by rows (resacct.account.peak.sharded.ENGINES, ZeRO-1 aside).
SHARDED_BY_ROWS = ("zero2", "fsdp2", "fsdp2-bf16")


def local_rows(rows: int, world_size: int, rank: int) -> int:
    """The rows of a ``rows``-row parameter that ``rank`` holds (``torch.chunk``: ⌈rows/N⌉ each, the rest to the last).

    >>> [local_rows(10, 4, rank) for rank in range(4)], [local_rows(2, 4, rank) for rank in range(4)]
    ([3, 3, 3, 1], [1, 1, 0, 0])
    """
    chunk = -(-rows // world_size)
    return max(0, min(chunk, rows - rank * chunk))


def representative_ranks(shapes: Iterable[Sequence[int]], engine: str, world_size: int, ranks: Sequence[int]) -> dict[int, int]:
    """For each of ``ranks``, the first of ``ranks`` holding shards of the same shapes (itself where none comes before).

    >>> representative_ranks([(8, 4), (10,)], "fsdp2", 4, [0, 1, 2, 3])
    {0: 0, 1: 0, 2: 0, 3: 3}
    >>> representative_ranks([(8, 4)], "zero1", 4, [0, 1])
    {0: 0, 1: 1}
    """
    if engine not in SHARDED_BY_ROWS:
        return {rank: rank for rank in ranks}
    rows = [shape[0] if len(shape) else 1 for shape in shapes]  # a 0-dim parameter: rank 0 alone holds it
    first: dict[tuple[int, ...], int] = {}
    return {rank: first.setdefault(tuple(local_rows(count, world_size, rank) for count in rows), rank) for rank in ranks}


def same_shards_note(representatives: dict[int, int]) -> str | None:
    """One line naming the ranks traced for others (None: every rank traced)."""
    followers: dict[int, list[int]] = {}
    for rank, representative in representatives.items():
        if rank != representative:
            followers.setdefault(representative, []).append(rank)
    if not followers:
        return None
    parts = [f"rank{'s' * (len(others) > 1)} {', '.join(map(str, others))} as rank {leader}" for leader, others in sorted(followers.items())]
    return ("ranks whose every parameter keeps the same rows run the same step: traced once — " + "; ".join(parts)
            + " (resacct.account.peak.rank_classes)")
