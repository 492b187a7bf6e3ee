"""Checking ``resacct run`` (resacct.formulas.run_accounting) against published training runs.

A published run cannot be re-measured here. As in the scale checks, the **measured** side is plain
arithmetic over the figures the source printed (GPU-hours ÷ GPUs ÷ 24, hours × price, a ratio of two
printed FLOP counts) or the printed figure itself, never resacct; the **prediction** is what
resacct's run accounting derives from the same inputs, by way of the quantity the source gave —
device-hours to days, a per-trillion-token rate to a whole run, device-hours to an implied MFU.
The claim's law is the figure the source printed.
"""

from __future__ import annotations

from fractions import Fraction

from resacct.facts.hardware import peak_flops_per_sec, raw_accelerator_table
from resacct.formulas.run_accounting import account_run, flops_per_token
from resacct.harness.registry import Outcome, check

Number = float | int

_SOME_PEAK = 1e15  # a run's days, device-hours and cost do not depend on the peak; any positive one serves


def _run(parameters: Number, tokens: Number, devices: int, given: str, value: Number | Fraction, **extra: object):  # -> RunAccount
    return account_run(flops_per_token(parameters), tokens=tokens, devices=devices, peak_flops_per_sec=extra.pop("peak", _SOME_PEAK),
                       given=given, value=value, **extra)  # type: ignore[arg-type]


@check("runs.days_from_device_hours")
def days_from_device_hours(device_hours: Number, devices: int, tokens: Number) -> Outcome:
    """Wall-clock days of a run given by its GPU-hours: hours ÷ GPUs ÷ 24 as arithmetic, against
    resacct's run given ``device_hours``."""
    run = _run(1e9, tokens, devices, "device_hours", device_hours)
    return Outcome(measured=device_hours / devices / 24, predicted=float(run.days))


@check("runs.device_hours_at_rate")
def device_hours_at_rate(rate_device_hours: Number, rate_tokens: Number, tokens: Number, devices: int) -> Outcome:
    """GPU-hours of ``tokens`` at the throughput of a published rate (``rate_device_hours`` per
    ``rate_tokens``): arithmetic, against resacct's run at the tokens/s per device that the rate's
    run implies."""
    rate = _run(1e9, rate_tokens, devices, "device_hours", rate_device_hours)
    run = _run(1e9, tokens, devices, "tokens_per_sec_per_device", rate.tokens_per_sec_per_device)
    return Outcome(measured=rate_device_hours * tokens / rate_tokens, predicted=float(run.device_hours))


@check("runs.cost")
def cost(device_hours: Number, devices: int, cost_per_device_hour: Number) -> Outcome:
    """A run's price: GPU-hours × the price of one, against resacct's run given ``device_hours``
    and ``cost_per_device_hour``."""
    run = _run(1e9, 1e12, devices, "device_hours", device_hours, cost_per_device_hour=cost_per_device_hour)
    return Outcome(measured=device_hours * cost_per_device_hour, predicted=float(run.cost))  # type: ignore[arg-type]


@check("runs.device_hours_saving_percent")
def device_hours_saving_percent(device_hours: Number, baseline_device_hours: Number, devices: int) -> Outcome:
    """How much less one run costs than another on the same tokens, in percent of the other:
    arithmetic over the two GPU-hour figures, against resacct's two runs (same devices, the same
    trillion tokens)."""
    run = _run(1e9, 1e12, devices, "device_hours", device_hours)
    baseline = _run(1e9, 1e12, devices, "device_hours", baseline_device_hours)
    return Outcome(measured=100 * (1 - device_hours / baseline_device_hours), predicted=float(100 * (1 - run.device_hours / baseline.device_hours)))


@check("runs.printed_flops_ratio_percent")
def printed_flops_ratio_percent(flops: Number, baseline_flops: Number, active_parameters: Number, baseline_parameters: Number) -> Outcome:
    """One model's training FLOPs in percent of another's: the ratio of the two FLOP counts the
    source printed, against the ratio of resacct's 6·N model FLOPs per token with N the *active*
    parameters (a mixture of experts runs only those)."""
    mine = flops_per_token(active_parameters).model_flops
    theirs = flops_per_token(baseline_parameters).model_flops
    return Outcome(measured=100 * flops / baseline_flops, predicted=float(100 * mine / theirs))


@check("runs.peak_ratio_between_formats", quantities=("mfu_low_precision",))
def peak_ratio_between_formats(device: str, dtype: str, low_precision_dtype: str) -> Outcome:
    """How much faster a board's ``low_precision_dtype`` peak is than its ``dtype`` peak: the data
    file's printed dense TFLOP/s divided, against the ratio of one run's MFU quoted against each
    peak by resacct (MFU against ``dtype`` ÷ MFU against ``low_precision_dtype``)."""
    raw = raw_accelerator_table()[device]["peaks_tera_per_sec"]
    run = _run(7e9, 1e12, 8, "mfu", 0.4, peak=peak_flops_per_sec(device, dtype))
    low = run.mfu_against(peak_flops_per_sec(device, low_precision_dtype))
    return Outcome(measured=raw[low_precision_dtype]["dense"] / raw[dtype]["dense"], predicted=float(run.mfu / low),
                   quantities={"mfu_low_precision": float(low)})


@check("runs.implied_mfu")
def implied_mfu(parameters: Number, tokens: Number, device_hours: Number, devices: int, device: str, goodput: Number = 1.0,
                dtype: str = "bf16") -> Outcome:
    """The MFU a published GPU-hours figure implies: 6·N·D ÷ (GPU-hours × 3600 × goodput × the
    datasheet peak) as arithmetic over the printed figures and the data file's raw peak, against
    resacct's run given ``device_hours`` and ``goodput``."""
    raw_peak = raw_accelerator_table()[device]["peaks_tera_per_sec"][dtype]["dense"] * 1e12
    run = _run(parameters, tokens, devices, "device_hours", device_hours, goodput=goodput, peak=peak_flops_per_sec(device, dtype))
    return Outcome(measured=6 * parameters * tokens / (device_hours * 3600 * goodput * raw_peak), predicted=float(run.mfu))
