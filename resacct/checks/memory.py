"""Measuring the memory of training state on real tensors: a Cruncher trained for real steps
with torch.optim, its parameters, gradients, master weights and optimizer state counted by
distinct storage; activations counted from what autograd saves for backward
(``torch.autograd.graph.saved_tensors_hooks``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from resacct.facts.dtypes import parse_dtype
from resacct.harness.registry import Outcome, check
from resacct.measurement.memory import (
    StateRecipe,
    cruncher_saved_activation_count,
    cruncher_training_memory_bytes,
    distinct_storage_bytes,
    get_state_recipe,
    optimizer_state_tensors,
    record_saved_tensors,
    training_state_bytes,
)
from resacct.training.models import Cruncher
from resacct.training.seeding import seed_torch


@dataclass
class _MixedPrecisionRun:
    """A Cruncher trained with torch.optim.AdamW under a recipe, one phase at a time."""

    recipe: StateRecipe
    model: Cruncher
    optimizer: torch.optim.Optimizer
    master: list[nn.Parameter] = field(default_factory=list)

    @classmethod
    def start(cls, recipe: StateRecipe, dim: int, num_layers: int) -> _MixedPrecisionRun:
        seed_torch(0)
        model = Cruncher(dim=dim, num_layers=num_layers).to(parse_dtype(recipe.parameter_dtype))
        if recipe.master_dtype is None:
            return cls(recipe, model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        master = [nn.Parameter(p.detach().to(parse_dtype(recipe.master_dtype))) for p in model.parameters()]
        return cls(recipe, model, torch.optim.AdamW(master, lr=1e-3), master)

    def backward(self, batch: int = 2) -> None:
        x = torch.randn(batch, self.model.dim, dtype=parse_dtype(self.recipe.parameter_dtype))  # (batch, dim)
        if self.recipe.compute_dtype is not None:
            with torch.autocast("cpu", dtype=parse_dtype(self.recipe.compute_dtype)):
                prediction = self.model(x)  # (batch, 1)
        else:
            prediction = self.model(x)
        prediction.float().pow(2).mean().backward()

    def hand_gradients_to_master(self) -> None:
        for master, param in zip(self.master, self.model.parameters()):
            master.grad = param.grad.to(master.dtype)
            if self.recipe.frees_model_gradients:
                param.grad = None

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for master, param in zip(self.master, self.model.parameters()):
                param.copy_(master)
        self.model.zero_grad(set_to_none=True)

    def held_bytes(self, *, include_step_counters: bool) -> int:
        params = list(self.model.parameters())
        tensors = params + [p.grad for p in params] + self.master + [m.grad for m in self.master]
        tensors += optimizer_state_tensors(self.optimizer, include_step_counters=include_step_counters)
        return distinct_storage_bytes(tensors)


@check("memory.training_state", evidence="measured", quantities=("params", "parameter_tensors"))
def training_state(recipe: str, moment: str, dim: int, num_layers: int, include_step_counters: bool = False) -> Outcome:
    """Bytes of distinct storages held by parameters, gradients, master weights and AdamW state
    during the second real step of a Cruncher trained under ``recipe``: right after backward
    (``after_backward``) or when torch.optim.AdamW.step() is about to run (``at_step``)."""
    chosen = get_state_recipe(recipe)
    run = _MixedPrecisionRun.start(chosen, dim, num_layers)
    run.backward()
    run.hand_gradients_to_master()
    run.step()  # step 1 creates the optimizer state
    run.backward()
    if moment == "at_step":
        run.hand_gradients_to_master()
    elif moment != "after_backward":
        raise ValueError(f"moment {moment!r}: expected after_backward or at_step")
    measured = run.held_bytes(include_step_counters=include_step_counters)
    params = sum(p.numel() for p in run.model.parameters())
    tensors = sum(1 for _ in run.model.parameters())
    return Outcome(
        measured=measured,
        predicted=training_state_bytes(params, tensors, chosen, "adamw", moment, include_step_counters=include_step_counters),  # type: ignore[arg-type]
        quantities={"params": params, "parameter_tensors": tensors},
    )


@check("memory.saved_activations", evidence="measured", quantities=("input_elements",))
def saved_activations(batch: int, dim: int, num_layers: int, count: str) -> Outcome:
    """Elements autograd saves for backward in a real Cruncher forward on x (batch×dim), by
    distinct storage, parameters left out: ``all`` of them, or ``hidden`` (the batch x left out
    too); with the input's own elements as a quantity."""
    seed_torch(0)
    model = Cruncher(dim=dim, num_layers=num_layers)
    x = torch.randn(batch, dim)  # (batch, dim)
    with record_saved_tensors() as saved:
        model(x)
    excluded = list(model.parameters()) + ([x] if count == "hidden" else [])
    predicted = cruncher_saved_activation_count(batch, dim, num_layers) - (batch * dim if count == "hidden" else 0)
    return Outcome(measured=saved.elements(excluding=excluded), predicted=predicted, quantities={"input_elements": x.numel()})


@check("memory.lecture_step_total", evidence="measured", quantities=("params", "parameter_tensors", "step_counter_bytes", "input_elements"))
def lecture_step_total(batch: int, dim: int, num_layers: int) -> Outcome:
    """Bytes of every distinct storage one real float32 training step of a Cruncher holds,
    each part kept alive from when it appears: the parameters, everything autograd saves in
    forward + mse_loss (the batch x, hidden activations, prediction, target), the gradients,
    and torch.optim.Adagrad's state after the step (its step counters as a quantity)."""
    seed_torch(0)
    model = Cruncher(dim=dim, num_layers=num_layers)
    params = list(model.parameters())
    optimizer = torch.optim.Adagrad(params, lr=0.01)
    x, y = torch.randn(batch, dim), torch.randn(batch, 1)
    with record_saved_tensors() as saved:
        loss = F.mse_loss(model(x), y)
    loss.backward()
    gradients = [p.grad for p in params]
    optimizer.step()
    state = optimizer_state_tensors(optimizer)
    counters = [tensor for tensor in state if tensor.dim() == 0]
    measured = distinct_storage_bytes(params + saved.tensors + gradients + state)
    return Outcome(
        measured=measured,
        predicted=cruncher_training_memory_bytes(batch, dim, num_layers, "adagrad"),
        quantities={
            "params": sum(p.numel() for p in params),
            "parameter_tensors": len(params),
            "step_counter_bytes": distinct_storage_bytes(counters),
            "input_elements": x.numel(),
        },
    )
