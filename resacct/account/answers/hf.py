"""``resacct account --hf-config NAME|config.json``: a Hugging Face causal LM built from its
config on the meta device, one training step **measured** (FlopCounterMode; storages of
parameters, optimizer state and saved tensors) beside resacct's **predicted** closed forms for the
architecture (:mod:`resacct.formulas.hf_formulas`: GQA, SwiGLU, untied heads, RoPE without parameters,
MoE active vs total) — parameters, FLOPs, training state per recipe, activations
(:mod:`resacct.formulas.hf_activation_formulas`: every tensor saved for backward, term by term) and
checkpoint size.

The measurement never uses the formulas: parameters and state are distinct storages of the
built model and of a real ``torch.optim`` optimizer after a meta step; FLOPs are
FlopCounterMode over the model's own forward (its own loss on ``labels``) and backward; saved
tensors are the hooks' — all three in one forward and backward
(:func:`resacct.account.trace.step_measurements.measure_step_once`). The step's peak is predicted by a
second run on fake CPU tensors (:mod:`resacct.account.peak.step_peak`): the only other pass.

>>> account = account_hf_config("llama-2-7b", batch=1, seq=128)                       # doctest: +SKIP
>>> account.parameters == account.predicted_parameters == 6738415616                 # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resacct.account.render.rows import ModuleRow, Row, sections_of, traced_flops_note
from resacct.measurement.activations import SavedActivations
from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.formulas.gpt_activation_formulas import SavedTerm
from resacct.formulas.hf_activation_formulas import hf_saved_terms
from resacct.formulas.hf_formulas import (
    HfArchitecture,
    HfStepFlops,
    architecture_of,
    predict_active_parameters,
    predict_parameter_tensors,
    predict_parameters,
    predict_step_flops,
)
from resacct.facts.recipes import Recipe
from resacct.measurement.memory import distinct_storage_bytes, get_state_recipe, step_counter_bytes, training_state_bytes
from resacct.account.load.hf_models import HfConfigSpec
from resacct.account.load.model_io import call_model, context_length, default_inputs, loss_of_output
from resacct.training.optim import state_tensors_per_parameter
from resacct.account.load.optimizers import memory_optimizer_name, optimizer_display_name
from resacct.account.trace.step_measurements import StepFlopTrace, TrainingStateMeasurement, measure_step_once
from resacct.account.trace.untraced import UnmeasuredState, UnrecordedActivations, UntracedFlops

__all__ = ["HfAccount", "account_hf_config", "checkpoint_bytes_predicted"]

_NOT_CHECKPOINTED = ("gradients", "master gradients")


@dataclass
class HfAccount:
    """One step of a transformers causal LM from a config: measured beside predicted."""

    name: str
    source: str
    model_type: str
    model_class: str
    architecture: HfArchitecture | None
    batch: int
    seq: int
    recipe: Recipe
    optimizer: str
    parameters: int
    parameter_tensors: int
    #: a raw model whose step could not run on meta: :mod:`resacct.account.trace.untraced`'s stand-ins (measured None)
    flops: StepFlopTrace | UntracedFlops
    state: TrainingStateMeasurement | UnmeasuredState
    saved: SavedActivations | UnrecordedActivations
    checkpoint_weights_bytes: int
    device: str = "meta"
    attention: str = "sdpa"
    notes: list[str] = field(default_factory=list)
    #: why the step itself is outside the activation formula (a raw model's loss, inputs, autocast …; None: it is not)
    step_gap: str | None = None
    #: the whole step's peak predicted on fake CPU tensors (:mod:`resacct.account.peak.step_peak`); None on a raw model's account
    step_peak: Any = None
    #: a raw model with frozen parameters: its :class:`~resacct.account.load.trainable.ParameterSplit` (the state is predicted from it)
    frozen: Any = None
    #: ``--device BOARD``'s answer (:meth:`~resacct.account.gpu.answers.device_answer.GpuStepAnswer.to_dict`: CUDA peaks, step time), --json's ``gpu``
    gpu: dict[str, Any] | None = None

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def predicted_parameters(self) -> int | None:
        return None if self.architecture is None else predict_parameters(self.architecture)

    @property
    def predicted_flops(self) -> HfStepFlops | None:
        return None if self.architecture is None else predict_step_flops(self.architecture, batch=self.batch, seq=self.seq)

    @property
    def activation_dtype(self) -> str:
        """The dtype the activations were recorded in: the recipe's parameter dtype (no autocast)."""
        return self.recipe.parameter_dtype

    def predicted_saved_terms(self) -> tuple[SavedTerm, ...] | None:
        """resacct's saved-tensor terms for this step (None without a formula; see :meth:`activation_formula_gap`)."""
        if self.architecture is None or self.activation_formula_gap() is not None:
            return None
        return hf_saved_terms(self.architecture, self.batch, self.seq, dtype=self.activation_dtype, attention=self.attention, device_type=self.device)

    def activation_formula_gap(self) -> str | None:
        """Why resacct cannot predict the activations here (None when it can)."""
        if self.architecture is None:
            return f"no formula for model_type {self.model_type!r}"
        if self.step_gap is not None:
            return self.step_gap
        try:
            hf_saved_terms(self.architecture, 1, 1, dtype=self.activation_dtype, attention=self.attention, device_type=self.device)
            hf_saved_terms(self.architecture, self.batch, self.seq, dtype=self.activation_dtype, attention=self.attention, device_type=self.device)
        except ResacctError as error:
            return str(error)
        return None

    @property
    def checkpoint_full_bytes(self) -> int | None:
        """Weights, master weights and optimizer state (step counters included): what a
        training checkpoint holds — the state at the step without its gradients (None: not measured)."""
        if self.state.at_step_bytes is None:
            return None
        return sum(value for part, value in self.state.parts_bytes.items() if part not in _NOT_CHECKPOINTED)

    def rows(self) -> list[Row]:
        """(section, quantity, predicted, measured, unit, note); predicted None → "—"."""
        return (_parameter_rows(self) + _flop_rows(self) + _state_rows(self) + _activation_rows(self) + _checkpoint_rows(self)
                + ([] if self.step_peak is None else self.step_peak.rows()))

    def per_module_rows(self) -> list[ModuleRow]:
        names = list(dict.fromkeys([*self.flops.forward_by_module, *self.flops.backward_by_module, *self.saved.by_module()]))
        saved = self.saved.by_module()
        terms = self.predicted_saved_terms()
        predicted: dict[str, int] = {}
        for term in terms or ():
            predicted[term.module] = predicted.get(term.module, 0) + term.bytes
        names = list(dict.fromkeys([*names, *predicted]))
        return [ModuleRow(module=name, predicted_forward_flops=None, traced_forward_flops=self.flops.forward_by_module.get(name, 0),
                          predicted_backward_flops=None, traced_backward_flops=self.flops.backward_by_module.get(name, 0),
                          predicted_saved_bytes=None if terms is None else predicted.get(name, 0), measured_saved_bytes=saved.get(name, 0))
                for name in names]

    def to_dict(self) -> dict[str, Any]:
        sections = sections_of(self.rows())
        return {
            "hf_config": self.name, "source": self.source, "model_type": self.model_type, "model_class": self.model_class,
            "batch": self.batch, "seq": self.seq, "tokens": self.tokens, "device": self.device, "recipe": self.recipe.name,
            "optimizer": self.optimizer, "parameters": self.parameters, **sections,
            "per_module": [vars(row) for row in self.per_module_rows()],
            "tracer_gaps": [{"phase": op.phase, "op": op.op, "calls": op.calls, "estimated_flops": op.estimated_flops} for op in self.flops.uncounted_ops],
            "warnings": self.flops.warnings, "notes": self.notes,
            **({} if self.step_peak is None else {"step_peak": self.step_peak.to_dict()}),
            **({} if self.gpu is None else {"gpu": self.gpu}),
        }

    to_json = to_dict


