"""Replace a file atomically, or refuse in one line: what checkpoints and token files use.

``write_atomically(path, write)`` calls ``write(file)`` on a temporary file in the same
directory, fsyncs it, ``os.replace``-s it over ``path`` and fsyncs the directory. A crash at
any moment leaves the old file or the new one, never a torn one; a reader that has the old
file open or memory-mapped keeps the old bytes (the new file is a new inode).

Refused before anything is written, each in one line naming the path:

- a target that exists and is not a regular file (a directory, a FIFO, a device such as
  ``/dev/null``): ``os.replace`` would silently put a regular file in its place;
- a file name longer than the file system allows (``PC_NAME_MAX``, usually 255 bytes);
- a path holding a NUL byte.

An ``OSError`` while writing (disk full, quota, I/O error, read-only file system) becomes one
line naming the file and saying the previous file is untouched. Temporary files are named
``.<name>.tmp-<pid>-<8 hex>`` (``<name>`` hash-shortened when long, so the temporary name
never outgrows the final one's limit); a process killed mid-write (SIGKILL: no cleanup runs)
leaves one behind, and the next write to the same path removes it when its writer is dead.

>>> import tempfile, os
>>> target = os.path.join(tempfile.mkdtemp(), "note.bin")
>>> write_atomically(target, lambda file: file.write(b"hello")).read_bytes()
b'hello'
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, no_type_check

from resacct.errors import ResacctError

__all__ = [
    "RecordingWriter",
    "write_atomically",
    "temporary_name",
    "stale_temporaries",
    "remove_stale_temporaries",
    "non_regular_kind",
    "refuse_non_regular_target",
    "refuse_nul_in_path",
]

_LONG_NAME_BYTES = 200  # names longer than this are hash-shortened in temporary names
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_IN_PROGRESS: set[Path] = set()  # temporaries this process is writing now (never "stale")
_IN_PROGRESS_LOCK = threading.Lock()


def _short_name(name: str) -> str:
    encoded = name.encode("utf-8", errors="surrogateescape")
    if len(encoded) <= _LONG_NAME_BYTES:
        return name
    head = encoded[:96].decode("utf-8", errors="ignore")
    return f"{head}~{hashlib.sha256(encoded).hexdigest()[:16]}"


def temporary_name(name: str, pid: int, token: str) -> str:
    """The temporary file name used while writing ``name`` (bounded: ≤ 230 bytes for any name).

    >>> temporary_name("ckpt.pt", 42, "0123abcd")
    '.ckpt.pt.tmp-42-0123abcd'
    >>> len(temporary_name("x" * 250, 4194304, "0123abcd").encode()) <= 230
    True
    """
    return f".{_short_name(name)}.tmp-{pid}-{token}"


def _temporary_pattern(name: str) -> re.Pattern[str]:
    current = rf"\.{re.escape(_short_name(name))}\.tmp-(?P<pid>\d+)-[0-9a-f]{{8}}"
    before_round_two = rf"\.{re.escape(name)}\.(?P<old_pid>\d+)\.[0-9a-f]{{8}}\.tmp"  # resacct's earlier naming
    return re.compile(rf"(?:{current}|{before_round_two})")


def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a pid we cannot ask about): leave it
    return True


def stale_temporaries(path: str | os.PathLike) -> list:  # of Path; bare: beartype would draw from global random
    """Temporaries of ``path`` left by writers that can no longer finish: their process is dead,
    or it is this process and not writing them now, or they are older than the file at ``path``
    (it was replaced after they were last written). Only regular files are listed."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    pattern = _temporary_pattern(path.name)
    try:
        target_mtime_ns = os.stat(path).st_mtime_ns
    except OSError:
        target_mtime_ns = None
    stale = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            pid = int(match.group("pid") or match.group("old_pid"))
            candidate = directory / entry.name
            with _IN_PROGRESS_LOCK:
                ours_now = candidate in _IN_PROGRESS
            if ours_now:
                continue
            older_than_target = target_mtime_ns is not None and entry.stat(follow_symlinks=False).st_mtime_ns < target_mtime_ns
            if pid == os.getpid() or not _process_is_alive(pid) or older_than_target:
                stale.append(candidate)
    return sorted(stale)


def remove_stale_temporaries(path: str | os.PathLike) -> list:  # of Path (see above)
    """Remove :func:`stale_temporaries` of ``path``; returns what was removed."""
    removed = []
    for candidate in stale_temporaries(path):
        with contextlib.suppress(OSError):  # best effort: a read-only directory keeps it, and the write is refused in one line
            candidate.unlink()
            removed.append(candidate)
    return removed


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def non_regular_kind(mode: int) -> str | None:
    """What a ``st_mode`` is when it is not a regular file (``None`` for a regular file).

    >>> non_regular_kind(stat.S_IFCHR | 0o666), non_regular_kind(stat.S_IFREG | 0o644)
    ('a character device', None)
    """
    if stat.S_ISREG(mode):
        return None
    for is_kind, kind in _KINDS:
        if is_kind(mode):
            return kind
    return "not a regular file"


