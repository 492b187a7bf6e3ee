"""Every subcommand refuses bad input the same way: exit status 2 and one line on stderr that
says what was wrong — never a traceback. One row per (command, bad input)."""

from __future__ import annotations

import json

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
    # an option the command does not take names the command's own --help (it has the options), not the top level's
    (["shard", "--ranks", "8"], "resacct shard: error: unrecognized arguments: --ranks 8 (see 'resacct shard --help')"),
    (["memory", "--params", "7e9", "--foo", "3"], "resacct memory: error: unrecognized arguments: --foo 3 (see 'resacct memory --help')"),
    (["--bogus"], "resacct: error: unrecognized arguments: --bogus (see 'resacct --help')"),
    (["memory", "--params", "0"], "'0' must be greater than 0"),
    (["memory", "--params", "7.5B", "--zero", "7"], "invalid choice: 7"),
    (["memory", "--params", "7.5B", "--devices", "0"], "must be a whole number greater than 0"),
    (["memory", "--params", "7.5B", "--device", "a1000"], "unknown accelerator 'a1000'"),
    (["memory", "--params", "nan"], "'nan' is not finite"),
    (["verify", "--specs", "/no/such/folder"], "specs folder '/no/such/folder' does not exist"),
    (["verify", "--area", "flopz"], "unknown area 'flopz'; did you mean 'flops'?"),
    (["verify", "--merge", "/no/such/report.json"], "report '/no/such/report.json' does not exist"),
    (["verify", "--workers", "-2"], "--workers must be 1 or more (1: every claim in this process), got -2"),
    (["account", "--model", "gpt2-smal"], "unknown model config 'gpt2-smal'"),
    (["account", "--batch", "0"], "'0' must be a whole number greater than 0"),
    (["account", "--batch", "-4"], "must be a whole number greater than 0"),
    (["account", "--seq", "100000"], "seq 100000 is longer than the model's context length 128"),
    (["account", "--model", "no.such.module:build"], "cannot import 'no.such.module'"),
    (["account", "--model", "resacct.training.models:Nope"], "module 'resacct.training.models' has no attribute 'Nope'"),
    (["account", "--optimizer", "lion"], "invalid choice: 'lion'"),
    (["account", "--recipe", "fp3"], "unknown precision recipe 'fp3'; did you mean 'fp32'?"),
    (["account", "--model", "resacct.training.models:Cruncher", "--model-arg", "dim"], "expected key=value"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
    # issue 26: absurd values are refused, never a traceback
    (["optimal", "--flops", "1e24", "--mfu", "1e-300", "--goodput", "1e-300", "--device", "h100"], "'1e-300' is too small for a utilisation"),
    (["time", *NAPKIN, "--devices", "1e300", "--device", "h100", "--json"], "'1e300' is too large; expected a whole number up to 2^53"),
    (["plan", "--hidden", "1e300", "--heads", "64", "--layers", "80", "--seq", "4096", "--params", "70B", "--device", "h100"], "'1e300' is too large"),
    (["plan", "--hidden", "8192", "--heads", "63", "--layers", "80", "--seq", "4096", "--params", "70B", "--device", "h100"],
     "--hidden 8192 is not a multiple of --heads 63"),
    (["plan", "--hidden", "8192", "--heads", "64", "--kv-heads", "3", "--layers", "80", "--seq", "4096", "--params", "70B", "--device", "h100"],
     "--kv-heads 3 does not divide --heads 64"),
    (["roofline", "--png", "x.txt"], "--png 'x.txt' does not end in an image format matplotlib writes"),
    (["roofline", "--png", ""], "--png '' is empty"),
    (["roofline", "--threads", "100000"], "--threads 100000: this machine has"),
    (["devices", ""], "accelerator name '' is empty"),
    (["verify", "--workers", "100000"], "--workers 100000: this machine has"),
    # issue 26, round three: the guards of resacct account, optimal below the Chinchilla fits, plan's 1e300 memory
    (["account", "--timeout", "0"], "argument --timeout: '0' must be seconds above 0"),
    (["account", "--timeout", "1e12"], "at most a year"),
    (["account", "--max-memory", "8XB"], "argument --max-memory: '8XB' is not a memory size"),
    (["account", "--model", "resacct.account.answers.generic:mlp", "--input-dtype", "float16"], "--input-dtype float16 applies to --input-shape's tensor"),
    (["optimal", "--flops", "1"], "a budget of 1 FLOPs gives approach 1 0.0992 parameters"),
    (["plan", "--hidden", "8192", "--heads", "64", "--layers", "80", "--seq", "4096", "--params", "70B", "--memory-gb", "1e300"],
     "--memory-gb 1e+300 is too large"),
    # issue 36, round four
    (["plan", "--hidden", "8192", "--heads", "64", "--layers", "80", "--seq", "4096", "--params", "1e300", "--memory-gb", "80"],
     "argument --params: '1e300' is too large; expected a parameter count up to 2^53"),
    (["flops", "--params", "1e-320", "--tokens", "15e12"], "argument --params: '1e-320' is below 1; expected a count of at least 1"),
    (["flops", "--params", "70B", "--tokens", "0.5"], "argument --tokens: '0.5' is below 1"),
    (["fit", "--devices", "8", "--device", "h100", "--recipe", "-2+2+12"], "argument --recipe: recipe '-2+2+12': '-2' bytes must be a finite number ≥ 0"),
    (["memory", "--params", "7B", "--recipe", "-2 + 2 + 12"], "recipe '-2 + 2 + 12': '-2' bytes must be a finite number ≥ 0"),
    (["verify", "--area", "dtypes", "--report-dir", ""], "argument --report-dir: '' is empty; expected a folder for the report files"),
    (["verify", "--merge", "report.json", "--report-dir", " "], "argument --report-dir: ' ' is empty"),
    (["plan", "--hidden", "8192", "--heads", "64", "--layers", "80", "--seq", "4096", "--params", "70B", "--memory-gb", "80", "--pp", "4",
      "--interleave", "7"], "an interleaved schedule of 7 chunks per stage splits each stage's 20 layers into equal chunks"),
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
    """9·10^15 devices (about the most a count takes: 2^53; 10^30 and 1e300 are refused since
    issue 26) is absurd but well-defined: a tiny, finite number of days and the same device-hours
    as with 1024 devices (the work does not change)."""
    import json
    import math

    assert main(["time", *NAPKIN, "--devices", "9e15", "--device", "h100", "--json"]) == 0
    absurd = json.loads(capsys.readouterr().out)
    assert main(["time", *NAPKIN, "--devices", "1024", "--device", "h100", "--json"]) == 0
    sane = json.loads(capsys.readouterr().out)
    assert 0 < absurd["training_days"] < 1e-9 and math.isfinite(absurd["training_days"])
    assert absurd["device_hours"] == pytest.approx(sane["device_hours"])


@pytest.mark.parametrize("command", ["flops", "time", "fit", "mfu", "roofline", "devices", "memory", "verify", "account"])
def test_every_command_has_help_with_an_example(command, capsys):
    assert main([command, "--help"]) == 0
    assert "example" in capsys.readouterr().out.lower()


def _strict_json(text: str):
    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


_BAD_DIR = "; --report-dir needs a directory resacct may create and write"
_NOT_A_REPORT = "resacct verify: error: report '{tmp}/r.json' is not a resacct report: "

# (arguments, files to create first as {name: text}, the exact line on stderr); {tmp} is a fresh folder.
EXACT_CASES = [
    (["flops", "--params", "1,5T", "--tokens", "1e12"], {},
     "resacct flops: error: argument --params: '1,5T': a comma may only separate groups of three digits (1,500,000); "
     "for a fraction write a point, e.g. '1.5T' (see 'resacct flops --help')"),
    (["time", "--params", "70B", "--tokens", "15,00T", "--device", "h100"], {},
     "resacct time: error: argument --tokens: '15,00T': a comma may only separate groups of three digits (1,500,000); "
     "for a fraction write a point, e.g. '15.00T' (see 'resacct time --help')"),
    (["verify", "--report-dir", "{tmp}/a-file"], {"a-file": "x"},
     "resacct verify: error: report directory '{tmp}/a-file' is a file" + _BAD_DIR),
    (["verify", "--report-dir", "{tmp}/a-file/reports"], {"a-file": "x"},
     "resacct verify: error: report directory '{tmp}/a-file/reports' cannot be created ('{tmp}/a-file' is a file)" + _BAD_DIR),
    (["verify", "--report-dir", "/proc/version/reports"], {},
     "resacct verify: error: report directory '/proc/version/reports' cannot be created ('/proc/version' is a file)" + _BAD_DIR),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": "hello"},
     "resacct verify: error: report '{tmp}/r.json' is not valid JSON: Expecting value (line 1, column 1)"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {"torch": "2.4"}, "claims": [{"id": "a", "ar'},
     "resacct verify: error: report '{tmp}/r.json' is not valid JSON (cut short?): Unterminated string starting at (line 1, column 58)"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": "[1, 2]"},
     _NOT_A_REPORT + "the top level is a list; expected an object with keys 'environment' and 'claims'"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"claims": []}'},
     _NOT_A_REPORT + "missing key 'environment' (expected keys 'environment' and 'claims')"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {}, "claims": "all of them"}'},
     _NOT_A_REPORT + "'claims' is a string; expected a list of claim records"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {}, "claims": [{"id": 7, "area": "x", "outcome": "holds"}]}'},
     _NOT_A_REPORT + "claims[0] key 'id' is a number; expected a string"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {}, "claims": [{"id": "a", "area": "x", "outcome": "great"}]}'},
     _NOT_A_REPORT + "claims[0] ('a') has outcome 'great'; expected one of holds, refuted, skipped, inconclusive, failed, invalid"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {"torch": NaN}, "claims": []}'},
     "resacct verify: error: report '{tmp}/r.json' is not valid JSON: it holds NaN, which strict JSON does not allow"),
    (["verify", "--merge", "{tmp}/r.json"], {"r.json": '{"environment": {}, "claims": [{"id": "a", "area": "x", "outcome": "holds", "measured": -Infinity}]}'},
     "resacct verify: error: report '{tmp}/r.json' is not valid JSON: it holds -Infinity, which strict JSON does not allow"),
    (["verify", "--merge", "{tmp}"], {},
     "resacct verify: error: report '{tmp}' is a directory; give the report.json inside it"),
    (["verify", "--merge", "{tmp}/r.json", "--report-dir", "{tmp}/a-file"],
     {"r.json": '{"environment": {}, "claims": []}', "a-file": "x"},
     "resacct verify: error: report directory '{tmp}/a-file' is a file" + _BAD_DIR),
    (["roofline", "--png", "/missing/dir/x.png"], {},
     "resacct roofline: error: --png '/missing/dir/x.png': folder '/missing/dir' does not exist; create it first or give another path"),
    (["roofline", "--device", "h100", "--png", "{tmp}"], {},
     "resacct roofline: error: --png '{tmp}' is a directory; give a file name such as '{tmp}/roofline.png'"),
]


