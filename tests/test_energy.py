"""A run's energy and emissions: resacct.formulas.energy, the sourced defaults, and ``resacct run``
(and ``time``) printing them with their assumptions — also from device-hours alone."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.facts.energy import DEFAULT_CARBON_INTENSITY, DEFAULT_PUE
from resacct.facts.hardware import get_accelerator
from resacct.formulas.energy import implied_emissions_factor_kg_per_kwh, implied_pue, run_energy


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- the formula -------------------------------------------------------------------------------------


def test_llama_65b_table15_figures_exactly() -> None:
    energy = run_energy(1_022_362, power_watts=400, pue=1.1, carbon_intensity_kg_per_kwh=0.385)
    assert energy.it_energy_mwh == Fraction(1_022_362 * 400, 10**6)
    assert energy.energy_mwh == Fraction(44983928, 10**5)  # 449.83928 MWh: 1.1 read as 11/10, exactly
    assert energy.emissions_tco2eq == energy.energy_mwh * Fraction(385, 1000)
    assert energy.emissions_per_device_hour_kg == Fraction(4, 10) * Fraction(11, 10) * Fraction(385, 1000)


@settings(max_examples=60, deadline=None)
@given(hours=st.floats(1e-3, 1e12), watts=st.floats(1, 5000), pue=st.floats(1, 3), intensity=st.floats(1e-4, 2))
def test_implied_figures_invert_the_formula_exactly(hours, watts, pue, intensity) -> None:
    energy = run_energy(hours, power_watts=watts, pue=pue, carbon_intensity_kg_per_kwh=intensity)
    assert implied_pue(hours, power_watts=watts, energy_mwh=energy.energy_mwh) == Fraction(repr(pue))
    assert implied_emissions_factor_kg_per_kwh(hours, power_watts=watts, emissions_tco2eq=energy.emissions_tco2eq) == \
        Fraction(repr(pue)) * Fraction(repr(intensity))


@pytest.mark.parametrize("kwargs, words", [
    ({"power_watts": 700, "pue": 0.9, "carbon_intensity_kg_per_kwh": 0.4}, "pue is 0.9; expected a power usage effectiveness ≥ 1"),
    ({"power_watts": 0, "pue": 1.1, "carbon_intensity_kg_per_kwh": 0.4}, "power_watts is 0"),
    ({"power_watts": float("nan"), "pue": 1.1, "carbon_intensity_kg_per_kwh": 0.4}, "power_watts is nan"),
    ({"power_watts": 700, "pue": 1.1, "carbon_intensity_kg_per_kwh": -0.1}, "carbon_intensity_kg_per_kwh is -0.1"),
    ({"power_watts": True, "pue": 1.1, "carbon_intensity_kg_per_kwh": 0.4}, "power_watts is True"),
])
def test_bad_inputs_are_refused_with_the_value(kwargs, words) -> None:
    with pytest.raises(ResacctError, match=words.replace("(", r"\(").replace(")", r"\)")):
        run_energy(1e6, **kwargs)


def test_a_carbon_free_grid_emits_nothing_but_still_uses_energy() -> None:
    energy = run_energy(1e6, power_watts=700, pue=1, carbon_intensity_kg_per_kwh=0)
    assert (energy.energy_mwh, energy.emissions_tco2eq) == (700, 0)


def test_defaults_are_llamas_named_and_sourced() -> None:
    assert (DEFAULT_PUE.value, DEFAULT_CARBON_INTENSITY.value) == (1.1, 0.385)
    assert "PUE) at 1.1" in DEFAULT_PUE.source and "0.385 kg CO2eq/KWh" in DEFAULT_CARBON_INTENSITY.source
    assert "arXiv:2302.13971" in DEFAULT_PUE.source and "Touvron" in DEFAULT_CARBON_INTENSITY.name


# --- resacct run -------------------------------------------------------------------------------------


def test_run_device_hours_alone_prints_energy_and_emissions_with_assumptions(capsys) -> None:
    assert main(["run", "--device-hours", "1M", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "energy: 770 MWh = 1e+06 device-hours × 700 W (h100-sxm TDP) × PUE 1.1 (LLaMA's PUE" in out
    assert "emissions: 296.4 tCO2eq, location-based, at 0.385 kg CO2eq/kWh (US national average" in out
    assert "(no --tokens: no FLOPs, no MFU)" in out  # no tokens: no FLOPs, no utilisation printed
    assert not [line for line in out.splitlines() if line.strip().startswith(("MFU", "FLOPs per token", "training FLOPs"))]


def test_run_device_hours_alone_json_has_units_in_names(capsys) -> None:
    fields = _json(capsys, ["run", "--device-hours", "1M", "--device", "h100", "--cost-per-device-hour", "2.5"])
    assert fields["energy_mwh"] == pytest.approx(770) and fields["it_energy_mwh"] == pytest.approx(700)
    assert fields["emissions_tco2eq"] == pytest.approx(296.45)
    assert fields["power_watts_per_device"] == 700 and "TDP of 700W" in fields["power_source"]
    assert fields["carbon_intensity_kg_co2eq_per_kwh"] == 0.385 and fields["carbon_accounting"] == "location-based"
    assert fields["cost"] == pytest.approx(2.5e6) and fields["mfu"] is None and fields["tokens"] is None and fields["days"] is None


def test_run_measured_power_pue_and_intensity_replace_the_defaults(capsys) -> None:
    fields = _json(capsys, ["run", "--device-hours", "1M", "--device", "h100", "--power-watts", "500", "--pue", "1.2",
                            "--carbon-intensity", "0.057"])
    assert fields["energy_mwh"] == pytest.approx(1e6 * 500 * 1.2 / 1e6)
    assert fields["emissions_tco2eq"] == pytest.approx(600 * 0.057)
    assert (fields["power_kind"], fields["pue_source"], fields["carbon_intensity_source"]) == ("measured average", "--pue", "--carbon-intensity")


def test_run_days_and_devices_without_tokens(capsys) -> None:
    fields = _json(capsys, ["run", "--days", "3", "--devices", "2048", "--device", "h100"])
    assert fields["device_hours"] == 3 * 24 * 2048 and fields["days"] == 3
    assert fields["energy_mwh"] == pytest.approx(3 * 24 * 2048 * 700 * 1.1 / 1e6)


def test_run_with_tokens_adds_energy_to_the_whole_account(capsys) -> None:
    base = ["run", "--params", "405B", "--tokens", "15.6T", "--devices", "16384", "--device", "h100"]
    fields = _json(capsys, [*base, "--device-hours", "30.84M"])
    assert fields["mfu"] > 0 and fields["energy_mwh"] == pytest.approx(30.84e6 * 0.7 * 1.1 / 1e3)
    assert fields["emissions_tco2eq"] == pytest.approx(30.84e6 * 0.7 * 1.1 * 0.385 / 1e3)


def test_run_prints_days_and_hours_to_four_figures(capsys) -> None:
    # DeepSeek-V3's 180K GPU-hours a trillion tokens on 2048 H800s: "3.7 days" in the paper, 3.662 here
    assert main(["run", "--device-hours", "180K", "--devices", "2048", "--device", "h800"]) == 0
    assert "wall clock: 3.662 days (87.89 hours)" in capsys.readouterr().out
    assert main(["run", "--params", "7B", "--tokens", "1T", "--devices", "8", "--device-hours", "1234.5"]) == 0
    assert "6.43 days (154.3 hours)" in capsys.readouterr().out


def test_run_without_a_tdp_says_what_to_give(capsys) -> None:
    assert get_accelerator("h800").tdp_watts is None
    fields = _json(capsys, ["run", "--device-hours", "1M", "--device", "h800"])
    assert fields["energy_mwh"] is None and "give --power-watts" in fields["energy_unavailable"]
    assert _json(capsys, ["run", "--device-hours", "1M", "--device", "h800", "--power-watts", "700"])["energy_mwh"] == pytest.approx(770)
    assert "a custom --peak names no board" in _json(capsys, ["run", "--device-hours", "1M", "--peak", "1e15"])["energy_unavailable"]


def test_run_flags_a_third_party_peak_on_a_vendor_board(capsys) -> None:
    fields = _json(capsys, ["run", "--params", "7B", "--tokens", "1T", "--devices", "64", "--device", "tpu-v5p", "--dtype", "int8", "--mfu", "0.4"])
    assert "tpu-v5p's int8 peak is from third-party pages" in fields["source_caveat"]
    assert _json(capsys, ["run", "--params", "7B", "--tokens", "1T", "--devices", "64", "--device", "tpu-v5p", "--mfu", "0.4"])["source_caveat"] is None


@pytest.mark.parametrize("argv, words", [
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--days", "1e-300"], "--days 1e-300 makes this run's rates larger than a float holds"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--tokens-per-sec-per-device", "1e-300"],
     "--tokens-per-sec-per-device 1e-300 makes this run's rates larger than a float holds"),
    (["--params", "7B", "--tokens", "1T", "--devices", "8", "--device-hours", "1e-300"], "--device-hours 1e-300 makes"),
    (["--mfu", "0.4", "--devices", "8"], "--mfu needs --tokens"),
    (["--days", "3"], "days need the number of devices"),
    (["--params", "7B", "--tokens", "1T", "--mfu", "0.4"], "--tokens needs --devices"),
    (["--device-hours", "1M", "--pue", "0.9"], "--pue 0.9 is below 1"),
    (["--device-hours", "1M", "--carbon-intensity", "-1"], "'-1' must be 0 or more"),
    (["--device-hours", "1M", "--power-watts", "0"], "--power-watts"),
    (["--device-hours", "1M", "--device", "h100", "--peak", "1e15"], "not both"),
])
def test_run_bad_input_is_one_line_exit_2(capsys, argv, words) -> None:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err, err


# --- resacct time -------------------------------------------------------------------------------------


def test_time_prints_the_energy_of_its_device_hours(capsys) -> None:
    fields = _json(capsys, ["time", "--params", "70B", "--tokens", "15T", "--devices", "1024", "--device", "h100", "--mfu", "0.5"])
    assert fields["energy_mwh"] == pytest.approx(fields["device_hours"] * 700 * 1.1 / 1e6)
    assert fields["emissions_tco2eq"] == pytest.approx(fields["energy_mwh"] * 0.385)
    assert main(["time", "--params", "70B", "--tokens", "15T", "--devices", "1024", "--device", "b300"]) == 0
    out = capsys.readouterr().out
    assert "× 1400 W (b300 TDP)" in out and "tCO2eq, location-based" in out


def test_optimal_prints_the_energy_of_its_device_hours(capsys) -> None:
    fields = _json(capsys, ["optimal", "--flops", "5.76e23", "--device", "a100", "--devices", "1024"])
    assert fields["energy_mwh"] == pytest.approx(fields["device_hours"] * 400 * 1.1 / 1e6)
    assert fields["emissions_tco2eq"] == pytest.approx(fields["energy_mwh"] * 0.385)
    fields = _json(capsys, ["optimal", "--flops", "5.76e23", "--device", "tpu-v5e", "--power-watts", "200", "--carbon-intensity", "0"])
    assert fields["energy_mwh"] == pytest.approx(fields["device_hours"] * 200 * 1.1 / 1e6) and fields["emissions_tco2eq"] == 0


def test_an_energy_beyond_a_float_is_one_line_exit_2(capsys) -> None:
    assert main(["run", "--device-hours", "1M", "--power-watts", "1e300", "--carbon-intensity", "1e300"]) == 2
    err = capsys.readouterr().err
    assert "this run's emissions would be above 1.8e308, beyond a float" in err and err.count("\n") == 1
