"""Issue 36: ``resacct shard`` and its child processes under signals and time limits, and a rank's
error shown when it dies. A killed ``shard`` (SIGTERM, SIGKILL) leaves no process and no temporary
folder behind, even with a model whose forward never returns; Ctrl-C is ``resacct: interrupted``
and 130, also when resacct starts with SIGINT ignored (a background job of a script); ``--timeout``
is one line and exit 2 (``fit`` too).

The launches run ``resacct shard`` in its own session, with a private TMPDIR and a hanging factory
in a module of its own folder: every process of the run is in that session or names that folder on
its command line (the forkserver's ``sys_path``), and every folder it made is in that TMPDIR."""

from __future__ import annotations

import os
import signal
import subprocess
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.measurement.distributed import DistributedRankError, run_isolated
from resacct.measurement.lifeline import launcher_alive, remove_stale_folders

REPO = Path(__file__).resolve().parents[1]
RESACCT = str(Path(sys.executable).parent / "resacct")
linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the run's processes")

_HANGING_FACTORY = '''
import os, time
from pathlib import Path
import torch
from torch import nn


class Hang(nn.Module):
    """A forward that never returns (it sleeps, as a stuck data loader or a deadlock would)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        Path(os.environ["HANG_STARTED"]).joinpath(str(os.getpid())).touch()
        while True:
            time.sleep(0.2)


def build():
    return Hang(), torch.zeros(2, 4)
'''