@pytest.mark.parametrize(("arguments", "files", "line"), EXACT_CASES, ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_bad_input_exits_2_with_exactly_this_line(arguments, files, line, tmp_path, capsys):
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert main([argument.replace("{tmp}", str(tmp_path)) for argument in arguments]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line.replace("{tmp}", str(tmp_path))]
    assert "Traceback" not in captured.out


def test_thousands_groups_are_still_numbers():
    from resacct.cli.arguments import count

    assert count("1,500,000") == 1_500_000 and count("1,500T") == 1.5e15 and count("12,345.5") == 12345.5


EXTREMES = [
    ["flops", "--params", "1e300", "--tokens", "1e-300"],
    ["time", "--flops", "1e300", "--devices", "1", "--device", "h100", "--mfu", "1e-300"],
    ["time", "--flops", "1e-300", "--devices", "1e300", "--device", "h100"],
    ["fit", "--devices", "1e300", "--memory-gb", "1e300"],
    ["fit", "--devices", "1", "--memory-gb", "1e-300"],
    ["mfu", "--params", "1e300", "--tokens-per-sec", "1e300", "--device", "h100"],
    ["mfu", "--params", "1e-300", "--tokens-per-sec", "1e-300", "--device", "h100"],
    ["memory", "--params", "1e300"],
    ["memory", "--params", "1e300", "--devices", "1e300", "--zero", "3"],
    ["optimal", "--flops", "1e300", "--device", "h100", "--devices", "1e300"],
    ["optimal", "--flops", "1e-300", "--device", "h100"],
]


@pytest.mark.parametrize("arguments", EXTREMES, ids=" ".join)
def test_json_is_strict_and_text_names_no_inf_or_zero_days_at_extremes(arguments, capsys):
    """1e300 and 1e-300 overflow and underflow floats: --json writes null for what a float cannot
    hold (never Infinity or NaN, which strict parsers refuse); text says it in words."""
    code = main([*arguments, "--json"])
    captured = capsys.readouterr()
    if code == 2:  # refused with one line (an input the command cannot use) is fine too
        assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err
        return
    assert code == 0, captured.err
    _strict_json(captured.out)
    assert main(arguments) == 0
    text = capsys.readouterr().out
    for wrong in ("inf days", "0.0 days", " inf ", "nan", "Infinity"):
        assert wrong not in text, (wrong, text)


def test_an_mfu_above_the_peak_is_answered_with_a_warning(capsys):
    """issue 26: 2000 TFLOP/s on an H100 (989.5 bf16 peak) printed utilization 2.02 and nothing else."""
    assert main(["mfu", "--achieved-tflops", "2000", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "utilization: 2.021" in out and "warning: 2.02× the datasheet peak is impossible" in out
    assert main(["mfu", "--achieved-tflops", "400", "--device", "h100"]) == 0
    assert "warning" not in capsys.readouterr().out
