"""Issue 26: a FIFO or a character device given as an input file (``verify --merge``,
``--hf-config``) hung, or read ``/dev/zero`` until MemoryError. ``read_regular_file`` refuses
what is not a regular file before opening it, opens without blocking, and caps the size."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.training.input_files import read_regular_file
from resacct.reporting import documents
from resacct.reporting.documents import load_report

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
needs_dev_zero = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")


def within(seconds: float, call, unblock: Path | None = None):
    """``call()`` in a thread; fails (after unblocking a FIFO reader) when it still runs after ``seconds``."""
    result: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if unblock is not None:
            with open(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                pass
        pytest.fail(f"still running after {seconds} s (it hangs)")
    if errors:
        raise errors[0]
    return result[0]


def test_a_regular_file_is_read(tmp_path: Path):
    path = tmp_path / "a.json"
    path.write_bytes(b"{}")
    assert read_regular_file(path, "file 'a.json'", max_bytes=2) == b"{}"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "absent.json", r"^thing does not exist$"),
        (lambda tmp: tmp, r"^thing is a directory; look inside$"),
        (lambda tmp: str(tmp / "a\x00b.json"), r"^thing: the path contains a NUL byte"),
    ],
    ids=["missing", "directory", "nul"],
)
def test_what_cannot_be_read_is_one_line(tmp_path: Path, make, message: str):
    with pytest.raises(ResacctError, match=message):
        read_regular_file(make(tmp_path), "thing", max_bytes=10, directory_hint="; look inside")


def test_a_file_over_the_cap_is_refused_before_reading(tmp_path: Path):
    path = tmp_path / "big.json"
    with open(path, "wb") as file:
        file.truncate(11)
    with pytest.raises(ResacctError, match=r"^thing is 11 bytes; expected at most 10 bytes$"):
        read_regular_file(path, "thing", max_bytes=10)


@needs_fifo
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(ResacctError, match=r"is a FIFO \(named pipe\), not a regular file$"):
        within(20, lambda: read_regular_file(fifo, "thing", max_bytes=10), unblock=fifo)


@needs_fifo
def test_a_fifo_swapped_in_after_the_check_does_not_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check looks at the path; between it and the open a FIFO can take its place. The open
    does not block (O_NONBLOCK) and what was opened is checked again."""
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *args, **kwargs: regular if Path(path) == fifo else real_stat(path, *args, **kwargs))
    with pytest.raises(ResacctError, match=r"is a FIFO \(named pipe\), not a regular file$"):
        within(20, lambda: read_regular_file(fifo, "thing", max_bytes=10), unblock=fifo)


@needs_dev_zero
def test_dev_zero_is_refused_not_read():
    with pytest.raises(ResacctError, match=r"^thing is a character device, not a regular file$"):
        within(20, lambda: read_regular_file("/dev/zero", "thing", max_bytes=10))


@needs_fifo
def test_verify_merge_refuses_a_fifo_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    assert within(20, lambda: main(["verify", "--merge", str(fifo)]), unblock=fifo) == 2
    err = capsys.readouterr().err
    assert err == f"resacct verify: error: report '{fifo}' is a FIFO (named pipe), not a regular file\n"


@needs_dev_zero
def test_verify_merge_refuses_a_character_device_in_one_line(capsys: pytest.CaptureFixture[str]):
    assert within(20, lambda: main(["verify", "--merge", "/dev/zero"])) == 2
    assert capsys.readouterr().err == "resacct verify: error: report '/dev/zero' is a character device, not a regular file\n"


def test_a_report_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(documents, "MAX_REPORT_BYTES", 100)
    path = tmp_path / "report.json"
    path.write_text(" " * 101)
    with pytest.raises(ResacctError, match=rf"^report '{path}' is 101 bytes; expected at most 100 bytes$"):
        load_report(path)
