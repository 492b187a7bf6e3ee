"""Atomic replacement (checkpoints, token files): refusing targets that are not regular files,
disk full, over-long names, and cleaning the temporaries a killed writer leaves (issue 13)."""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from resacct.training import atomic_files
from resacct.training.atomic_files import non_regular_kind, stale_temporaries, temporary_name, write_atomically
from resacct.training.checkpoint import read_checkpoint, save_checkpoint
from resacct.errors import ResacctError

REPOSITORY = Path(__file__).resolve().parents[1]


def small_checkpoint(path: Path, step: int = 1) -> Path:
    model = torch.nn.Linear(3, 2)
    return save_checkpoint(path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=step)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


# --- targets that are not regular files -------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_saving_over_a_fifo_is_refused(tmp_path: Path):
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: is a FIFO \(named pipe\), not a regular file; refusing to replace it with a checkpoint") as error:
        small_checkpoint(fifo)
    one_line(error)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["ckpt.pt"]


def test_saving_over_a_directory_is_refused(tmp_path: Path):
    directory = tmp_path / "ckpt.pt"
    (directory / "inside").mkdir(parents=True)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: is a directory, not a regular file") as error:
        small_checkpoint(directory)
    one_line(error)
    assert (directory / "inside").is_dir()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_symlink_to_a_fifo_is_refused(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "ckpt.pt").symlink_to(tmp_path / "pipe")
    with pytest.raises(ResacctError, match=r"is a FIFO"):
        small_checkpoint(tmp_path / "ckpt.pt")
    assert (tmp_path / "ckpt.pt").is_symlink()


def test_saving_over_a_device_is_refused_without_touching_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """As root, save_checkpoint('/dev/null') used to replace /dev/null with a regular file. The
    test never goes near /dev: a regular file here is reported as a character device."""
    target = small_checkpoint(tmp_path / "ckpt.pt")
    content = target.read_bytes()
    real_mode = atomic_files._existing_mode
    monkeypatch.setattr(atomic_files, "_existing_mode", lambda path: stat.S_IFCHR | 0o666 if path == target else real_mode(path))
    with pytest.raises(ResacctError, match=r"ckpt\.pt: is a character device, not a regular file; refusing to replace it with a checkpoint") as error:
        small_checkpoint(target, step=2)
    one_line(error)
    assert target.read_bytes() == content


@pytest.mark.parametrize(
    ("mode", "kind"),
    [(stat.S_IFCHR, "a character device"), (stat.S_IFBLK, "a block device"), (stat.S_IFIFO, "a FIFO (named pipe)"), (stat.S_IFSOCK, "a socket"), (stat.S_IFDIR, "a directory"), (stat.S_IFREG, None)],
)
def test_non_regular_kind(mode: int, kind: str | None):
    assert non_regular_kind(mode | 0o644) == kind


# --- disk full, write errors, names -------------------------------------------------------------


class DiskFull(io.FileIO):
    """A file that takes ``limit`` bytes, then fails as a full disk does."""

    limit = 1000

    def __init__(self, path: Path):
        super().__init__(path, "x")
        self.taken = 0

    def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
        if self.taken + len(memoryview(data).cast("B")) > self.limit:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.taken += len(memoryview(data).cast("B"))
        return super().write(data)


def test_disk_full_names_the_file_and_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = small_checkpoint(tmp_path / "ckpt.pt", step=1)
    monkeypatch.setattr(atomic_files, "_open_temporary", DiskFull)
    with pytest.raises(ResacctError) as error:
        small_checkpoint(path, step=2)
    message = one_line(error)
    assert message.startswith(f"{path}: cannot write the checkpoint: no space left on the device (errno ENOSPC) after ")
    assert message.endswith(f"; the previous checkpoint at {path} is untouched")
    monkeypatch.undo()
    assert read_checkpoint(path)["step"] == 1
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["ckpt.pt"]


def test_disk_full_on_a_first_save_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(atomic_files, "_open_temporary", DiskFull)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: cannot write the checkpoint: no space left .*; nothing was written at .*ckpt\.pt$"):
        small_checkpoint(tmp_path / "ckpt.pt")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def refuse(path: Path) -> object:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(atomic_files, "_open_temporary", refuse)
    with pytest.raises(ResacctError, match=r"ckpt\.pt: cannot write the checkpoint: Permission denied; nothing was written"):
        small_checkpoint(tmp_path / "ckpt.pt")


