"""Napkin math for a training run: total FLOPs, days on G devices, the largest model that fits,
and how a run compares with the compute thresholds of regulation.

>>> flops = training_flops(70e9, 15e12)                        # 6 · N · D
>>> flops
6.3e+24
>>> round(training_days(flops, devices=1024, peak_flops_per_sec=989.5e12, mfu=0.5), 1)
143.9
>>> max_parameters(devices=8, memory_bytes_per_device=80e9, bytes_per_parameter=16) / 1e9
40.0
>>> [(c.threshold.name, c.above) for c in compare_to_thresholds(flops)]
[('EU AI Act', False), ('US Executive Order 14110', False)]
"""

from __future__ import annotations

from dataclasses import dataclass

from resacct.errors import ResacctError, UnknownNameError
from resacct.formulas.validation import positive_number as _positive

__all__ = [
    "SECONDS_PER_DAY",
    "SECONDS_PER_HOUR",
    "TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER",
    "training_flops",
    "flops_per_day",
    "cluster_flops",
    "training_seconds",
    "training_days",
    "device_hours",
    "TrainingTime",
    "training_time",
    "max_parameters",
    "throughput_mfu",
    "ComputeThreshold",
    "COMPUTE_THRESHOLDS",
    "get_threshold",
    "ThresholdComparison",
    "compare_to_thresholds",
    "REPORTED_TRAINING_FLOPS",
]

Number = float | int

SECONDS_PER_HOUR = 60 * 60
SECONDS_PER_DAY = 24 * SECONDS_PER_HOUR

#: Forward 2 (a multiply and an add per parameter per token) + backward 4 (gradients with
#: respect to the weights and to the inputs): the "6" of 6ND.
TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER = 6


def _utilization(value: object) -> float:
    """MFU must be in (0, 1]: a fraction of the peak, never more than all of it."""
    mfu = _positive("mfu", value, "a fraction in (0, 1], e.g. 0.5 for 50% of peak")
    if mfu > 1:
        raise ResacctError(f"mfu is {value!r}; expected a fraction in (0, 1], e.g. 0.5 for 50% of peak")
    return mfu


def _device_count(value: object) -> float:
    devices = _positive("devices", value, "a whole number of devices ≥ 1")
    if devices != int(devices):
        raise ResacctError(f"devices is {value!r}; expected a whole number of devices ≥ 1")
    return devices


def training_flops(parameters: Number, tokens: Number, flops_per_token_per_parameter: Number = TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER) -> float:
    """Total training FLOPs ≈ 6 · N · D (N parameters, D tokens) for a dense model.

    >>> training_flops(175e9, 300e9)   # GPT-3
    3.15e+23
    """
    return _positive("parameters", parameters) * _positive("tokens", tokens) * _positive("flops_per_token_per_parameter", flops_per_token_per_parameter)


def flops_per_day(devices: Number, peak_flops_per_sec: Number, mfu: Number) -> float:
    """FLOPs ``devices`` devices do in a day at ``mfu`` of ``peak_flops_per_sec`` each."""
    return _device_count(devices) * _positive("peak_flops_per_sec", peak_flops_per_sec) * _utilization(mfu) * SECONDS_PER_DAY


def cluster_flops(devices: Number, seconds: Number, peak_flops_per_sec: Number, mfu: Number = 1.0) -> float:
    """FLOPs ``devices`` devices do in ``seconds`` (at the peak unless ``mfu`` says otherwise).

    >>> cluster_flops(8, 14 * SECONDS_PER_DAY, 989.5e12) / 1e21   # 8 H100s, two weeks, dense bf16
    9.5751936
    """
    return _device_count(devices) * _positive("seconds", seconds) * _positive("peak_flops_per_sec", peak_flops_per_sec) * _utilization(mfu)


def training_seconds(total_flops: Number, devices: Number, peak_flops_per_sec: Number, mfu: Number) -> float:
    """Training time = total FLOPs ÷ (peak FLOP/s × MFU × devices)."""
    rate = _device_count(devices) * _positive("peak_flops_per_sec", peak_flops_per_sec) * _utilization(mfu)
    return _positive("total_flops", total_flops) / rate


def training_days(total_flops: Number, devices: Number, peak_flops_per_sec: Number, mfu: Number) -> float:
    """Training time in days: total FLOPs ÷ FLOPs per day."""
    return training_seconds(total_flops, devices, peak_flops_per_sec, mfu) / SECONDS_PER_DAY


def device_hours(total_flops: Number, peak_flops_per_sec: Number, mfu: Number) -> float:
    """GPU-hours (device-hours): independent of how many devices share the work."""
    return training_seconds(total_flops, 1, peak_flops_per_sec, mfu) / SECONDS_PER_HOUR


