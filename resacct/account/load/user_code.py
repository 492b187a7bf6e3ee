"""Errors raised inside a user's code (a ``--model module:factory`` factory, the model's forward,
its loss or backward) turned into one line: what raised, the message, and the user's frame.

>>> def factory():
...     raise ValueError("width must be even")
>>> try:
...     with calling_user_code("factory 'pkg:factory'"):
...         factory()
... except UserCodeError as error:
...     print(str(error).split(" (at ")[0])
factory 'pkg:factory' raised ValueError: width must be even
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from resacct.errors import ResacctError

__all__ = ["UserCodeError", "user_frame", "code_location", "calling_user_code", "system_exit_error", "MAX_MESSAGE_CHARS",
           "running_phase", "current_phase", "showing_progress", "stopping_after", "HARD_STOP_GRACE_S"]

MAX_MESSAGE_CHARS = 300
_TYPE_CHECK_WRAPPERS = ("jaxtyping", "beartype", "typeguard")  # run-time type checks wrap resacct's functions


class UserCodeError(ResacctError):
    """A user's factory, forward, loss or backward raised: one line naming the frame it came from."""


#: resacct's own folder (this module lives in it; not ``import resacct``, which would point the
#: import graph from here back up at the package's API).
_RESACCT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "")


def _is_library(filename: str) -> bool:
    import torch

    if filename.startswith((os.path.join(os.path.dirname(torch.__file__), ""), _RESACCT_DIR)):
        return True
    if any(f"{os.sep}{wrapper}{os.sep}" in filename for wrapper in _TYPE_CHECK_WRAPPERS):
        return True
    standard_library = os.path.join(os.path.dirname(contextlib.__file__), "")
    return filename.startswith(standard_library) and "-packages" not in filename


def user_frame(trace: TracebackType | None, fallback: str | None = None) -> str | None:
    """``file:line in function`` of the innermost frame outside torch, resacct and the standard
    library (the user's, or a library such as transformers when the error is raised there). When
    every frame is library code (a forward called with missing arguments): ``fallback`` if given,
    else the innermost frame of all."""
    frames = traceback.extract_tb(trace)
    outside = [frame for frame in frames if not _is_library(frame.filename)]
    if not outside and fallback:
        return fallback
    if not frames:
        return None
    chosen = (outside or frames)[-1]
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def code_location(function: object) -> str | None:
    """``file:line in name`` where ``function`` is defined (None when Python cannot tell).

    >>> code_location(code_location).endswith("in code_location")
    True
    """
    import inspect

    try:
        target = inspect.unwrap(function)  # type: ignore[arg-type]
        lines = inspect.getsourcelines(target)
        return f"{inspect.getsourcefile(target)}:{lines[1]} in {getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
    except (TypeError, OSError):
        return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 1] + "…"


