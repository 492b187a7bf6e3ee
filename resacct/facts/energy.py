"""The named, sourced defaults of a run's energy and emissions: data-centre overhead (PUE) and the
grid's carbon intensity (location-based). Board power (TDP) lives with each board in
``resacct/facts/datasheets/accelerators.yaml`` (``tdp_watts``, ``tdp_source``).

The defaults are one published convention, taken whole so that a figure computed with them can be
compared with the reports that used it: LLaMA's (Touvron et al. 2023, §6 and Table 15), which fixes
PUE at 1.1 and the carbon intensity at the US national average of 0.385 kg CO2eq per kWh "to compare
the cost in carbon emission of training of these models if they were trained in the same data
center". Llama 2's model card (0.4235 kg CO2eq per GPU-kWh of its 400 W boards) reproduces with the
same two numbers. They are a convention, not a measurement of any particular data centre: a run's
own PUE and its grid's intensity (``--pue``, ``--carbon-intensity``) replace them.

>>> DEFAULT_PUE.value, DEFAULT_CARBON_INTENSITY.value
(1.1, 0.385)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SourcedValue", "DEFAULT_PUE", "DEFAULT_CARBON_INTENSITY"]

_LLAMA = ('Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models" (arXiv:2302.13971), §6 "Carbon footprint" '
          "and Table 15")


@dataclass(frozen=True)
class SourcedValue:
    """A default with its name (what to call it in output) and where it comes from."""

    value: float
    name: str
    source: str


DEFAULT_PUE = SourcedValue(
    value=1.1,
    name="LLaMA's PUE (Touvron et al. 2023)",
    source=f'{_LLAMA}: "Wh = GPU-h×(GPU power consumption)×PUE, where we set the Power Usage Effectiveness (PUE) at 1.1"',
)

DEFAULT_CARBON_INTENSITY = SourcedValue(
    value=0.385,
    name="US national average, LLaMA's convention (Touvron et al. 2023)",
    source=f'{_LLAMA}: "use, instead, the US national average carbon intensity factor of 0.385 kg CO2eq/KWh. '
           'This leads to the following formula for the tons of carbon emissions: tCO2eq = MWh × 0.385"',
)
