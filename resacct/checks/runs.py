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


@check("runs.days_from_device_hours", evidence="arithmetic")
def days_from_device_hours(device_hours: Number, devices: int, tokens: Number) -> Outcome:
    """Wall-clock days of a run given by its GPU-hours: hours ÷ GPUs ÷ 24 as arithmetic, against
    resacct's run given ``device_hours``."""
    run = _run(1e9, tokens, devices, "device_hours", device_hours)
    return Outcome(measured=device_hours / devices / 24, predicted=float(run.days))


@check("runs.device_hours_at_rate", evidence="arithmetic")
def device_hours_at_rate(rate_device_hours: Number, rate_tokens: Number, tokens: Number, devices: int) -> Outcome:
    """GPU-hours of ``tokens`` at the throughput of a published rate (``rate_device_hours`` per
    ``rate_tokens``): arithmetic, against resacct's run at the tokens/s per device that the rate's
    run implies."""
    rate = _run(1e9, rate_tokens, devices, "device_hours", rate_device_hours)
    run = _run(1e9, tokens, devices, "tokens_per_sec_per_device", rate.tokens_per_sec_per_device)
    return Outcome(measured=rate_device_hours * tokens / rate_tokens, predicted=float(run.device_hours))


@check("runs.cost", evidence="arithmetic")
def cost(device_hours: Number, devices: int, cost_per_device_hour: Number) -> Outcome:
    """A run's price: GPU-hours × the price of one, against resacct's run given ``device_hours``
    and ``cost_per_device_hour``."""
    run = _run(1e9, 1e12, devices, "device_hours", device_hours, cost_per_device_hour=cost_per_device_hour)
    return Outcome(measured=device_hours * cost_per_device_hour, predicted=float(run.cost))  # type: ignore[arg-type]


@check("runs.device_hours_saving_percent", evidence="arithmetic")
def device_hours_saving_percent(device_hours: Number, baseline_device_hours: Number, devices: int) -> Outcome:
    """How much less one run costs than another on the same tokens, in percent of the other:
    arithmetic over the two GPU-hour figures, against resacct's two runs (same devices, the same
    trillion tokens)."""
    run = _run(1e9, 1e12, devices, "device_hours", device_hours)
    baseline = _run(1e9, 1e12, devices, "device_hours", baseline_device_hours)
    return Outcome(measured=100 * (1 - device_hours / baseline_device_hours), predicted=float(100 * (1 - run.device_hours / baseline.device_hours)))


@check("runs.printed_flops_ratio_percent", evidence="arithmetic")
def printed_flops_ratio_percent(flops: Number, baseline_flops: Number, active_parameters: Number, baseline_parameters: Number) -> Outcome:
    """One model's training FLOPs in percent of another's: the ratio of the two FLOP counts the
    source printed, against the ratio of resacct's 6·N model FLOPs per token with N the *active*
    parameters (a mixture of experts runs only those)."""
    mine = flops_per_token(active_parameters).model_flops
    theirs = flops_per_token(baseline_parameters).model_flops
    return Outcome(measured=100 * flops / baseline_flops, predicted=float(100 * mine / theirs))


@check("runs.peak_ratio_between_formats", evidence="arithmetic", quantities=("mfu_low_precision",))
def peak_ratio_between_formats(device: str, dtype: str, low_precision_dtype: str) -> Outcome:
    """How much faster a board's ``low_precision_dtype`` peak is than its ``dtype`` peak: the data
    file's printed dense TFLOP/s divided, against the ratio of one run's MFU quoted against each
    peak by resacct (MFU against ``dtype`` ÷ MFU against ``low_precision_dtype``)."""
    raw = raw_accelerator_table()[device]["peaks_tera_per_sec"]
    run = _run(7e9, 1e12, 8, "mfu", 0.4, peak=peak_flops_per_sec(device, dtype))
    low = run.mfu_against(peak_flops_per_sec(device, low_precision_dtype))
    return Outcome(measured=raw[low_precision_dtype]["dense"] / raw[dtype]["dense"], predicted=float(run.mfu / low),
                   quantities={"mfu_low_precision": float(low)})


@check("runs.implied_mfu", evidence="arithmetic")
def implied_mfu(parameters: Number, tokens: Number, device_hours: Number, devices: int, device: str, goodput: Number = 1.0,
                dtype: str = "bf16") -> Outcome:
    """The MFU a published GPU-hours figure implies: 6·N·D ÷ (GPU-hours × 3600 × goodput × the
    datasheet peak) as arithmetic over the printed figures and the data file's raw peak, against
    resacct's run given ``device_hours`` and ``goodput``."""
    raw_peak = raw_accelerator_table()[device]["peaks_tera_per_sec"][dtype]["dense"] * 1e12
    run = _run(parameters, tokens, devices, "device_hours", device_hours, goodput=goodput, peak=peak_flops_per_sec(device, dtype))
    return Outcome(measured=6 * parameters * tokens / (device_hours * 3600 * goodput * raw_peak), predicted=float(run.mfu))


