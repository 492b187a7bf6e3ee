"""A whole training run from any one of its rates: MFU, HFU, tokens/s or FLOP/s per device, days,
device-hours — each derived from the one given, with the FLOP convention named, cost and goodput.

**FLOPs per token** follow the *active* parameters N (a mixture of experts runs k of its E experts
per token; its memory follows the *total*), by a named convention:

- ``6nd``:        6·N (forward 2·N, backward 4·N; Kaplan et al. 2020 §2.1, without the attention term)
- ``attention``:  6·N + 12·L·h·s, PaLM's count (Chowdhery et al. 2022, Appendix B): the two attention
  matmuls QKᵀ and A·V over all s² scores, forward 4·L·h·s and backward twice that, h = heads × head width

and **hardware FLOPs** add what recomputation executes again (HFU): ``selective`` recomputes the
attention core's forward (4·L·h·s a token), ``full`` the whole forward (2·N + 4·L·h·s) — Megatron's
8·N·D (Narayanan et al. 2021, eq. 4) is ``6nd`` with ``full``.

**Rates.** While the run trains, its devices together do ``model FLOPs ÷ training seconds``; MFU
divides that by devices × the peak, HFU the hardware FLOPs by the same. **Goodput** is the share of
wall-clock time that trains (the rest: restarts, interruptions, evaluation): wall-clock seconds =
training seconds ÷ goodput, and device-hours (what is billed) = devices × wall-clock hours.

Everything is exact rational arithmetic (:class:`fractions.Fraction`; a float is read as the decimal it
prints as, so 0.8 is 4/5): a run given by its
device-hours and the same run given by the MFU that implies are the same run, to the last bit.

>>> flops = flops_per_token(37e9)                                   # 6·N with N active = 37B
>>> run = account_run(flops, tokens=14.8e12, devices=2048, peak_flops_per_sec=989.5e12, given="device_hours", value=2.664e6)
>>> round(float(run.mfu), 4), round(float(run.days), 1)
(0.3462, 54.2)
>>> account_run(flops, tokens=14.8e12, devices=2048, peak_flops_per_sec=989.5e12, given="mfu", value=run.mfu).device_hours == run.device_hours
True
>>> flops_per_token(175e9, recompute="full").hardware_flops == 8 * Fraction(175e9)   # Megatron's 8·N
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import no_type_check

from resacct.errors import ResacctError, UnknownNameError

__all__ = [
    "CONVENTIONS",
    "RECOMPUTE_MODES",
    "GIVEN_QUANTITIES",
    "FlopsPerToken",
    "RunAccount",
    "flops_per_token",
    "account_run",
    "RunModel",
    "run_model_from_hf_values",
    "DeviceTime",
    "account_device_time",
]

CONVENTIONS = ("6nd", "attention")
RECOMPUTE_MODES = ("none", "selective", "full")
#: What may be given (exactly one) to fix a run's speed; every other rate is derived from it.
GIVEN_QUANTITIES = ("mfu", "hfu", "tokens_per_sec_per_device", "model_flops_per_sec_per_device",
                    "hardware_flops_per_sec_per_device", "days", "device_hours")

SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400

Number = float | int | Fraction


@no_type_check  # per number (13,815 checks): value is object (checked below), name and allowed the callers' words (docs/suite_time.md, session 7)
def _exact(name: str, value: object, allowed: str = "a finite number > 0") -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise ResacctError(f"{name} is {value!r}; expected {allowed}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ResacctError(f"{name} is {value!r}; expected {allowed}")
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)  # 0.8 is 4/5, as written
    if exact <= 0:
        raise ResacctError(f"{name} is {value!r}; expected {allowed}")
    return exact


def _whole(name: str, value: object) -> int:
    exact = _exact(name, value, "a whole number ≥ 1")
    if exact.denominator != 1:
        raise ResacctError(f"{name} is {value!r}; expected a whole number ≥ 1")
    return int(exact)


def _fraction_of_one(name: str, value: object, example: str) -> Fraction:
    exact = _exact(name, value, f"a fraction in (0, 1], e.g. {example}")
    if exact > 1:
        raise ResacctError(f"{name} is {value!r}; expected a fraction in (0, 1], e.g. {example}")
    return exact


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs one training token costs: the model's (for MFU) and the hardware's (for HFU)."""

    active_parameters: Fraction
    convention: str
    recompute: str
    attention_flops: Fraction  # 12·L·h·s, 0 under "6nd"
    model_flops: Fraction  # 6·N (+ attention)
    hardware_flops: Fraction  # model + what recomputation executes again

    @property
    def formula(self) -> str:
        """The convention in words, e.g. ``6·N + 12·L·h·s (+ recompute full: 2·N + 4·L·h·s)``."""
        model = "6·N" + (" + 12·L·h·s" if self.convention == "attention" else "")
        extra = {"none": "", "selective": " (+ recompute selective: 4·L·h·s)",
                 "full": " (+ recompute full: 2·N" + (" + 4·L·h·s)" if self.convention == "attention" else ")")}[self.recompute]
        return model + extra