def _parameter_rows(a: HfAccount) -> list[Row]:
    arch = a.architecture
    rows = [
        Row("parameter counts", "total", a.predicted_parameters, a.parameters, "parameters", "distinct parameter storages"),
        Row("parameter counts", "tensors", None if arch is None else predict_parameter_tensors(arch), a.parameter_tensors, "tensors", "one step counter each"),
    ]
    if arch is not None and arch.experts:
        rows.append(Row("parameter counts", f"active per token ({arch.experts_per_token} of {arch.experts} experts)", predict_active_parameters(arch), None, "parameters",
                        "predicted only: routing decides which"))
    return rows


def _flop_rows(a: HfAccount) -> list[Row]:
    p, f = a.predicted_flops, a.flops
    how = traced_flops_note(f)  # resacct's sdpa fill: the CPU flash kernel on a real CPU step
    rows = [
        Row("FLOPs", "forward", None if p is None else p.forward_flops, f.forward_flops, "FLOPs", how),
        Row("FLOPs", "backward", None if p is None else p.backward_flops, f.backward_flops, "FLOPs", how),
        Row("FLOPs", "step", None if p is None else p.step_flops, f.step_flops, "FLOPs", traced_flops_note(f, whole_step=True)),
    ]
    if a.architecture is not None:
        active = predict_active_parameters(a.architecture)
        rows.append(Row("FLOPs", "step, 6N rule (N active)", 6 * active * a.tokens, f.step_flops, "FLOPs", "6 · params · tokens"))
    return rows


