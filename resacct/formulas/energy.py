"""A run's energy and emissions from its device-hours, in closed form (the convention of the
published training reports: LLaMA, Llama 2 and Llama 3.1's model cards, DINOv2/v3):

- energy (MWh)     = device-hours × board power (W) × PUE ÷ 10⁶
- emissions (tCO2eq) = energy (MWh) × carbon intensity (kg CO2eq per kWh)

(a MWh is 1000 kWh and a tonne 1000 kg, so the two thousands cancel). Board power is the
datasheet's TDP unless a measured average is given: a run rarely draws its boards' TDP throughout,
so the TDP convention is an upper estimate of the boards' own draw. PUE (power usage
effectiveness: facility energy ÷ IT energy, ≥ 1) adds the data centre's overhead; the carbon
intensity is location-based (the grid's average), not market-based (after renewable purchases).

Exact arithmetic (:class:`fractions.Fraction`, a float read as the decimal it prints as):

>>> e = run_energy(1_022_362, power_watts=400, pue=1.1, carbon_intensity_kg_per_kwh=0.385)   # LLaMA-65B, Table 15
>>> round(float(e.energy_mwh), 2), round(float(e.emissions_tco2eq), 1)
(449.84, 173.2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from resacct.errors import ResacctError

__all__ = ["RunEnergy", "run_energy", "implied_pue", "implied_emissions_factor_kg_per_kwh", "WATT_HOURS_PER_MWH"]

WATT_HOURS_PER_MWH = 10**6

Number = float | int | Fraction


def _exact(name: str, value: object, expected: str, *, at_least: Fraction = Fraction(0), strictly: bool = True) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ResacctError(f"{name} is {value!r}; expected {expected}")
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if exact < at_least or (strictly and exact == at_least):
        raise ResacctError(f"{name} is {value!r}; expected {expected}")
    return exact


@dataclass(frozen=True)
class RunEnergy:
    """One run's energy and emissions, every input named beside the result."""

    device_hours: Fraction
    power_watts: Fraction  # per device: the TDP or a measured average
    pue: Fraction
    carbon_intensity_kg_per_kwh: Fraction

    @property
    def it_energy_mwh(self) -> Fraction:
        """The boards' own energy, before the data centre's overhead: device-hours × power."""
        return self.device_hours * self.power_watts / WATT_HOURS_PER_MWH

    @property
    def energy_mwh(self) -> Fraction:
        """Facility energy: the boards' energy × PUE."""
        return self.it_energy_mwh * self.pue

    @property
    def emissions_tco2eq(self) -> Fraction:
        """Location-based emissions: MWh × kg CO2eq per kWh (= tonnes per MWh)."""
        return self.energy_mwh * self.carbon_intensity_kg_per_kwh

    @property
    def emissions_per_device_hour_kg(self) -> Fraction:
        """kg CO2eq one device-hour costs: power (kW) × PUE × intensity."""
        return self.power_watts / 1000 * self.pue * self.carbon_intensity_kg_per_kwh


def run_energy(device_hours: Number, *, power_watts: Number, pue: Number, carbon_intensity_kg_per_kwh: Number) -> RunEnergy:
    """The energy and emissions of ``device_hours`` of boards drawing ``power_watts`` each, in a
    data centre of ``pue`` on a grid of ``carbon_intensity_kg_per_kwh`` (location-based).

    >>> run_energy(1e6, power_watts=700, pue=1, carbon_intensity_kg_per_kwh=0).emissions_tco2eq
    Fraction(0, 1)
    >>> run_energy(1e6, power_watts=700, pue=0.9, carbon_intensity_kg_per_kwh=0.4)
    Traceback (most recent call last):
    resacct.errors.ResacctError: pue is 0.9; expected a power usage effectiveness ≥ 1 (facility energy ÷ IT energy), e.g. 1.1
    """
    return RunEnergy(
        device_hours=_exact("device_hours", device_hours, "device-hours > 0"),
        power_watts=_exact("power_watts", power_watts, "a power per device in watts > 0, e.g. 700 for an H100 SXM's TDP"),
        pue=_exact("pue", pue, "a power usage effectiveness ≥ 1 (facility energy ÷ IT energy), e.g. 1.1", at_least=Fraction(1), strictly=False),
        carbon_intensity_kg_per_kwh=_exact("carbon_intensity_kg_per_kwh", carbon_intensity_kg_per_kwh,
                                           "a grid carbon intensity ≥ 0 in kg CO2eq per kWh, e.g. 0.385", strictly=False),
    )


def implied_pue(device_hours: Number, *, power_watts: Number, energy_mwh: Number) -> Fraction:
    """The PUE a published energy figure implies: MWh × 10⁶ ÷ (device-hours × W) — the inverse of
    :func:`run_energy`'s energy, to read a report's unstated overhead off its own figures.

    >>> round(float(implied_pue(22_016, power_watts=400, energy_mwh=9.7)), 3)        # DINOv2-g, Table 14
    1.101
    """
    it_mwh = _exact("device_hours", device_hours, "device-hours > 0") * _exact("power_watts", power_watts, "watts > 0") / WATT_HOURS_PER_MWH
    return _exact("energy_mwh", energy_mwh, "a published energy in MWh > 0") / it_mwh


def implied_emissions_factor_kg_per_kwh(device_hours: Number, *, power_watts: Number, emissions_tco2eq: Number) -> Fraction:
    """kg CO2eq per kWh of board energy that a published emissions figure implies (PUE × carbon
    intensity together): tCO2eq × 10⁶ ÷ (device-hours × W).

    >>> round(float(implied_emissions_factor_kg_per_kwh(184_320, power_watts=400, emissions_tco2eq=31.22)), 4)   # Llama 2 7B
    0.4234
    """
    it_mwh = _exact("device_hours", device_hours, "device-hours > 0") * _exact("power_watts", power_watts, "watts > 0") / WATT_HOURS_PER_MWH
    return _exact("emissions_tco2eq", emissions_tco2eq, "published emissions in tCO2eq ≥ 0", strictly=False) / it_mwh
