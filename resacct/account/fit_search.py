"""Will it fit on a device: the largest micro-batch — or sequence length — whose training step's
**predicted** peak (:mod:`resacct.account.peak`: the step on fake tensors of a model built on the
meta device, nothing allocated) stays within a device's memory less a reserve.

Each probe is one prediction (a trace of the whole step). A step's peak is affine in the batch
wherever one phase holds it, so the search traces 1 and 2, solves the line through them for the
budget and confirms its answer ``b`` with two more traces — ``b`` fits and ``b + 1`` does not (both
probed, always): four traces for ``b`` up to 128 (one more per × 64 beyond), two when 2 does not fit. Where the line misses
(the peak not affine) it searches on from the probes made (:func:`largest_fitting`).

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
>>> target = FitTarget("mlp", model, lambda batch, seq: torch.empty(batch, 64, device="meta"), loss="mean", seq_limit=None)
>>> answer = fit_step(target, memory_bytes=800_000, search="batch", recipe="fp32")
>>> answer.largest, answer.peak_bytes <= answer.budget_bytes < answer.next_peak_bytes
(94, True)
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from resacct.errors import ResacctError

__all__ = ["FitProbe", "FitTarget", "FitAnswer", "ModelSource", "SEARCHES", "MAX_BATCH", "affine_answer", "affine_deviation_bytes",
           "largest_fitting", "fit_step", "step_peak_function", "hf_config_target", "named_model_target"]

#: What a fit searches over.
SEARCHES = ("batch", "seq")
#: The largest micro-batch a search tries (a bound on the doubling, not a property of any model).
MAX_BATCH = 1 << 20
#: The farthest a line's answer is trusted before a size that fails: × the largest size that fits.
GROWTH = 64


@dataclass(frozen=True)
class FitProbe:
    """One prediction of the search: the size tried, its predicted step peak, whether it fits."""

    size: int
    peak_bytes: int
    fits: bool
    seconds: float


@dataclass(frozen=True)
class FitTarget:
    """A model to fit: built once (on the meta device), ``make_inputs(batch, seq)`` its step's
    inputs (``seq`` None for a model without one), ``loss`` a name
    :func:`resacct.account.model_io.loss_of_output` reads or ``loss(model, inputs)`` itself,
    ``seq_limit`` the longest sequence it takes (its context length; None: no sequence axis)."""

    name: str
    model: nn.Module
    make_inputs: Callable[[int, int | None], Any]
    loss: str | Callable[[nn.Module, Any], Any]
    seq_limit: int | None

    def loss_fn(self) -> Callable[[nn.Module, Any], Any]:
        """``loss(model, inputs)``: the target's own callable, or its named loss of the model's output."""
        from resacct.account.model_io import call_model, loss_of_output

        loss = self.loss
        return loss if callable(loss) else (lambda module, inputs: loss_of_output(call_model(module, inputs), loss))


@dataclass(frozen=True)
class ModelSource:
    """A real model as the command line names it, parsed once and picklable (a child process builds
    it too): ``hf_config`` (a shipped name or a config.json path) or ``factory`` (``module:factory``
    with ``model_args``, importable from ``path``), its input (``input_shape``/``input_dtype``) and
    ``loss``. :meth:`target` builds it on the meta device."""

    hf_config: str | None = None
    factory: str | None = None
    model_args: tuple[tuple[str, Any], ...] = ()
    input_shape: tuple[int, ...] | None = None
    input_dtype: str = "float32"
    loss: str = "auto"
    path: str = field(default_factory=os.getcwd)

    def target(self) -> FitTarget:
        if (self.hf_config is None) == (self.factory is None):
            raise ResacctError("give the model by exactly one of --hf-config NAME (or config.json) and --model module:factory")
        if self.hf_config is not None:
            return hf_config_target(self.hf_config)
        if self.path not in sys.path:
            sys.path.insert(0, self.path)  # as python -m does: a module next to you is importable
        return named_model_target(self.factory, dict(self.model_args), input_shape=self.input_shape, input_dtype=self.input_dtype, loss=self.loss)


@dataclass
class FitAnswer:
    """The largest ``searched`` size (``batch`` or ``seq``) that fits ``memory_bytes`` less
    ``reserve_bytes``, the other size ``fixed``; ``largest`` None when even 1 does not fit."""

    model: str
    searched: str
    fixed: int | None
    memory_bytes: float
    reserve_bytes: float
    device: Any
    recipe: str
    optimizer: str
    micro_batches: int
    limit: int
    largest: int | None
    probes: list[FitProbe]
    peak_phase: str = ""
    peak_op: str = ""
    attention_kernel: str = ""
    live_at_peak_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def budget_bytes(self) -> float:
        return self.memory_bytes - self.reserve_bytes

    def _peak_at(self, size: int | None) -> int | None:
        return next((probe.peak_bytes for probe in self.probes if probe.size == size), None)

    @property
    def peak_bytes(self) -> int | None:
        """The predicted peak at the answer (None: nothing fits)."""
        return self._peak_at(self.largest)

    @property
    def next_peak_bytes(self) -> int | None:
        """The predicted peak one size past the answer (None when the answer is the limit)."""
        return self._peak_at(1 if self.largest is None else self.largest + 1)

    @property
    def headroom_bytes(self) -> float | None:
        """What the budget leaves free at the answer's predicted peak."""
        return None if self.peak_bytes is None else self.budget_bytes - self.peak_bytes

    @property
    def seconds(self) -> float:
        return sum(probe.seconds for probe in self.probes)

    @property
    def traces(self) -> int:
        """How many steps the search traced (one per probe)."""
        return len(self.probes)

    def to_dict(self) -> dict[str, Any]:
        """``--json``: sizes, bytes with units in their names, every probe."""
        from resacct.account.peak import ENGINE

        return {
            "model": self.model, "searched": self.searched, "fixed_batch" if self.searched == "seq" else "fixed_seq": self.fixed,
            "device": None if self.device is None else self.device.name, "memory_bytes": self.memory_bytes, "reserve_bytes": self.reserve_bytes,
            "budget_bytes": self.budget_bytes, "recipe": self.recipe, "optimizer": self.optimizer, "micro_batches": self.micro_batches,
            "limit": self.limit, "largest": self.largest, "predicted_peak_bytes": self.peak_bytes, "next_predicted_peak_bytes": self.next_peak_bytes,
            "headroom_bytes": self.headroom_bytes, "peak_phase": self.peak_phase, "peak_op": self.peak_op, "attention_kernel": self.attention_kernel,
            "live_at_peak_bytes": self.live_at_peak_bytes, "seconds": self.seconds, "traces": self.traces,
            "affine_deviation_bytes": affine_deviation_bytes(self.probes),
            "probes": [{"size": p.size, "predicted_peak_bytes": p.peak_bytes, "fits": p.fits, "seconds": p.seconds} for p in self.probes],
            "predicted_by": ENGINE,
        }