def _state_rows(a: HfAccount) -> list[Row]:
    s, n = a.state, a.parameters
    label = f"{s.recipe}, {optimizer_display_name(s.optimizer)}"
    rows = [
        Row("training state", f"after backward ({label})", _predicted_state(a, "after_backward"), s.after_backward_bytes, "bytes", "kept between steps"),
        Row("training state", f"at optimizer step ({label})", _predicted_state(a, "at_step"), s.at_step_bytes, "bytes", "step counters included"),
        Row("training state", "bytes per parameter at step", None if a.architecture is None else _predicted_state(a, "at_step") / predict_parameters(a.architecture),
            None if s.at_step_bytes is None else s.at_step_bytes / n, "B/param", f"{n:,} parameters"),
    ]
    return rows + [Row("training state", f"  {part}", None, value, "bytes", f"{value / n:.3g} B/param") for part, value in s.parts_bytes.items()]


def _predicted_state(a: HfAccount, moment: str) -> int | None:
    if a.architecture is None:
        return None
    arch = a.architecture
    if a.frozen is not None:  # frozen parameters hold their weights only (resacct.account.load.trainable)
        from resacct.account.load.trainable import predict_state_bytes

        return predict_state_bytes(a.frozen, a.recipe, memory_optimizer_name(a.optimizer), moment)  # type: ignore[arg-type]
    return training_state_bytes(predict_parameters(arch), predict_parameter_tensors(arch), a.recipe, memory_optimizer_name(a.optimizer), moment)  # type: ignore[arg-type]


def _first_layer(module: str) -> bool:
    return ".layers.0." in f".{module}." or ".h.0." in f".{module}."


def _activation_rows(a: HfAccount) -> list[Row]:
    recorded = a.saved.activation_bytes is not None
    layer = sum(value for module, value in a.saved.by_module().items() if _first_layer(module)) if recorded else None
    terms = a.predicted_saved_terms()
    gap = a.activation_formula_gap()
    note = "saved_tensors_hooks, by storage" + (f"; measured only: {gap}" if gap else f"; predicted {a.activation_dtype}, {a.attention} on {a.device}")
    if not recorded:  # the step could not run (resacct.account.trace.untraced)
        note = "not recorded (see the note)" + (f"; no prediction: {gap}" if gap else f"; predicted {a.activation_dtype}, {a.attention} on {a.device}")
    elif a.architecture is not None and a.architecture.experts:
        note += " (batched_mm experts keep each token's expert weights: more than the default kernels save)"
    return [
        Row("activations", "saved for backward", None if terms is None else sum(t.bytes for t in terms), a.saved.activation_bytes, "bytes", note),
        Row("activations", "one layer (the first)", None if terms is None else sum(t.bytes for t in terms if _first_layer(t.module)), layer, "bytes",
            "RoPE's cos/sin, shared, counted here" if a.architecture is not None and a.architecture.family != "gpt2" else ""),
        Row("activations", "saved weights (parameters, not activations)", None, a.saved.parameter_bytes, "bytes", "no extra memory"),
    ]


def moe_basis(config: Any, tokens: int) -> str | None:
    """The routing a mixture of experts was traced under (:mod:`resacct.account.load.moe_routing`); None for a dense model."""
    from resacct.account.load.meta_facts import EXPERT_COUNT_KEYS
    from resacct.account.load.moe_routing import routing_basis

    text = getattr(config, "get_text_config", lambda: config)()
    experts = next((getattr(text, key) for key in EXPERT_COUNT_KEYS if getattr(text, key, None)), 0)
    per_token = getattr(text, "num_experts_per_tok", 0) or 0
    if not experts or not per_token:
        return None
    if getattr(text, "model_type", "") == "mixtral":
        return (f"routing: transformers' batched_mm experts (each of {tokens} tokens runs its {per_token} of {experts} experts; the saved tensors "
                "include a copy of the expert weights per token–expert pair, as resacct's Mixtral formulas model)")
    return routing_basis(experts=experts, per_token=per_token, tokens=tokens)


