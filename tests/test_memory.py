"""Unit tests of resacct.measurement.memory: recipes, the Cruncher totals and the storage-level counters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resacct.errors import ResacctError, UnknownNameError
from resacct.measurement.memory import (
    STATE_RECIPES,
    StateRecipe,
    cruncher_saved_activation_count,
    cruncher_training_memory_bytes,
    distinct_storage_bytes,
    lecture_cruncher_activation_count,
    lecture_training_memory_bytes,
    optimizer_state_tensors,
    record_saved_tensors,
    step_counter_bytes,
    training_state_bytes,
    training_state_bytes_per_parameter,
)
from resacct.training.models import Cruncher, cruncher_parameter_count


@pytest.mark.parametrize(
    "recipe, after_backward, at_step",
    [("fp32", 16, 16), ("bf16-autocast", 16, 16), ("bf16", 8, 8), ("bf16-fp32-master", 16, 20), ("bf16-fp32-master-free-bf16-grads", 16, 18)],
)
def test_adamw_bytes_per_parameter(recipe, after_backward, at_step):
    assert training_state_bytes_per_parameter(recipe, "adamw", "after_backward") == after_backward
    assert training_state_bytes_per_parameter(recipe, "adamw", "at_step") == at_step


def test_other_optimizers_and_custom_recipes():
    assert training_state_bytes_per_parameter("fp32", "sgd") == 8
    assert training_state_bytes_per_parameter("fp32", "adagrad") == 12
    fp16_everything = StateRecipe("fp16", parameter_dtype="float16", gradient_dtype="float16", optimizer_state_dtype="float16")
    assert training_state_bytes_per_parameter(fp16_everything, "adam") == 8


def test_training_state_bytes_adds_step_counters():
    assert training_state_bytes(1000, 2, "fp32", "adamw") == 16_008
    assert training_state_bytes(1000, 2, "fp32", "adamw", include_step_counters=False) == 16_000
    assert step_counter_bytes(6, "sgd") == 0 and step_counter_bytes(6, "adagrad") == 24


def test_lecture_numbers_for_the_optimizer_example():
    params = cruncher_parameter_count(4, 2)
    assert params == 45
    assert lecture_training_memory_bytes(params, lecture_cruncher_activation_count(2, 4, 2), params) == 604
    assert cruncher_saved_activation_count(2, 4, 2) == 24
    assert cruncher_training_memory_bytes(2, 4, 2, "adagrad") == 676


def test_distinct_storage_bytes_counts_each_storage_once():
    x = torch.zeros(4, 8)
    y = torch.zeros(3, dtype=torch.bfloat16)
    assert distinct_storage_bytes([x, x.t(), x[1:], y, None]) == 128 + 6


def test_record_saved_tensors_sees_input_and_weights():
    torch.manual_seed(0)
    model = Cruncher(dim=4, num_layers=2)
    x = torch.randn(2, 4)
    with record_saved_tensors() as saved:
        model(x)
    params = list(model.parameters())
    assert saved.elements(excluding=params) == cruncher_saved_activation_count(2, 4, 2)
    assert saved.elements(excluding=params + [x]) == lecture_cruncher_activation_count(2, 4, 2)
    assert saved.bytes(excluding=params) == 4 * 24
    assert any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in saved.tensors)


def test_optimizer_state_tensors_with_and_without_step_counters():
    model = Cruncher(dim=4, num_layers=1)
    adamw = torch.optim.AdamW(model.parameters())
    F.mse_loss(model(torch.randn(2, 4)), torch.randn(2, 1)).backward()
    adamw.step()
    tensors = sum(1 for _ in model.parameters())
    assert len(optimizer_state_tensors(adamw)) == 3 * tensors
    assert len(optimizer_state_tensors(adamw, include_step_counters=False)) == 2 * tensors


def test_bad_input_is_refused_with_the_value():
    with pytest.raises(UnknownNameError, match="did you mean 'fp32'"):
        training_state_bytes_per_parameter("fp31")
    with pytest.raises(Exception) as error:  # beartype refuses the Literal first when the hook is on
        STATE_RECIPES["fp32"].bytes_per_parameter("adamw", "during")  # type: ignore[arg-type]
    assert "during" in str(error.value)
    if isinstance(error.value, ResacctError):
        assert "expected one of after_backward, at_step" in str(error.value)
    with pytest.raises(ResacctError, match="num_parameters -5: expected a whole number ≥ 0"):
        training_state_bytes(-5, 1)
    with pytest.raises(ResacctError, match="has 4 bits"):
        StateRecipe("fp4", parameter_dtype="float4_e2m1", gradient_dtype="float32").bytes_per_parameter("sgd")
