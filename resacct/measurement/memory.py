"""Memory of training state: parameters, gradients, optimizer state and saved activations.

Two halves:

- **Predictions** — bytes per parameter of the training state under a precision recipe
  (:data:`resacct.facts.recipes.RECIPES`, also named ``STATE_RECIPES`` here), at two moments of a step (``after_backward``: what is kept between
  steps; ``at_step``: what exists while ``optimizer.step()`` runs), the step counters torch
  keeps, and the activations a Cruncher saves for backward.
- **Measurements** — byte counts of real tensors, deduplicated by storage
  (``untyped_storage().data_ptr()``), and :func:`record_saved_tensors`, which collects what
  autograd saves for backward through ``torch.autograd.graph.saved_tensors_hooks``.

>>> training_state_bytes_per_parameter("fp32", "adamw")  # 4 param + 4 grad + 8 Adam m, v
16
>>> training_state_bytes_per_parameter("bf16-fp32-master", "adamw", moment="after_backward")
16
>>> training_state_bytes_per_parameter("bf16-fp32-master", "adamw", moment="at_step")
20
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import no_type_check

import torch
from jaxtyping import Shaped

from resacct.errors import ResacctError
from resacct.training.models import cruncher_parameter_count, cruncher_parameter_tensor_count
from resacct.training.optim import state_tensors_per_parameter
from resacct.facts.recipes import RECIPES, Moment, Recipe, get_recipe

__all__ = [
    "Moment",
    "StateRecipe",
    "STATE_RECIPES",
    "STEP_COUNTER_BYTES",
    "OPTIMIZERS_WITH_STEP_TENSORS",
    "get_state_recipe",
    "training_state_bytes_per_parameter",
    "training_state_bytes",
    "step_counter_bytes",
    "lecture_cruncher_activation_count",
    "cruncher_saved_activation_count",
    "lecture_training_memory_bytes",
    "cruncher_training_memory_bytes",
    "distinct_storage_bytes",
    "storage_key",
    "optimizer_state_tensors",
    "SavedTensors",
    "record_saved_tensors",
]

STEP_COUNTER_BYTES = 4  # torch.optim keeps state["step"] as a float32 0-dim tensor
OPTIMIZERS_WITH_STEP_TENSORS = frozenset({"adagrad", "rmsprop", "adam", "adamw"})

# The recipes are resacct.facts.recipes' one table; these names stay for the code that uses them.
StateRecipe = Recipe
STATE_RECIPES = RECIPES
get_state_recipe = get_recipe


def training_state_bytes_per_parameter(recipe: str | Recipe, optimizer: str = "adamw", moment: Moment = "at_step") -> int:
    """Bytes of parameters, gradients, master weights and optimizer state per parameter.

    >>> training_state_bytes_per_parameter("bf16-fp32-master-free-bf16-grads", moment="at_step")
    18
    """
    return get_recipe(recipe).bytes_per_parameter(optimizer, moment)


def step_counter_bytes(num_parameter_tensors: int, optimizer: str = "adamw") -> int:
    """Bytes of torch.optim's per-tensor ``step`` counters (float32 0-dim tensors).

    >>> step_counter_bytes(6, "adamw"), step_counter_bytes(6, "sgd")
    (24, 0)
    """
    _count("num_parameter_tensors", num_parameter_tensors)
    state_tensors_per_parameter(optimizer)  # refuses unknown optimizers
    return STEP_COUNTER_BYTES * num_parameter_tensors if optimizer in OPTIMIZERS_WITH_STEP_TENSORS else 0


def training_state_bytes(
    num_parameters: int,
    num_parameter_tensors: int,
    recipe: str | Recipe = "fp32",
    optimizer: str = "adamw",
    moment: Moment = "at_step",
    *,
    include_step_counters: bool = True,
) -> int:
    """Bytes of the whole training state (activations aside), step counters included.

    >>> training_state_bytes(1000, 2, "fp32", "adamw")  # 16 · 1000 + 4 · 2
    16008
    """
    total = _count("num_parameters", num_parameters) * training_state_bytes_per_parameter(recipe, optimizer, moment)
    return total + (step_counter_bytes(num_parameter_tensors, optimizer) if include_step_counters else 0)


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResacctError(f"{name} {value!r}: expected a whole number ≥ 0")
    return value


# ── activations and the lecture's total ────────────────────────────────────────────────────


def lecture_cruncher_activation_count(batch: int, dim: int, num_layers: int) -> int:
    """The lecture's num_activations = B · D · num_layers (the hidden layers' outputs).

    >>> lecture_cruncher_activation_count(2, 4, 2)
    16
    """
    return _count("batch", batch) * _count("dim", dim) * _count("num_layers", num_layers)


def cruncher_saved_activation_count(batch: int, dim: int, num_layers: int) -> int:
    """Numbers autograd saves in a Cruncher's forward: every layer's input — the batch x and
    the num_layers hidden outputs (the final layer's input included) — B · D · (num_layers + 1).

    >>> cruncher_saved_activation_count(2, 4, 2)
    24
    """
    return _count("batch", batch) * _count("dim", dim) * (_count("num_layers", num_layers) + 1)


def lecture_training_memory_bytes(num_parameters: int, num_activations: int, num_optimizer_states: int, bytes_per_value: int = 4) -> int:
    """The lecture's total: bytes_per_value × (parameters + activations + gradients + optimizer states).

    >>> lecture_training_memory_bytes(45, 16, 45)
    604
    """
    return _count("bytes_per_value", bytes_per_value) * (
        2 * _count("num_parameters", num_parameters) + _count("num_activations", num_activations) + _count("num_optimizer_states", num_optimizer_states)
    )


def cruncher_training_memory_bytes(batch: int, dim: int, num_layers: int, optimizer: str = "adagrad", *, loss_saves: int = 2) -> int:
    """Bytes a float32 Cruncher step really holds: parameters, gradients, optimizer state and its
    step counters, the input batch and hidden activations saved for backward, and what the loss
    saves (``loss_saves`` tensors of B numbers: mse_loss keeps prediction and target).

    >>> cruncher_training_memory_bytes(2, 4, 2)  # the lecture's 604, + x 32, + steps 24, + loss 16
    676
    """
    parameters = cruncher_parameter_count(dim, num_layers)
    states = state_tensors_per_parameter(optimizer) * parameters
    saved = cruncher_saved_activation_count(batch, dim, num_layers) + _count("loss_saves", loss_saves) * batch
    steps = step_counter_bytes(cruncher_parameter_tensor_count(num_layers), optimizer)
    return 4 * (2 * parameters + states + saved) + steps


# ── measuring real tensors ─────────────────────────────────────────────────────────────────


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def storage_key(tensor: Shaped[torch.Tensor, "..."]) -> tuple[str, int]:
    """An identity for the storage behind ``tensor``: (device, data pointer); on the meta device,
    where every pointer is 0, the storage implementation's address. Views share their base's key.

    >>> x = torch.zeros(4, 4)
    >>> storage_key(x) == storage_key(x.t()) == storage_key(x[1:])
    True
    """
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta":
        return ("meta", int(storage._cdata))
    return (str(tensor.device), storage.data_ptr())


def distinct_storage_bytes(tensors: Iterable[Shaped[torch.Tensor, "..."] | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and repeats counted once;
    None skipped; a DTensor counts its local shard; meta tensors count by storage identity).
    Keep the tensors alive while calling: a freed storage's address is reused.

    >>> x = torch.zeros(4, 8)
    >>> distinct_storage_bytes([x, x.t(), x[0], None])
    128
    >>> m = torch.zeros(4, 8, device="meta")
    >>> distinct_storage_bytes([m, m.t(), torch.zeros(2, device="meta")])
    136
    """
    storages: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storages[storage_key(local)] = local.untyped_storage().nbytes()
    return sum(storages.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer, *, include_step_counters: bool = True) -> list[Shaped[torch.Tensor, "..."]]:
    """Every tensor in ``optimizer.state`` (0-dim step counters optional).

    >>> p = torch.nn.Parameter(torch.zeros(3)); p.grad = torch.ones(3)
    >>> adam = torch.optim.Adam([p]); adam.step()
    >>> len(optimizer_state_tensors(adam)), len(optimizer_state_tensors(adam, include_step_counters=False))
    (3, 2)
    """
    found = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and (include_step_counters or not _is_step_counter(value)):
                found.append(value)
    return found


def _is_step_counter(value: Shaped[torch.Tensor, "..."]) -> bool:
    return value.dim() == 0  # torch.optim's state["step"]; every other state tensor has the parameter's shape


@dataclass
class SavedTensors:
    """What autograd saved for backward inside :func:`record_saved_tensors` (kept alive)."""

    tensors: list[Shaped[torch.Tensor, "..."]]

    def bytes(self, *, excluding: Iterable[Shaped[torch.Tensor, "..."]] = ()) -> int:
        """Bytes of distinct saved storages, leaving out those shared with ``excluding``
        (e.g. the parameters: a saved weight costs nothing extra)."""
        return distinct_storage_bytes(self.distinct(excluding=excluding))

    def elements(self, *, excluding: Iterable[Shaped[torch.Tensor, "..."]] = ()) -> int:
        """Elements of the distinct saved storages (as ``bytes`` but counted in numbers)."""
        return sum(tensor.untyped_storage().nbytes() // tensor.element_size() for tensor in self.distinct(excluding=excluding))

    def distinct(self, *, excluding: Iterable[Shaped[torch.Tensor, "..."]] = ()) -> list[Shaped[torch.Tensor, "..."]]:
        """One saved tensor per distinct storage, leaving out storages shared with ``excluding``."""
        seen = {tensor.untyped_storage().data_ptr() for tensor in excluding}
        distinct = []
        for tensor in self.tensors:
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in seen:
                seen.add(pointer)
                distinct.append(tensor)
        return distinct


@contextlib.contextmanager
def record_saved_tensors() -> Iterator[SavedTensors]:
    """Collect every tensor autograd saves for backward in the block.

    >>> w = torch.ones(3, 2, requires_grad=True)
    >>> with record_saved_tensors() as saved:
    ...     y = torch.ones(4, 3) @ w
    >>> saved.bytes(excluding=[w])  # mm saves its input x (4×3 float32) to get w's gradient
    48
    """
    saved = SavedTensors(tensors=[])
    with torch.autograd.graph.saved_tensors_hooks(functools.partial(_keep_saved, saved), lambda tensor: tensor):
        yield saved


def _keep_saved(saved: SavedTensors, tensor: Shaped[torch.Tensor, "..."]) -> Shaped[torch.Tensor, "..."]:
    """:func:`record_saved_tensors`'s pack hook: a module-level function under a ``functools.partial``, not a def
    in it, so the type-checking hook decorates it once (its jaxtyping hints, new classes at each def, built
    beartype's wrappers afresh at every call of record_saved_tensors: docs/suite_time.md, session 7)."""
    saved.tensors.append(tensor)
    return tensor
