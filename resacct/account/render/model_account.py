"""What :func:`resacct.account.answers.generic.account_module` found for one step of any ``nn.Module``:
:class:`ModelAccount`, laid out as the rows of ``resacct account --model module:factory`` and its
``--json``. Its predictions come from the provider registry (:mod:`resacct.account.answers.providers`):
a Linear/activation stack's (``predicted``), a transformers causal LM's (``hf``: ``--hf-config``'s
rows), or none ("—"); a step that could not run where the model is carries the stand-ins of
:mod:`resacct.account.trace.untraced` (measured "—")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resacct.account.answers.hf import HfAccount
from resacct.account.load.optimizers import optimizer_display_name
from resacct.account.peak.step_peak import StepPeakAccount
from resacct.account.render.rows import ModuleRow, Row, sections_of, traced_flops_note
from resacct.account.trace.step_measurements import StepFlopTrace, TrainingStateMeasurement
from resacct.account.trace.untraced import UnmeasuredState, UnrecordedActivations, UntracedFlops
from resacct.facts.recipes import Recipe
from resacct.formulas.account_formulas import StackPrediction
from resacct.measurement.activations import AllocationTrace, SavedActivations

__all__ = ["ModelAccount"]


@dataclass
class ModelAccount:
    """Everything :func:`resacct.account.answers.generic.account_module` found for one step of any ``nn.Module`` (the typed
    result of the generic path). ``predicted`` is None where resacct has no FLOP/activation
    formula for the architecture; :meth:`rows` lays it out, :meth:`to_dict` gives JSON values."""

    model: str
    model_class: str
    input_shape: tuple[int, ...]
    input_dtype: str
    loss: str
    device: str
    recipe: Recipe
    optimizer: str
    parameters: int
    #: a step that could not run where the model is (a kernel the meta device cannot trace): :mod:`resacct.account.trace.untraced`'s stand-ins
    flops: StepFlopTrace | UntracedFlops
    state: TrainingStateMeasurement | UnmeasuredState
    saved: SavedActivations | UnrecordedActivations
    predicted: StackPrediction | None
    step_peak_bytes: int | None = None
    optimizer_transient: AllocationTrace | None = None
    predicted_optimizer_transient_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    #: a transformers causal LM resacct models: ``--hf-config``'s rows over this step's measurements (:mod:`resacct.account.answers.providers`)
    hf: HfAccount | None = None
    #: the whole step's peak, predicted on fake tensors beside the allocator's (:mod:`resacct.account.peak.step_peak`)
    step_peak: StepPeakAccount | None = None

    @property
    def predicted_step_flops(self) -> int | None:
        if self.hf is not None:
            return None if self.hf.predicted_flops is None else self.hf.predicted_flops.step_flops
        return None if self.predicted is None else self.predicted.step_flops

    @property
    def predicted_saved_bytes(self) -> int | None:
        if self.hf is not None:
            terms = self.hf.predicted_saved_terms()
            return None if terms is None else sum(term.bytes for term in terms)
        return None if self.predicted is None else self.predicted.saved_bytes

    @property
    def predicted_forward_backward_peak_bytes(self) -> int | None:
        """The forward + backward peak above what the step starts with (parameters, inputs, optimizer
        state), read off the predicted step: the higher of its forward and backward peaks less its start.
        Only where the measured figure (:attr:`step_peak_bytes`) runs the same step: the recipe keeps
        the model in float32 (fp32); None elsewhere."""
        peak, recipe = self.step_peak, self.recipe
        if peak is None or peak.predicted is None or recipe.parameter_dtype != "float32" or recipe.compute_dtype or recipe.master_dtype:
            return None
        timeline = peak.predicted.timeline
        return max(timeline.peak_of_phase("forward"), timeline.peak_of_phase("backward")) - timeline.start_bytes

    def rows(self) -> list[Row]:
        """(section, quantity, predicted, measured, unit, note) rows; predicted None → "—"."""
        return ((self._formula_rows() if self.hf is None else self.hf.rows()) + self._peak_rows()
                + ([] if self.step_peak is None else self.step_peak.rows()))

    def _formula_rows(self) -> list[Row]:
        p, f, s, n = self.predicted, self.flops, self.state, self.parameters
        how = traced_flops_note(f, counter="FlopCounterMode (matmuls)")
        rows = [
            Row("FLOPs", "forward", None if p is None else p.forward_flops, f.forward_flops, "FLOPs", how),
            Row("FLOPs", "backward", None if p is None else p.backward_flops, f.backward_flops, "FLOPs", how),
            Row("FLOPs", "step", None if p is None else p.step_flops, f.step_flops, "FLOPs",
                traced_flops_note(f, counter="FlopCounterMode (matmuls)", whole_step=True)),
        ]
        label = f"{s.recipe}, {optimizer_display_name(s.optimizer)}"
        rows += [
            Row("training state", f"after backward ({label})", s.predicted_after_backward_bytes, s.after_backward_bytes, "bytes", "kept between steps"),
            Row("training state", f"at optimizer step ({label})", s.predicted_at_step_bytes, s.at_step_bytes, "bytes", "step counters included"),
            Row("training state", "bytes per parameter at step", s.predicted_at_step_bytes / n, None if s.at_step_bytes is None else s.at_step_bytes / n,
                "B/param", f"{n:,} parameters"),
        ]
        rows += [Row("training state", f"  {part}", None, value, "bytes", f"{value / n:.3g} B/param") for part, value in s.parts_bytes.items()]
        rows += [
            Row("activations", "saved for backward", None if p is None else p.saved_bytes, self.saved.activation_bytes, "bytes",
                "saved_tensors_hooks, by storage"),
            Row("activations", "saved weights (parameters, not activations)", None, self.saved.parameter_bytes, "bytes", "no extra memory"),
        ]
        return rows

    def _peak_rows(self) -> list[Row]:
        rows = []
        if self.optimizer_transient is not None:
            rows.append(Row("peak", f"{optimizer_display_name(self.optimizer)} step transient (foreach)", self.predicted_optimizer_transient_bytes,
                            self.optimizer_transient.peak_bytes, "bytes", "allocator, above the state"))
        if self.step_peak_bytes is not None:
            rows.append(Row("peak", "forward + backward peak", self.predicted_forward_backward_peak_bytes, self.step_peak_bytes, "bytes",
                            "allocator, above params" + ("" if self.predicted_forward_backward_peak_bytes is None else "; predicted: the step peak's")))
        return rows

    def per_module_rows(self) -> list[ModuleRow]:
        """Traced FLOPs and saved bytes per module (exclusive), beside resacct's where it has them."""
        if self.hf is not None:
            return self.hf.per_module_rows()
        p, measured = self.predicted, self.saved.by_module()
        names = list(dict.fromkeys([*self.flops.forward_by_module, *self.flops.backward_by_module, *measured,
                                    *([] if p is None else p.saved_by_module)]))
        return [
            ModuleRow(
                module=name,
                predicted_forward_flops=None if p is None else p.forward_by_module.get(name, 0),
                traced_forward_flops=self.flops.forward_by_module.get(name, 0),
                predicted_backward_flops=None if p is None else p.backward_by_module.get(name, 0),
                traced_backward_flops=self.flops.backward_by_module.get(name, 0),
                predicted_saved_bytes=None if p is None else p.saved_by_module.get(name, 0),
                measured_saved_bytes=measured.get(name, 0),
            )
            for name in names
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON: the rows by section (units in the field names), per module, gaps."""
        sections = sections_of(self.rows())
        return {
            "model": self.model, "model_class": self.model_class, "input_shape": list(self.input_shape), "input_dtype": self.input_dtype,
            "loss": self.loss, "device": self.device, "recipe": self.recipe.name, "optimizer": self.optimizer, "parameters": self.parameters,
            "hf_model_type": None if self.hf is None else self.hf.model_type, **sections,
            "per_module": [vars(row) for row in self.per_module_rows()],
            "tracer_gaps": [{"phase": op.phase, "op": op.op, "calls": op.calls, "estimated_flops": op.estimated_flops} for op in self.flops.uncounted_ops],
            "warnings": self.flops.warnings,
            "notes": self.notes,
            "step_peak": None if self.step_peak is None else self.step_peak.to_dict(),
        }

    to_json = to_dict
