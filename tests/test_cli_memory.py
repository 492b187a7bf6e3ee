"""``resacct memory``: per-rank memory under ZeRO stages, fits, largest model; errors exit 2."""

from __future__ import annotations

import json

import pytest

from resacct.cli import main


def _json(capsys, *argv: str) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_zero_paper_example_as_json(capsys):
    report = _json(capsys, "--params", "7.5B", "--recipe", "mixed-adam", "--zero", "1", "--devices", "64")
    assert report["parameters"] == 7.5e9
    assert report["zero_stage"] == 1 and report["devices"] == 64 and report["sharded"] == ["optimizer_state"]
    assert report["parameters_bytes_per_rank"] == 15e9
    assert report["gradients_bytes_per_rank"] == 15e9
    assert report["optimizer_state_bytes_per_rank"] == pytest.approx(1.40625e9)
    assert report["total_bytes_per_rank"] == pytest.approx(31.40625e9)
    by_stage = report["total_bytes_per_rank_by_stage"]
    assert [round(by_stage[s] / 1e9, 1) for s in "0123"] == [120.0, 31.4, 16.6, 1.9]


def test_params_accept_plain_and_suffixed_numbers(capsys):
    assert _json(capsys, "--params", "7.5e9")["total_bytes_per_rank"] == _json(capsys, "--params", "7.5B")["total_bytes_per_rank"] == 120e9


def test_eight_h100s_fit_40b_only_when_fully_sharded(capsys):
    sharded = _json(capsys, "--params", "40B", "--zero", "3", "--devices", "8", "--device", "h100")
    assert sharded["device"] == "h100-sxm" and sharded["device_memory_bytes"] == 80e9
    assert sharded["fits"] is True and sharded["largest_model_parameters"] == 40e9
    replicated = _json(capsys, "--params", "40B", "--zero", "0", "--devices", "8", "--device-memory-gb", "80")
    assert replicated["fits"] is False and replicated["largest_model_parameters"] == 5e9
    assert replicated["spare_bytes_per_rank"] == pytest.approx(80e9 - 640e9)


def test_largest_model_without_params(capsys):
    report = _json(capsys, "--zero", "2", "--devices", "8", "--device-memory-gb", "80")
    assert report["parameters"] is None and "total_bytes_per_rank" not in report
    assert report["largest_model_parameters"] == pytest.approx(80e9 / 5.5, rel=1e-9)


def test_custom_recipe(capsys):
    assert _json(capsys, "--params", "1B", "--recipe", "2+2+12")["total_bytes_per_rank"] == 16e9


def test_text_output_names_every_piece_and_the_verdict(capsys):
    assert main(["memory", "--params", "40B", "--zero", "0", "--devices", "8", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    for fragment in ("parameters", "gradients", "optimizer state", "640.00 GB per rank", "does NOT fit",
                     "largest model that fits 8 × 80.00 GB at ZeRO stage 0: 5 billion parameters", "not counted"):
        assert fragment in out


def test_help_has_an_example(capsys):
    assert main(["memory", "--help"]) == 0
    out = capsys.readouterr().out
    assert "resacct memory --params 7.5B --recipe mixed-adam --zero 1 --devices 64" in out
    assert "mixed-adam" in out and "--device-memory-gb" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--params", "1e9", "--devices", "0"], "argument --devices: '0' must be a whole number greater than 0"),
        (["--params", "1e9", "--devices", "-4"], "argument --devices"),
        (["--params", "1e9", "--zero", "4"], "argument --zero: invalid choice: 4 (choose from 0, 1, 2, 3)"),
        (["--params", "1e9", "--zero", "-1"], "argument --zero: invalid choice: -1"),
        (["--params", "nan"], "argument --params: 'nan' is not finite"),
        (["--params", "-5"], "argument --params: '-5' must be greater than 0"),
        (["--params", "1e9", "--device-memory-gb", "nan"], "argument --device-memory-gb: 'nan' is not finite"),
        (["--params", "1e9", "--recipe", "fp32-adam"], "argument --recipe: unknown precision recipe 'fp32-adam'; did you mean 'fp32-adamw'"),
        (["--params", "1e9", "--device", "h100", "--device-memory-gb", "80"], "argument --device-memory-gb: not allowed with argument --device"),
    ],
)
def test_bad_arguments_exit_2_with_argparses_error_line(capsys, argv, fragment):
    assert main(["memory", *argv]) == 2
    err = capsys.readouterr().err
    assert f"resacct memory: error: {fragment}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--params", "3", "--devices", "8"], "parameter count 3.0 is smaller than world size 8"),
        (["--params", "1B", "--device", "h1000"], "unknown accelerator 'h1000'; did you mean 'h100'"),
        ([], "nothing to answer: give --params N"),
    ],
)
def test_impossible_requests_exit_2_with_one_line(capsys, argv, fragment):
    assert main(["memory", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"resacct memory: error: {fragment}")


def test_precision_recipe_names_of_resacct_memory_are_accepted(capsys):
    report = _json(capsys, "--params", "7.5B", "--recipe", "bf16-fp32-master", "--zero", "2", "--devices", "64")
    assert report["total_bytes_per_rank"] == pytest.approx(16.640625e9)
