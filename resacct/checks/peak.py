"""Will it fit: a training step's peak memory, predicted by resacct on fake tensors before the step
runs (:mod:`resacct.account.peak.step_peak`), against the peak the CPU allocator records when it runs
(``torch.profiler`` with ``profile_memory=True``, :mod:`resacct.measurement.memory_timeline`) — and
the lecture's sums (training state + activations; 16 bytes per parameter) against the same measurement.

The law's quantities come from torch too: the training state is a real ``torch.optim.AdamW``'s
storages with the gradients (:func:`resacct.account.trace.step_measurements.measure_training_state`),
the activations what ``saved_tensors_hooks`` see, the inputs their storages, the parameters counted.
Recipes (autocast, master weights) run the step :func:`resacct.account.peak.recipes.recipe_step`
builds; gradient accumulation the step of :mod:`resacct.account.peak.accumulation`; a fit the
search of :mod:`resacct.account.fit.search` (predictions only), its answer then run for real.
"""

from __future__ import annotations

from typing import Any

import torch

from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.memo import shared_measurement


def _adamw(parameters: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-3)


def _model(model: str, batch: int, seq: int) -> tuple[Any, Any, Any]:
    from resacct.account.peak.models import peak_model

    try:
        return peak_model(model, batch=batch, seq=seq)
    except ResacctError as error:
        raise NotMeasurable(str(error)) from None


def _input_bytes(inputs: Any) -> int:
    from resacct.measurement.memory import distinct_storage_bytes
    from resacct.measurement.memory_timeline import copy_inputs

    tensors: list[torch.Tensor] = []
    copy_inputs(inputs, lambda t: tensors.append(t) or t)
    return distinct_storage_bytes(tensors)


@shared_measurement
def _step(model: str, batch: int, seq: int, recipe: str = "fp32") -> Outcome:
    """One step of a peak model under ``recipe``: the prediction on fake tensors, the allocator's
    record, and the lecture's parts (the training state of a real AdamW run, the saved activations
    of one forward). Shared by every claim on the same step (``peak.step_peak``, ``peak.phase_matches``).
    Not :func:`resacct.account.trace.step_measurements.measure_step_once`: the same bytes, but its
    FlopCounterMode costs more than the second step it saves on models this small (0.56 against
    0.41 CPU s over 14 steps, one thread)."""
    from resacct.account.peak.step_peak import measure_step_peak, predict_step_peak
    from resacct.account.peak.recipes import recipe_step
    from resacct.account.trace.step_measurements import measure_training_state
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.activations import record_saved_activations

    net, inputs, loss_fn = _model(model, batch, seq)
    chosen = parse_recipe(recipe, allow_custom=False)
    step = recipe_step(chosen, net, inputs, loss_fn, "adamw")
    predicted = predict_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    measured = measure_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    state = measure_training_state(step.model, lambda m: loss_fn(m, step.inputs), chosen, "adamw")
    with record_saved_activations(step.model) as saved:
        loss = step.loss_fn(step.model, step.inputs)
    del loss
    return Outcome(
        measured=measured.peak_bytes, predicted=predicted.peak_bytes,
        quantities={"state_bytes": state.at_step_bytes, "saved_bytes": saved.activation_bytes, "input_bytes": _input_bytes(step.inputs),
                    "params": sum(p.numel() for p in net.parameters()),
                    "measured_start_bytes": measured.start_bytes, "predicted_start_bytes": predicted.timeline.start_bytes,
                    "peak_phase": measured.peak_phase, "predicted_peak_phase": predicted.peak.phase, "attention_kernel": predicted.attention_kernel},
    )


@check("peak.step_peak", evidence="measured", threads_matter=lambda model, **_: "sdpa" in model,  # the CPU flash kernel's scratch grows with the threads
       quantities=("state_bytes", "saved_bytes", "input_bytes", "params", "measured_start_bytes", "predicted_start_bytes"))
def step_peak(model: str, batch: int, seq: int, recipe: str = "fp32") -> Outcome:
    """The CPU allocator's peak over one steady AdamW step (forward, backward, step, zero_grad) of a
    :data:`resacct.account.peak.models.PEAK_MODELS` model under the precision ``recipe`` (bf16
    parameters, autocast, fp32 master weights: :func:`resacct.account.peak.recipes.recipe_step`);
    predicted: resacct on fake tensors. ``state_bytes``: the recipe's training state at the step."""
    return _step(model, batch, seq, recipe)


@check("peak.phase_matches", evidence="measured")
def phase_matches(model: str, batch: int, seq: int) -> Outcome:
    """1 when the allocator's peak falls in the phase resacct predicts for it (forward, backward,
    optimizer step, zero_grad), else 0."""
    outcome = _step(model, batch, seq)
    return Outcome(measured=int(outcome.quantities["peak_phase"] == outcome.quantities["predicted_peak_phase"]),
                   quantities={"measured_phase": outcome.quantities["peak_phase"], "predicted_phase": outcome.quantities["predicted_peak_phase"]})