# --- published runs reproduced from a throughput, an iteration time or a FLOP rate -----------------
# (the checks below serve LLaMA-65B, TinyLlama, Nemotron-4 15B, NeMo's FP8 GPT-3 175B, BLOOM, JetMoE
# and DeepSeekMoE 145B; the measured side is the printed figures' arithmetic written out here, the
# prediction is resacct's run accounting fed the same figures)

def _per_token(parameters: Number, layers: int | None = None, attention_width: int | None = None, seq: int | None = None,
               recompute: str = "none"):  # -> FlopsPerToken
    return flops_per_token(parameters, layers=layers, attention_width=attention_width, seq=seq, recompute=recompute)


def _model_flops_per_token(parameters: Number, layers: int | None, attention_width: int | None, seq: int | None) -> float:
    """6·N, plus PaLM's 12·L·h·s when the shape is given: the arithmetic resacct's conventions name."""
    return 6 * parameters + (12 * layers * attention_width * seq if layers and attention_width and seq else 0)


def _tokens_per_sec_per_device(batch_sequences: int, seq: int, iteration_seconds: Number, devices: int) -> Fraction:
    return Fraction(batch_sequences * seq) / (Fraction(repr(iteration_seconds)) * devices)


@check("runs.wall_clock_from_throughput", evidence="arithmetic")
def wall_clock_from_throughput(tokens_per_sec_per_device: Number, devices: int, tokens: Number, unit: str = "days") -> Outcome:
    """Wall-clock time of ``tokens`` at a published tokens/s per device on ``devices``: tokens ÷
    (rate × devices) as arithmetic, against resacct's run given ``tokens_per_sec_per_device``;
    ``unit`` is ``days`` or ``hours``."""
    seconds = {"days": 86400, "hours": 3600}[unit]
    run = _run(1e9, tokens, devices, "tokens_per_sec_per_device", tokens_per_sec_per_device)
    return Outcome(measured=tokens / (tokens_per_sec_per_device * devices) / seconds,
                   predicted=float(run.wall_clock_seconds / seconds))


@check("runs.device_hours_from_throughput", evidence="arithmetic")
def device_hours_from_throughput(tokens_per_sec_per_device: Number, tokens: Number, devices: int) -> Outcome:
    """Device-hours of ``tokens`` at a published tokens/s per device: tokens ÷ rate ÷ 3600 as
    arithmetic (the device count cancels), against resacct's run's device-hours."""
    run = _run(1e9, tokens, devices, "tokens_per_sec_per_device", tokens_per_sec_per_device)
    return Outcome(measured=tokens / tokens_per_sec_per_device / 3600, predicted=float(run.device_hours))


@check("runs.days_from_iteration_time", evidence="arithmetic")
def days_from_iteration_time(batch_sequences: int, seq: int, iteration_seconds: Number, devices: int, tokens: Number) -> Outcome:
    """Days of ``tokens`` at a published iteration time (``batch_sequences`` × ``seq`` tokens a
    step): tokens ÷ tokens-per-step × seconds ÷ 86400 as arithmetic, against resacct's run at the
    tokens/s per device the iteration time implies."""
    run = _run(1e9, tokens, devices, "tokens_per_sec_per_device", _tokens_per_sec_per_device(batch_sequences, seq, iteration_seconds, devices))
    return Outcome(measured=tokens / (batch_sequences * seq) * iteration_seconds / 86400, predicted=float(run.days))


def _mfu_percent(parameters: Number, tokens_per_sec_per_device: Number | Fraction, device: str, dtype: str, layers: int | None,
                 attention_width: int | None, seq: int | None) -> Outcome:
    raw_peak = raw_accelerator_table()[device]["peaks_tera_per_sec"][dtype]["dense"] * 1e12
    measured = float(tokens_per_sec_per_device) * _model_flops_per_token(parameters, layers, attention_width, seq) / raw_peak
    run = account_run(_per_token(parameters, layers, attention_width, seq), tokens=1e12, devices=1,
                      peak_flops_per_sec=peak_flops_per_sec(device, dtype), given="tokens_per_sec_per_device", value=tokens_per_sec_per_device)
    return Outcome(measured=100 * measured, predicted=float(100 * run.mfu))


@check("runs.mfu_percent_from_throughput", evidence="arithmetic")
def mfu_percent_from_throughput(parameters: Number, tokens_per_sec_per_device: Number, device: str, dtype: str = "bf16",
                                layers: int | None = None, attention_width: int | None = None, seq: int | None = None) -> Outcome:
    """MFU in percent from a published tokens/s per device: 6·N (+ 12·L·h·s when the shape is
    given) × rate ÷ the data file's raw dense peak, against resacct's run given the rate."""
    return _mfu_percent(parameters, tokens_per_sec_per_device, device, dtype, layers, attention_width, seq)