def _processes() -> list[tuple[int, int, int, str, str]]:
    """(pid, parent pid, session id, state, command line) of every process (Linux)."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        rows.append((int(entry.name), int(fields[1]), int(fields[3]), fields[0], cmdline))
    return rows


@pytest.fixture
def shard_run(tmp_path):
    """Starts ``resacct shard`` on the hanging factory (:class:`_Run`); kills all that is left of it at the end."""
    runs: list[_Run] = []

    def start(*extra: str, ignore_sigint: bool = False) -> _Run:
        runs.append(_Run(tmp_path, *extra, ignore_sigint=ignore_sigint))
        return runs[-1]

    yield start
    for run in runs:
        run.kill_everything()
        run.process.communicate()
        shutil.rmtree(run.tmpdir, ignore_errors=True)


class _Run:
    """``resacct shard`` on a hanging factory, in a session of its own, with a private TMPDIR."""

    def __init__(self, tmp_path: Path, *extra: str, ignore_sigint: bool = False) -> None:
        self.marker = tmp_path / "run-marker-module-dir"
        self.marker.mkdir()
        (self.marker / "hanging_model_36.py").write_text(textwrap.dedent(_HANGING_FACTORY))
        # short: the forkserver's Unix socket lives in TMPDIR and a path past 107 bytes is refused (pytest's
        # tmp_path under xdist, /tmp/pytest-of-root/pytest-N/popen-gwK/test_…/tmp, is too long for it)
        self.tmpdir = Path(tempfile.mkdtemp(prefix="rs36-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.started = tmp_path / "started"
        self.started.mkdir()
        env = dict(os.environ, TMPDIR=str(self.tmpdir), PYTHONPATH=os.pathsep.join([str(self.marker), str(REPO)]),
                   HANG_STARTED=str(self.started), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))

        def before_exec() -> None:
            if ignore_sigint:  # as a shell starts a background job of a script
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.process = subprocess.Popen([RESACCT, "shard", "--model", "hanging_model_36:build", "--devices", "2", *extra],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, start_new_session=True,
                                        preexec_fn=before_exec)
        self.session = self.process.pid

    def wait_until_the_rank_hangs(self, seconds: float = 240.0) -> None:
        deadline = time.monotonic() + seconds
        while not any(self.started.iterdir()):
            assert self.process.poll() is None, f"shard ended before its forward ran: {self.process.communicate()}"
            assert time.monotonic() < deadline, "the rank's forward never started"
            time.sleep(0.2)
        assert self.survivors(), "no child process found while the rank hangs: the test would prove nothing"

    def wait_for_the_forkserver(self, seconds: float = 240.0) -> None:
        """Until the forkserver exists (it then imports torch for seconds before it serves a rank)."""
        deadline = time.monotonic() + seconds
        while not any("multiprocessing.forkserver" in row[4] for row in self.survivors()):
            assert self.process.poll() is None and time.monotonic() < deadline, "no forkserver started"
            time.sleep(0.02)

    def survivors(self) -> list[tuple[int, int, int, str, str]]:
        """Live processes of the run other than shard itself (zombies are dead: they hold nothing)."""
        return [row for row in _processes() if row[0] != self.process.pid and row[3] != "Z"
                and (row[2] == self.session or str(self.marker) in row[4])]

    def folders(self) -> list[str]:
        return sorted(path.name for path in self.tmpdir.iterdir())

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            out, err = self.process.communicate(timeout=timeout)
        finally:
            self.kill_everything()
        return self.process.returncode, out, err

    def kill_everything(self) -> None:
        """Whatever the assertions say, leave nothing running."""
        for pid in [self.process.pid] + [row[0] for row in self.survivors()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def assert_nothing_left(self, within: float = 30.0) -> None:
        """No process and no folder of the run within ``within`` seconds (a forkserver that imported
        torch takes 2–3 s to exit on a busy machine)."""
        deadline = time.monotonic() + within
        while (self.survivors() or self.folders()) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not self.survivors(), f"orphans of the killed run: {self.survivors()}"
        assert not self.folders(), f"temporary folders left by the killed run: {self.folders()}"


@linux_only
@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_shard_leaves_no_process_and_no_folder(shard_run, signal_number):
    """Before: the rank (a forkserver child, 240 MB) slept for ever under init, and ``pymp-*`` and
    ``resacct-store-*`` stayed in the temporary directory (3 of 3 tries)."""
    run = shard_run()
    run.wait_until_the_rank_hangs()
    assert run.folders(), "the run made no temporary folder: the test would prove nothing"
    os.kill(run.process.pid, signal_number)
    returncode, _, _ = run.finish()
    assert returncode == -signal_number
    run.assert_nothing_left()


@linux_only
@pytest.mark.slow
def test_ctrl_c_stops_shard_at_once_with_130_and_one_line_even_when_started_with_sigint_ignored(shard_run):
    """Before: started as a script's background job (SIGINT ignored), shard finished and exited 0
    (6 of 6 tries); with a hanging forward it never ended."""
    run = shard_run(ignore_sigint=True)
    run.wait_until_the_rank_hangs()
    interrupted = time.monotonic()
    os.killpg(run.session, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    returncode, out, err = run.finish(timeout=60)
    assert (returncode, out, err) == (130, "", "resacct: interrupted\n")
    assert time.monotonic() - interrupted < 30  # measured 2.4 s here, most of it Python tearing torch down
    run.assert_nothing_left()


@linux_only
@pytest.mark.slow
def test_ctrl_c_while_the_forkserver_imports_torch_is_one_line(shard_run):
    """Before: the forkserver printed its own KeyboardInterrupt traceback (from inside torch's
    import) beside ``resacct: interrupted``, and held the output open until its import ended."""
    run = shard_run()
    run.wait_for_the_forkserver()
    forkserver = next(row[0] for row in run.survivors() if "multiprocessing.forkserver" in row[4])
    blocked = next(line for line in Path(f"/proc/{forkserver}/status").read_text().splitlines() if line.startswith("SigBlk:"))
    assert int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1)), f"the forkserver hears Ctrl-C while it starts: {blocked}"
    os.killpg(run.session, signal.SIGINT)
    returncode, out, err = run.finish(timeout=60)
    assert (returncode, out, err) == (130, "", "resacct: interrupted\n")
    assert not any(run.started.iterdir()), "the rank had started: the test did not interrupt the forkserver's start"
    run.assert_nothing_left()


@linux_only
@pytest.mark.slow
def test_shard_timeout_is_one_line_exit_2_and_leaves_nothing(shard_run):
    run = shard_run("--timeout", "3")
    returncode, out, err = run.finish(timeout=300)
    assert returncode == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("resacct shard: error: --timeout 3 s reached while "), err
    run.assert_nothing_left()


@pytest.mark.parametrize("command", [["shard", "--hf-config", "gpt2"], ["fit", "--hf-config", "gpt2", "--memory-gb", "80"]])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_timeout_is_one_line_and_exit_2(command, value, capsys):
    assert main([*command, f"--timeout={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--timeout: {value!r}" in err, err


def test_fit_refuses_a_timeout_without_a_model(capsys):
    assert main(["fit", "--memory-gb", "80", "--timeout", "5"]) == 2
    assert "--timeout search a real model's step" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_timeout_stops_a_hanging_forward_with_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "hanging_model_36_fit.py").write_text(textwrap.dedent(_HANGING_FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HANG_STARTED", str(tmp_path))
    started = time.monotonic()
    assert main(["fit", "--model", "hanging_model_36_fit:build", "--memory-gb", "1", "--timeout", "2"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("resacct fit: error: --timeout 2 s reached while the forward of Hang (at ") and "in forward" in err, err


def test_stale_folders_of_dead_launchers_are_removed_and_no_others(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not launcher_alive(gone.pid)
    alive = os.getppid()
    folders = {
        "dead_store": tmp_path / f"resacct-store-{gone.pid}-abc",
        "live_store": tmp_path / f"resacct-store-{alive}-abc",
        "dead_pymp": tmp_path / "pymp-dead",
        "live_pymp": tmp_path / "pymp-live",
        "foreign_pymp": tmp_path / "pymp-notours",
        "other": tmp_path / f"something-{gone.pid}",
    }
    for folder in folders.values():
        folder.mkdir()
    (folders["dead_pymp"] / f"resacct-launcher-{gone.pid}").touch()
    (folders["live_pymp"] / f"resacct-launcher-{alive}").touch()
    removed = remove_stale_folders(str(tmp_path))
    assert sorted(removed) == sorted(str(folders[name]) for name in ("dead_store", "dead_pymp"))
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(folders[name].name for name in
                                                                      ("live_store", "live_pymp", "foreign_pymp", "other"))


# ── a rank that fails on start-up: its error, not "rank 0 raised died without answering (exit code 1)" ──

_CHILD_PROGRAMS = '''
import os, sys


def write_then_die():
    print("out: starting", flush=True)
    print("err: the last words of rank 0", file=sys.stderr, flush=True)
    os._exit(3)
'''

_UNIMPORTABLE_IN_A_CHILD = '''
import multiprocessing

if multiprocessing.parent_process() is not None:
    raise ImportError("this module refuses to be imported in a child process")


def answer():
    return 42
'''


def _module(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_whose_program_cannot_be_imported_shows_the_exception(tmp_path, monkeypatch):
    """Before: the program and its arguments were unpickled by multiprocessing before resacct's code
    ran in the child, and the launcher said "rank 0 raised died without answering (exit code 1)"."""
    module = _module(tmp_path, monkeypatch, "unimportable_in_a_child_36", _UNIMPORTABLE_IN_A_CHILD)
    with pytest.raises(DistributedRankError) as raised:
        run_isolated(module.answer)
    message = str(raised.value)
    assert message.splitlines()[0] == "answer: rank 0 raised ImportError: this module refuses to be imported in a child process", message
    assert "unimportable_in_a_child_36.py" in message  # the traceback names the line


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_that_dies_shows_its_exit_code_and_last_lines_and_its_output_reaches_stderr(tmp_path, monkeypatch, capsys):
    module = _module(tmp_path, monkeypatch, "child_programs_36", _CHILD_PROGRAMS)
    with pytest.raises(DistributedRankError) as raised:
        run_isolated(module.write_then_die)
    message = str(raised.value)
    assert message.splitlines()[0] == "write_then_die: rank 0 died without answering (exit code 3): err: the last words of rank 0", message
    assert "out: starting" in message
    captured = capsys.readouterr()
    assert "out: starting" in captured.err and "err: the last words of rank 0" in captured.err and captured.out == ""


_UNGUARDED_MAIN = """import math
from resacct.measurement.distributed import DistributedRankError, run_isolated
try:
    run_isolated(math.factorial, 4)