def flops_per_token(active_parameters: Number, *, layers: int | None = None, attention_width: int | None = None,
                    seq: int | None = None, recompute: str = "none") -> FlopsPerToken:
    """FLOPs per training token of a model with ``active_parameters``; with ``layers``, the attention
    width h (heads × head width) and ``seq`` all given, PaLM's attention term 12·L·h·s is added
    (convention ``attention``), else none is (``6nd``).

    >>> f = flops_per_token(540.35e9, layers=118, attention_width=48 * 256, seq=2048, recompute="selective")
    >>> f.convention, round(float(f.model_flops) / 1e12, 3), round(float(f.hardware_flops / f.model_flops), 4)
    ('attention', 3.278, 1.0036)
    """
    n = _exact("active_parameters", active_parameters)
    if recompute not in RECOMPUTE_MODES:
        raise UnknownNameError("recompute mode", recompute, list(RECOMPUTE_MODES))
    shape = {"layers": layers, "attention_width": attention_width, "seq": seq}
    given = [name for name, value in shape.items() if value is not None]
    if given and len(given) < len(shape):
        missing = ", ".join(name for name in shape if name not in given)
        raise ResacctError(f"the attention term 12·L·h·s needs layers, attention_width and seq; missing {missing}")
    attention = Fraction(12 * _whole("layers", layers) * _whole("attention_width", attention_width) * _whole("seq", seq)) if given else Fraction(0)
    if recompute == "selective" and not attention:
        raise ResacctError("recompute 'selective' recomputes the attention core: give layers, attention_width and seq")
    model = 6 * n + attention
    extra = {"none": Fraction(0), "selective": attention / 3, "full": 2 * n + attention / 3}[recompute]
    return FlopsPerToken(active_parameters=n, convention="attention" if given else "6nd", recompute=recompute,
                         attention_flops=attention, model_flops=model, hardware_flops=model + extra)