@check("runs.mfu_percent_from_iteration_time", evidence="arithmetic")
def mfu_percent_from_iteration_time(parameters: Number, batch_sequences: int, seq: int, iteration_seconds: Number, devices: int,
                                    device: str, dtype: str = "bf16", layers: int | None = None,
                                    attention_width: int | None = None) -> Outcome:
    """MFU in percent from a published iteration time: the tokens/s per device it implies, then as
    :func:`mfu_percent_from_throughput` (the attention term, when the shape is given, at ``seq``)."""
    rate = _tokens_per_sec_per_device(batch_sequences, seq, iteration_seconds, devices)
    return _mfu_percent(parameters, rate, device, dtype, layers, attention_width, seq if layers else None)


@check("runs.model_tflops_from_throughput", evidence="arithmetic")
def model_tflops_from_throughput(parameters: Number, tokens_per_sec_per_device: Number, layers: int | None = None,
                                 attention_width: int | None = None, seq: int | None = None) -> Outcome:
    """Model TFLOP/s per device from a published tokens/s per device: rate × (6·N [+ 12·L·h·s]) as
    arithmetic, against resacct's run's model FLOP/s per device under the same convention."""
    run = account_run(_per_token(parameters, layers, attention_width, seq), tokens=1e12, devices=1, peak_flops_per_sec=_SOME_PEAK,
                      given="tokens_per_sec_per_device", value=tokens_per_sec_per_device)
    measured = tokens_per_sec_per_device * _model_flops_per_token(parameters, layers, attention_width, seq) / 1e12
    return Outcome(measured=measured, predicted=float(run.model_flops_per_sec_per_device / 10**12))


@check("runs.hardware_tflops_from_iteration_time", evidence="arithmetic")
def hardware_tflops_from_iteration_time(parameters: Number, layers: int, hidden: int, vocab: int, seq: int, batch_sequences: int,
                                        iteration_seconds: Number, devices: int) -> Outcome:
    """Hardware TFLOP/s per device of a run with full activation recomputation, from its iteration
    time: Narayanan et al. 2021 eq. 3 written out, 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) ÷ (seconds ×
    devices), against resacct's run under ``attention`` + ``full`` (8·N + 16·L·h·s a token)."""
    measured = 96 * batch_sequences * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    run = account_run(_per_token(parameters, layers, hidden, seq, recompute="full"), tokens=1e12, devices=devices,
                      peak_flops_per_sec=_SOME_PEAK, given="tokens_per_sec_per_device",
                      value=_tokens_per_sec_per_device(batch_sequences, seq, iteration_seconds, devices))
    return Outcome(measured=measured / (iteration_seconds * devices) / 1e12, predicted=float(run.hardware_flops_per_sec_per_device / 10**12))


@check("runs.days_at_hardware_flops_rate", evidence="arithmetic")
def days_at_hardware_flops_rate(parameters: Number, tokens: Number, devices: int, hardware_flops_per_sec_per_device: Number) -> Outcome:
    """Days of a run with full recomputation (8·N hardware FLOPs a token, Megatron's count) at a
    hardware FLOP/s per device: tokens × 8·N ÷ (devices × rate) ÷ 86400 as arithmetic, against
    resacct's run (``6nd`` + ``full``) given ``hardware_flops_per_sec_per_device``."""
    run = account_run(_per_token(parameters, recompute="full"), tokens=tokens, devices=devices, peak_flops_per_sec=_SOME_PEAK,
                      given="hardware_flops_per_sec_per_device", value=hardware_flops_per_sec_per_device)
    return Outcome(measured=tokens * 8 * parameters / (devices * hardware_flops_per_sec_per_device) / 86400, predicted=float(run.days))


@check("runs.active_compute_share_percent", evidence="arithmetic")
def active_compute_share_percent(active_parameters: Number, baseline_parameters: Number) -> Outcome:
    """A mixture of experts' training FLOPs per token in percent of a dense model's, by active
    parameters: 100·N_active ÷ N_dense as arithmetic, against resacct's 6·N model FLOPs ratio."""
    ratio = flops_per_token(active_parameters).model_flops / flops_per_token(baseline_parameters).model_flops
    return Outcome(measured=100 * active_parameters / baseline_parameters, predicted=float(100 * ratio))


@check("runs.active_compute_saving_percent", evidence="arithmetic")
def active_compute_saving_percent(active_parameters: Number, baseline_parameters: Number) -> Outcome:
    """How much less compute per token a mixture of experts needs than a dense model, in percent:
    100·(1 − N_active ÷ N_dense) as arithmetic, against resacct's 6·N model FLOPs ratio."""
    ratio = flops_per_token(active_parameters).model_flops / flops_per_token(baseline_parameters).model_flops
    return Outcome(measured=100 * (1 - active_parameters / baseline_parameters), predicted=float(100 * (1 - ratio)))