def _exit_status(code: object) -> int:
    """The process's exit status for ``sys.exit(code)``: None → 0, an int → itself, anything else → 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


def system_exit_error(what: str, exit_: SystemExit, frame: str | None) -> UserCodeError:
    """One line for user code that called ``sys.exit`` (or raised ``SystemExit``): a run of
    resacct never ends with the user code's status, 0 least of all (a CI step would pass).

    >>> print(system_exit_error("factory 'pkg:build'", SystemExit(0), None))
    factory 'pkg:build' called sys.exit(0): exit status 0 from inside the model's code; expected it to return (resacct stops with status 2)
    """
    where = f" (at {frame})" if frame else ""
    shown = "" if exit_.code is None else repr(exit_.code)[:MAX_MESSAGE_CHARS]
    return UserCodeError(f"{what} called sys.exit({shown}){where}: exit status {_exit_status(exit_.code)} from inside the model's code; "
                         "expected it to return (resacct stops with status 2)")


@contextlib.contextmanager
def calling_user_code(what: str, *, hint: str = "", fallback: str | None = None, phase: str | None = None) -> Iterator[None]:
    """Run user code; any exception that is not a :class:`ResacctError` becomes a
    :class:`UserCodeError`: ``<what> raised <Type>: <first line of the message> (at file:line in
    function)<hint>``. ``RecursionError`` and ``MemoryError`` included; ``SystemExit``
    (``sys.exit(0)`` in a factory or a forward) too, as ``<what> called sys.exit(0) …``, and a
    ``BaseException`` subclass of the user's own; ``KeyboardInterrupt`` passes through (the command
    line's ``interrupted``, 130), and so does a ``--timeout`` (:func:`stopping_after`). ``fallback``: the location to name when no frame is the
    user's (e.g. :func:`code_location` of the model's forward). ``phase``: what the progress line
    and ``--timeout`` call this (default: from ``what``, see :func:`running_phase`)."""
    with running_phase(phase or _phase_of(what)):
        try:
            yield
        except ResacctError:
            raise
        except SystemExit as exit_:  # sys.exit(0) in a factory must not end resacct with status 0
            raise system_exit_error(what, exit_, user_frame(sys.exc_info()[2], fallback)) from None
        except (KeyboardInterrupt, GeneratorExit, _TimeLimitReached):
            raise
        except BaseException as error:  # the user's code may raise anything, a BaseException of its own too
            frame = user_frame(sys.exc_info()[2], fallback)
            where = f" (at {frame})" if frame else ""
            raise UserCodeError(f"{what} raised {type(error).__name__}: {_first_line(error)}{where}{hint}") from None


# ── phases, the progress line and --timeout: guards around a long run of the user's code ──

_phases: list[tuple[str, float]] = []  # (what runs, since when: time.monotonic()), innermost last


def _phase_of(what: str) -> str:
    if what.startswith("factory "):
        return f"loading the model ({what})"
    if what.startswith("the step of "):
        return f"tracing and measuring {what}"
    return what


@contextlib.contextmanager
def running_phase(name: str) -> Iterator[None]:
    """Name what runs now (``loading the model``, ``tracing and measuring the step of MLP …``) for
    the progress line (:func:`showing_progress`) and the ``--timeout`` message; phases nest.

    >>> with running_phase("loading the model"):
    ...     current_phase()[0]
    'loading the model'
    """
    entry = (name, time.monotonic())
    try:
        _phases.append(entry)
        yield
    finally:  # by identity: an alarm between two statements must not leave a stale phase behind
        for index in range(len(_phases) - 1, -1, -1):
            if _phases[index] is entry:
                del _phases[index]
                break


def current_phase() -> tuple[str, float] | None:
    """The innermost phase running and when it began, or None."""
    try:
        return _phases[-1]
    except IndexError:
        return None


@contextlib.contextmanager
def showing_progress(stream: Any, *, command: str, after_s: float = 2.0, every_s: float = 10.0, live: bool = False) -> Iterator[None]:
    """While the body runs, a thread writes ``<command>: <phase>, <n> s`` to ``stream`` (stderr; never
    stdout, so ``--json`` stays clean) once a phase has run ``after_s``: ``live`` (a terminal) rewrites
    one line each second and erases it at the end; otherwise a new line when a phase passes
    ``after_s``, then every ``every_s``. A run whose phases are all shorter writes nothing."""
    stop = threading.Event()
    started = time.monotonic()
    wrote: list[bool] = []

    def report() -> None:
        shown: dict[tuple[str, float], float] = {}
        while not stop.wait(0.2):
            phase = current_phase()
            if phase is None or time.monotonic() - phase[1] < after_s:
                continue
            now = time.monotonic()
            if not live and now - shown.get(phase, -math.inf) < every_s:
                continue
            if live and now - shown.get(phase, -math.inf) < 1.0:
                continue
            shown[phase] = now
            line = f"{command}: {phase[0]}, {now - phase[1]:.0f} s (run {now - started:.0f} s)"
            if live:  # one terminal row: a wrapped line would not be rewritten in place
                width = shutil.get_terminal_size().columns - 1
                line = line if len(line) <= width else line[: max(width - 1, 0)] + "…"
            try:
                stream.write(f"\r\033[K{line}" if live else f"{line}\n")
                stream.flush()
                wrote.append(True)
            except (OSError, ValueError):  # the stream went away (a closed pipe): stop reporting
                return

    thread = threading.Thread(target=report, name="resacct-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if live and wrote:
            with contextlib.suppress(OSError, ValueError):
                stream.write("\r\033[K")
                stream.flush()


class _TimeLimitReached(BaseException):
    """Raised by ``--timeout``'s alarm inside whatever runs. A ``BaseException``, as
    ``KeyboardInterrupt``: a user's ``except Exception`` and resacct's ``except ResacctError``
    let it through; :func:`stopping_after` turns it into one :class:`ResacctError` line."""


#: After the limit, how long the main thread may stay inside one C call (a huge matmul, a lock)
#: before the run is stopped hard: the line printed and the process ended with status 2.
HARD_STOP_GRACE_S = 10.0


def _user_location(frame: FrameType | None) -> str | None:
    """``file:line in function`` of the innermost frame of ``frame``'s stack outside the libraries,
    the installed packages (transformers …) and the ``resacct`` launcher script; None when the
    user's code is not on the stack (the limit came during resacct's or a library's own work)."""
    launcher = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (_is_library(filename) or "-packages" + os.sep in filename or os.path.abspath(filename) == launcher):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _limit_message(option: str, seconds: float, phase: tuple[str, float] | None, where: str | None, elapsed: float, hint: str) -> str:
    running = phase[0] if phase else "resacct's own work"
    at = f" (at {where})" if where else ""
    return f"{option} {seconds:g} s reached while {running}{at}, after {elapsed:.1f} s; {hint}"