@dataclass(frozen=True)
class RunAccount:
    """One run, every rate exact. ``training_seconds`` is the time the devices train; the wall clock
    is that ÷ goodput."""

    flops: FlopsPerToken
    tokens: Fraction
    devices: int
    peak_flops_per_sec: Fraction  # per device
    goodput: Fraction
    training_seconds: Fraction
    cost_per_device_hour: Fraction | None = None

    @property
    def model_flops(self) -> Fraction:
        return self.flops.model_flops * self.tokens

    @property
    def hardware_flops(self) -> Fraction:
        return self.flops.hardware_flops * self.tokens

    @property
    def model_flops_per_sec_per_device(self) -> Fraction:
        return self.model_flops / (self.devices * self.training_seconds)

    @property
    def hardware_flops_per_sec_per_device(self) -> Fraction:
        return self.hardware_flops / (self.devices * self.training_seconds)

    @property
    def mfu(self) -> Fraction:
        return self.model_flops_per_sec_per_device / self.peak_flops_per_sec

    @property
    def hfu(self) -> Fraction:
        return self.hardware_flops_per_sec_per_device / self.peak_flops_per_sec

    @property
    def mfu_over_wall_clock(self) -> Fraction:
        """MFU counted over the whole wall clock (MFU × goodput): what the device-hours bought."""
        return self.mfu * self.goodput

    @property
    def tokens_per_sec_per_device(self) -> Fraction:
        return self.tokens / (self.devices * self.training_seconds)

    @property
    def wall_clock_seconds(self) -> Fraction:
        return self.training_seconds / self.goodput

    @property
    def days(self) -> Fraction:
        return self.wall_clock_seconds / SECONDS_PER_DAY

    @property
    def device_hours(self) -> Fraction:
        return self.devices * self.wall_clock_seconds / SECONDS_PER_HOUR

    @property
    def cost(self) -> Fraction | None:
        """device-hours × the price of a device-hour (None without a price)."""
        return None if self.cost_per_device_hour is None else self.device_hours * self.cost_per_device_hour

    def mfu_against(self, peak_flops_per_sec: Number) -> Fraction:
        """The same run's MFU relative to another peak (an fp8 peak instead of bf16's, say)."""
        return self.model_flops_per_sec_per_device / _exact("peak_flops_per_sec", peak_flops_per_sec)


def _training_seconds(flops: FlopsPerToken, tokens: Fraction, devices: int, peak: Fraction, goodput: Fraction,
                      given: str, value: Number) -> Fraction:
    if given in ("mfu", "hfu"):
        utilization = _fraction_of_one(given, value, "0.4 for 40% of the peak")
        per_token = flops.model_flops if given == "mfu" else flops.hardware_flops
        return per_token * tokens / (devices * peak * utilization)
    rate = _exact(given, value)
    if given == "tokens_per_sec_per_device":
        return tokens / (devices * rate)
    if given == "model_flops_per_sec_per_device":
        return flops.model_flops * tokens / (devices * rate)
    if given == "hardware_flops_per_sec_per_device":
        return flops.hardware_flops * tokens / (devices * rate)
    if given == "days":
        return rate * SECONDS_PER_DAY * goodput
    return rate * SECONDS_PER_HOUR / devices * goodput  # device_hours


def account_run(flops: FlopsPerToken, *, tokens: Number, devices: Number, peak_flops_per_sec: Number, given: str, value: Number,
                goodput: Number = 1, cost_per_device_hour: Number | None = None) -> RunAccount:
    """The run of ``tokens`` tokens on ``devices`` devices of ``peak_flops_per_sec`` each, whose
    ``given`` quantity (one of :data:`GIVEN_QUANTITIES`) is ``value``: every other quantity derived.

    A derived MFU above 1 is returned, not refused (the inputs contradict the peak: the caller says so);
    a *given* MFU or HFU must be in (0, 1].
    """
    if given not in GIVEN_QUANTITIES:
        raise UnknownNameError("run quantity", given, list(GIVEN_QUANTITIES))
    exact_tokens = _exact("tokens", tokens)
    count = _whole("devices", devices)
    peak = _exact("peak_flops_per_sec", peak_flops_per_sec)
    share = _fraction_of_one("goodput", goodput, "0.9 when a tenth of the wall clock is lost to restarts")
    price = _price(cost_per_device_hour)
    seconds = _training_seconds(flops, exact_tokens, count, peak, share, given, value)
    return RunAccount(flops=flops, tokens=exact_tokens, devices=count, peak_flops_per_sec=peak, goodput=share,
                      training_seconds=seconds, cost_per_device_hour=price)


def _price(cost_per_device_hour: Number | None) -> Fraction | None:
    if cost_per_device_hour is None:
        return None
    if cost_per_device_hour == 0 and not isinstance(cost_per_device_hour, bool):
        return Fraction(0)
    return _exact("cost_per_device_hour", cost_per_device_hour, "a price ≥ 0")


