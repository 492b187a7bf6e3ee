"""Run a small program on N gloo ranks of this machine, safely: loopback only, never hanging.

resacct measures sharded training (ZeRO, FSDP) on the real ``torch.distributed`` engine.
:func:`run_on_ranks` starts ``world_size`` processes, joins them into one gloo process group,
runs ``program(rank, world_size, *args)`` on each and returns what every rank returned::

    >>> run_on_ranks(all_reduce_rank_sum, 2)   # doctest: +SKIP
    [1.0, 1.0]

What keeps it safe:

* **No ports to choose.** Ranks meet through a ``FileStore`` in a fresh temporary folder;
  gloo's own connections bind ephemeral ports on the loopback interface only
  (``GLOO_SOCKET_IFNAME`` is set to it). Nothing listens on another interface.
* **Timeouts everywhere.** Every collective gets ``init_process_group(timeout=...)``; the
  launcher waits at most ``timeout_seconds`` for all ranks, then kills the stragglers and
  raises :class:`DistributedTimeoutError`.
* **Failures surface at once.** A rank that raises sends its traceback; the launcher kills
  the others (they would wait in a collective) and raises :class:`DistributedRankError`.
* **Cleanup.** Each rank destroys its process group in ``finally``; the launcher joins or
  kills every child and removes the store folder, whatever happened. A launcher killed outright
  (SIGTERM, SIGKILL) takes its ranks and folders with it (:mod:`resacct.measurement.lifeline`).
* **Interrupts.** Ranks ignore SIGINT: Ctrl-C reaches the launcher (``KeyboardInterrupt``),
  which kills them; a rank that reports a ``KeyboardInterrupt`` is raised as one too.
* **Errors shown.** What a rank writes (stdout and stderr, C code's too) is relayed to the
  launcher's stderr as it comes; a rank that dies without answering is reported with its exit
  code and its last lines, one that dies before resacct's code runs in it with the likely cause.
* The calling process never creates a process group (a pytest process stays clean).

Children are forked from a ``forkserver`` that imported torch once (``spawn`` where the
platform has no forkserver), so a launch costs a fraction of a second after the first.
``program`` must be a module-level function whose arguments and result can be pickled.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from resacct.measurement.lifeline import (
    STORE_PREFIX,
    OutputRelay,
    capture_output,
    install_forkserver_excepthook,
    launcher_temp_dir,
    lifeline_reader,
    rank_process_name,
    remove_stale_folders,
    start_forkserver_deaf_to_ctrl_c,
    stop_forkserver,
    watch_launcher,
)
from resacct.measurement.rank_errors import (
    DistributedError,
    DistributedRankError,
    DistributedTimeoutError,
    DistributedUnavailableError,
    died_without_answering,
    raised,
    rank_failure,
    refuse_reentered_main,
)

__all__ = [
    "DistributedError",
    "DistributedUnavailableError",
    "DistributedRankError",
    "DistributedTimeoutError",
    "MAX_LOCAL_WORLD_SIZE",
    "run_on_ranks",
    "run_isolated",
    "gloo_process_group",
    "loopback_interface",
    "all_reduce_rank_sum",
    "raise_on_rank",
    "sleep_on_rank",
]

#: More local ranks than this is refused: each is a process importing torch.
MAX_LOCAL_WORLD_SIZE = 16
#: Modules the forkserver imports once, so that each rank starts warm.
_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torch.nn.parallel", "torch.distributed", "torch.distributed.optim",
            "torch.distributed.fsdp", "resacct.measurement.distributed"]
install_forkserver_excepthook()  # does something only in the forkserver, which preloads this module
_GRACE_SECONDS = 5.0
_ERROR_GATHER_SECONDS = 1.0
_RELAY_EVERY_SECONDS = 0.25


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


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_LOCAL_WORLD_SIZE:
        raise DistributedError(f"world_size {world_size!r}: expected a whole number from 1 to {MAX_LOCAL_WORLD_SIZE} local ranks")


def _check_seconds(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DistributedError(f"{name} {value!r}: expected a finite number of seconds greater than 0")


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)  # only effective before the server first starts
        start_forkserver_deaf_to_ctrl_c()
        return context
    return multiprocessing.get_context("spawn")


def _rank_main(payload: bytes, rank: int, world_size: int, folder: str, join_group: bool, collective_timeout_seconds: float,
               interface: str, connection: multiprocessing.connection.Connection, lifeline: multiprocessing.connection.Connection,
               launcher_folders: tuple[str, ...]) -> None:
    """What each child runs: watch the launcher's lifeline, send its output to the run's folder,
    unpickle ``payload`` (the program and its arguments: an import that fails here is reported like
    any error), join the group (when ``join_group``), run the program, send ("ok", result) or
    ("error", traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle: it kills the ranks
    if hasattr(signal, "pthread_sigmask"):  # the forkserver's blocked SIGINT (lifeline.start_forkserver_deaf_to_ctrl_c) is not the program's
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    watch_launcher(lifeline, (folder, *launcher_folders))
    if not os.path.isdir(folder):  # the launcher gave this run up (Ctrl-C, its time limit) before this rank started
        os._exit(1)
    capture_output(os.path.join(folder, f"rank-{rank}.out"))
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        program, args = pickle.loads(payload)
        import torch

        torch.set_num_threads(1)
        store_path = os.path.join(folder, "store") if join_group else None
        if store_path is None:
            result = program(*args)
        else:
            with gloo_process_group(rank, world_size, store_path, collective_timeout_seconds):
                result = program(rank, world_size, *args)
        connection.send(("ok", result))
    except BaseException:  # noqa: BLE001 - everything goes back to the launcher
        with contextlib.suppress(Exception):
            connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()


def _stop(processes: Sequence[multiprocessing.process.BaseProcess], grace_seconds: float) -> None:
    """Join every started child within ``grace_seconds`` in all; kill and reap the ones still running."""
    started = [process for process in processes if process.pid is not None]
    deadline = time.monotonic() + grace_seconds
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in started:
        if process.is_alive():
            process.kill()
    for process in started:
        process.join(_GRACE_SECONDS)


def _collect(connections: dict[multiprocessing.connection.Connection, int], processes: Sequence[multiprocessing.process.BaseProcess],
             timeout_seconds: float, program_name: str, relay: OutputRelay) -> list[Any]:
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout_seconds
    pending = dict(connections)
    while pending:
        relay.pump()
        remaining = deadline - time.monotonic()
        ready = multiprocessing.connection.wait(list(pending), timeout=min(remaining, _RELAY_EVERY_SECONDS)) if remaining > 0 else []
        if not ready and time.monotonic() < deadline:
            continue
        if not ready:
            if errors:
                break
            missing = sorted(pending.values())
            returned = f" (ranks {sorted(results)} had returned)" if results else ""
            raise DistributedTimeoutError(
                f"{program_name} on {len(processes)} ranks: ranks {missing} did not finish within {timeout_seconds:g} s; "
                f"they were killed{returned}"
            )
        for connection in ready:
            rank = pending.pop(connection)
            try:
                status, payload = connection.recv()
            except EOFError:
                status, payload = "died", died_without_answering(processes[rank], relay, rank)
            if status in ("error", "died"):
                if not errors:  # give the other ranks a moment to report, to find who failed first-hand
                    deadline = min(deadline, time.monotonic() + _ERROR_GATHER_SECONDS)
                errors[rank] = raised(payload) if status == "error" else payload
            else:
                results[rank] = payload
    if errors:
        raise rank_failure(errors, program_name)
    return [results[rank] for rank in range(len(processes))]


def run_on_ranks(program: Callable[..., Any], world_size: int, *args: Any, timeout_seconds: float = 60.0,
                 collective_timeout_seconds: float = 20.0) -> list[Any]:
    """Run ``program(rank, world_size, *args)`` on ``world_size`` local gloo ranks; return the
    results in rank order.

    Raises :class:`DistributedTimeoutError` when the ranks do not all finish within
    ``timeout_seconds`` (each collective alone times out after ``collective_timeout_seconds``),
    :class:`DistributedRankError` when a rank raises or dies; in every case all children are
    stopped before this returns.

    >>> run_on_ranks(all_reduce_rank_sum, 4)   # doctest: +SKIP
    [6.0, 6.0, 6.0, 6.0]
    """
    _check_world_size(world_size)
    _check_seconds(collective_timeout_seconds, "collective_timeout_seconds")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        raise DistributedUnavailableError("this torch build has no torch.distributed with the gloo backend")
    return _launch(program, args, world_size, timeout_seconds, collective_timeout_seconds, join_group=True)


def run_isolated(program: Callable[..., Any], *args: Any, timeout_seconds: float = 60.0) -> Any:
    """Run ``program(*args)`` in one child process (no process group is joined for it) and
    return its result; killed after ``timeout_seconds``. For programs that set up their own
    process-wide state, such as a fake process group, which must not touch the caller.

    >>> run_isolated(math.factorial, 5)   # doctest: +SKIP
    120
    """
    return _launch(program, args, 1, timeout_seconds, 1.0, join_group=False)[0]


def _launch(program: Callable[..., Any], args: tuple[Any, ...], world_size: int, timeout_seconds: float,
            collective_timeout_seconds: float, *, join_group: bool) -> list[Any]:
    _check_seconds(timeout_seconds, "timeout_seconds")
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        refuse_reentered_main()
    interface = loopback_interface()
    context = _context()
    name = getattr(program, "__qualname__", repr(program))
    payload = pickle.dumps((program, args))  # unpickled in the child, where a failing import is reported as the rank's error
    processes: list[multiprocessing.process.BaseProcess] = []
    connections: dict[multiprocessing.connection.Connection, int] = {}
    finished = False
    remove_stale_folders()
    with tempfile.TemporaryDirectory(prefix=f"{STORE_PREFIX}{os.getpid()}-") as folder:
        relay = OutputRelay([os.path.join(folder, f"rank-{rank}.out") for rank in range(world_size)], sys.stderr)
        try:
            lifeline = lifeline_reader(context)
            launcher_folders = (launcher_temp_dir(),)
            for rank in range(world_size):
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main,
                    args=(payload, rank, world_size, folder, join_group, collective_timeout_seconds, interface, sender, lifeline,
                          launcher_folders),
                    name=rank_process_name(rank, folder),
                    daemon=True,
                )
                processes.append(process)
                process.start()
                sender.close()
                connections[receiver] = rank
            results = _collect(connections, processes, timeout_seconds, name, relay)
            finished = True
            return results
        except BaseException as error:
            if not isinstance(error, Exception):  # Ctrl-C, a time limit: the process is ending
                stop_forkserver()
            raise
        finally:
            # After success the ranks are exiting: give them a moment. After a failure the
            # others may wait in a collective: kill them now.
            _stop(processes, _GRACE_SECONDS if finished else 0.0)
            relay.pump()
            for connection in connections:
                connection.close()


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


def sleep_on_rank(rank: int, world_size: int, sleeping_rank: int, seconds: float) -> int:
    """``sleeping_rank`` sleeps ``seconds`` (a stuck rank); the others wait for it in a barrier."""
    import torch.distributed as dist

    if rank == sleeping_rank:
        time.sleep(seconds)
    dist.barrier()
    return rank