def _crossing(low: int, low_peak: int, high: int, high_peak: int, budget_bytes: float) -> float | None:
    """Where the line through (low, low_peak) and (high, high_peak) reaches the budget (None: it does not rise)."""
    if high_peak <= low_peak:
        return None
    return low + (budget_bytes - low_peak) * (high - low) / (high_peak - low_peak)


def affine_answer(first: FitProbe, second: FitProbe, budget_bytes: float) -> int | None:
    """The largest size the line through two probes keeps within the budget (None: the line does not rise).

    >>> affine_answer(FitProbe(1, 1010, True, 0.0), FitProbe(2, 1020, True, 0.0), 1095)
    9
    """
    if second.peak_bytes <= first.peak_bytes:
        return None
    slope = (second.peak_bytes - first.peak_bytes) / (second.size - first.size)
    return first.size + math.floor((budget_bytes - first.peak_bytes) / slope + 1e-9)


def affine_deviation_bytes(probes: list[FitProbe]) -> int | None:
    """How far the farthest probe lies from the line through the first two (0: every probe on it to
    the byte; None: fewer than three probes). A step's peak is the largest of a few phase peaks, each
    affine in the batch: where one phase holds the peak at every probe, this is 0 or a few bytes of rounding."""
    if len(probes) < 3:
        return None
    first, second = probes[0], probes[1]
    slope = (second.peak_bytes - first.peak_bytes) / (second.size - first.size)
    return max(round(abs(p.peak_bytes - (first.peak_bytes + slope * (p.size - first.size)))) for p in probes[2:])