@dataclass(frozen=True)
class DeviceTime:
    """What a run's device time alone answers, without its tokens or its model: device-hours, the
    wall clock (given the devices), the share of it that trains, the cost. No FLOPs, no MFU."""

    device_hours: Fraction
    devices: int | None
    goodput: Fraction
    cost_per_device_hour: Fraction | None = None

    @property
    def wall_clock_seconds(self) -> Fraction | None:
        return None if self.devices is None else self.device_hours * SECONDS_PER_HOUR / self.devices

    @property
    def days(self) -> Fraction | None:
        seconds = self.wall_clock_seconds
        return None if seconds is None else seconds / SECONDS_PER_DAY

    @property
    def training_seconds(self) -> Fraction | None:
        seconds = self.wall_clock_seconds
        return None if seconds is None else seconds * self.goodput

    @property
    def cost(self) -> Fraction | None:
        return None if self.cost_per_device_hour is None else self.device_hours * self.cost_per_device_hour


def account_device_time(*, given: str, value: Number, devices: Number | None = None, goodput: Number = 1,
                        cost_per_device_hour: Number | None = None) -> DeviceTime:
    """A run known by its ``days`` (which need ``devices``) or its ``device_hours`` only.

    >>> t = account_device_time(given="device_hours", value=2.664e6, devices=2048, cost_per_device_hour=2)
    >>> round(float(t.days), 2), float(t.cost)
    (54.2, 5328000.0)
    >>> account_device_time(given="device_hours", value=1e6).days is None
    True
    """
    if given not in ("days", "device_hours"):
        raise ResacctError(f"without tokens a run is known only by its days or device-hours, not by {given!r}; "
                           "give the tokens to derive the time from a rate")
    count = None if devices is None else _whole("devices", devices)
    share = _fraction_of_one("goodput", goodput, "0.9 when a tenth of the wall clock is lost to restarts")
    amount = _exact(given, value)
    if given == "days":
        if count is None:
            raise ResacctError("days need the number of devices to give device-hours (device-hours = devices × days × 24)")
        device_hours = amount * count * SECONDS_PER_DAY / SECONDS_PER_HOUR
    else:
        device_hours = amount
    return DeviceTime(device_hours=device_hours, devices=count, goodput=share, cost_per_device_hour=_price(cost_per_device_hour))


@dataclass(frozen=True)
class RunModel:
    """What a run needs of a model: total parameters (memory), active ones (FLOPs), and the shape of
    its attention (layers L and width h = heads × head width) for the attention term."""

    total_parameters: int
    active_parameters: int
    layers: int
    attention_width: int
    source: str


def run_model_from_hf_values(values: dict, source: str = "") -> RunModel:
    """A :class:`RunModel` from a transformers config's values (a shipped ``--hf-config`` or a
    config.json read as a dict), by resacct's closed-form HF parameter counts; no transformers needed.
    The fields a config may omit take transformers' defaults (GPT-2: ``n_inner`` 4·d, tied head).

    >>> m = run_model_from_hf_values({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    ...     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    ...     "num_local_experts": 8, "num_experts_per_tok": 2})
    >>> m.total_parameters, m.active_parameters                     # Mixtral 8x7B: 46.7B total, 12.9B active
    (46702792704, 12879925248)
    """
    from types import SimpleNamespace

    from resacct.formulas.hf_formulas import architecture_of, predict_active_parameters, predict_parameters

    defaults = {"n_inner": None, "tie_word_embeddings": values.get("model_type") == "gpt2", "attn_pdrop": 0.0, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "activation_function": "gelu_new"}
    architecture = architecture_of(SimpleNamespace(**{**defaults, **values}))
    if architecture is None:
        from resacct.formulas.hf_formulas import FAMILIES

        raise UnknownNameError("model_type for run accounting", values.get("model_type"), sorted(FAMILIES))
    return RunModel(total_parameters=predict_parameters(architecture), active_parameters=predict_active_parameters(architecture),
                    layers=architecture.layers, attention_width=architecture.heads * architecture.head_dim, source=source)
