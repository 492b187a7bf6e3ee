"""The GPT account's record — :class:`StepAccount` (what :func:`resacct.account.account_gpt`
found) and :class:`StepTiming` (a real step's seconds) — and how it is laid out: its rows,
per-module rows and JSON. One function per group of rows, so a new figure is a new row where it
belongs (:func:`time_rows` for the step's time, MFU and the run projection).

The record and its layout share this module so that neither imports the other: the measuring
and predicting (:mod:`resacct.account.answers.gpt_step`) builds a :class:`StepAccount`; nothing here
imports it back. ``from resacct.account import StepAccount`` keeps working (re-exported there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resacct.account.load.optimizers import optimizer_display_name
from resacct.account.render.rows import ModuleRow, Row, sections_of, traced_flops_note
from resacct.account.trace.step_measurements import StepFlopTrace, TrainingStateMeasurement
from resacct.facts.dtypes import parse_dtype
from resacct.formulas.gpt_formulas import GptStepFlops, predict_gpt_step_flops
from resacct.measurement.activations import (
    AllocationTrace,
    CheckpointPoint,
    GradAccumulation,
    SavedActivations,
    predict_gpt_held_after_forward_bytes,
)
from resacct.measurement.memory import StateRecipe
from resacct.training.gpt import GPTConfig

__all__ = ["StepTiming", "StepAccount", "step_account_rows", "time_rows", "step_account_module_rows", "step_account_json"]


@dataclass(frozen=True)
class StepTiming:
    """Seconds of one real training step (forward, backward, AdamW step), and what follows."""

    device: str
    median_sec: float
    samples_sec: tuple[float, ...]
    step_flops: int
    tokens: int
    peak_flops_per_sec: float | None = None
    peak_source: str | None = None
    prediction: Any = None  # resacct.measurement.runtime_model.StepPrediction (CPU): the step predicted op by op

    @property
    def achieved_flops_per_sec(self) -> float:
        return self.step_flops / self.median_sec

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.median_sec

    @property
    def mfu(self) -> float | None:
        return None if self.peak_flops_per_sec is None else self.achieved_flops_per_sec / self.peak_flops_per_sec


@dataclass
class StepAccount:
    """Everything :func:`account_gpt` found (the typed result of the GPT path); :meth:`rows`
    lays it out predicted | measured, :meth:`to_dict` as plain JSON-ready values.

    >>> from resacct.account import account_gpt
    >>> account = account_gpt("gpt-nano", batch=1, seq=8, measure=False)
    >>> account.flops.step_flops == account.predicted_flops.step_flops, account.saved.activation_bytes == account.predicted_saved_bytes
    (True, True)
    >>> [row.quantity for row in account.rows()][:2]
    ['forward (exact per-matmul formula)', 'backward (exact per-matmul formula)']
    """

    model: str
    config: GPTConfig
    batch: int
    seq: int
    device: str
    recipe: StateRecipe
    attention: str
    parameters: int
    predicted_flops: GptStepFlops
    flops: StepFlopTrace
    state: TrainingStateMeasurement
    saved: SavedActivations
    predicted_saved_bytes: int | None
    predicted_saved_by_module: Mapping[str, int] = field(default_factory=dict)
    optimizer_transient: AllocationTrace | None = None
    predicted_optimizer_transient_bytes: int | None = None
    step_peak_bytes: int | None = None
    predicted_step_peak_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    checkpoint_segments: int = 0
    checkpointing: list[CheckpointPoint] = field(default_factory=list)
    grad_accumulation: GradAccumulation | None = None
    timing: StepTiming | None = None
    train_tokens: float | None = None
    devices: int = 1
    notes: list[str] = field(default_factory=list)
    #: the whole step's peak predicted on fake tensors, beside the allocator's on a CPU run (:mod:`resacct.account.peak.step_peak`)
    step_peak: Any = None

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def rows(self) -> list[Row]:
        """The account as (section, quantity, predicted, measured, unit, note) rows."""
        return step_account_rows(self) + ([] if self.step_peak is None else self.step_peak.rows())

    def per_module_rows(self) -> list[ModuleRow]:
        """FLOPs and saved bytes per module, predicted beside measured (modules with either)."""
        return step_account_module_rows(self)

    def to_json(self) -> dict[str, Any]:
        """Named fields with units in the names, for ``--json``."""
        return {**step_account_json(self), "step_peak": None if self.step_peak is None else self.step_peak.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """The same as :meth:`to_json`: plain values (``json.dumps``-able), units in the names."""
        return self.to_json()


# ───────────────────────────── the layout ─────────────────────────────


def _per_layer_measured(saved: SavedActivations) -> int:
    return sum(value for module, value in saved.by_module().items() if module.startswith("blocks.0."))


def step_account_rows(a: StepAccount) -> list[Row]:
    """The GPT account as rows: FLOPs, training state, activations, peaks, checkpointing, accumulation, time."""
    from resacct.measurement.activations import predict_gpt_recompute_flops
    from resacct.formulas.gpt_formulas import gpt_layer_saved_bytes, korthikanti_layer_activation_bytes, palm_step_flops, six_n_step_flops

    p, f, n, t = a.predicted_flops, a.flops, a.parameters, a.tokens
    traced = traced_flops_note(f)
    rows = [
        Row("FLOPs", "forward (exact per-matmul formula)", p.forward_flops, f.forward_flops, "FLOPs", traced),
        Row("FLOPs", "backward (exact per-matmul formula)", p.backward_flops, f.backward_flops, "FLOPs", traced),
        Row("FLOPs", "step (exact per-matmul formula)", p.step_flops, f.step_flops, "FLOPs", traced_flops_note(f, whole_step=True)),
        Row("FLOPs", "step, 6N rule (lecture)", six_n_step_flops(n, t), f.step_flops, "FLOPs", "6 · params · tokens"),
        Row("FLOPs", "step, 6N + 12·L·d·s (PaLM, nanoGPT)", palm_step_flops(n, a.config, a.batch, a.seq), f.step_flops, "FLOPs",
            "N without position embedding"),
    ]
    if f.gap_filled_flops:
        rows.append(Row("FLOPs", "FlopCounterMode alone (fused attention = 0)", p.step_flops, f.step_flops - f.gap_filled_flops, "FLOPs", "tracer gap"))
    if f.attention_recompute_flops:
        fused = predict_gpt_step_flops(a.config, a.batch, a.seq, fused_attention=True)
        rows.append(Row("FLOPs", "fused attention recomputes q·kᵀ (backward)", fused.step_flops - p.step_flops, f.attention_recompute_flops, "FLOPs",
                        "hardware work, not model FLOPs (HFU)"))
    s = a.state
    rows += [
        Row("training state", f"after backward ({s.recipe}, {optimizer_display_name(s.optimizer)})", s.predicted_after_backward_bytes, s.after_backward_bytes, "bytes", "kept between steps"),
        Row("training state", f"at optimizer step ({s.recipe}, {optimizer_display_name(s.optimizer)})", s.predicted_at_step_bytes, s.at_step_bytes, "bytes", "step counters included"),
        Row("training state", "bytes per parameter at step", s.predicted_at_step_bytes / n, s.at_step_bytes / n, "B/param", f"{n:,} parameters"),
    ]
    rows += [Row("training state", f"  {part}", None, value, "bytes", f"{value / n:.3g} B/param") for part, value in s.parts_bytes.items()]
    element = parse_dtype(a.recipe.parameter_dtype).itemsize
    measured_layer = _per_layer_measured(a.saved)
    rows += [
        Row("activations", "saved for backward (resacct formula)", a.predicted_saved_bytes, a.saved.activation_bytes, "bytes", "saved_tensors_hooks, by storage"),
        Row("activations", "one layer (blocks.0)", gpt_layer_saved_bytes(a.config, a.batch, a.seq, element_bytes=element, attention=a.attention, device_type=a.device)
            if a.predicted_saved_bytes is not None else None, measured_layer, "bytes", ""),
        Row("activations", "one layer, Korthikanti s·b·h·(34 + 5as/h)", korthikanti_layer_activation_bytes(a.seq, a.batch, a.config.d_model, a.config.n_heads),
            measured_layer, "bytes", "16-bit, with dropout"),
        Row("activations", "saved weights (parameters, not activations)", None, a.saved.parameter_bytes, "bytes", "no extra memory"),
        Row("activations", "state + activations per parameter", None if a.predicted_saved_bytes is None else (s.predicted_at_step_bytes + a.predicted_saved_bytes) / n,
            (s.at_step_bytes + a.saved.activation_bytes) / n, "B/param", f"batch {a.batch} × seq {a.seq}"),
    ]
    if a.optimizer_transient is not None:
        rows.append(Row("peak", "AdamW step transient (foreach)", a.predicted_optimizer_transient_bytes, a.optimizer_transient.peak_bytes, "bytes", "allocator, above the state"))
    if a.step_peak_bytes is not None:
        rows.append(Row("peak", "forward + backward peak", a.predicted_step_peak_bytes, a.step_peak_bytes, "bytes", "allocator, above params + state"))
    if a.gpu_peak_bytes is not None:
        rows.append(Row("peak", "GPU step peak (max_memory_allocated)", None, a.gpu_peak_bytes, "bytes", "above what existed before"))
    for point in a.checkpointing:
        label = f"k={point.segments}" if point.segments else "no checkpointing"
        rows += [
            Row("checkpointing", f"held after forward, {label}", point.predicted_held_after_forward_bytes, point.held_after_forward_bytes, "bytes", "allocator"),
            Row("checkpointing", f"peak, {label}", point.predicted_peak_bytes, point.peak_bytes, "bytes", "allocator"),
        ]
    if len(a.checkpointing) == 2:
        extra = a.checkpointing[1].backward_flops - a.checkpointing[0].backward_flops
        predicted_extra = predict_gpt_recompute_flops(a.config, a.batch, a.seq, a.checkpointing[1].segments)
        rows.append(Row("checkpointing", f"recompute FLOPs, k={a.checkpointing[1].segments}", predicted_extra, extra, "FLOPs", "FlopCounterMode, backward"))
    if a.grad_accumulation is not None:
        g = a.grad_accumulation
        micro = predict_gpt_held_after_forward_bytes(a.config, g.micro_batch, a.seq)
        rows += [
            Row("grad accumulation", f"held per micro-batch of {g.micro_batch} (× {g.steps})", micro, g.max_micro_held_bytes, "bytes", "loss / steps adds a scalar"),
            Row("grad accumulation", f"held by one batch of {g.micro_batch * g.steps}", predict_gpt_held_after_forward_bytes(a.config, a.batch, a.seq),
                g.effective_batch_held_bytes, "bytes", ""),
        ]
    if a.timing is not None:
        rows += time_rows(a, a.timing)
    return rows


def time_rows(a: StepAccount, timing: StepTiming) -> list[Row]:
    """The measured step time, the achieved rate, MFU and a projected run (a row per figure)."""
    from resacct.formulas.napkin import training_days

    rows = [
        Row("time", f"step on {timing.device} (median of {len(timing.samples_sec)})", None, timing.median_sec, "s", ""),
        Row("time", "achieved", None, timing.achieved_flops_per_sec, "FLOP/s", f"{timing.tokens_per_sec:,.0f} tokens/s"),
    ]
    if timing.prediction is not None:  # resacct.measurement.runtime_model: the step predicted op by op, beside its own clock
        from resacct.measurement.runtime_model import step_time_rows

        rows += [Row("time", quantity, predicted, measured, "s", note) for quantity, predicted, measured, note in step_time_rows(timing.prediction)]
    if timing.mfu is not None:
        rows.append(Row("time", "MFU", None, timing.mfu, "", timing.peak_source or "given peak"))
    if a.train_tokens:
        total_flops = a.flops.step_flops / a.tokens * a.train_tokens
        if timing.mfu is not None and timing.mfu <= 1:  # napkin: FLOPs ÷ (devices · peak · MFU), MFU as measured
            days = training_days(total_flops, a.devices, timing.peak_flops_per_sec, timing.mfu)
        else:  # no peak: the measured rate is the whole answer (MFU 1 of it)
            days = training_days(total_flops, a.devices, timing.achieved_flops_per_sec, 1.0)
        rows.append(Row("time", f"{a.train_tokens:.3g} tokens on {a.devices} such device(s)", None, days, "days", "at the measured rate"))
    return rows


def step_account_module_rows(a: StepAccount) -> list[ModuleRow]:
    predicted_forward, predicted_backward = a.predicted_flops.by_module("forward"), a.predicted_flops.by_module("backward")
    measured_saved = a.saved.by_module()
    names = list(dict.fromkeys([*a.predicted_saved_by_module, *measured_saved, *predicted_forward, *a.flops.forward_by_module]))
    return [
        ModuleRow(
            module=name,
            predicted_forward_flops=predicted_forward.get(name, 0),
            traced_forward_flops=a.flops.forward_by_module.get(name, 0),
            predicted_backward_flops=predicted_backward.get(name, 0),
            traced_backward_flops=a.flops.backward_by_module.get(name, 0),
            predicted_saved_bytes=a.predicted_saved_by_module.get(name, 0) if a.predicted_saved_bytes is not None else None,
            measured_saved_bytes=measured_saved.get(name, 0),
        )
        for name in names
    ]


def step_account_json(a: StepAccount) -> dict[str, Any]:
    sections = sections_of(a.rows())
    return {
        "model": a.model,
        "config": {"vocab_size": a.config.vocab_size, "context_length": a.config.context_length, "n_layers": a.config.n_layers,
                   "n_heads": a.config.n_heads, "d_model": a.config.d_model, "mlp_ratio": a.config.mlp_ratio},
        "attention": a.attention,
        "batch": a.batch, "seq": a.seq, "tokens": a.tokens, "device": a.device, "recipe": a.recipe.name, "optimizer": a.state.optimizer,
        "parameters": a.parameters,
        "checkpoint_segments": a.checkpoint_segments,
        **sections,
        "per_module": [vars(row) for row in a.per_module_rows()],
        "tracer_gaps": [
            {"phase": op.phase, "op": op.op, "calls": op.calls, "estimated_flops": op.estimated_flops} for op in a.flops.uncounted_ops
        ],
        "warnings": a.flops.warnings,
        "notes": a.notes,
    }