def largest_fitting(peak_of: Callable[[int], int], budget_bytes: float, *, limit: int,
                    on_probe: Callable[[FitProbe], None] | None = None) -> tuple[int | None, list[FitProbe]]:
    """The largest n in 1..``limit`` with ``peak_of(n) ≤ budget_bytes`` (None: not even 1), for a
    ``peak_of`` that grows with n, and every probe made (n + 1 among them unless n is the limit).

    Few traces: the step's peak is affine in the batch wherever one phase holds it, so the line
    through the probes at 1 and 2 names the answer b, and two more probes confirm it — b fits and
    b + 1 does not: **four traces** for an affine peak (two when 2 does not fit), one more per × 64
    beyond 128 (the line is trusted up to 64 × the largest size that fits).
    Where the peak is not affine (a phase that takes over at a larger batch, a curved peak) the line
    misses: the search goes on from the probes made — by the line through the two largest sizes
    that fit while none has failed (× 8 while it does not rise, at most × 64); after a miss, by the line
    through two sizes side by side that do not fit (exact where one phase holds the peak there);
    last, between the largest that fits and the smallest that does not, by their line, bisecting
    when the line would not halve the gap.

    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 1095, limit=10**6)
    >>> answer, [p.size for p in probes]
    (9, [1, 2, 9, 10])
    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 10**6, limit=10**7)
    >>> answer, [p.size for p in probes]
    (99900, [1, 2, 128, 8192, 99900, 99901])
    >>> largest_fitting(lambda n: 10 * n, 5, limit=8)[0], largest_fitting(lambda n: n, 100, limit=8)[0]
    (None, 8)
    """
    probes: dict[int, FitProbe] = {}

    def fits(size: int) -> bool:
        started = time.perf_counter()
        peak = peak_of(size)
        probes[size] = FitProbe(size=size, peak_bytes=peak, fits=peak <= budget_bytes, seconds=time.perf_counter() - started)
        if on_probe is not None:
            on_probe(probes[size])
        return probes[size].fits

    if not fits(1):
        return None, list(probes.values())
    low, previous, high = 1, None, None  # low fits; high (when known) does not; previous: the size that fit before low
    while high is None and low < limit:
        guess = None if previous is None else affine_answer(probes[previous], probes[low], budget_bytes)
        if guess is None or guess < low:  # 2 (the line's second size), or × 8 while the line does not rise (or low fits above it)
            size = 2 * low if previous is None else 8 * low
        else:  # the line's answer (at most GROWTH × low: a line from small sizes may miss by far); when that is low itself, one more
            size = min(max(guess, low + 1), GROWTH * low)
        size = min(size, limit)
        previous = low
        if not fits(size):
            high = size
            break
        low = size
        if size == guess and size < limit:  # the line's answer fits: one more must not
            if not fits(size + 1):
                high = size + 1
                break
            previous, low = size, size + 1
    if high is not None:
        low, high = _from_the_right(fits, probes, low, high, budget_bytes)
    steer = True  # by the line; after a step it narrowed by less than half, one bisection
    while high is not None and high - low > 1:
        gap = high - low
        crossing = _crossing(low, probes[low].peak_bytes, high, probes[high].peak_bytes, budget_bytes) if steer else None
        size = (low + high) // 2 if crossing is None else min(max(int(crossing), low + 1), high - 1)
        if fits(size):
            low = size
        else:
            high = size
        steer = crossing is None or high - low <= gap // 2 or high - low == 1
    return low, list(probes.values())


