"""The napkin commands start without torch (issue 26: ``resacct memory`` went from 0.07 s to 1.1 s
when it began importing torch): only the chosen command's module is registered, and nothing a
napkin command runs imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from resacct.cli import COMMAND_MODULES, _command_modules
from resacct.cli.app import build_parser, subparsers_of

NAPKIN_COMMANDS = [
    ["memory", "--params", "7B"],
    ["memory", "--params", "7.5B", "--recipe", "mixed", "--zero", "3", "--devices", "64", "--optimizer", "sgd-momentum"],
    ["time", "--params", "70B", "--tokens", "15T", "--devices", "1024", "--device", "h100", "--mfu", "0.5"],
    ["fit", "--devices", "8", "--device", "h100", "--zero", "3"],
    ["flops", "--params", "7B", "--tokens", "1T"],
    ["mfu", "--achieved-tflops", "400", "--device", "h100"],
    ["devices"],
    ["devices", "h100"],  # its step-time model named from the calibration files, read without torch (calibrated_times.py)
    ["plan", "--help"],
    ["optimal", "--flops", "1e24"],
    ["run", "--params", "405B", "--tokens", "15.6T", "--device", "h100", "--devices", "16384", "--device-hours", "30.84M"],
    ["infer", "--layers", "32", "--hidden", "4096", "--heads", "32", "--mlp", "11008", "--vocab", "32000", "--context", "4096",
     "--device", "h100"],
    ["lora", "--help"],
    ["account", "--help"],  # the help lists the shipped configs without importing resacct.account (~1.4 s of torch)
    ["fit", "--help"],
    ["shard", "--help"],
]

_PROBE = """
import json, sys, time
started = time.perf_counter()
from resacct.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                  "seconds": time.perf_counter() - started}), file=sys.stderr)
"""


def _fresh_process(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", NAPKIN_COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_a_napkin_command_never_imports_torch(argv):
    probe = _fresh_process(argv)
    assert probe["code"] == 0 and probe["torch"] is False and probe["transformers"] is False, probe


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_every_commands_help_imports_neither_torch_nor_transformers(command):
    """``resacct <command> --help`` for every command (issue 34): the help is read before any work."""
    probe = _fresh_process([command, "--help"])
    assert probe["code"] == 0 and probe["torch"] is False and probe["transformers"] is False, (command, probe)


REFUSED_ACCOUNT_ARGUMENTS = [  # refused before anything imports resacct.account (torch): one line, exit 2, at napkin speed
    ["account", "--batch", "0"],
    ["account", "--loss", "hinge"],
    ["account", "--no-such-flag"],
    ["account", "--model", "my_pkg.models:build", "--input-dtype", "float16"],  # checked in run_account, before its imports
]


@pytest.mark.parametrize("argv", REFUSED_ACCOUNT_ARGUMENTS, ids=lambda argv: " ".join(argv[1:3]))
def test_a_refused_account_argument_never_imports_torch(argv):
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    *lines, last = done.stderr.strip().splitlines()
    probe = json.loads(last)
    assert probe["code"] == 2 and probe["torch"] is False, (probe, lines)
    assert len(lines) == 1 and lines[0].startswith(("resacct account: error: ", "resacct: error: unrecognized arguments")), lines


def test_resacct_memory_starts_fast():
    """The bar is 0.3 s; best of three, under a bound a busy shared machine still meets (torch alone takes ~1 s)."""
    argv = ["memory", "--params", "7B"]
    best = min(_fresh_process(argv)["seconds"] for _ in range(3))
    wall = time.perf_counter()
    subprocess.run([sys.executable, "-m", "resacct", *argv], capture_output=True, check=True, timeout=120)
    assert best < 0.5 and time.perf_counter() - wall < 2.0, best


def test_the_command_table_names_what_each_module_registers():
    parser = build_parser()
    subparsers = subparsers_of(parser)
    registered = {}
    for module in _command_modules():
        before = set(subparsers.choices)
        module.register(subparsers)  # type: ignore[attr-defined]
        registered.update({name: module.__name__.rsplit(".", 1)[-1] for name in set(subparsers.choices) - before})
    assert registered == COMMAND_MODULES


def test_the_optimizer_words_of_napkin_tables_are_the_account_tables():
    from resacct.account.load.optimizers import OPTIMIZER_NAMES, optimizer_display_name
    from resacct.facts.optimizer_state import OPTIMIZER_DISPLAY_NAMES

    assert {name: optimizer_display_name(name) for name in OPTIMIZER_NAMES} == OPTIMIZER_DISPLAY_NAMES


def test_shipped_config_names_are_the_account_ones():
    from resacct.account.load.hf_models import known_hf_configs
    from resacct.cli._model_args import shipped_hf_config_names

    assert shipped_hf_config_names() == list(known_hf_configs())


def test_the_shipped_names_are_read_once_a_process_and_handed_out_as_copies():
    """Every parser asks for them (three times a command): the file is read once (issue 34)."""
    from resacct.cli import _model_args

    _model_args._shipped_hf_config_names.cache_clear()
    first = _model_args.shipped_hf_config_names()
    first.append("not-a-config")
    assert "not-a-config" not in _model_args.shipped_hf_config_names()
    assert _model_args._shipped_hf_config_names.cache_info().misses == 1
