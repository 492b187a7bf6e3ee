"""Will it fit: a training step's peak memory, predicted by resacct on fake tensors before the step
runs (:mod:`resacct.account.peak`), against the peak the CPU allocator records when it runs
(``torch.profiler`` with ``profile_memory=True``, :mod:`resacct.measurement.memory_timeline`) — and
the lecture's sum (training state + activations) against the same measurement.

The law's quantities come from torch too: the training state is a real ``torch.optim.AdamW``'s
storages with the gradients (:func:`resacct.account.step_measurements.measure_training_state`),
the activations what ``saved_tensors_hooks`` see, the inputs their storages.
"""

from __future__ import annotations

import functools

import torch

from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check


@functools.lru_cache(maxsize=16)
def _step(model: str, batch: int, seq: int) -> Outcome:
    from resacct.account.peak import measure_step_peak, predict_step_peak
    from resacct.account.peak_models import peak_model
    from resacct.account.step_measurements import measure_training_state
    from resacct.measurement.activations import record_saved_activations
    from resacct.measurement.memory import distinct_storage_bytes
    from resacct.measurement.memory_timeline import copy_inputs

    try:
        net, inputs, loss_fn = peak_model(model, batch=batch, seq=seq)
    except ResacctError as error:
        raise NotMeasurable(str(error)) from None

    def adamw(parameters: list) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=1e-3)

    predicted = predict_step_peak(net, inputs, loss_fn, adamw)
    measured = measure_step_peak(net, inputs, loss_fn, adamw)
    state = measure_training_state(net, lambda m: loss_fn(m, inputs), "fp32", "adamw")
    with record_saved_activations(net) as saved:
        loss = loss_fn(net, inputs)
    del loss
    tensors: list[torch.Tensor] = []
    copy_inputs(inputs, lambda t: tensors.append(t) or t)
    return Outcome(
        measured=measured.peak_bytes, predicted=predicted.peak_bytes,
        quantities={"state_bytes": state.at_step_bytes, "saved_bytes": saved.activation_bytes, "input_bytes": distinct_storage_bytes(tensors),
                    "measured_start_bytes": measured.start_bytes, "predicted_start_bytes": predicted.timeline.start_bytes,
                    "peak_phase": measured.peak_phase, "predicted_peak_phase": predicted.peak.phase, "attention_kernel": predicted.attention_kernel},
    )


@check("peak.step_peak", evidence="measured", quantities=("state_bytes", "saved_bytes", "input_bytes", "measured_start_bytes", "predicted_start_bytes"))
def step_peak(model: str, batch: int, seq: int) -> Outcome:
    """The CPU allocator's peak over one steady AdamW step (forward, backward, step, zero_grad) of a
    :data:`resacct.account.peak_models.PEAK_MODELS` model; predicted: resacct on fake tensors."""
    return _step(model, batch, seq)


@check("peak.phase_matches", evidence="measured")
def phase_matches(model: str, batch: int, seq: int) -> Outcome:
    """1 when the allocator's peak falls in the phase resacct predicts for it (forward, backward,
    optimizer step, zero_grad), else 0."""
    outcome = _step(model, batch, seq)
    return Outcome(measured=int(outcome.quantities["peak_phase"] == outcome.quantities["predicted_peak_phase"]),
                   quantities={"measured_phase": outcome.quantities["peak_phase"], "predicted_phase": outcome.quantities["predicted_peak_phase"]})