@check("peak.accumulated_step_peak", evidence="measured", quantities=("single_step_peak_bytes", "extra_bytes", "gradient_bytes"))
def accumulated_step_peak(model: str, batch: int, seq: int, micro_batches: int) -> Outcome:
    """The CPU allocator's peak over one steady AdamW step accumulating gradients over
    ``micro_batches`` micro-steps of ``batch`` × ``seq`` (forward, ``(loss / k).backward()`` each; the
    gradients kept between them), predicted on fake tensors; ``single_step_peak_bytes`` the
    allocator's peak of one plain step at the same micro-batch, ``gradient_bytes`` the gradients'."""
    from resacct.account.peak.step_peak import measure_step_peak, predict_step_peak

    net, inputs, loss_fn = _model(model, batch, seq)
    predicted = predict_step_peak(net, inputs, loss_fn, _adamw, micro_batches=micro_batches)
    measured = measure_step_peak(net, inputs, loss_fn, _adamw, micro_batches=micro_batches)
    single = measure_step_peak(net, inputs, loss_fn, _adamw)
    gradient_bytes = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    return Outcome(measured=measured.peak_bytes, predicted=predicted.peak_bytes,
                   quantities={"single_step_peak_bytes": single.peak_bytes, "extra_bytes": measured.peak_bytes - single.peak_bytes,
                               "gradient_bytes": gradient_bytes, "peak_phase": measured.peak_phase, "predicted_peak_phase": predicted.peak.phase})


@check("peak.state_bytes_per_parameter", evidence="measured",
       quantities=("params", "step_counter_bytes", "step_peak_bytes_per_parameter", "small_batch_step_peak_bytes_per_parameter", "tokens"))
def state_bytes_per_parameter(model: str, batch: int, small_batch: int, seq: int) -> Outcome:
    """The training state without activations, per parameter: the distinct storages a real fp32
    ``torch.optim.AdamW`` run holds when its second ``step()`` runs (parameters, gradients, both
    moments; the 4-byte step counters left out and reported as ``step_counter_bytes``) ÷ the
    parameters counted (predicted: resacct's state bytes ÷ the same count). Beside it, for the
    caveat the source adds, the CPU allocator's peak over a whole steady step ÷ parameters at
    ``batch`` × ``seq`` and at ``small_batch`` × ``seq`` (activations included)."""
    from resacct.account.peak.step_peak import measure_step_peak
    from resacct.account.trace.step_measurements import measure_training_state

    net, inputs, loss_fn = _model(model, batch, seq)
    params = sum(p.numel() for p in net.parameters())
    state = measure_training_state(net, lambda m: loss_fn(m, inputs), "fp32", "adamw")
    counters = state.step_counter_bytes
    measured_state = state.at_step_bytes - counters
    predicted_state = state.predicted_at_step_bytes - 4 * state.parameter_tensors
    peak = measure_step_peak(net, inputs, loss_fn, _adamw)
    small_net, small_inputs, small_loss = _model(model, small_batch, seq)
    small = measure_step_peak(small_net, small_inputs, small_loss, _adamw)
    return Outcome(measured=measured_state / params, predicted=predicted_state / params,
                   quantities={"params": params, "step_counter_bytes": counters, "step_peak_bytes_per_parameter": peak.peak_bytes / params,
                               "small_batch_step_peak_bytes_per_parameter": small.peak_bytes / params, "tokens": batch * seq})


@check("peak.fit_batch", evidence="measured", quantities=("batch", "budget_bytes", "next_predicted_peak_bytes"))
def fit_batch(model: str, seq: int, memory_bytes: int) -> Outcome:
    """The step peak the CPU allocator records when the micro-batch :func:`resacct.account.fit.search.fit_step`
    answers (the largest whose predicted steady AdamW step peak is at most ``memory_bytes``, the
    model built on the meta device) runs for real; predicted: that answer's predicted peak.
    ``next_predicted_peak_bytes``: the predicted peak one micro-batch larger."""
    from resacct.account.fit.search import FitTarget, fit_step
    from resacct.account.peak.step_peak import measure_step_peak

    meta_net, _, loss_fn = _model(model, 1, seq)
    meta_net = meta_net.to("meta")

    def make_inputs(batch: int, length: int | None) -> Any:
        return _model(model, batch, seq)[1]

    answer = fit_step(FitTarget(model, meta_net, make_inputs, loss_fn, seq_limit=None), memory_bytes=memory_bytes, search="batch", recipe="fp32")
    if answer.largest is None:
        raise ResacctError(f"{model}: not even a micro-batch of 1 is predicted to fit {memory_bytes} bytes; expected a larger memory_bytes")
    net, inputs, _ = _model(model, answer.largest, seq)
    measured = measure_step_peak(net, inputs, loss_fn, _adamw)
    return Outcome(measured=measured.peak_bytes, predicted=answer.peak_bytes,
                   quantities={"batch": answer.largest, "budget_bytes": answer.budget_bytes, "next_predicted_peak_bytes": answer.next_peak_bytes})
