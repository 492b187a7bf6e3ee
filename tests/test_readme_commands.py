"""The README's command-line examples print what the README shows (issue 21: every figure in the
README produced by a command and kept current by a test). Each ``$ resacct …`` line of the block
under "## Questions from the command line" runs in this process; every output line the README
shows under it must be a line of what it prints today."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from resacct.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
#: commands that build a model (torch, transformers): the slow tier
_SLOW_WORDS = ("--hf-config", "--model", "account")


def readme_commands() -> list[tuple[list[str], list[str]]]:
    """``(argv, shown output lines)`` for each ``$ resacct`` line of the block, comments dropped."""
    section = README.read_text(encoding="utf-8").split("## Questions from the command line", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    commands: list[tuple[list[str], list[str]]] = []
    for line in block:
        if line.startswith("$ resacct "):
            commands.append((shlex.split(line[len("$ resacct "):], comments=True), []))
        elif commands and line.strip():
            commands[-1][1].append(line.rstrip())
    return commands


def _cases() -> list[object]:
    cases = []
    for argv, shown in readme_commands():
        if not shown:  # nothing shown to keep current (the account example runs in tests/test_hf_config.py)
            continue
        marks = [pytest.mark.slow] if any(word in argv for word in _SLOW_WORDS) else []
        cases.append(pytest.param(argv, shown, marks=marks, id=" ".join(argv[:3])))
    return cases


def test_the_block_has_the_commands_it_promises():
    commands = readme_commands()
    assert len(commands) >= 5 and sum(1 for _, shown in commands if shown) >= 4 and len(_cases()) >= 4


@pytest.mark.parametrize(("argv", "shown"), _cases())
def test_a_readme_command_prints_what_the_readme_shows(argv, shown, capsys):
    if "--hf-config" in argv:
        pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot; the command refuses in one line)
    if any(word in argv for word in _SLOW_WORDS):  # a model's step: run as a user runs it, in a fresh `resacct` process
        # (outside this session's runtime type checks of every resacct call: 16 s for the 7B fit instead of 42)
        done = subprocess.run([sys.executable, "-m", "resacct", *argv], capture_output=True, text=True, timeout=600, cwd=README.parent)
        assert done.returncode == 0, done.stderr
        out = done.stdout
    else:
        assert main(argv) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
    printed = {line.rstrip() for line in out.splitlines()}
    missing = [line for line in shown if line not in printed]
    assert not missing, f"resacct {' '.join(argv)} no longer prints these README lines:\n" + "\n".join(missing)
