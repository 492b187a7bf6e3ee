"""Kineto's start/stop lines, kept off the user's terminal without losing anything else.

torch's profiler (kineto) writes ``USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
profiler_start`` and ``… profiler_stop`` to file descriptor 2 each time a profiler starts and
stops, whatever its log level: USDT is kineto's highest severity, above ERROR (libkineto
``ILoggerObserver.h``), so only ``KINETO_LOG_LEVEL=6`` would hide it, and that hides kineto's real
errors too. resacct starts a profiler for each allocation trace and kernel probe (ten lines on a
first ``account_model``), so :func:`kineto_start_stop_lines_dropped` captures file descriptor 2
around a start or a stop and writes back every line but those.

>>> import os
>>> with kineto_start_stop_lines_dropped():
...     _ = os.write(2, b"USDT:2026-11-28 06:09:43 3000:3000 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["kineto_start_stop_lines_dropped", "KINETO_START_STOP_LINE"]

KINETO_START_STOP_LINE = re.compile(rb"^USDT:[^\n]*\] profiler_(start|stop)\r?$")
"""A line kineto writes when a profiler starts or stops (nothing else is dropped)."""


@contextlib.contextmanager
def kineto_start_stop_lines_dropped() -> Iterator[None]:
    """Capture file descriptor 2 for the block (C++ logging bypasses ``sys.stderr``); afterwards
    write back to it every captured line that is not a kineto start/stop line, in order — a
    warning or an error torch or kineto prints there is kept. Where file descriptor 2 cannot be
    captured (closed), the block runs as is."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not KINETO_START_STOP_LINE.match(line.rstrip(b"\n"))]
            if kept:
                with contextlib.suppress(OSError):
                    os.write(2, b"".join(kept))
