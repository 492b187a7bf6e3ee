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
  raises :class:`DistributedTimeoutError`. A program made of parts gives each its own limit
  (:func:`part_deadline`, :mod:`resacct.measurement.rank_parts`): a hung part is stopped within it.
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

Children are forked from one ``forkserver`` per process that imported torch and the rank programs'
modules once (:func:`preload_in_ranks`; ``spawn`` where there is none) and freeze what they inherit
(``gc.freeze``: a collection, made before each measured step, scans only what the program made), so
a launch costs a fraction of a second after the first. :func:`started_isolated` runs one child
beside what the caller does meanwhile (a prediction beside the ranks that measure it).
``program`` must be a module-level function whose arguments and result can be pickled.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from resacct.measurement.distributed_group import (  # the small programs: re-exported for tests and examples
    all_reduce_rank_sum,
    frozen_object_count,
    gloo_process_group,
    imported,
    loopback_interface,
    raise_on_rank,
    sleep_on_rank,
)
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
    refuse_reentered_main,
)
from resacct.measurement.rank_parts import DistributedPartTimeoutError, collect, part_deadline, report_parts_to

__all__ = [
    "DistributedError",
    "DistributedUnavailableError",
    "DistributedRankError",
    "DistributedTimeoutError",
    "DistributedPartTimeoutError",
    "MAX_LOCAL_WORLD_SIZE",
    "run_on_ranks",
    "run_isolated",
    "started_isolated",
    "preload_in_ranks",
    "part_deadline",
    "start_forkserver_early",
    "gloo_process_group",
    "loopback_interface",
    "all_reduce_rank_sum",
    "raise_on_rank",
    "sleep_on_rank",
    "frozen_object_count",
    "imported",
]

#: More local ranks than this is refused: each is a process importing torch.
MAX_LOCAL_WORLD_SIZE = 16
#: Modules the forkserver imports once, so that each rank starts warm (and those named by :func:`preload_in_ranks`).
_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torch.nn.parallel", "torch.distributed", "resacct.measurement.quiet_distributed_optim",
            "torch.distributed.fsdp", "torch.profiler", "torch.distributed.tensor.parallel", "resacct.measurement.distributed"]
_preloaded_by_callers: list[str] = []
#: Children freeze what they inherit (``gc.freeze``); benchmarks/launch_cost.py turns it off for the old way beside the new.
FREEZE_INHERITED = True
install_forkserver_excepthook()  # does something only in the forkserver, which preloads this module
_GRACE_SECONDS = 5.0


def preload_in_ranks(*module_names: str) -> None:
    """Have the forkserver import ``module_names`` (a rank program's module, what it imports) before
    it forks the first child, so that no rank pays their import again: call it where the module is
    imported (its own top level). A forkserver already running keeps what it has (each rank then
    imports the rest itself). Only modules that have imported once in this process belong here: a
    module the forkserver cannot import stops every launch."""
    for name in module_names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise DistributedError(f"module name {name!r}: expected a dotted module name such as 'resacct.checks.sharding_runs'")
        if name not in _PRELOAD and name not in _preloaded_by_callers:
            _preloaded_by_callers.append(name)