def _from_the_right(fits: Callable[[int], bool], probes: dict[int, FitProbe], low: int, high: int, budget_bytes: float) -> tuple[int, int]:
    """Narrow ``low`` (fits) … ``high`` (does not) by the line through two sizes that do not fit, side
    by side: where one phase's affine peak holds there, its answer ``c`` is exact, and a peak that is
    the largest of affine phase peaks (convex) lies above that line, so ``c + 1`` does not fit — traced,
    with ``c``. A few rounds (one per phase the line crosses); the caller bisects whatever is left."""
    for _ in range(4):
        if high - low <= 1:
            break
        if high + 1 not in probes:  # the line at high needs a second size that does not fit: the one below
            if fits(high - 1):
                return high - 1, high
            high -= 1
            if high - low <= 1:
                break
        answer = affine_answer(probes[high], probes[high + 1], budget_bytes)
        if answer is None or answer >= high:  # flat, or not convex: bisection
            break
        answer = max(answer, low)
        if answer + 1 < high:
            if fits(answer + 1):  # above the line's answer yet within the budget: not convex
                return answer + 1, high
            high = answer + 1
        if answer > low:
            if fits(answer):
                low = answer
            else:
                high = answer
    return low, high


def _check_size(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ResacctError(f"{name} {value!r}: expected a whole number ≥ 1")


def fit_step(target: FitTarget, *, memory_bytes: float, search: str = "batch", batch: int = 1, seq: int | None = None,
             reserve_bytes: float = 0.0, device: Any = None, recipe: Any = "fp32", optimizer: str = "adamw", micro_batches: int = 1,
             max_batch: int = MAX_BATCH, on_probe: Callable[[FitProbe], None] | None = None) -> FitAnswer:
    """The largest micro-batch (``search="batch"``, at ``seq``) or sequence (``search="seq"``, at
    ``batch``) of ``target`` whose predicted step peak — ``recipe`` (a name or a
    :class:`~resacct.facts.recipes.Recipe`), ``optimizer``, ``micro_batches`` accumulated micro-steps —
    is at most ``memory_bytes − reserve_bytes``. ``device``: the board the memory is from (named in the answer)."""
    from resacct.facts.dtypes import parse_dtype
    from resacct.facts.recipes import get_recipe

    if search not in SEARCHES:
        raise ResacctError(f"search {search!r}: expected one of {', '.join(SEARCHES)}")
    for name, value in (("batch", batch), ("micro-batches", micro_batches), ("max batch", max_batch)):
        _check_size(name, value)
    if seq is not None:
        _check_size("seq", seq)
    if not memory_bytes > 0 or not 0 <= reserve_bytes < memory_bytes:
        raise ResacctError(f"memory {memory_bytes!r} bytes with {reserve_bytes!r} reserved: expected memory > 0 and 0 ≤ reserve < memory")
    chosen = get_recipe(recipe)
    dtype = parse_dtype(chosen.parameter_dtype)
    model = target.model if all(p.dtype == dtype for p in target.model.parameters()) else copy.deepcopy(target.model).to(dtype)  # once
    if search == "seq":
        if target.seq_limit is None:
            raise ResacctError(f"{target.name} has no sequence length to search (no context length in its config); expected --search batch")
        limit, fixed = target.seq_limit, batch
    else:
        if seq is not None and target.seq_limit is not None and seq > target.seq_limit:
            raise ResacctError(f"seq {seq} is longer than {target.name}'s context length {target.seq_limit}; expected seq ≤ {target.seq_limit}")
        limit, fixed = max_batch, seq if seq is not None else target.seq_limit
    latest: dict[int, Any] = {}
    peak_of = step_peak_function(target, model, search=search, fixed=fixed, recipe=chosen, optimizer=optimizer, micro_batches=micro_batches,
                                 keep=latest)
    largest, probes = largest_fitting(peak_of, memory_bytes - reserve_bytes, limit=limit, on_probe=on_probe)
    answer = FitAnswer(model=target.name, searched=search, fixed=fixed, memory_bytes=memory_bytes, reserve_bytes=reserve_bytes, device=device,
                       recipe=chosen.name, optimizer=optimizer, micro_batches=micro_batches, limit=limit, largest=largest, probes=probes)
    shown = latest.get(largest if largest is not None else 1)
    if shown is not None:
        answer.peak_phase, answer.peak_op, answer.attention_kernel = shown.peak.phase, shown.peak.op, shown.attention_kernel
        answer.live_at_peak_bytes = dict(shown.peak.bytes_by_kind)
    return answer


def step_peak_function(target: FitTarget, model: nn.Module, *, search: str, fixed: int | None, recipe: Any, optimizer: str,
                       micro_batches: int = 1, keep: dict[int, Any] | None = None) -> Callable[[int], int]:
    """``peak_of(size)``: the predicted step peak (bytes) of ``model`` (``target``'s, in the recipe's
    parameter dtype) at ``search`` = size, the other size ``fixed`` — one trace of the whole step on
    fake tensors per call; each prediction kept in ``keep`` by size."""
    from resacct.account.peak import account_recipe_step_peak

    loss_fn = target.loss_fn()

    def peak_of(size: int) -> int:
        inputs = target.make_inputs(size, fixed) if search == "batch" else target.make_inputs(fixed, size)
        account = account_recipe_step_peak(model, inputs, loss_fn, recipe=recipe, optimizer=optimizer, measure=False, micro_batches=micro_batches)
        if account.predicted is None:
            raise ResacctError(f"{target.name}: no predicted peak at {search} {size} ({account.gap})")
        if keep is not None:
            keep[size] = account.predicted
        return account.predicted.peak_bytes

    return peak_of


def hf_config_target(config: str) -> FitTarget:
    """A Hugging Face causal LM from a shipped config name or a ``config.json`` path, built on the
    meta device (sdpa attention; a mixture of experts with ``batched_mm`` experts), its own loss on
    ``input_ids`` and ``labels``; the sequence limit is its context length."""
    from resacct.account.hf_models import build_hf_model, load_hf_config
    from resacct.account.model_io import context_length, default_inputs

    spec = load_hf_config(config)
    model = build_hf_model(spec, device="meta")
    model.train()
    return FitTarget(name=spec.name, model=model, make_inputs=lambda batch, seq: default_inputs(model, batch=batch, seq=seq, device="meta"),
                     loss="model", seq_limit=context_length(model))


def _with_batch(example: Any, batch: int) -> Any:
    """A factory's example input with its first axis (the batch) set to ``batch``, on meta."""
    import torch

    from resacct.measurement.memory_timeline import copy_inputs

    return copy_inputs(example, lambda t: torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta"))


def named_model_target(spec: str, model_args: dict[str, Any] | None = None, *, input_shape: tuple[int, ...] | None = None,
                       input_dtype: str = "float32", loss: str = "auto") -> FitTarget:
    """``module:factory`` built under ``torch.device("meta")``; its inputs as ``resacct account``
    makes them (:func:`resacct.account.model_io.default_inputs`), or the factory's example input
    with the batch axis resized (a fit then searches the batch only)."""
    import torch

    from resacct.account.model_factory import load_model
    from resacct.account.model_io import LOSS_CHOICES, call_model, check_inputs, context_length, default_inputs, is_token_model, resolve_loss
    from resacct.account.user_code import calling_user_code

    if loss not in LOSS_CHOICES:
        raise ResacctError(f"loss {loss!r}: expected one of {', '.join(LOSS_CHOICES)}")
    with torch.device("meta"):
        model, example = load_model(spec, model_args)
    if not list(model.parameters()):
        raise ResacctError(f"the model {type(model).__name__} from {spec!r} has no parameters; expected a model with something to train")
    model.train()
    if example is not None:
        example = check_inputs(example)
        make_inputs: Callable[[int, int | None], Any] = lambda batch, seq: _with_batch(example, batch)  # noqa: E731
        seq_limit = None
    else:
        shape = None if input_shape is None else tuple(input_shape)

        def make_inputs(batch: int, seq: int | None) -> Any:
            with calling_user_code(f"making the input of {type(model).__name__}"):
                if shape is not None:
                    return default_inputs(model, batch=batch, input_shape=(batch, *shape[1:]), input_dtype=input_dtype, device="meta")
                return default_inputs(model, batch=batch, seq=seq, input_dtype=input_dtype, device="meta")

        seq_limit = context_length(model) if is_token_model(model) else None
    if loss == "auto":
        with calling_user_code(f"the forward of {type(model).__name__}"):
            loss = resolve_loss(call_model(model, make_inputs(1, 1 if seq_limit else None)), "auto")
    return FitTarget(name=spec, model=model, make_inputs=make_inputs, loss=loss, seq_limit=seq_limit)
