"""The compute commands end to end: ``resacct flops | time | fit | mfu | roofline | devices``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resacct.cli import main

COMMANDS = ["flops", "time", "fit", "mfu", "roofline", "devices"]


def run_json(capsys, *argv: str) -> dict:
    status = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return json.loads(captured.out)


def run_error(capsys, *argv: str) -> str:
    status = main(list(argv))
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"resacct {argv[0]}: error: "), lines[0]
    return lines[0]


# --- the lecture's napkin numbers --------------------------------------------------------------


def test_flops_70b_15t(capsys):
    fields = run_json(capsys, "flops", "--params", "70e9", "--tokens", "15T")
    assert fields["training_flops"] == pytest.approx(6.3e24)
    eu, us = fields["thresholds"]
    assert (eu["threshold_flops"], eu["above"], eu["ratio"]) == (1e25, False, pytest.approx(0.63))
    assert (us["threshold_flops"], us["in_force"]) == (1e26, False)


def test_flops_gpt3_is_3_14e23(capsys):
    fields = run_json(capsys, "flops", "--params", "175B", "--tokens", "300B")
    assert fields["training_flops"] == pytest.approx(3.14e23, rel=0.005)


def test_time_144_days(capsys):
    fields = run_json(capsys, "time", "--params", "70e9", "--tokens", "15e12", "--devices", "1024", "--device", "h100",
                      "--dtype", "bf16", "--mfu", "0.5")
    assert fields["training_days"] == pytest.approx(144, rel=0.001)
    assert fields["flops_per_day"] == pytest.approx(4.377e22, rel=0.001)
    assert fields["peak_flops_per_sec"] == 989.5e12 and fields["device"] == "h100-sxm" and fields["sparse"] is False
    assert fields["device_hours"] == pytest.approx(fields["training_days"] * 24 * 1024)


def test_time_from_flops_and_sparse_peak(capsys):
    fields = run_json(capsys, "time", "--flops", "6.3e24", "--devices", "1024", "--device", "NVIDIA H100 80GB HBM3", "--sparse")
    assert fields["training_days"] == pytest.approx(72.0, rel=0.001)


def test_fit_40b(capsys):
    fields = run_json(capsys, "fit", "--devices", "8", "--device", "h100", "--bytes-per-param", "16", "--zero", "3")
    assert fields["max_parameters"] == pytest.approx(40e9)
    assert fields["total_memory_bytes"] == 640e9
    fields = run_json(capsys, "fit", "--devices", "8", "--memory-gb", "80", "--zero", "3")
    assert fields["max_parameters"] == pytest.approx(40e9)


def test_mfu_from_step_time_and_from_throughput(capsys):
    by_step = run_json(capsys, "mfu", "--params", "7B", "--tokens", "4M", "--step-time", "12.5", "--devices", "64", "--device", "h100")
    by_rate = run_json(capsys, "mfu", "--params", "7B", "--tokens-per-sec", "320000", "--devices", "64", "--device", "h100")
    assert by_step["mfu"] == pytest.approx(by_rate["mfu"]) == pytest.approx(6 * 7e9 * 320000 / 64 / 989.5e12)
    assert by_step["above_peak"] is False


def test_mfu_above_peak_is_flagged(capsys):
    fields = run_json(capsys, "mfu", "--params", "70B", "--tokens-per-sec", "1e6", "--device", "a100")
    assert fields["above_peak"] is True and fields["mfu"] > 1


def test_devices_lists_the_table(capsys):
    fields = run_json(capsys, "devices")
    names = [device["name"] for device in fields["devices"]]
    assert {"a100-sxm-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200"} <= set(names)
    h100 = next(device for device in fields["devices"] if device["name"] == "h100-sxm")
    assert h100["peaks_flops_per_sec"]["bf16"] == {"dense": 989.5e12, "sparse": 1979e12}
    assert h100["bf16_dense_intensity_flops_per_byte"] == pytest.approx(295.4, rel=1e-3)


def test_devices_one_by_cuda_name(capsys):
    fields = run_json(capsys, "devices", "NVIDIA H200")
    assert [device["name"] for device in fields["devices"]] == ["h200-sxm"]
    assert main(["devices", "h200"]) == 0
    assert "NVIDIA H200 Tensor Core GPU datasheet" in capsys.readouterr().out


def test_roofline_of_a_datasheet(capsys):
    fields = run_json(capsys, "roofline", "--device", "h100", "--dtype", "bf16")
    assert fields["roofline"]["ridge_point_flops_per_byte"] == pytest.approx(295.4, rel=1e-3)
    bounds = {(row["name"], row["size"]): row["bound"] for row in fields["operations"]}
    assert bounds[("relu", 2**24)] == bounds[("gelu", 2**24)] == bounds[("matvec", 8192)] == "memory"
    assert bounds[("matmul", 8192)] == "compute"


@pytest.mark.slow
def test_roofline_measured_here_with_png(capsys, tmp_path):
    png = tmp_path / "roofline.png"
    fields = run_json(capsys, "roofline", "--quick", "--png", str(png))
    assert fields["roofline"]["measured"] is True and fields["roofline"]["threads"] == 1
    rows = {row["name"]: row for row in fields["operations"]}
    assert rows["add"]["bound"] == "memory" and rows["matmul"]["bound"] == "compute"
    assert all(row["median_sec"] > 0 for row in fields["operations"])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_text_output(capsys):
    assert main(["time", "--params", "70B", "--tokens", "15T", "--devices", "1024"]) == 0
    out = capsys.readouterr().out
    assert "143.9 days" in out and "989.5 TFLOP/s" in out


# --- help and errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"resacct {command}" in out and "--json" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["flops", "--params", "0", "--tokens", "15T"], "argument --params: '0' must be greater than 0"),
        (["flops", "--params", "-70e9", "--tokens", "15T"], "must be greater than 0"),
        (["flops", "--params", "nan", "--tokens", "15T"], "'nan' is not finite"),
        (["flops", "--params", "seventy", "--tokens", "15T"], "'seventy' is not a number"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "0"], "argument --devices: '0' must be a whole number greater than 0"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--mfu", "1.5"], r"argument --mfu: '1.5' must be in (0, 1]"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--mfu", "0"], r"must be in (0, 1]"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--device", "h100sxm"], "did you mean 'h100-sxm'"),
        (["time", "--params", "70B", "--devices", "8"], "give --params and --tokens"),
        (["time", "--flops", "1e24", "--params", "70B", "--tokens", "15T", "--devices", "8"], "not both"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--dtype", "fp7"], "unknown peak format 'fp7'"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--device", "a100", "--dtype", "fp8"], "a100-sxm-80gb has no fp8 peak"),
        (["time", "--params", "70B", "--tokens", "15T", "--devices", "8", "--dtype", "fp32", "--sparse"], "no structured-sparsity peak"),
        (["fit", "--devices", "8"], "give exactly one of --memory-gb"),
        (["fit", "--devices", "8", "--memory-gb", "-80"], "must be greater than 0"),
        (["mfu", "--params", "7B", "--step-time", "1"], "give --tokens-per-sec, or --step-time"),
        (["mfu", "--params", "7B", "--tokens", "4M", "--step-time", "0"], "argument --step-time: '0' must be greater than 0"),
        (["roofline", "--device", "h100", "--threads", "2"], "--threads and --cuda are for measuring"),
        (["roofline", "--sparse"], "--sparse applies to a datasheet roofline"),
        (["devices", "b900"], "unknown accelerator 'b900'"),  # b300 is in the table since issue 35
        (["flops", "--params", "70B"], "the following arguments are required: --tokens"),
    ],
)
def test_errors_are_one_line_with_status_2(capsys, argv, message):
    assert message in run_error(capsys, *argv)


# --- the installed script --------------------------------------------------------------------------


@pytest.mark.slow
def test_installed_script_runs():
    script = Path(sys.executable).with_name("resacct")
    if not script.exists():
        pytest.skip(f"no installed resacct script next to {sys.executable}")
    done = subprocess.run([str(script), "time", "--params", "70e9", "--tokens", "15e12", "--devices", "1024", "--device", "h100",
                           "--mfu", "0.5", "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["training_days"] == pytest.approx(143.9, rel=1e-3)


# ---- fit with ZeRO stages (sharding issue) ----------------------------------------------------

def _fit_json(capsys, *arguments: str) -> dict:
    import json

    from resacct.cli import main as cli_main

    assert cli_main(["fit", "--devices", "8", "--device", "h100", "--json", *arguments]) == 0
    return json.loads(capsys.readouterr().out)


def test_fit_default_is_zero_stage_0_as_in_every_command_and_says_so(capsys):
    from resacct.cli import main as cli_main

    fields = _fit_json(capsys)
    assert fields["max_parameters"] == pytest.approx(5e9) and fields["zero_stage"] == 0 and fields["zero_stage_is_default"] is True
    assert _fit_json(capsys, "--zero", "3")["max_parameters"] == pytest.approx(40e9)  # the lecture's napkin answer: all state sharded
    assert cli_main(["fit", "--devices", "8", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 0 (default; nothing sharded" in out and "largest model: 5 billion parameters" in out


def test_fit_plain_data_parallel_fits_one_device_worth(capsys):
    assert _fit_json(capsys, "--zero", "0")["max_parameters"] == pytest.approx(5e9)


@pytest.mark.parametrize(("stage", "expected"), [(1, 80e9 / (2 + 2 + 12 / 8)), (2, 80e9 / (2 + 14 / 8))])
def test_fit_partial_sharding_with_a_recipe(capsys, stage, expected):
    fields = _fit_json(capsys, "--recipe", "mixed-adam", "--zero", str(stage))
    assert fields["max_parameters"] == pytest.approx(expected)
    assert fields["recipe"] == "bf16-fp32-master" and fields["moment"] == "after_backward"  # mixed-adam is its alias, with Adam


def test_fit_partial_sharding_needs_a_recipe(capsys):
    from resacct.cli import main as cli_main

    assert cli_main(["fit", "--devices", "8", "--device", "h100", "--zero", "2"]) == 2
    assert "give --recipe" in capsys.readouterr().err


# --- boards with third-party figures are flagged wherever they are used ---------------------------

THIRD_PARTY_NOTE = "figures are from third-party tables, unconfirmed by the vendor"


def test_devices_flags_third_party_boards(capsys):
    assert main(["devices"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    for name in ("h800-sxm", "h20", "v100-pcie-16gb", "mi325x"):
        assert lines[name].endswith("[third-party: unconfirmed by the vendor]"), lines[name]
    assert lines["b200"].endswith("[derived]") and lines["h100-sxm"].endswith("datasheet")
    fields = run_json(capsys, "devices", "h20")
    assert fields["devices"][0]["confidence"] == "third-party"


@pytest.mark.parametrize(
    "argv",
    [
        ["mfu", "--params", "7B", "--tokens-per-sec", "3000", "--device", "h20", "--dtype", "fp16"],
        ["mfu", "--achieved-tflops", "100", "--device", "h800", "--dtype", "fp8"],
        ["time", "--params", "70B", "--tokens", "15T", "--devices", "1024", "--device", "mi325x", "--mfu", "0.4"],
        ["roofline", "--device", "mi325x"],
        ["fit", "--devices", "8", "--device", "v100-pcie", "--bytes-per-param", "16", "--zero", "3"],
        ["optimal", "--flops", "1e23", "--device", "mi325x"],
        ["plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--device", "h20", "--dp", "8", "--zero", "3"],
    ],
)
def test_outputs_using_a_third_party_board_say_so(capsys, argv):
    assert main(argv) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("  note: ") and THIRD_PARTY_NOTE in last, last
    assert THIRD_PARTY_NOTE in run_json(capsys, *argv)["source_caveat"]


def test_outputs_using_a_vendor_board_carry_no_caveat(capsys):
    assert run_json(capsys, "mfu", "--achieved-tflops", "400", "--device", "h100")["source_caveat"] is None
    assert main(["time", "--params", "70B", "--tokens", "15T", "--devices", "1024", "--device", "h100"]) == 0
    assert "third-party" not in capsys.readouterr().out
