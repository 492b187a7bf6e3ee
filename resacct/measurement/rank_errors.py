"""The errors of :mod:`resacct.measurement.distributed`, and how a rank's failure is told: the rank
that failed first-hand (not one that lost its peer), what it raised, or — when it died without
answering — its exit code and its last lines of output, or why it never reached resacct's code."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys

from resacct.errors import ResacctError
from resacct.measurement.lifeline import OutputRelay

__all__ = ["DistributedError", "DistributedUnavailableError", "DistributedRankError", "DistributedTimeoutError", "MAIN_REENTERED_EXIT_CODE",
           "rank_failure", "raised", "died_without_answering", "refuse_reentered_main"]

#: A child's exit status when multiprocessing's start-up ran the launcher's ``__main__`` again in it
#: and that module launched ranks itself (a script without ``if __name__ == "__main__":``).
MAIN_REENTERED_EXIT_CODE = 86


class DistributedError(ResacctError):
    """A distributed run could not start, failed on a rank, or ran out of time."""


class DistributedUnavailableError(DistributedError):
    """This machine or torch build cannot run a local gloo process group (the reason says why)."""


class DistributedRankError(DistributedError):
    """A rank raised (its traceback is in the message) or died without answering."""


class DistributedTimeoutError(DistributedError):
    """Not every rank answered within the time allowed; the stragglers were killed."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


_PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe")


def _is_peer_failure(traceback_text: str) -> bool:
    """True when a rank failed only because another rank went away first."""
    return any(marker in traceback_text for marker in _PEER_FAILURE_MARKERS)


def rank_failure(errors: dict[int, tuple[str, str]], program_name: str) -> DistributedRankError:
    """One error naming the rank that failed first-hand (not one that lost its peer). ``errors``:
    rank → (what happened, in a few words; the traceback or the rank's last lines)."""
    first_hand = [rank for rank, (_, detail) in sorted(errors.items()) if not _is_peer_failure(detail)]
    rank = first_hand[0] if first_hand else min(errors)
    others = [other for other in sorted(errors) if other != rank]
    also = f" (then ranks {others} failed too)" if others else ""
    headline, detail = errors[rank]
    return DistributedRankError(f"{program_name}: rank {rank} {headline}{also}\n{detail}")


def raised(traceback_text: str) -> tuple[str, str]:
    """What a rank that raised reported, as (headline, traceback); a ``KeyboardInterrupt`` is raised here."""
    if _last_line(traceback_text).startswith("KeyboardInterrupt"):
        raise KeyboardInterrupt  # the rank was interrupted: so is the run
    return f"raised {_last_line(traceback_text)}", traceback_text


def died_without_answering(process: multiprocessing.process.BaseProcess, relay: OutputRelay, rank: int) -> tuple[str, str]:
    """What to say of a rank that closed its pipe without answering: its exit code, and either its
    last lines of output or why there are none."""
    process.join(1.0)
    code = process.exitcode
    how = f"exit code {code}" if code is None or code >= 0 else f"killed by {_signal_name(-code)}"
    if code == MAIN_REENTERED_EXIT_CODE:
        return ("never started: multiprocessing ran the launching program's __main__ module again in the child (each child imports "
                "it) and that module launched ranks itself; expected the launch under `if __name__ == \"__main__\":`", "")
    relay.pump()
    lines = relay.tail(rank)
    if lines:
        return f"died without answering ({how}): {lines[-1].strip()}", "its last lines:\n" + "\n".join(f"  {line}" for line in lines)
    if not relay.started(rank):
        return (f"died on start-up before resacct's code ran in it ({how}): multiprocessing's start-up failed in the child, most often "
                "the launching program's __main__ module (each child imports it again) raising; its traceback is on stderr", "")
    return f"died without answering ({how}) and wrote nothing", ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def refuse_reentered_main() -> None:
    """Called in a child that multiprocessing's start-up is preparing, when the launcher's
    ``__main__`` module (imported again in the child) launches ranks itself: end the child with a
    status the launcher explains (the child cannot answer yet), as multiprocessing would end it."""
    sys.stderr.write("resacct: this child process imported the launching program's __main__ module again, and it launches ranks; "
                     "expected the launch under `if __name__ == \"__main__\":`\n")
    sys.stderr.flush()
    os._exit(MAIN_REENTERED_EXIT_CODE)