except DistributedRankError as error:
    print(error)
"""

_MAIN_RAISING_IN_THE_CHILD = """import math
from resacct.measurement.distributed import DistributedRankError, run_isolated
if __name__ != "__main__":
    raise RuntimeError("this script refuses to be imported again")
try:
    run_isolated(math.factorial, 4)
except DistributedRankError as error:
    print(error)
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("script", "first_line"), [
    (_UNGUARDED_MAIN, "factorial: rank 0 never started: multiprocessing ran the launching program's __main__ module again in the child "
                      "(each child imports it) and that module launched ranks itself; expected the launch under "
                      "`if __name__ == \"__main__\":`"),
    (_MAIN_RAISING_IN_THE_CHILD, "factorial: rank 0 died without answering (exit code 1): RuntimeError: this script refuses to be "
                                 "imported again"),
], ids=["launches-again", "raises"])
def test_a_main_module_that_fails_in_the_child_is_explained(tmp_path, script, first_line):
    """multiprocessing imports the launcher's ``__main__`` again in each child, before resacct's code
    runs there: the launcher said only "died without answering (exit code 1)"."""
    (tmp_path / "launcher.py").write_text(script)
    done = subprocess.run([sys.executable, "launcher.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path)))
    assert done.stdout.splitlines()[0] == first_line, done.stdout + done.stderr


@pytest.mark.slow
def test_a_temporary_folder_too_long_for_the_forkserver_socket_is_one_line(tmp_path):
    """A TMPDIR whose forkserver socket path passes 107 bytes was a raw ``OSError: AF_UNIX path too
    long`` traceback from multiprocessing: one line naming the folder, exit 2."""
    long_folder = tmp_path / ("t" * 120)
    long_folder.mkdir()
    env = dict(os.environ, TMPDIR=str(long_folder), PYTHONPATH=str(REPO))
    done = subprocess.run([RESACCT, "shard", "--model", "resacct.account.answers.generic:mlp", "--devices", "2"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is too long for the Unix socket" in lines[0] and "set TMPDIR to a shorter folder" in lines[0], done.stderr