def checkpoint_bytes_predicted(parameters: int, parameter_tensors: int, recipe: str | Recipe, optimizer: str) -> tuple[int, int]:
    """(weights only, full training checkpoint) bytes: parameters in the recipe's parameter dtype;
    plus master weights, optimizer state and step counters.

    >>> checkpoint_bytes_predicted(1000, 2, "bf16-fp32-master", "adamw")   # 2·1000; + 4·1000 + 2·4·1000 + 2·4
    (2000, 14008)
    """
    chosen = get_state_recipe(recipe)
    memory_name = memory_optimizer_name(optimizer)
    weights = parameters * parse_dtype(chosen.parameter_dtype).itemsize
    master = parameters * parse_dtype(chosen.master_dtype).itemsize if chosen.master_dtype else 0
    states = parameters * state_tensors_per_parameter(memory_name) * parse_dtype(chosen.optimizer_state_dtype).itemsize
    return weights, weights + master + states + step_counter_bytes(parameter_tensors, memory_name)


def _checkpoint_rows(a: HfAccount) -> list[Row]:
    predicted = (None, None) if a.architecture is None else checkpoint_bytes_predicted(
        predict_parameters(a.architecture), predict_parameter_tensors(a.architecture), a.recipe, a.optimizer)
    return [
        Row("checkpoint", f"weights ({a.recipe.parameter_dtype})", predicted[0], a.checkpoint_weights_bytes, "bytes",
            "state_dict, distinct storages"),
        Row("checkpoint", "weights + master + optimizer state", predicted[1], a.checkpoint_full_bytes, "bytes", "the state at the step less its gradients"),
    ]


def account_hf_config(config: str | HfConfigSpec, *, batch: int = 1, seq: int | None = None, recipe: str | Recipe = "fp32", optimizer: str = "adamw",
                      layers: str = "auto", peak: bool = True) -> HfAccount:
    """Build the config's causal LM (a shipped name, a config.json path, or an
    :class:`~resacct.account.load.hf_models.HfConfigSpec`) on the meta device and account one step of
    ``batch`` × ``seq`` tokens (default: the config's context length) with its own next-token loss.
    A stack of identical layers is traced at three small depths and extrapolated, checked
    (:mod:`resacct.account.trace.repeated_layers`). ``layers``: ``"auto"`` does that above
    :data:`~resacct.account.trace.repeated_layers.SAMPLED_ABOVE_LAYERS` layers (below, three small builds
    cost more than one whole trace), ``"sampled"`` above 5, ``"all"`` traces every layer. ``peak=False``:
    FLOPs, training state and saved tensors only, no step peak (its pass on fake tensors is most of
    the time: ~0.6 of a small model's account)."""
    from resacct.account.load.hf_models import load_hf_config
    from resacct.account.trace.repeated_layers import LAYER_CHOICES
    from resacct.account.trace.cache import cached

    if layers not in LAYER_CHOICES:  # before any work; :func:`~resacct.account.trace.repeated_layers.layer_plan` says the same
        raise ResacctError(f"layers {layers!r}: expected one of {', '.join(LAYER_CHOICES)}")
    spec = config if isinstance(config, HfConfigSpec) else load_hf_config(config)
    chosen = get_state_recipe(recipe)
    memory_optimizer_name(optimizer)
    question = {"config": spec.values, "name": spec.name, "source": spec.source, "batch": batch, "seq": seq, "recipe": chosen,
                "optimizer": optimizer, "attention": "sdpa", "device": "meta", **({} if layers == "auto" else {"layers": layers}),
                **({} if peak else {"peak": False})}
    # with caching on (a command's, resacct.account.trace.cache): the same question's answer read back, not traced again
    return cached("hf-account", question, lambda: _traced_hf_account(spec, batch=batch, seq=seq, recipe=chosen, optimizer=optimizer, layers=layers, peak=peak))


