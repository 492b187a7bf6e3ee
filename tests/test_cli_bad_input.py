"""Every subcommand refuses bad input the same way: exit status 2 and one line on stderr that
says what was wrong — never a traceback. One row per (command, bad input)."""

from __future__ import annotations

import pytest

from resacct.cli import main

NAPKIN = ["--params", "70e9", "--tokens", "15e12"]

CASES = [
    # (arguments, a fragment the one-line message must contain)
    (["flops", "--params", "0", "--tokens", "15e12"], "'0' must be greater than 0"),
    (["flops", "--params", "-70e9", "--tokens", "15e12"], "'-70e9' must be greater than 0"),
    (["flops", "--params", "nan", "--tokens", "15e12"], "'nan' is not finite"),
    (["flops", "--params", "inf", "--tokens", "15e12"], "'inf' is not finite"),
    (["flops", "--params", "seventy", "--tokens", "15e12"], "'seventy' is not a number"),
    (["flops", "--tokens", "15e12"], "the following arguments are required: --params"),
    (["flops", *NAPKIN, "--bogus"], "unrecognized arguments: --bogus"),
    (["time", *NAPKIN, "--devices", "0", "--device", "h100"], "must be a whole number greater than 0"),
    (["time", *NAPKIN, "--devices", "1.5", "--device", "h100"], "must be a whole number greater than 0"),
    (["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--mfu", "1.5"], "must be in (0, 1]"),
    (["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--mfu", "0"], "must be in (0, 1]"),
    (["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--mfu", "nan"], "'nan' is not finite"),
    (["time", *NAPKIN, "--devices", "1024", "--device", "h1000"], "unknown accelerator 'h1000'; did you mean"),
    (["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--dtype", "fp7"], "fp7"),
    (["fit", "--devices", "8"], "give exactly one of --memory-gb (per device) or --device NAME"),
    (["fit", "--devices", "8", "--memory-gb", "-80"], "'-80' must be greater than 0"),
    (["fit", "--devices", "8", "--device", "h100", "--zero", "4"], "invalid choice: 4"),
    (["fit", "--devices", "8", "--device", "h100", "--zero", "1"], "give --recipe"),
    (["fit", "--devices", "8", "--device", "h100", "--recipe", "mystery"], "mystery"),
    (["mfu", "--params", "7B", "--devices", "8", "--device", "h100"], "give --tokens-per-sec, or --step-time"),
    (["mfu", "--params", "7B", "--tokens", "4M", "--step-time", "0", "--device", "h100"], "'0' must be greater than 0"),
    (["mfu", "--params", "7B", "--tokens-per-sec", "inf", "--device", "h100"], "'inf' is not finite"),
    (["roofline", "--device", "tpu-v9"], "unknown accelerator 'tpu-v9'"),
    (["roofline", "--threads", "0"], "must be a whole number greater than 0"),
    (["roofline", "--sparse"], "--sparse applies to a datasheet roofline"),
    (["devices", "--color"], "unrecognized arguments: --color"),
    (["memory", "--params", "0"], "'0' must be greater than 0"),
    (["memory", "--params", "7.5B", "--zero", "7"], "invalid choice: 7"),
    (["memory", "--params", "7.5B", "--devices", "0"], "must be a whole number greater than 0"),
    (["memory", "--params", "7.5B", "--device", "a1000"], "unknown accelerator 'a1000'"),
    (["memory", "--params", "nan"], "'nan' is not finite"),
    (["verify", "--specs", "/no/such/folder"], "specs folder '/no/such/folder' does not exist"),
    (["verify", "--area", "flopz"], "unknown area 'flopz'; did you mean 'flops'?"),
    (["verify", "--merge", "/no/such/report.json"], "report '/no/such/report.json' does not exist"),
    (["verify", "--workers", "-2"], "--workers must be 0 or more, got -2"),
    (["account", "--model", "gpt2-smal"], "unknown model config 'gpt2-smal'"),
    (["account", "--batch", "0"], "'0' must be a whole number greater than 0"),
    (["account", "--batch", "-4"], "must be a whole number greater than 0"),
    (["account", "--seq", "100000"], "seq 100000 is longer than the model's context length 128"),
    (["account", "--model", "no.such.module:build"], "cannot import 'no.such.module'"),
    (["account", "--model", "resacct.models:Nope"], "module 'resacct.models' has no attribute 'Nope'"),
    (["account", "--optimizer", "lion"], "invalid choice: 'lion'"),
    (["account", "--recipe", "fp3"], "unknown state recipe 'fp3'; did you mean 'fp32'?"),
    (["account", "--model", "resacct.models:Cruncher", "--model-arg", "dim"], "expected key=value"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
]


@pytest.mark.parametrize(("arguments", "fragment"), CASES, ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_bad_input_exits_2_with_one_line(arguments, fragment, capsys):
    assert main(arguments) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert fragment in lines[0]
    assert lines[0].startswith("resacct")
    assert "Traceback" not in captured.err + captured.out


def test_absurd_but_valid_values_are_answered_not_crashed(capsys):
    """10^30 devices is absurd but well-defined: a tiny, finite number of days and the same
    device-hours as with 1024 devices (the work does not change)."""
    import json
    import math

    assert main(["time", *NAPKIN, "--devices", "1e30", "--device", "h100", "--json"]) == 0
    absurd = json.loads(capsys.readouterr().out)
    assert main(["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--json"]) == 0
    sane = json.loads(capsys.readouterr().out)
    assert 0 < absurd["training_days"] < 1e-20 and math.isfinite(absurd["training_days"])
    assert absurd["device_hours"] == pytest.approx(sane["device_hours"])


@pytest.mark.parametrize("command", ["flops", "time", "fit", "mfu", "roofline", "devices", "memory", "verify", "account"])
def test_every_command_has_help_with_an_example(command, capsys):
    assert main([command, "--help"]) == 0
    assert "example" in capsys.readouterr().out.lower()
