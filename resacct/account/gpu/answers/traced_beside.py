"""The board's step traced on the second core while the CPU kernels' search runs on the first (issue 34:
``fit --device BOARD`` ≤ 10 s).

``fit --device`` answers twice: the CPU kernels' search (:func:`resacct.account.fit.search.fit_step`, each
probe the step on fake tensors), then the board's search by the reserved peak
(:func:`~resacct.account.gpu.answers.device_answer.fit_gpu_answer`), which starts from the CPU answer ``n`` and traces
``n`` and ``n + 1`` first — sizes the CPU search has just probed. :class:`TracedBeside` forks a child once the
model is built; each size the CPU search is about to probe is sent to it, and it traces the board's step there
(meta tensors, CUDA's choices) while the parent traces the CPU step. When the search ends the parent takes
what the child finished; any size it still needs it traces itself. So the answer is the same, the board's
traces cost no wall time where they ran beside the CPU's, and a size the board's search never asks about
costs only the second core.

Only with two cores or more (``os.sched_getaffinity``) and where ``fork`` exists; otherwise — or when the
child fails, cannot run autograd (a fork of a process whose autograd started its device threads), or what it sends
back cannot be read — every size is traced in the parent, as before. The child
never writes to the terminal, and it dies with the search (``close``, also on Ctrl-C or ``--timeout``).

>>> beside = TracedBeside(lambda size, fixed: size * fixed, enabled=False)   # one core: nothing forked
>>> beside.ask(3, 7); beside.collect()
{}
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

__all__ = ["TracedBeside", "two_cores"]


def two_cores() -> bool:
    """Whether this process may run on two CPUs or more, and can fork."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS): the CPU count
        cores = os.cpu_count() or 1
    return cores >= 2 and "fork" in multiprocessing.get_all_start_methods()


def _serve(connection: Any, trace: Callable[[int, Any], Any]) -> None:
    """The child: trace each ``(size, fixed)`` received, send back ``(size, fixed, answer)`` or ``(size, fixed, None)`` on any
    failure (the parent traces that size itself); stop at None."""
    while True:
        try:
            asked = connection.recv()
        except (EOFError, OSError):
            break
        if asked is None:
            break
        size, fixed = asked
        try:
            answer = trace(size, fixed)
            connection.send((size, fixed, answer))
        except BaseException:  # noqa: BLE001 — a failure here is the parent's to meet again, with its own message
            try:
                connection.send((size, fixed, None))
            except (OSError, ValueError):
                break
    connection.close()


class TracedBeside:
    """``trace(size, fixed)`` run in a forked child for each size :meth:`ask` names; :meth:`collect` returns
    ``{(size, fixed): answer}`` of those it finished (module doc). ``enabled=False``: nothing forked, nothing traced.
    ``autograd``: ``trace`` runs a backward, so a child that cannot (:func:`_autograd_runs_here`) traces nothing."""

    def __init__(self, trace: Callable[[int, Any], Any], *, enabled: bool | None = None, autograd: bool = True) -> None:
        self.asked: list[tuple[int, Any]] = []
        self._process: Any = None
        self._connection: Any = None
        if not (two_cores() if enabled is None else enabled):
            return
        context = multiprocessing.get_context("fork")
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_child_main, args=(child_end, parent_end, trace, autograd), daemon=True, name="resacct-board-traces")
        try:
            process.start()
        except OSError:  # no process to be had: the parent traces everything
            parent_end.close()
            child_end.close()
            return
        child_end.close()
        self._process, self._connection = process, parent_end

    def ask(self, size: int, fixed: Any) -> None:
        """Have the child trace ``size`` (at ``fixed``), once."""
        if self._connection is None or (size, fixed) in self.asked:
            return
        try:
            self._connection.send((size, fixed))
            self.asked.append((size, fixed))
        except (OSError, ValueError):  # the child is gone: the parent traces what it needs
            self.close()

    def collect(self) -> dict[tuple[int, Any], Any]:
        """What the child traced, once every size asked is answered (or the child is gone); the child stops."""
        done: dict[tuple[int, Any], Any] = {}
        if self._connection is None:
            return done
        try:
            self._connection.send(None)
            for _ in self.asked:
                size, fixed, answer = self._connection.recv()
                if answer is not None:
                    done[(size, fixed)] = answer
        except (EOFError, OSError, ValueError, TypeError):  # the child died or sent what cannot be read: what arrived stands
            pass
        self.close()
        return done

    def close(self) -> None:
        """Stop the child (if any) and wait for it."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            if self._process.is_alive():
                self._process.terminate()
            self._process.join(timeout=5)
            self._process = None

    def __enter__(self) -> TracedBeside:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_main(connection: Any, parent_end: Any, trace: Callable[[int, Any], Any], autograd: bool = True) -> None:
    """The forked child's entry: its copy of the parent's end closed, output silenced, then :func:`_serve` (where
    ``autograd`` is needed, only if this child can run it)."""
    import signal
    import sys

    parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the child
    devnull = open(os.devnull, "w")  # noqa: SIM115 — the child's whole life
    sys.stdout = sys.stderr = devnull
    if autograd and not _autograd_runs_here():
        connection.close()  # the parent traces every size itself
        return
    _serve(connection, trace)


def _autograd_runs_here() -> bool:
    """Whether this forked child can run a backward. Once autograd has started its device threads in a process (a backward
    over tensors of an accelerator's device type, fake CUDA tensors on a CUDA build of torch included: measured on torch
    2.12.1+cu130 without a GPU, the second ``lora --device h100`` answer in one process), every backward in a fork of it
    raises "Unable to handle autograd's threading in combination with fork-based multiprocessing" — which a trace in
    the child would report as the step's own failure."""
    import torch

    try:
        torch.ones(1, requires_grad=True).sum().backward()
    except RuntimeError:
        return False
    return True
