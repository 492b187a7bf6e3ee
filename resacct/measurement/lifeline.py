"""Child processes that never outlive their launcher, and temporary folders that never outlive a run.

:mod:`resacct.measurement.distributed` starts its ranks from multiprocessing's ``forkserver``. A rank
is the forkserver's child, not the launcher's, and it holds the forkserver's own lifeline (every
forkserver child inherits it), so neither ``PR_SET_PDEATHSIG`` (the forkserver outlives the
launcher as long as a rank does) nor the forkserver notices the launcher's death: before this
module, a SIGTERM or SIGKILL to ``resacct shard`` left the rank asleep for ever under init, and its
``pymp-*`` and ``resacct-store-*`` folders in the temporary directory.

* **The lifeline.** Each launcher process owns one pipe whose write end it alone holds and never
  closes (:func:`lifeline_reader`); each rank gets the read end. Nothing is ever written to it, so
  the rank's watcher thread (:func:`watch_launcher`) wakes exactly when the kernel closes the write
  end: the launcher has gone, whatever killed it. The watcher then removes the run's folders (the
  rank's store folder and the launcher's ``pymp-*`` folder) and ends the rank at once
  (``os._exit``). It waits in ``os.read`` without Python's GIL: a rank sleeping, looping in Python
  or inside a torch op (torch releases the GIL) is ended within milliseconds; only C code that
  holds the GIL for ever would keep it. ``PR_SET_PDEATHSIG`` is not used: under the forkserver it
  never fires first, and under ``spawn`` its SIGKILL would race the watcher's clean-up.
* **Stale folders.** Folders are named after their launcher's PID (``resacct-store-<pid>-…``; a
  ``pymp-*`` folder gets a ``resacct-launcher-<pid>`` marker file); each launch removes those of this
  user whose launcher is no longer alive (:func:`remove_stale_folders`) — the rare run killed when
  no rank was alive to clean up (SIGKILL while the forkserver started).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Sequence
from typing import Any

__all__ = ["STORE_PREFIX", "lifeline_reader", "launcher_temp_dir", "watch_launcher", "remove_stale_folders", "launcher_alive",
           "capture_output", "OutputRelay", "start_forkserver_deaf_to_ctrl_c", "stop_forkserver", "forkserver_pid",
           "rank_process_name", "install_forkserver_excepthook"]

#: The prefix of a run's folder (its FileStore, its ranks' stderr): ``resacct-store-<launcher pid>-<random>``.
STORE_PREFIX = "resacct-store-"
_MARKER_PREFIX = "resacct-launcher-"
_lifeline: dict[int, tuple[Any, Any]] = {}  # launcher pid → (reader, writer): one per process, rebuilt after a fork


def lifeline_reader(context: multiprocessing.context.BaseContext) -> multiprocessing.connection.Connection:
    """The read end of this process's lifeline, to pass to each child (see the module's docstring).
    The write end is kept here for the life of the process and never written to."""
    pid = os.getpid()
    if pid not in _lifeline:
        _lifeline.clear()  # a forked copy of a launcher gets a lifeline of its own
        _lifeline[pid] = context.Pipe(duplex=False)
    return _lifeline[pid][0]


def launcher_temp_dir() -> str:
    """multiprocessing's temporary folder of this process (``pymp-*``: the forkserver's socket lives
    there), marked with this process's PID so a later run can tell when it is stale."""
    folder = multiprocessing.util.get_temp_dir()
    marker = os.path.join(folder, f"{_MARKER_PREFIX}{os.getpid()}")
    if not os.path.exists(marker):
        with contextlib.suppress(OSError):
            open(marker, "x").close()
    return folder


def watch_launcher(lifeline: multiprocessing.connection.Connection, folders: Sequence[str]) -> threading.Thread:
    """In a child: a daemon thread that waits on ``lifeline`` and, when the launcher has gone,
    removes ``folders`` and ends this process with status 1."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline.fileno(), 1):  # nothing is ever written: this returns b"" at the launcher's death
                pass
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    thread = threading.Thread(target=watch, name="resacct-lifeline", daemon=True)
    thread.start()
    return thread


def launcher_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(path: str, name: str) -> int | None:
    """The launcher PID a folder of the temporary directory names, or None when it is not resacct's."""
    if name.startswith(STORE_PREFIX):
        digits = name[len(STORE_PREFIX):].split("-", 1)[0]
        return int(digits) if digits.isdigit() else None
    if name.startswith("pymp-"):
        with contextlib.suppress(OSError):
            for inner in os.listdir(path):
                digits = inner[len(_MARKER_PREFIX):]
                if inner.startswith(_MARKER_PREFIX) and digits.isdigit():
                    return int(digits)
    return None


