"""resacct.measurement.memory against real torch training steps, written to kill the mutants mutmut left alive
(docs/mutation.md). Bytes are measured as distinct storages of real tensors; the optimizers are
torch.optim's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resacct.measurement import memory
from resacct.errors import ResacctError, UnknownNameError
from resacct.training.models import Cruncher


def _measured_cruncher_step_bytes(batch: int, dim: int, num_layers: int, optimizer_name: str) -> int:
    torch.manual_seed(0)
    model = Cruncher(dim=dim, num_layers=num_layers)
    params = list(model.parameters())
    optimizer = getattr(torch.optim, optimizer_name)(params, lr=0.01)
    x, y = torch.randn(batch, dim), torch.randn(batch, 1)
    with memory.record_saved_tensors() as saved:
        loss = F.mse_loss(model(x), y)
    loss.backward()
    gradients = [p.grad for p in params]
    optimizer.step()
    return memory.distinct_storage_bytes(params + saved.tensors + gradients + memory.optimizer_state_tensors(optimizer))


@pytest.mark.parametrize(("optimizer", "torch_name"), [("sgd", "SGD"), ("adam", "Adam"), ("adagrad", "Adagrad")])
def test_cruncher_step_bytes_follow_the_optimizer_torch_runs(optimizer, torch_name):
    for batch, dim, num_layers in ((2, 4, 2), (3, 5, 1)):
        measured = _measured_cruncher_step_bytes(batch, dim, num_layers, torch_name)
        assert memory.cruncher_training_memory_bytes(batch, dim, num_layers, optimizer) == measured


def _measured_fp32_state(optimizer_name: str, **kwargs) -> tuple[int, int, int]:
    model = Cruncher(dim=6, num_layers=2)
    params = list(model.parameters())
    optimizer = getattr(torch.optim, optimizer_name)(params, lr=0.01, **kwargs)
    F.mse_loss(model(torch.randn(3, 6)), torch.zeros(3, 1)).backward()
    optimizer.step()
    held = memory.distinct_storage_bytes(params + [p.grad for p in params] + memory.optimizer_state_tensors(optimizer))
    return held, sum(p.numel() for p in params), len(params)


def test_training_state_bytes_defaults_are_fp32_adamw_with_step_counters():
    held, numel, tensors = _measured_fp32_state("AdamW")
    assert memory.training_state_bytes(numel, tensors) == held
    without_counters = held - memory.step_counter_bytes(tensors, "adamw")
    assert memory.training_state_bytes_per_parameter("fp32") * numel == without_counters
    held_sgd, _, _ = _measured_fp32_state("SGD")
    assert memory.training_state_bytes(numel, tensors, "fp32", "sgd") == held_sgd
    assert memory.step_counter_bytes(tensors, "sgd") == 0 < memory.step_counter_bytes(tensors)


def test_saved_tensors_count_a_tensor_saved_twice_once():
    x = torch.randn(4, 3, requires_grad=True)
    with memory.record_saved_tensors() as saved:
        y = x * x  # mul saves both operands: the same storage twice
    assert len(saved.tensors) == 2
    assert saved.bytes() == x.untyped_storage().nbytes()
    assert saved.elements() == x.numel()
    assert saved.bytes(excluding=[x]) == 0
    y.sum().backward()


COUNT_ARGUMENTS = {
    memory.lecture_cruncher_activation_count: ("batch", "dim", "num_layers"),
    memory.cruncher_saved_activation_count: ("batch", "dim", "num_layers"),
    memory.lecture_training_memory_bytes: ("num_parameters", "num_activations", "num_optimizer_states", "bytes_per_value"),
    memory.cruncher_training_memory_bytes: ("loss_saves",),
    memory.step_counter_bytes: ("num_parameter_tensors",),
    memory.training_state_bytes: ("num_parameters",),
}
GOOD = {"batch": 2, "dim": 4, "num_layers": 2, "num_parameters": 45, "num_activations": 16, "num_optimizer_states": 45,
        "bytes_per_value": 4, "loss_saves": 2, "num_parameter_tensors": 6}
CASES = [(function, argument) for function, arguments in COUNT_ARGUMENTS.items() for argument in arguments]


@pytest.mark.parametrize(("function", "argument"), CASES, ids=[f"{f.__name__}-{a}" for f, a in CASES])
def test_a_bad_count_is_named_in_the_error(function, argument):
    required = {
        memory.cruncher_training_memory_bytes: {"batch": 2, "dim": 4, "num_layers": 2},
        memory.training_state_bytes: {"num_parameter_tensors": 6},
    }.get(function, {})
    kwargs = {**required, **{name: GOOD[name] for name in COUNT_ARGUMENTS[function]}}
    assert function(**kwargs) >= 0
    for bad in (-1, True):
        with pytest.raises(ResacctError, match=rf"^{argument} {bad!r}: expected a whole number ≥ 0$"):
            function(**{**kwargs, argument: bad})


def test_unknown_recipe_names_the_kind():
    from resacct.facts.recipes import ALIASES

    with pytest.raises(UnknownNameError, match=r"^unknown precision recipe 'fp33'; did you mean 'fp32'") as error:
        memory.get_state_recipe("fp33")
    assert error.value.kind == "precision recipe"
    assert set(error.value.known) == set(memory.STATE_RECIPES) | set(ALIASES)