@dataclass(frozen=True)
class TrainingTime:
    """A napkin estimate, with every input it was made from."""

    total_flops: float
    devices: int
    peak_flops_per_sec: float
    mfu: float
    flops_per_day: float
    training_days: float
    device_hours: float


def training_time(total_flops: Number, devices: Number, peak_flops_per_sec: Number, mfu: Number) -> TrainingTime:
    """Days, device-hours and FLOPs per day of a run, in one object."""
    return TrainingTime(
        total_flops=_positive("total_flops", total_flops),
        devices=int(_device_count(devices)),
        peak_flops_per_sec=_positive("peak_flops_per_sec", peak_flops_per_sec),
        mfu=_utilization(mfu),
        flops_per_day=flops_per_day(devices, peak_flops_per_sec, mfu),
        training_days=training_days(total_flops, devices, peak_flops_per_sec, mfu),
        device_hours=device_hours(total_flops, peak_flops_per_sec, mfu),
    )


def max_parameters(devices: Number, memory_bytes_per_device: Number, bytes_per_parameter: Number) -> float:
    """The largest model whose per-parameter state fits: devices × memory ÷ bytes per parameter
    (activations, buffers and fragmentation not counted — a ceiling, not a plan)."""
    total = _device_count(devices) * _positive("memory_bytes_per_device", memory_bytes_per_device)
    return total / _positive("bytes_per_parameter", bytes_per_parameter)


def throughput_mfu(parameters: Number, tokens_per_sec: Number, peak_flops_per_sec: Number, devices: Number = 1,
                   flops_per_token_per_parameter: Number = TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER) -> float:
    """MFU of a training run from its throughput: 6 · N · tokens/s ÷ (devices × peak).
    Above 1 means an input is wrong; it is returned so the caller can say so.

    >>> round(throughput_mfu(7e9, 3000, 989.5e12), 3)
    0.127
    """
    achieved = _positive("parameters", parameters) * _positive("tokens_per_sec", tokens_per_sec) * _positive("flops_per_token_per_parameter", flops_per_token_per_parameter)
    return achieved / (_device_count(devices) * _positive("peak_flops_per_sec", peak_flops_per_sec))


@dataclass(frozen=True)
class ComputeThreshold:
    """A training-compute threshold set by regulation."""

    key: str
    name: str
    threshold_flops: float
    consequence: str
    in_force: bool
    source: str


COMPUTE_THRESHOLDS: dict[str, ComputeThreshold] = {
    "eu_ai_act": ComputeThreshold(
        "eu_ai_act", "EU AI Act", 1e25,
        "general-purpose AI model presumed to have systemic risk (training compute ≥ 10^25 FLOPs)",
        True, "Regulation (EU) 2024/1689 (AI Act), Article 51(2)"),
    "us_executive_order": ComputeThreshold(
        "us_executive_order", "US Executive Order 14110", 1e26,
        "models trained with ≥ 10^26 FLOPs had to be reported (order revoked on 20 January 2025)",
        False, "Executive Order 14110 (30 October 2023), Section 4.2(b); revoked by Executive Order 14148"),
}


def get_threshold(key: str) -> ComputeThreshold:
    try:
        return COMPUTE_THRESHOLDS[key]
    except KeyError:
        raise UnknownNameError("compute threshold", key, list(COMPUTE_THRESHOLDS)) from None


@dataclass(frozen=True)
class ThresholdComparison:
    threshold: ComputeThreshold
    run_flops: float

    @property
    def ratio(self) -> float:
        """Run FLOPs ÷ threshold FLOPs (≥ 1 means at or above the threshold)."""
        return self.run_flops / self.threshold.threshold_flops

    @property
    def above(self) -> bool:
        return self.run_flops >= self.threshold.threshold_flops


def compare_to_thresholds(run_flops: Number) -> list[ThresholdComparison]:
    """How a run of ``run_flops`` training FLOPs compares with each regulatory threshold."""
    flops = _positive("run_flops", run_flops)
    return [ThresholdComparison(threshold, flops) for threshold in COMPUTE_THRESHOLDS.values()]


#: Training compute of well-known models as their sources state it — data, not measurements.
#: GPT-4's figure is a public estimate (OpenAI has not published it); nothing here can check it.
REPORTED_TRAINING_FLOPS: dict[str, tuple[float, str]] = {
    "gpt-3": (3.14e23, "Brown et al. 2020, Language Models are Few-Shot Learners, Table D.1 (175B parameters, 300B tokens)"),
    "gpt-4": (2e25, "speculated in the lecture notes (CS336 lecture 2); not published by OpenAI"),
}