def test_a_250_character_name_saves(tmp_path: Path):
    """The temporary name used to be the final name plus ~20 characters: a 250-character
    name failed with ENAMETOOLONG although the name itself was allowed."""
    path = small_checkpoint(tmp_path / ("c" * 247 + ".pt"))
    assert len(path.name) == 250 and read_checkpoint(path)["step"] == 1
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]


def test_a_name_longer_than_the_file_system_allows_is_one_line(tmp_path: Path):
    with pytest.raises(ResacctError, match=r"the file name is 300 bytes; the file system at .* allows 255 — choose a shorter name") as error:
        small_checkpoint(tmp_path / ("c" * 297 + ".pt"))
    one_line(error)


def test_temporary_names_are_bounded():
    for length in (1, 200, 201, 255, 1000):
        name = temporary_name("é" * length, 2**22, "0123abcd")
        assert len(name.encode()) <= 230, length
    assert temporary_name("a" * 300, 1, "0123abcd") != temporary_name("a" * 299 + "b", 1, "0123abcd")


# --- temporaries a killed writer leaves ----------------------------------------------------------

KILLED_WRITER = """
import sys, time
from resacct.training.atomic_files import write_atomically

def write(file):
    file.write(b"x" * 1_000_000)
    file.flush()
    print("writing", flush=True)
    time.sleep(60)

write_atomically(sys.argv[1], write)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_next_save_removes_the_temporary_of_a_writer_killed_with_sigkill(tmp_path: Path):
    path = small_checkpoint(tmp_path / "ckpt.pt", step=1)
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    with subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=environment) as writer:
        try:  # the with block closes its stdout pipe
            assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        finally:
            writer.kill()
            writer.wait(timeout=30)
    leaked = [entry for entry in tmp_path.iterdir() if entry.name != "ckpt.pt"]
    assert [entry.name for entry in leaked] == [f".ckpt.pt.tmp-{writer.pid}-{leaked[0].name[-8:]}"]
    assert leaked[0].stat().st_size == 1_000_000
    assert read_checkpoint(path)["step"] == 1  # the kill never touched the checkpoint
    small_checkpoint(path, step=2)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["ckpt.pt"]
    assert read_checkpoint(path)["step"] == 2


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid


def test_which_temporaries_are_stale(tmp_path: Path):
    path = small_checkpoint(tmp_path / "ckpt.pt")
    checkpoint_ns = os.stat(path).st_mtime_ns
    dead, live = dead_pid(), os.getppid()
    files = {
        f".ckpt.pt.tmp-{dead}-0123abcd": "stale",  # its writer is dead
        f".ckpt.pt.{dead}.deadbeef.tmp": "stale",  # resacct's earlier naming
        f".ckpt.pt.tmp-{os.getpid()}-0123abcd": "stale",  # ours, and we are not writing it
        f".ckpt.pt.tmp-{live}-aaaaaaaa": "stale",  # a live writer, but older than the checkpoint
        f".ckpt.pt.tmp-{live}-bbbbbbbb": "kept",  # a live writer, newer: may be writing now
        f".other.pt.tmp-{dead}-0123abcd": "kept",  # another checkpoint's
        f".ckpt.pt.tmp-{dead}-0123abcd.keep": "kept",  # not our pattern
        "notes.txt": "kept",
    }
    for name in files:
        (tmp_path / name).write_bytes(b"partial")
    older = checkpoint_ns - 10**9
    os.utime(tmp_path / f".ckpt.pt.tmp-{live}-aaaaaaaa", ns=(older, older))
    newer = time.time_ns() + 10**9
    os.utime(tmp_path / f".ckpt.pt.tmp-{live}-bbbbbbbb", ns=(newer, newer))
    (tmp_path / f".ckpt.pt.tmp-{dead}-fedcba98").mkdir()  # not a regular file: never removed
    assert sorted(entry.name for entry in stale_temporaries(path)) == sorted(name for name, fate in files.items() if fate == "stale")
    small_checkpoint(path, step=2)
    remaining = sorted(entry.name for entry in tmp_path.iterdir())
    assert remaining == sorted(["ckpt.pt", f".ckpt.pt.tmp-{dead}-fedcba98", *(name for name, fate in files.items() if fate == "kept")])


def test_write_atomically_with_a_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    write_atomically("plain.bin", lambda file: file.write(b"abc"))
    assert (tmp_path / "plain.bin").read_bytes() == b"abc"
