"""A step that could not run where its model was built, accounted by prediction alone.

On the meta device some kernels cannot run: transformers' default Mixtral experts (``grouped_mm``
refuses float32 there; ``eager`` asks ``nonzero`` for a data-dependent shape). Where a provider
of :mod:`resacct.account.answers.providers` knows such a kernel, the account keeps resacct's predictions
and these stand in for the measurements — FLOPs traced, the training state a real optimizer
holds, the tensors autograd saves — every measured figure None ("—" in the table), never a
figure that was not measured.

>>> flops = UntracedFlops()
>>> flops.step_flops is None and flops.warnings == [] and UnrecordedActivations().by_module() == {}
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn

from resacct.account.load.optimizers import memory_optimizer_name
from resacct.measurement.flop_tracing import UncountedOp
from resacct.account.load.trainable import predict_state_bytes
from resacct.measurement.memory import StateRecipe
from resacct.training.models import count_parameter_tensors, count_parameters

__all__ = ["UntracedFlops", "UnmeasuredState", "UnrecordedActivations", "unmeasured_state"]


@dataclass(frozen=True)
class UntracedFlops:
    """In place of a :class:`~resacct.account.trace.step_measurements.StepFlopTrace`: nothing was traced."""

    forward_flops: None = None
    backward_flops: None = None
    forward_by_module: Mapping[str, int] = field(default_factory=dict)
    backward_by_module: Mapping[str, int] = field(default_factory=dict)
    uncounted_ops: tuple[UncountedOp, ...] = ()
    gap_filled_flops: int = 0
    attention_recompute_flops: int = 0

    @property
    def step_flops(self) -> None:
        return None

    @property
    def warnings(self) -> list[str]:
        return []


@dataclass(frozen=True)
class UnmeasuredState:
    """In place of a :class:`~resacct.account.trace.step_measurements.TrainingStateMeasurement`: the
    prediction (:func:`resacct.measurement.memory.training_state_bytes`) without a measurement."""

    recipe: StateRecipe
    optimizer: str
    parameters: int
    parameter_tensors: int
    predicted_after_backward_bytes: int
    predicted_at_step_bytes: int
    after_backward_bytes: None = None
    at_step_bytes: None = None
    parts_bytes: Mapping[str, int] = field(default_factory=dict)

    @property
    def step_counter_bytes(self) -> None:
        return None


def unmeasured_state(model: nn.Module, recipe: StateRecipe, optimizer: str) -> UnmeasuredState:
    """The training state ``optimizer`` would hold for ``model``'s parameters under ``recipe``, predicted only.

    >>> from resacct.measurement.memory import get_state_recipe
    >>> state = unmeasured_state(nn.Linear(4, 2), get_state_recipe("fp32"), "adamw")
    >>> state.predicted_at_step_bytes, state.at_step_bytes        # 16 B × 10 parameters + 2 step counters
    (168, None)
    """
    numbers, tensors = count_parameters(model), count_parameter_tensors(model)
    memory_name = memory_optimizer_name(optimizer)
    return UnmeasuredState(
        recipe=recipe, optimizer=optimizer, parameters=numbers, parameter_tensors=tensors,
        predicted_after_backward_bytes=predict_state_bytes(model, recipe, memory_name, "after_backward"),
        predicted_at_step_bytes=predict_state_bytes(model, recipe, memory_name, "at_step"),
    )


@dataclass(frozen=True)
class UnrecordedActivations:
    """In place of a :class:`~resacct.measurement.activations.SavedActivations`: nothing was recorded."""

    activation_bytes: None = None
    parameter_bytes: None = None

    def by_module(self) -> dict[str, int]:
        return {}