def start_forkserver_early() -> None:
    """Start the forkserver now without waiting for it: it imports torch and the preloads (seconds)
    beside what this process does before its first launch. It is stopped when this process exits."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        _context()
        atexit.register(stop_forkserver)


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_LOCAL_WORLD_SIZE:
        raise DistributedError(f"world_size {world_size!r}: expected a whole number from 1 to {MAX_LOCAL_WORLD_SIZE} local ranks")


def _check_seconds(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DistributedError(f"{name} {value!r}: expected a finite number of seconds greater than 0")


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*_PRELOAD[:-1], *_preloaded_by_callers, _PRELOAD[-1]])  # effective when the server (re)starts
        launcher_temp_dir()  # its pymp-* folder marked before the server's socket goes in: a launcher killed before any launch leaves none
        start_forkserver_deaf_to_ctrl_c()
        return context
    return multiprocessing.get_context("spawn")


def _rank_main(payload: bytes, rank: int, world_size: int, folder: str, join_group: bool, collective_timeout_seconds: float,
               interface: str, connection: multiprocessing.connection.Connection, lifeline: multiprocessing.connection.Connection,
               launcher_folders: tuple[str, ...], freeze: bool = True) -> None:
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
        if freeze:  # what the child inherited and imported is never garbage: a collection then scans only what the program makes
            gc.freeze()
        report_parts_to(connection)  # a program made of parts gives each its own time limit (rank_parts.part_deadline)
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


def started_isolated(program: Callable[..., Any], *args: Any, timeout_seconds: float = 60.0) -> contextlib.AbstractContextManager[Callable[[], Any]]:
    """Start ``program(*args)`` in one child process now (as :func:`run_isolated`) and run the
    ``with`` block meanwhile; the block gets a function that waits for the result and returns it.
    The time limit counts from the start. Leaving the block stops the child (at once when the block
    raised or never asked for the result).

    >>> with started_isolated(math.factorial, 5) as result:   # doctest: +SKIP
    ...     other = run_on_ranks(all_reduce_rank_sum, 2)      # both run at the same time
    ...     value = result()
    """
    return _Launch(program, args, 1, timeout_seconds, 1.0, join_group=False).single()


def _launch(program: Callable[..., Any], args: tuple[Any, ...], world_size: int, timeout_seconds: float,
            collective_timeout_seconds: float, *, join_group: bool) -> list[Any]:
    with _Launch(program, args, world_size, timeout_seconds, collective_timeout_seconds, join_group=join_group) as launch:
        return launch.results()


class _Launch:
    """``world_size`` children running ``program``, started on entering; :meth:`results` waits for
    them. Leaving stops every child still running (after a failure at once, after success with a
    grace period) and removes the run's folder; a Ctrl-C or a time limit also stops the forkserver."""

    def __init__(self, program: Callable[..., Any], args: tuple[Any, ...], world_size: int, timeout_seconds: float,
                 collective_timeout_seconds: float, *, join_group: bool) -> None:
        _check_seconds(timeout_seconds, "timeout_seconds")
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            refuse_reentered_main()
        self._interface = loopback_interface()
        self._context = _context()
        self._name = getattr(program, "__qualname__", repr(program))
        self._payload = pickle.dumps((program, args))  # unpickled in the child, where a failing import is reported as the rank's error
        self._world_size, self._join_group = world_size, join_group
        self._timeout_seconds, self._collective_timeout_seconds = timeout_seconds, collective_timeout_seconds
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._connections: dict[multiprocessing.connection.Connection, int] = {}
        self._finished = False
        self._started = time.monotonic()

    def __enter__(self) -> _Launch:
        remove_stale_folders()
        self._folder = tempfile.TemporaryDirectory(prefix=f"{STORE_PREFIX}{os.getpid()}-")
        folder = self._folder.name
        self._relay = OutputRelay([os.path.join(folder, f"rank-{rank}.out") for rank in range(self._world_size)], sys.stderr)
        try:
            lifeline = lifeline_reader(self._context)
            launcher_folders = (launcher_temp_dir(),)
            self._started = time.monotonic()
            for rank in range(self._world_size):
                receiver, sender = self._context.Pipe(duplex=False)
                process = self._context.Process(
                    target=_rank_main,
                    args=(self._payload, rank, self._world_size, folder, self._join_group, self._collective_timeout_seconds,
                          self._interface, sender, lifeline, launcher_folders, FREEZE_INHERITED),
                    name=rank_process_name(rank, folder),
                    daemon=True,
                )
                self._processes.append(process)
                process.start()
                sender.close()
                self._connections[receiver] = rank
        except BaseException as error:
            self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def results(self) -> list[Any]:
        results = collect(self._connections, self._processes, self._timeout_seconds, self._name, self._relay, self._started)
        self._finished = True
        return results

    @contextlib.contextmanager
    def single(self) -> Iterator[Callable[[], Any]]:
        with self as launch:
            yield lambda: launch.results()[0]

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        try:
            if error is not None and not isinstance(error, Exception):  # Ctrl-C, a time limit: the process is ending
                stop_forkserver()
        finally:
            try:
                # After success the ranks are exiting: give them a moment. After a failure the
                # others may wait in a collective: kill them now.
                _stop(self._processes, _GRACE_SECONDS if self._finished else 0.0)
                self._relay.pump()
                for connection in self._connections:
                    connection.close()
            finally:
                self._folder.cleanup()
