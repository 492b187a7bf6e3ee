"""The energy and emissions flags and lines shared by ``run``, ``time`` and ``optimal``: device-hours ×
board power (the datasheet TDP, or ``--power-watts``) × PUE → MWh; × the grid's carbon intensity →
tCO2eq (location-based), each assumption printed beside the result (resacct.formulas.energy)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from resacct.cli.arguments import non_negative_float, positive_float
from resacct.errors import ResacctError

__all__ = ["add_energy_arguments", "energy_fields", "energy_lines"]


def add_energy_arguments(parser: argparse.ArgumentParser) -> None:
    from resacct.facts.energy import DEFAULT_CARBON_INTENSITY, DEFAULT_PUE

    group = parser.add_argument_group("energy and emissions (device-hours × power × PUE; × carbon intensity)")
    group.add_argument("--power-watts", type=positive_float, metavar="W",
                       help="measured average power per device in watts (default: the board's TDP from 'resacct devices')")
    group.add_argument("--pue", type=positive_float, default=None,
                       help=f"data-centre power usage effectiveness, ≥ 1 (default: {DEFAULT_PUE.value:g}, {DEFAULT_PUE.name})")
    group.add_argument("--carbon-intensity", type=non_negative_float, default=None, metavar="KG_PER_KWH",
                       help=f"grid carbon intensity, location-based, kg CO2eq per kWh (default: {DEFAULT_CARBON_INTENSITY.value:g}, "
                            f"{DEFAULT_CARBON_INTENSITY.name})")


def _finite(name: str, value: Any, flag: str) -> float:
    try:
        result = float(value)
    except OverflowError:
        raise ResacctError(f"this run's {name} would be above 1.8e308, beyond a float; check {flag}, --power-watts and --carbon-intensity") from None
    return result


def energy_fields(device_hours: Any, board: Any, args: argparse.Namespace, flag: str = "the inputs") -> dict[str, Any]:
    """JSON fields (units in the names) of the energy and emissions of ``device_hours`` on ``board``
    (an accelerator, or None for a custom peak); the energy fields are null, with the reason in
    ``energy_unavailable``, where no power per device is known."""
    from resacct.facts.energy import DEFAULT_CARBON_INTENSITY, DEFAULT_PUE
    from resacct.formulas.energy import run_energy

    if args.pue is not None and args.pue < 1:
        raise ResacctError(f"--pue {args.pue:g} is below 1; expected a power usage effectiveness ≥ 1 (facility energy ÷ IT energy), e.g. 1.1")
    pue = DEFAULT_PUE.value if args.pue is None else args.pue
    intensity = DEFAULT_CARBON_INTENSITY.value if args.carbon_intensity is None else args.carbon_intensity
    fields: dict[str, Any] = {
        "pue": pue, "pue_source": DEFAULT_PUE.source if args.pue is None else "--pue",
        "pue_name": DEFAULT_PUE.name if args.pue is None else "given",
        "carbon_intensity_kg_co2eq_per_kwh": intensity,
        "carbon_intensity_source": DEFAULT_CARBON_INTENSITY.source if args.carbon_intensity is None else "--carbon-intensity",
        "carbon_intensity_name": DEFAULT_CARBON_INTENSITY.name if args.carbon_intensity is None else "given",
        "carbon_accounting": "location-based",
        "power_watts_per_device": None, "power_source": None, "power_kind": None,
        "it_energy_mwh": None, "energy_mwh": None, "emissions_tco2eq": None, "energy_unavailable": None,
    }
    if args.power_watts is not None:
        power, kind, source = args.power_watts, "measured average", "--power-watts"
    elif board is not None and board.tdp_watts is not None:
        power, kind, source = board.tdp_watts, f"{board.name} TDP", board.tdp_source
    else:
        fields["energy_unavailable"] = (f"no TDP for {board.name} in the table (resacct devices {board.name}); give --power-watts" if board is not None
                                        else "a custom --peak names no board; give --power-watts")
        return fields
    energy = run_energy(device_hours, power_watts=power, pue=pue, carbon_intensity_kg_per_kwh=intensity)
    fields.update({
        "power_watts_per_device": float(power), "power_source": source, "power_kind": kind,
        "it_energy_mwh": _finite("IT energy", energy.it_energy_mwh, flag), "energy_mwh": _finite("energy", energy.energy_mwh, flag),
        "emissions_tco2eq": _finite("emissions", energy.emissions_tco2eq, flag),
    })
    return fields


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def energy_lines(fields: dict[str, Any], device_hours: float) -> list[str]:
    """The energy and emissions as text lines, each assumption named."""
    if fields["energy_unavailable"]:
        return [f"  energy and emissions: {fields['energy_unavailable']}"]
    return [
        f"  energy: {_number(fields['energy_mwh'])} MWh = {_number(device_hours)} device-hours × {fields['power_watts_per_device']:g} W "
        f"({fields['power_kind']}) × PUE {fields['pue']:g} ({fields['pue_name']}); the boards alone: {_number(fields['it_energy_mwh'])} MWh",
        f"  emissions: {_number(fields['emissions_tco2eq'])} tCO2eq, location-based, at {fields['carbon_intensity_kg_co2eq_per_kwh']:g} kg CO2eq/kWh "
        f"({fields['carbon_intensity_name']})",
    ]
