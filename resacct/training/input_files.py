"""Reading a file a user names (``--hf-config config.json``, ``verify --merge report.json``):
only a regular file, and only up to a size, refused in one line otherwise.

A FIFO as input used to hang (``open`` blocks until a writer comes) and ``/dev/zero`` read until
``MemoryError`` (issue 26). This refuses what is not a regular file before reading it — the same
kinds the checkpoint reader refuses (:func:`resacct.training.atomic_files.non_regular_kind`) —
opens without blocking (a FIFO swapped in after the check cannot hang it) and never reads more
than ``max_bytes`` + 1 bytes.

>>> read_regular_file("/dev/zero", "config file '/dev/zero'", max_bytes=1024)
Traceback (most recent call last):
...
resacct.errors.ResacctError: config file '/dev/zero' is a character device, not a regular file
"""

from __future__ import annotations

import os

from resacct.errors import ResacctError
from resacct.training.atomic_files import non_regular_kind

__all__ = ["read_regular_file"]


def read_regular_file(path: str | os.PathLike, where: str, *, max_bytes: int, directory_hint: str = "") -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``max_bytes``.

    Refused, as a :class:`ResacctError` that starts with ``where`` (e.g. ``report 'r.json'``):
    a missing file, a NUL in the path, a directory (``directory_hint`` appended), a FIFO, a
    device, a socket, a file larger than ``max_bytes`` (checked before reading, and again while
    reading: a file that grows is cut off, not read to the end), a file that cannot be read."""
    text = os.fspath(path)
    if ("\x00" if isinstance(text, str) else b"\x00") in text:
        raise ResacctError(f"{where}: the path contains a NUL byte (\\x00), which no file name may hold")
    try:
        kind = non_regular_kind(os.stat(path).st_mode)
        if kind is not None:
            raise ResacctError(f"{where} is {kind}{directory_hint if kind == 'a directory' else ', not a regular file'}")
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ResacctError(f"{where} does not exist") from None
    except OSError as error:
        raise ResacctError(f"{where} cannot be read: {error.strerror or error}") from None
    with open(descriptor, "rb", closefd=True) as file:
        kind = non_regular_kind(os.fstat(file.fileno()).st_mode)  # what was opened, not what was looked at
        if kind is not None:
            raise ResacctError(f"{where} is {kind}, not a regular file")
        size = os.fstat(file.fileno()).st_size
        if size > max_bytes:
            raise ResacctError(f"{where} is {size} bytes; expected at most {max_bytes} bytes")
        try:
            data = file.read(max_bytes + 1)
        except OSError as error:
            raise ResacctError(f"{where} cannot be read: {error.strerror or error}") from None
    if len(data) > max_bytes:
        raise ResacctError(f"{where} grew past {max_bytes} bytes while being read; expected at most {max_bytes} bytes")
    return data
