"""``resacct run`` and resacct.formulas.run_accounting: any one rate gives all the others, exactly."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.formulas.run_accounting import GIVEN_QUANTITIES, account_run, flops_per_token

_positive = st.floats(min_value=1e-3, max_value=1e30, allow_nan=False, allow_infinity=False)
_params = st.floats(min_value=1e3, max_value=1e13)
_tokens = st.floats(min_value=1e3, max_value=1e15)
_devices = st.integers(min_value=1, max_value=200_000)
_peak = st.floats(min_value=1e9, max_value=1e17)
_share = st.floats(min_value=1e-3, max_value=1.0)


@st.composite
def _flops(draw):  # -> FlopsPerToken
    n = draw(_params)
    if draw(st.booleans()):
        return flops_per_token(n, recompute=draw(st.sampled_from(["none", "full"])))
    return flops_per_token(n, layers=draw(st.integers(1, 200)), attention_width=draw(st.integers(1, 65536)),
                           seq=draw(st.integers(1, 1 << 20)), recompute=draw(st.sampled_from(["none", "selective", "full"])))


@settings(max_examples=200, deadline=None)
@given(flops=_flops(), tokens=_tokens, devices=_devices, peak=_peak, goodput=_share, device_hours=_positive)
def test_device_hours_to_implied_mfu_and_back_is_exact(flops, tokens, devices, peak, goodput, device_hours) -> None:
    run = account_run(flops, tokens=tokens, devices=devices, peak_flops_per_sec=peak, given="device_hours", value=device_hours, goodput=goodput)
    assert run.device_hours == Fraction(repr(device_hours))  # the given value is kept exactly, read as the decimal it prints as
    assert float(run.device_hours) == device_hours
    if run.mfu <= 1:
        back = account_run(flops, tokens=tokens, devices=devices, peak_flops_per_sec=peak, given="mfu", value=run.mfu, goodput=goodput)
        assert back.device_hours == run.device_hours
        assert back == run


@settings(max_examples=100, deadline=None)
@given(flops=_flops(), tokens=_tokens, devices=_devices, peak=_peak, goodput=_share, mfu=_share)
def test_every_given_quantity_names_the_same_run(flops, tokens, devices, peak, goodput, mfu) -> None:
    run = account_run(flops, tokens=tokens, devices=devices, peak_flops_per_sec=peak, given="mfu", value=mfu, goodput=goodput)
    for quantity in GIVEN_QUANTITIES:
        value = getattr(run, quantity)
        if quantity == "hfu" and value > 1:
            continue
        again = account_run(flops, tokens=tokens, devices=devices, peak_flops_per_sec=peak, given=quantity, value=value, goodput=goodput)
        assert again.training_seconds == run.training_seconds, quantity


def test_rates_agree_with_each_other_by_hand() -> None:
    # 1e9 parameters, 1e12 tokens: 6e21 FLOPs; 100 devices of 1e15 FLOP/s at MFU 0.5 train 1.2e5 s
    run = account_run(flops_per_token(1e9), tokens=1e12, devices=100, peak_flops_per_sec=1e15, given="mfu", value=0.5,
                      goodput=0.8, cost_per_device_hour=2)
    assert run.training_seconds == 120_000
    assert run.wall_clock_seconds == 150_000
    assert run.device_hours == Fraction(100 * 150_000, 3600)
    assert run.tokens_per_sec_per_device == Fraction(10**12, 100 * 120_000)
    assert run.model_flops_per_sec_per_device == Fraction(5 * 10**14)
    assert run.mfu_over_wall_clock == Fraction(2, 5)
    assert run.cost == 2 * run.device_hours


def test_recompute_conventions() -> None:
    assert flops_per_token(10).hardware_flops == 60
    assert flops_per_token(10, recompute="full").hardware_flops == 80  # Megatron's 8·N
    shaped = flops_per_token(10, layers=2, attention_width=3, seq=5, recompute="selective")
    assert shaped.attention_flops == 12 * 2 * 3 * 5
    assert shaped.hardware_flops - shaped.model_flops == 4 * 2 * 3 * 5
    full = flops_per_token(10, layers=2, attention_width=3, seq=5, recompute="full")
    assert full.hardware_flops - full.model_flops == 2 * 10 + 4 * 2 * 3 * 5


@pytest.mark.parametrize("kwargs, match", [
    ({"recompute": "selective"}, "recomputes the attention core"),
    ({"layers": 2, "seq": 4}, "missing attention_width"),
    ({"recompute": "partial"}, "unknown recompute mode"),
])
def test_flops_per_token_refuses(kwargs, match) -> None:
    with pytest.raises(ResacctError, match=match):
        flops_per_token(1e9, **kwargs)


@pytest.mark.parametrize("given_name, value, match", [("mfu", 1.5, "mfu is 1.5; expected a fraction in"), ("days", -1, "days is -1"),
                                                     ("speed", 1, "unknown run quantity")])
def test_account_run_refuses(given_name, value, match) -> None:
    with pytest.raises(ResacctError, match=match):
        account_run(flops_per_token(1e9), tokens=1e12, devices=8, peak_flops_per_sec=1e15, given=given_name, value=value)


def _json(capsys, argv: list[str]) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_device_hours_round_trip_through_the_printed_mfu(capsys) -> None:
    base = ["--params", "671B", "--active-params", "37B", "--tokens", "14.8T", "--devices", "2048", "--device", "h800", "--dtype", "fp8"]
    first = _json(capsys, [*base, "--device-hours", "2.664M", "--cost-per-device-hour", "2"])
    assert first["model_flops_per_token"] == 6 * 37e9
    assert first["cost"] == pytest.approx(2 * 2.664e6, rel=1e-15)
    # the H800 has an fp8 and (third-party) bf16 peak: the same run is quoted against both
    assert first["mfu_by_peak_format"] == {"fp8": first["mfu"], "bf16": pytest.approx(first["mfu"] * 1979 / 990)}
    back = _json(capsys, [*base, "--mfu", repr(first["mfu"])])
    assert back["device_hours"] == pytest.approx(2.664e6, rel=4e-16)  # the printed MFU is a float: one rounding


@pytest.mark.slow  # 2.02 s idle on 2026-11-28
def test_cli_hf_config_moe_and_other_peaks(capsys) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, ["--hf-config", "mixtral-8x7b", "--tokens", "1T", "--devices", "8", "--mfu", "0.4"])
    assert (fields["parameters_total"], fields["parameters_active"]) == (46702792704, 12879925248)
    assert fields["model_flops_per_token"] == 6 * 12879925248
    assert fields["training_state_bytes"] == 20 * 46702792704  # memory follows the total
    assert fields["mfu_by_peak_format"]["fp8"] == pytest.approx(0.2)  # the H100's fp8 peak is twice its bf16


def test_cli_text_names_the_convention(capsys) -> None:
    assert main(["run", "--params", "540.35B", "--tokens", "780B", "--devices", "6144", "--device", "tpu-v4", "--convention", "attention",
                 "--layers", "118", "--attention-width", "12288", "--seq", "2048", "--recompute", "full", "--hfu", "0.578", "--goodput", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "6·N + 12·L·h·s (+ recompute full: 2·N + 4·L·h·s)" in out
    assert "over the wall clock (goodput 0.9)" in out


def test_cli_json_is_strict_and_null_without_price(capsys) -> None:
    fields = _json(capsys, ["--params", "7B", "--tokens", "2T", "--devices", "64", "--tflops-per-device", "400", "--tflops-count", "hardware",
                            "--recompute", "full"])
    assert fields["cost"] is None and fields["given"] == "hardware_flops_per_sec_per_device"
    assert fields["hardware_flops_per_sec_per_device"] == pytest.approx(400e12)
    assert fields["hfu"] / fields["mfu"] == pytest.approx(8 / 6)


@pytest.mark.parametrize("argv, words", [
    (["--params", "7B", "--tokens", "1T", "--devices", "8"], "give exactly one of --mfu"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--days", "3"], "(got --mfu, --days)"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "1.4"], "'1.4' must be in (0, 1]"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--goodput", "0"], "'0' must be in (0, 1]"),
    (["--params", "7B", "--active-params", "8B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4"], "is more than --params"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--device", "h20"], "h20 has no bf16 peak"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--convention", "attention"], "needs --layers, --attention-width, --seq"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--recompute", "selective"], "--recompute selective"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--device", "h100", "--peak", "1e15"], "not both"),
    (["--hf-config", "nope", "--tokens", "1T", "--devices", "8", "--mfu", "0.4"], "unknown hf config 'nope'"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--cost-per-device-hour", "-2"], "'-2' must be 0 or more"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv, words) -> None:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["run", "formats", "dtypes"])
def test_help_has_an_example(command, capsys) -> None:
    assert main([command, "--help"]) == 0
    assert "example" in capsys.readouterr().out.lower()


def test_recipe_takes_custom_bytes(capsys) -> None:
    fields = _json(capsys, ["--params", "7B", "--tokens", "1T", "--devices", "8", "--mfu", "0.4", "--recipe", "2+2+12"])
    assert (fields["recipe"], fields["training_state_bytes"]) == ("2+2+12", 16 * 7e9)


def test_boards_added_for_published_runs() -> None:
    """Gaudi 2 (Intel's Hot Chips 2024 table, read in a transcription: derived) and the H800's bf16
    (DeepSeek's FlashMLA figure: third-party) give a run its peak; the H800's is flagged."""
    from resacct.facts.hardware import accelerators, peak_flops_per_sec

    assert peak_flops_per_sec("gaudi2", "bf16") == 432e12 and accelerators()["gaudi2"].confidence == "derived"
    assert peak_flops_per_sec("h800", "bf16") == 990e12 and accelerators()["h800-sxm"].confidence == "third-party"
    flops = flops_per_token(37e9)
    run = account_run(flops, tokens=14.8e12, devices=2048, peak_flops_per_sec=peak_flops_per_sec("h800", "bf16"),
                      given="device_hours", value=2.664e6)
    assert run.mfu_against(peak_flops_per_sec("h800", "fp8")) * 2 == pytest.approx(float(run.mfu), rel=1e-3)  # 1979 vs 990


def test_cli_h800_bf16_run_carries_the_third_party_note(capsys) -> None:
    assert main(["run", "--params", "671B", "--active-params", "37B", "--tokens", "14.8T", "--devices", "2048", "--device", "h800",
                 "--device-hours", "2.664M"]) == 0
    out = capsys.readouterr().out
    assert "third-party" in out