@contextlib.contextmanager
def stopping_after(seconds: float | None, *, option: str = "--timeout", hint: str = "expected a run within the limit",
                   command: str = "resacct") -> Iterator[None]:
    """Stop the body after ``seconds`` (None: no limit) with one :class:`ResacctError` line naming the
    phase that ran (:func:`running_phase`) and the user's frame.

    How: on POSIX in the main thread, ``signal.setitimer`` raises :class:`_TimeLimitReached`
    between two Python bytecodes — a forward that loops or sleeps stops at once, a single long C
    call (one huge matmul) when it returns. A watchdog thread backs it up: still inside one C call
    :data:`HARD_STOP_GRACE_S` after the limit (or with no usable alarm: at the limit), it writes the
    line to stderr and ends the process with status 2 (``os._exit``: nothing else can stop a C call)."""
    if seconds is None:
        yield
        return
    started, owner = time.monotonic(), threading.get_ident()
    armed = [True]
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if armed[0]:
            armed[0] = False
            raise _TimeLimitReached(_limit_message(option, seconds, current_phase(), _user_location(frame), time.monotonic() - started, hint))

    def hard_stop() -> None:
        where = _user_location(sys._current_frames().get(owner))
        message = _limit_message(option, seconds, current_phase(), where, time.monotonic() - started, hint)
        why = f"still inside one call {HARD_STOP_GRACE_S:g} s after the limit" if use_alarm else "no alarm outside the main thread"
        sys.stderr.write(f"{command}: error: {message} (stopped hard: {why})\n")
        sys.stderr.flush()
        os._exit(2)

    watchdog = threading.Timer(seconds + (HARD_STOP_GRACE_S if use_alarm else 0.0), hard_stop)
    watchdog.daemon = True
    previous = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    try:  # a limit shorter than starting the timers (--timeout 1e-9) ends here: one line too
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        watchdog.start()
        yield
    except _TimeLimitReached as reached:
        raise ResacctError(str(reached)) from None
    finally:
        armed[0] = False
        watchdog.cancel()
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
