"""Checking a run's energy and emissions (resacct.formulas.energy, resacct.facts) against the
training reports that state their method.

A run's electricity cannot be re-measured here. Two kinds of check:

- ``energy.reported_energy_mwh`` and ``energy.reported_emissions_tco2eq`` (evidence ``published``):
  the **measured** side is the report's own printed figure (``reported``); the claim's **law** is
  the convention written out over the report's printed inputs (GPU-hours × W × PUE ÷ 10⁶, × kg CO2eq
  per kWh); the **prediction** is resacct's :func:`~resacct.formulas.energy.run_energy` with the
  board's TDP taken from resacct's own table (``device``), so a wrong TDP in the table fails too.
- ``energy.implied_pue`` and ``energy.implied_emissions_factor`` (evidence ``arithmetic``): the
  **measured** side is what a report's printed figures imply (MWh × 10⁶ ÷ (GPU-hours × W), the
  same for tCO2eq), written out here; the **law** is the convention's PUE (or PUE × intensity); the
  **prediction** is resacct's inverse function. These decide where a report departs from the
  convention (refuted claims), and by how much.
"""

from __future__ import annotations

from resacct.facts.hardware import get_accelerator
from resacct.formulas.energy import implied_emissions_factor_kg_per_kwh, implied_pue, run_energy
from resacct.harness.registry import Outcome, check

Number = float | int


def _tdp_watts(device: str) -> float:
    board = get_accelerator(device)
    if board.tdp_watts is None:
        from resacct.errors import ResacctError

        raise ResacctError(f"{board.name} has no TDP in resacct's table; a claim on its energy needs one")
    return board.tdp_watts


@check("energy.reported_energy_mwh", evidence="published")
def reported_energy_mwh(device_hours: Number, device: str, power_watts: Number, pue: Number, reported: Number) -> Outcome:
    """A report's printed energy (MWh), against resacct's run energy for the same GPU-hours and PUE
    at the TDP resacct's table holds for ``device`` (``power_watts`` is the report's own figure, for
    the claim's law)."""
    energy = run_energy(device_hours, power_watts=_tdp_watts(device), pue=pue, carbon_intensity_kg_per_kwh=0)
    return Outcome(measured=float(reported), predicted=float(energy.energy_mwh))


@check("energy.reported_emissions_tco2eq", evidence="published")
def reported_emissions_tco2eq(device_hours: Number, device: str, power_watts: Number, pue: Number, carbon_intensity: Number,
                              reported: Number) -> Outcome:
    """A report's printed location-based emissions (tCO2eq), against resacct's run emissions at the
    TDP resacct's table holds for ``device``, the PUE and the carbon intensity (kg CO2eq per kWh)."""
    energy = run_energy(device_hours, power_watts=_tdp_watts(device), pue=pue, carbon_intensity_kg_per_kwh=carbon_intensity)
    return Outcome(measured=float(reported), predicted=float(energy.emissions_tco2eq))


@check("energy.implied_pue", evidence="arithmetic")
def implied_pue_of_report(device_hours: Number, power_watts: Number, energy_mwh: Number, pue: Number) -> Outcome:
    """The PUE a report's printed MWh implies: MWh × 10⁶ ÷ (GPU-hours × W) written out, against
    resacct's inverse (:func:`~resacct.formulas.energy.implied_pue`); ``pue`` is the convention's,
    for the claim's law."""
    return Outcome(measured=energy_mwh * 1e6 / (device_hours * power_watts),
                   predicted=float(implied_pue(device_hours, power_watts=power_watts, energy_mwh=energy_mwh)))


@check("energy.implied_emissions_factor", evidence="arithmetic")
def implied_emissions_factor(device_hours: Number, power_watts: Number, emissions_tco2eq: Number, pue: Number,
                             carbon_intensity: Number) -> Outcome:
    """kg CO2eq per kWh of board energy (PUE × carbon intensity) that a report's printed tCO2eq
    implies: tCO2eq × 10⁶ ÷ (GPU-hours × W) written out, against resacct's inverse; ``pue`` and
    ``carbon_intensity`` are the convention's, for the claim's law."""
    return Outcome(measured=emissions_tco2eq * 1e6 / (device_hours * power_watts),
                   predicted=float(implied_emissions_factor_kg_per_kwh(device_hours, power_watts=power_watts, emissions_tco2eq=emissions_tco2eq)))