def refuse_nul_in_path(path: str | os.PathLike, what: str) -> Path:
    r"""``Path(path)``, or one line when it holds a NUL byte (no file system allows one; ``os``
    would raise a bare ``ValueError``).

    >>> refuse_nul_in_path("a\x00b.pt", "checkpoint")
    Traceback (most recent call last):
    ...
    resacct.errors.ResacctError: 'a\x00b.pt': the checkpoint path contains a NUL byte (\x00), which no file name may hold
    """
    text = os.fspath(path)
    if ("\x00" if isinstance(text, str) else b"\x00") in text:
        raise ResacctError(f"{text!r}: the {what} path contains a NUL byte (\\x00), which no file name may hold")
    return Path(path)


def _existing_mode(path: Path) -> int | None:
    """``st_mode`` of what ``path`` names (symlinks followed), ``None`` when nothing is there."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ResacctError(f"{path}: cannot inspect the target: {error.strerror or error}") from None


def refuse_non_regular_target(path: Path, what: str) -> bool:
    """Refuse a ``path`` that exists and is not a regular file; returns whether a file is there."""
    mode = _existing_mode(path)
    if mode is None:
        return False
    kind = non_regular_kind(mode)
    if kind is not None:
        raise ResacctError(f"{path}: is {kind}, not a regular file; refusing to replace it with a {what} (choose a path to a regular file)")
    return True


def _refuse_long_name(path: Path, directory: Path) -> None:
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    name_bytes = len(path.name.encode("utf-8", errors="surrogateescape"))
    if name_bytes > name_max:
        raise ResacctError(
            f"{path.name[:48]}…: the file name is {name_bytes} bytes; the file system at {directory} allows {name_max} — choose a shorter name"
        )


class RecordingWriter:
    """A write-only binary file that forwards to ``file``, counts the bytes, keeps the last bytes
    written, updates a SHA-256 of them (when ``digest``) and remembers the ``OSError`` a write
    raised (torch.save turns it into a ``RuntimeError`` that names no file; this keeps the cause)."""

    def __init__(self, file: Any, *, digest: bool = False):
        self.file = file
        self.bytes_written = 0
        self.sha256 = hashlib.sha256() if digest else None
        self.tail = b""
        self.os_error: OSError | None = None

    @no_type_check  # called per element/block (tens of thousands of checked calls in the CI quick tier, docs/suite_time.md)
    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            written = self.file.write(view)
        except OSError as error:
            self.os_error = error
            raise
        if self.sha256 is not None:
            self.sha256.update(view)
        self.bytes_written += len(view)
        self.tail = (self.tail + bytes(view[-64:]))[-64:]
        return len(view) if written is None else written

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as error:
            self.os_error = error
            raise

    def rewrite_tail(self, drop_bytes: int, replacement: bytes) -> None:
        """Replace the last ``drop_bytes`` written by ``replacement`` (not hashed)."""
        self.flush()
        self.file.seek(self.bytes_written - drop_bytes)
        self.file.write(replacement)
        self.file.truncate()


def _open_temporary(temporary: Path) -> Any:
    return open(temporary, "xb")


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _write_failure(path: Path, what: str, error: OSError, written_bytes: int, existed: bool) -> ResacctError:
    survivor = f"the previous {what} at {path} is untouched" if existed else f"nothing was written at {path}"
    if error.errno in _DISK_FULL_ERRNOS:
        cause = f"no space left on the device (errno {errno.errorcode.get(error.errno or 0, error.errno)}) after {written_bytes} bytes of the new {what}"
    else:
        cause = f"{error.strerror or error}".splitlines()[0]
    return ResacctError(f"{path}: cannot write the {what}: {cause}; {survivor}")


def write_atomically(path: str | os.PathLike, write: Callable[[RecordingWriter], Any], *, what: str = "file", digest: bool = False) -> Path:
    """Call ``write(file)`` on a temporary file next to ``path`` (``file`` is a
    :class:`RecordingWriter`, keeping a SHA-256 of what is written when ``digest``), make it
    durable, then move it over ``path`` in one ``os.replace``. If anything fails, ``path`` is
    untouched and the temporary file is removed. ``what`` names the file in messages."""
    path = refuse_nul_in_path(path, what)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ResacctError(f"{path}: the directory {directory} does not exist")
    _refuse_long_name(path, directory)
    existed = refuse_non_regular_target(path, what)
    remove_stale_temporaries(path)
    temporary = directory / temporary_name(path.name, os.getpid(), uuid.uuid4().hex[:8])
    with _IN_PROGRESS_LOCK:
        _IN_PROGRESS.add(temporary)
    writer: RecordingWriter | None = None
    try:
        try:
            with _open_temporary(temporary) as file:
                writer = RecordingWriter(file, digest=digest)
                write(writer)
                writer.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException as error:
            with contextlib.suppress(OSError):  # on a read-only file system even a missing file's unlink fails (EROFS)
                temporary.unlink()
            cause = error if isinstance(error, OSError) else (writer.os_error if writer is not None and isinstance(error, RuntimeError) else None)
            if cause is not None:
                raise _write_failure(path, what, cause, writer.bytes_written if writer else 0, existed) from None
            raise
    finally:
        with _IN_PROGRESS_LOCK:
            _IN_PROGRESS.discard(temporary)
    _fsync_directory(directory)
    return path