def _traced_hf_account(spec: HfConfigSpec, *, batch: int, seq: int | None, recipe: Recipe, optimizer: str, layers: str = "auto",
                       peak: bool = True) -> HfAccount:
    """:func:`account_hf_config`'s answer, traced: a stack of more than 5 identical layers at depths 3, 4 and 5
    and extrapolated (:mod:`resacct.account.trace.repeated_layers`), any other model whole (see :func:`account_hf_config`'s ``layers``)."""
    from resacct.account.load.hf_models import with_depth
    from resacct.account.peak.one_pass import TraceOnceHint
    from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, NotRepeating, segmenting
    from resacct.account.trace.repeated_layers import extrapolate_account, layer_path_of, layer_plan, sampled_note

    plan = layer_plan(spec, layers)
    depth, why_not = plan.depth, plan.why_whole
    trace_hint = TraceOnceHint()  # one config at every depth: where tracing once failed at the first, it fails at the rest
    if plan.sample:
        samples = []
        for repeated, built in zip(SAMPLE_DEPTHS, plan.sample_layers()):
            with segmenting(repeated, plan.prefix, plan.period):
                samples.append(_whole_hf_account(with_depth(spec, built), batch=batch, seq=seq, recipe=recipe, optimizer=optimizer,
                                                 peak=peak, trace_hint=trace_hint))
        try:
            names = [*samples[-1].flops.forward_by_module, *(entry.module for entry in samples[-1].saved.entries)]
            account = extrapolate_account(samples, depth, layer_path_of(names, plan.sample_layers()[-1]), plan.prefix, plan.period)
        except NotRepeating as error:
            why_not = str(error)
        else:
            account.notes.append(sampled_note(depth, prefix=plan.prefix, period=plan.period))
            return account
    account = _whole_hf_account(spec, batch=batch, seq=seq, recipe=recipe, optimizer=optimizer, peak=peak, trace_hint=trace_hint)
    if why_not is not None:
        account.notes.append(f"all {depth} layers traced: {why_not}")
    return account


def _whole_hf_account(spec: HfConfigSpec, *, batch: int, seq: int | None, recipe: Recipe, optimizer: str, peak: bool = True,
                      trace_hint: TraceOnceHint | None = None) -> HfAccount:
    """Every layer of the model built on meta, one step measured, its peak predicted (``peak``).
    ``trace_hint``: whether to try tracing once, updated with whether it worked (a fresh try without it)."""
    from resacct.account.load.hf_models import build_hf_model
    from resacct.account.peak.one_pass import TraceOnceHint, trace_hf_step_once

    chosen = recipe
    model = build_hf_model(spec, device="meta")
    model.train()
    length = seq if seq is not None else context_length(model)
    inputs = default_inputs(model, batch=batch, seq=length, device="meta")

    def loss_of(module: Any) -> Any:
        return loss_of_output(call_model(module, inputs), "model")

    once = trace_hf_step_once(model, inputs, chosen, optimizer, trace_hint or TraceOnceHint()) if peak else None
    if once is not None and once[0] is not None:  # FLOPs, state and saved tensors recorded on the peak's fake pass: no meta pass
        recorder = once[0]
        flops, state, saved, recipe_model = recorder.flops, recorder.state, recorder.saved, model
    else:
        measured = _measure_on_meta(spec, model, loss_of, chosen, optimizer)
        flops, state, saved, recipe_model = measured.flops, measured.state, measured.saved, measured.model
    weights = distinct_storage_bytes(list(recipe_model.state_dict().values()))  # the model in the recipe's dtype
    parameters = list(model.parameters())
    element = parameters[0].element_size()
    architecture = architecture_of(model.config)
    notes = [f"{spec.name}: {spec.source}", "built on the meta device: shapes, storages and FlopCounterMode, no arithmetic and no memory"]
    if architecture is None:
        notes.append(f"resacct has no formula for model_type {spec.model_type!r} (it has: gpt2, llama, mistral, mixtral): measured only")
    basis = moe_basis(model.config, batch * length)
    if basis is not None:
        notes.append(basis)
    from resacct.account.peak.step_peak import account_model_step_peak

    step_peak = None if not peak else once[1] if once is not None else account_model_step_peak(
        model, inputs, loss="model", recipe=chosen, optimizer=optimizer, measure=False)
    return HfAccount(
        name=spec.name, source=spec.source, model_type=spec.model_type, model_class=type(model).__name__, architecture=architecture,
        batch=batch, seq=length, recipe=chosen, optimizer=optimizer, parameters=distinct_storage_bytes(parameters) // element,
        parameter_tensors=len(parameters), flops=flops, state=state, saved=saved, checkpoint_weights_bytes=weights, notes=notes,
        step_peak=step_peak,
    )


def _measure_on_meta(spec: HfConfigSpec, model: Any, loss_of: Callable[[Any], Any], recipe: Recipe, optimizer: str) -> Any:
    """FLOPs, training state and saved tensors in one forward and backward on meta: the model's first
    run, where a config can still break it (one line naming the config)."""
    try:
        return measure_step_once(model, loss_of, recipe, optimizer)
    except ResacctError:
        raise
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ResacctError(f"{spec.name} ({spec.source}): the model transformers built from it fails in its first step ({type(error).__name__}: {first[:300]})") from None
