"""Will it fit on a device: the largest micro-batch — or sequence length — whose training step's
**predicted** peak (:mod:`resacct.account.peak.step_peak`: the step on fake tensors of a model built on the
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

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: an answer read back from the trace cache renders without torch
    from torch import nn

from resacct.account.fit.lines import GROWTH, FitProbe, affine_answer, affine_deviation_bytes, largest_fitting, probed_peak_bytes
from resacct.errors import ResacctError

__all__ = ["FitProbe", "FitTarget", "FitAnswer", "ModelSource", "SEARCHES", "MAX_BATCH", "GROWTH", "affine_answer", "affine_deviation_bytes",
           "largest_fitting", "fit_step", "phase_peaks_bytes", "step_peak_function", "hf_config_target", "named_model_target"]

#: What a fit searches over.
SEARCHES = ("batch", "seq")
#: The largest micro-batch a search tries (a bound on the doubling, not a property of any model).
MAX_BATCH = 1 << 20


@dataclass(frozen=True)
class FitTarget:
    """A model to fit: built once (on the meta device), ``make_inputs(batch, seq)`` its step's
    inputs (``seq`` None for a model without one), ``loss`` a name
    :func:`resacct.account.load.model_io.loss_of_output` reads or ``loss(model, inputs)`` itself,
    ``seq_limit`` the longest sequence it takes (its context length; None: no sequence axis)."""

    name: str
    model: nn.Module
    make_inputs: Callable[[int, int | None], Any]
    loss: str | Callable[[nn.Module, Any], Any]
    seq_limit: int | None
    #: the model at depths 3, 4 and 5, when its probes are sampled (:mod:`resacct.account.fit.sampled_layers`); None: traced whole
    shallow: Any = None

    def loss_fn(self) -> Callable[[nn.Module, Any], Any]:
        """``loss(model, inputs)``: the target's own callable, or its named loss of the model's output."""
        from resacct.account.load.model_io import call_model, loss_of_output

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
    #: how a ``hf_config``'s deep stack of identical layers is traced (:data:`~resacct.account.trace.repeated_layers.LAYER_CHOICES`)
    layers: str = "auto"

    def target(self) -> FitTarget:
        if (self.hf_config is None) == (self.factory is None):
            raise ResacctError("give the model by exactly one of --hf-config NAME (or config.json) and --model module:factory")
        if self.hf_config is not None:
            return hf_config_target(self.hf_config, self.layers)
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
    #: how the probes traced a deep model from three shallow ones (None: each the whole step)
    sampled: str | None = None

    @property
    def budget_bytes(self) -> float:
        return self.memory_bytes - self.reserve_bytes

    @property
    def peak_bytes(self) -> int | None:
        """The predicted peak at the answer (None: nothing fits)."""
        return probed_peak_bytes(self.probes, self.largest)

    @property
    def next_peak_bytes(self) -> int | None:
        """The predicted peak one size past the answer (None when the answer is the limit)."""
        return probed_peak_bytes(self.probes, 1 if self.largest is None else self.largest + 1)

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
        from resacct.account.peak.engine import ENGINE

        return {
            "model": self.model, "searched": self.searched, "fixed_batch" if self.searched == "seq" else "fixed_seq": self.fixed,
            "device": None if self.device is None else self.device.name, "memory_bytes": self.memory_bytes, "reserve_bytes": self.reserve_bytes,
            "budget_bytes": self.budget_bytes, "recipe": self.recipe, "optimizer": self.optimizer, "micro_batches": self.micro_batches,
            "limit": self.limit, "largest": self.largest, "predicted_peak_bytes": self.peak_bytes, "next_predicted_peak_bytes": self.next_peak_bytes,
            "headroom_bytes": self.headroom_bytes, "peak_phase": self.peak_phase, "peak_op": self.peak_op, "attention_kernel": self.attention_kernel,
            "live_at_peak_bytes": self.live_at_peak_bytes, "seconds": self.seconds, "traces": self.traces,
            "affine_deviation_bytes": affine_deviation_bytes(self.probes),
            "probes": [{"size": p.size, "predicted_peak_bytes": p.peak_bytes, "fits": p.fits, "seconds": p.seconds} for p in self.probes],
            "predicted_by": ENGINE, "sampled_layers": self.sampled,
        }


def _check_size(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ResacctError(f"{name} {value!r}: expected a whole number ≥ 1")


def fit_step(target: FitTarget, *, memory_bytes: float, search: str = "batch", batch: int = 1, seq: int | None = None,
             reserve_bytes: float = 0.0, device: Any = None, recipe: Any = "fp32", optimizer: str = "adamw", micro_batches: int = 1,
             max_batch: int = MAX_BATCH, on_probe: Callable[[FitProbe], None] | None = None,
             on_probe_start: Callable[[int, int | None], None] | None = None) -> FitAnswer:
    """The largest micro-batch (``search="batch"``, at ``seq``) or sequence (``search="seq"``, at
    ``batch``) of ``target`` whose predicted step peak — ``recipe`` (a name or a
    :class:`~resacct.facts.recipes.Recipe`), ``optimizer``, ``micro_batches`` accumulated micro-steps —
    is at most ``memory_bytes − reserve_bytes``. ``device``: the board the memory is from (named in the answer).
    ``on_probe_start(size, fixed)``: told of each size before its probe is traced (``fit --device`` traces the
    board's step there beside it: :mod:`resacct.account.gpu.answers.traced_beside`)."""
    from resacct.account.peak.recipes import model_in_dtype
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
    model = model_in_dtype(target.model, parse_dtype(chosen.parameter_dtype))  # once, not per probe
    if search == "seq":
        if target.seq_limit is None:
            raise ResacctError(f"{target.name} has no sequence length to search (no context length in its config); expected --search batch")
        limit, fixed = target.seq_limit, batch
    else:
        if seq is not None and target.seq_limit is not None and seq > target.seq_limit:
            raise ResacctError(f"seq {seq} is longer than {target.name}'s context length {target.seq_limit}; expected seq ≤ {target.seq_limit}")
        limit, fixed = max_batch, seq if seq is not None else target.seq_limit
    latest: dict[int, Any] = {}
    sampled: dict[str, Any] = {}
    peak_of = step_peak_function(target, model, search=search, fixed=fixed, recipe=chosen, optimizer=optimizer, micro_batches=micro_batches,
                                 keep=latest, sampled=sampled)
    if on_probe_start is not None:
        traced, tell = peak_of, on_probe_start

        def peak_of(size: int) -> int:
            tell(size, fixed)
            return traced(size)
    largest, probes = largest_fitting(peak_of, memory_bytes - reserve_bytes, limit=limit, on_probe=on_probe,
                                      phase_peaks_of=lambda size: phase_peaks_bytes(latest[size]))
    answer = FitAnswer(model=target.name, searched=search, fixed=fixed, memory_bytes=memory_bytes, reserve_bytes=reserve_bytes, device=device,
                       recipe=chosen.name, optimizer=optimizer, micro_batches=micro_batches, limit=limit, largest=largest, probes=probes,
                       sampled=sampled.get("how"))
    shown = latest.get(largest if largest is not None else 1)
    if shown is not None:
        answer.peak_phase, answer.peak_op, answer.attention_kernel = shown.peak.phase, shown.peak.op, shown.attention_kernel
        answer.live_at_peak_bytes = dict(shown.peak.bytes_by_kind)
    return answer


def phase_peaks_bytes(predicted: Any) -> dict[str, int]:
    """The most a predicted step (:class:`~resacct.account.peak.step_peak.PredictedStepPeak`) holds in each of its phases."""
    timeline = predicted.timeline
    return {phase: timeline.peak_of_phase(phase) for phase in dict.fromkeys(timeline.phases)}


def step_peak_function(target: FitTarget, model: nn.Module, *, search: str, fixed: int | None, recipe: Any, optimizer: str,
                       micro_batches: int = 1, keep: dict[int, Any] | None = None, sampled: dict[str, Any] | None = None) -> Callable[[int], int]:
    """``peak_of(size)``: the predicted step peak (bytes) of ``model`` (``target``'s, in the recipe's
    parameter dtype) at ``search`` = size, the other size ``fixed`` — one trace of the whole step on
    fake tensors per call, or, for a target with shallow copies and one micro-batch, the step at
    depths 3, 4 and 5 extrapolated (:mod:`resacct.account.fit.sampled_layers`; one that does not
    repeat: whole from then on; ``sampled["how"]`` says which); each prediction kept in ``keep`` by size."""
    from resacct.account.fit.sampled_layers import sampled_step_peak
    from resacct.account.peak.layer_segments import NotRepeating
    from resacct.account.peak.step_peak import account_recipe_step_peak

    loss_fn = target.loss_fn()
    shallow = [target.shallow if micro_batches == 1 else None]
    dtype = next(model.parameters()).dtype
    said = sampled if sampled is not None else {}

    def peak_of(size: int) -> int:
        inputs = target.make_inputs(size, fixed) if search == "batch" else target.make_inputs(fixed, size)
        predicted = None
        if shallow[0] is not None:
            try:
                predicted = sampled_step_peak(shallow[0], dtype, inputs, loss_fn, recipe=recipe, optimizer=optimizer)
                said.setdefault("how", shallow[0].describe())
            except NotRepeating as error:
                shallow[0], said["how"] = None, f"every layer traced: at {search} {size} the layers did not repeat ({error})"
        if predicted is None:
            account = account_recipe_step_peak(model, inputs, loss_fn, recipe=recipe, optimizer=optimizer, measure=False, micro_batches=micro_batches)
            if account.predicted is None:
                raise ResacctError(f"{target.name}: no predicted peak at {search} {size} ({account.gap})")
            predicted = account.predicted
        if keep is not None:
            keep[size] = predicted
        return predicted.peak_bytes

    return peak_of


def hf_config_target(config: str, layers: str = "auto") -> FitTarget:
    """A Hugging Face causal LM from a shipped config name or a ``config.json`` path, built on the
    meta device (sdpa attention; a mixture of experts with ``batched_mm`` experts), its own loss on
    ``input_ids`` and ``labels``; the sequence limit is its context length. A deep stack of identical
    layers also gets its shallow copies (``layers``: as :func:`resacct.account.answers.hf.account_hf_config`'s)."""
    from resacct.account.fit.sampled_layers import shallow_copies
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.account.load.model_io import context_length, default_inputs

    spec = load_hf_config(config)
    model = build_hf_model(spec, device="meta")
    model.train()
    return FitTarget(name=spec.name, model=model, make_inputs=lambda batch, seq: default_inputs(model, batch=batch, seq=seq, device="meta"),
                     loss="model", seq_limit=context_length(model), shallow=shallow_copies(spec, layers))


def _with_batch(example: Any, batch: int) -> Any:
    """A factory's example input with its first axis (the batch) set to ``batch``, on meta."""
    import torch

    from resacct.measurement.memory_timeline import copy_inputs

    return copy_inputs(example, lambda t: torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta"))


def named_model_target(spec: str, model_args: dict[str, Any] | None = None, *, input_shape: tuple[int, ...] | None = None,
                       input_dtype: str = "float32", loss: str = "auto") -> FitTarget:
    """``module:factory`` built under ``torch.device("meta")``; its inputs as ``resacct account``
    makes them (:func:`resacct.account.load.model_io.default_inputs`), or the factory's example input
    with the batch axis resized (a fit then searches the batch only)."""
    from resacct.account.load.model_factory import load_model_on
    from resacct.account.load.model_io import LOSS_CHOICES, call_model, check_inputs, context_length, default_inputs, is_token_model, resolve_loss
    from resacct.account.load.user_code import calling_user_code

    if loss not in LOSS_CHOICES:
        raise ResacctError(f"loss {loss!r}: expected one of {', '.join(LOSS_CHOICES)}")
    model, example = load_model_on("meta", spec, model_args)
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
