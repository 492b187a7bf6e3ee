"""The progress lines of a search whose every probe traces a step (``fit``, ``lora``): one line per
probe on stderr — never on stdout, so ``--json`` stays one document — with ``--progress`` always,
with ``--no-progress`` never, and by default once the command has run 2 s (a quick answer prints none).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add_progress_flag", "probe_progress", "QUIET_SECONDS"]

#: How long a command runs before its probes are reported by default.
QUIET_SECONDS = 2.0


def add_progress_flag(parser: argparse.ArgumentParser, what: str = "one line per probe") -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help=f"{what} on stderr (default: once the search has run {QUIET_SECONDS:g} s); never on stdout")


def probe_progress(command: str, size_name: str, progress: bool | None, started: float,
                   bytes_text: Callable[[float], str]) -> Callable[[Any], None]:
    """``on_probe(probe)`` for :func:`resacct.account.fit.lines.largest_fitting`: ``resacct <command>:
    <size_name> <size>: predicted <peak> fits|does not fit (<its seconds>; <seconds since started> in all)``."""

    def on_probe(probe: Any) -> None:
        elapsed = time.perf_counter() - started
        if progress or (progress is None and elapsed > QUIET_SECONDS):
            verdict = "fits" if probe.fits else "does not fit"
            print(f"resacct {command}: {size_name} {probe.size:,}: predicted {bytes_text(probe.peak_bytes)} {verdict} "
                  f"({probe.seconds:.1f} s; {elapsed:.0f} s in all)", file=sys.stderr, flush=True)

    return on_probe
