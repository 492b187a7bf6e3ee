"""The gloo process group a rank of :mod:`resacct.measurement.distributed` joins: kept to the loopback
interface, every collective under a time limit, destroyed without the deadlock of torch < 2.8; and
small programs the ranks run in tests and examples (module-level: pickled by reference)."""

from __future__ import annotations

import contextlib
import datetime
import gc
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from resacct.measurement.rank_errors import DistributedUnavailableError

__all__ = ["loopback_interface", "gloo_process_group", "all_reduce_rank_sum", "raise_on_rank", "sleep_on_rank", "frozen_object_count", "imported", "no_collective", "pid_on_rank"]


def loopback_interface() -> str:
    """The name of this machine's loopback network interface (``lo`` on Linux, ``lo0`` on macOS).

    >>> loopback_interface() in {"lo", "lo0"}   # doctest: +SKIP
    True
    """
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise DistributedUnavailableError(f"no loopback network interface found among {names}; gloo is kept to loopback")


@contextlib.contextmanager
def gloo_process_group(rank: int, world_size: int, store_path: str, collective_timeout_seconds: float) -> Iterator[None]:
    """Join the gloo process group of ``world_size`` ranks meeting at ``store_path`` (a
    ``FileStore``); every collective times out after ``collective_timeout_seconds``. The group
    is destroyed on exit, also when the body raises."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=collective_timeout_seconds)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        # Every rank connected before any program runs: a rank whose program makes no collective could
        # otherwise end (closing its sockets) while a peer still completes gloo's full mesh, whose
        # connectFullMesh then fails "Connection closed by peer" (1 to 3 such launches in 24, 2026-11-28).
        dist.barrier()
        yield
    finally:
        backends = _cpu_backends_of_every_group()
        dist.destroy_process_group()
        _release_without_the_gil(backends)


def _cpu_backends_of_every_group() -> list[Any]:
    """The gloo backend object of every live process group, as Python objects of their own.

    Why: until torch 2.8, ``ProcessGroup``'s Python binding destroys the C++ object with the GIL
    held (pytorch/pytorch#154976 released it from 2.8 on). Dropping a group's last reference then
    runs ``~ProcessGroupGloo``, which joins gloo's worker threads; a worker still freeing a finished
    collective whose tensor's Python object outlived it (``all_reduce_rank_sum``'s ``value``) needs
    the GIL to release that object, and the two wait on each other for ever. This hung one rank of
    ``run_on_ranks(all_reduce_rank_sum, 4)`` in about 1 launch in 4 on torch 2.4.1 (gdb: the main
    thread in ``~ProcessGroupGloo`` → ``thread.join``, the worker in ``~AsyncAllreduceWork`` →
    ``gil_scoped_acquire``). The ``ProcessGroupGloo`` binding itself has released the GIL in its
    destructor since long before 2.4, so holding these objects across ``destroy_process_group``
    and dropping them last makes the join run without the GIL, on every torch version.
    """
    import torch
    import torch.distributed.distributed_c10d as c10d

    backends = []
    for group in list(c10d._world.pg_map):
        with contextlib.suppress(RuntimeError):  # a group with no CPU backend has nothing to join
            backends.append(group._get_backend(torch.device("cpu")))
    return backends


def _release_without_the_gil(backends: list[Any]) -> None:
    """Drop the last references to ``backends`` (see :func:`_cpu_backends_of_every_group`)."""
    while backends:
        backends.pop()


# Small programs for tests and examples (module-level, so they can be pickled by reference).


def all_reduce_rank_sum(rank: int, world_size: int) -> float:
    """Every rank contributes its rank; returns the all-reduced sum, 0 + 1 + … + (N − 1)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    return float(value.item())


def raise_on_rank(rank: int, world_size: int, failing_rank: int) -> int:
    """Raises ValueError on ``failing_rank``; the other ranks wait in a barrier that never completes."""
    import torch.distributed as dist

    if rank == failing_rank:
        raise ValueError(f"rank {rank} fails on purpose")
    dist.barrier()
    return rank


def no_collective(rank: int, world_size: int) -> int:
    """Returns ``rank`` at once, without a collective of its own."""
    return rank


def pid_on_rank(rank: int, world_size: int, tag: str) -> tuple[str, int, int]:
    """(``tag``, rank, this process's id): which process ran a program."""
    import os

    return tag, rank, os.getpid()


def frozen_object_count() -> int:
    """How many objects a child holds frozen out of the garbage collector's reach (``gc.freeze``)."""
    return gc.get_freeze_count()


def imported(names: Sequence[str]) -> list[bool]:
    """Whether each module of ``names`` was imported in this process when it was asked."""
    return [name in sys.modules for name in names]


def sleep_on_rank(rank: int, world_size: int, sleeping_rank: int, seconds: float) -> int:
    """``sleeping_rank`` sleeps ``seconds`` (a stuck rank); the others wait for it in a barrier."""
    import torch.distributed as dist

    if rank == sleeping_rank:
        time.sleep(seconds)
    dist.barrier()
    return rank