def remove_stale_folders(directory: str | None = None) -> list[str]:
    """Remove this user's resacct folders in ``directory`` (default: the temporary directory) whose
    launcher is no longer alive; return their paths. Folders of live launchers, of other users and
    of other programs are never touched."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith((STORE_PREFIX, "pymp-")):
            continue
        with contextlib.suppress(OSError):
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            pid = _owner_pid(entry.path, entry.name)
            if pid is not None and pid != os.getpid() and not launcher_alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


# ── what a child writes: captured to a file in the run's folder, relayed by the launcher ──


def capture_output(path: str) -> None:
    """In a child: send its stdout and stderr (file descriptors 1 and 2, so C code's writes too) to
    ``path``; the launcher relays it to its own stderr (:class:`OutputRelay`) — a child never writes
    on the launcher's stdout (``--json`` stays clean), and a child that dies without answering
    leaves its last lines for the error message."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream in (1, 2):
        os.dup2(fd, stream)
    os.close(fd)


class OutputRelay:
    """In the launcher: copies what each child wrote to its capture file (:func:`capture_output`) to
    ``stream`` as it comes (:meth:`pump`), and keeps each child's last bytes for :meth:`tail`."""

    TAIL_BYTES = 8192

    def __init__(self, paths: Sequence[str], stream: Any) -> None:
        self._paths = list(paths)
        self._offsets = [0] * len(self._paths)
        self._tails = [b""] * len(self._paths)
        self._stream = stream

    def pump(self) -> None:
        for index, path in enumerate(self._paths):
            try:
                with open(path, "rb") as file:
                    file.seek(self._offsets[index])
                    data = file.read()
            except OSError:  # not created yet (the child has not started), or the folder is gone
                continue
            if not data:
                continue
            self._offsets[index] += len(data)
            self._tails[index] = (self._tails[index] + data)[-self.TAIL_BYTES:]
            with contextlib.suppress(OSError, ValueError):
                self._stream.write(data.decode("utf-8", errors="replace"))
                self._stream.flush()

    def started(self, index: int) -> bool:
        """Whether child ``index`` reached resacct's code (it created its capture file)."""
        return os.path.exists(self._paths[index])

    def tail(self, index: int, lines: int = 12) -> list[str]:
        """The last ``lines`` non-empty lines child ``index`` wrote."""
        text = self._tails[index].decode("utf-8", errors="replace")
        return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


# ── the forkserver: deaf to Ctrl-C while it starts, stopped with an interrupted launcher ──


def start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the forkserver (if it is not running) with SIGINT blocked, as multiprocessing starts its
    resource tracker: otherwise Ctrl-C during its import of torch (seconds) printed the forkserver's
    KeyboardInterrupt traceback beside ``resacct: interrupted``. A Ctrl-C meanwhile stays pending here
    and is raised once the mask is restored."""
    from multiprocessing import forkserver, resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        with _socket_path_refused():
            forkserver.ensure_running()
        return
    resource_tracker.ensure_running()  # first: starting it unblocks SIGINT (multiprocessing's own block around its start)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _socket_path_refused():
            forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _socket_path_refused() -> Any:
    """The forkserver listens on a Unix socket in the temporary folder (``pymp-*/listener-*``); a
    TMPDIR so long that the path passes the kernel's 107 bytes failed with a raw ``OSError: AF_UNIX
    path too long``. It becomes one line naming the folder and what to do."""
    from resacct.errors import ResacctError

    try:
        yield
    except OSError as error:
        if "AF_UNIX path too long" not in str(error):
            raise
        folder = tempfile.gettempdir()
        raise ResacctError(f"the temporary folder {folder!r} ({len(folder)} characters) is too long for the Unix socket the child "
                           "processes are started through (at most 107 bytes with pymp-*/listener-* added); set TMPDIR to a "
                           "shorter folder, e.g. TMPDIR=/tmp") from None


def forkserver_pid() -> int | None:
    """The pid of the forkserver this process knows of (started here, or inherited through a fork), or None."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def stop_forkserver() -> None:
    """Kill this process's forkserver (a later launch starts another): interrupted while it still
    imports torch, it would hold the terminal's output open for seconds after resacct ended."""
    pid = forkserver_pid()
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # not reaped here: multiprocessing's next ensure_running does, and restarts it


def rank_process_name(rank: int, folder: str) -> str:
    """A rank's process name: ``resacct-rank-<rank>@<its run's folder>``. multiprocessing's start-up
    sets it in the child before anything can fail, so the forkserver's excepthook
    (:func:`install_forkserver_excepthook`) knows where that rank's output goes."""
    return f"resacct-rank-{rank}@{folder}"


def install_forkserver_excepthook() -> None:
    """In the forkserver only (this module is among its preloads): a child whose start-up fails
    before resacct's code runs in it (the launcher's ``__main__`` module, imported again, raising)
    is reported by multiprocessing through ``sys.excepthook``; this hook appends the traceback to
    that rank's output file instead of the forkserver's stderr, so the launcher relays it once and
    its error names the exception, not only an exit code."""
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None and frame.f_code is not forkserver.main.__code__:
        frame = frame.f_back
    if frame is None or getattr(sys.excepthook, "_resacct", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        rank, _, folder = multiprocessing.current_process().name.partition("@")
        if rank.startswith("resacct-rank-") and os.path.isdir(folder):
            with contextlib.suppress(OSError), open(os.path.join(folder, f"{rank[len('resacct-'):]}.out"), "a") as file:
                traceback.print_exception(kind, error, trace, file=file)
                return  # the launcher relays it to its stderr
        previous(kind, error, trace)

    hook._resacct = True  # type: ignore[attr-defined]
    sys.excepthook = hook
