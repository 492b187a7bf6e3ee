"""Tests that kill mutants of resacct/formulas/sharding.py (see docs/mutation.md): refusals that name the
value, the edges of FSDP's row split (checked against ``torch.chunk``, which FSDP uses) and the
precision recipes of resacct.measurement.memory (checked against the bytes of real torch tensors)."""

from __future__ import annotations

import pytest
import torch

from resacct.errors import ResacctError
from resacct.measurement.memory import StateRecipe
from resacct.formulas.sharding import fits_in_memory, fsdp_padded_shard_numel, fsdp_shard_rows, sharding_recipe_from_state_recipe


@pytest.mark.parametrize("memory_bytes", [0, -1.0, float("nan")])
def test_fits_in_memory_names_the_bad_device_memory(memory_bytes):
    with pytest.raises(ResacctError, match=rf"^device memory \(bytes\) {memory_bytes!r}: expected a finite number greater than 0$"):
        fits_in_memory(1e9, memory_bytes, "fp32-adamw", 1, 8)


def test_fsdp_refuses_a_bool_row_count():
    with pytest.raises(ResacctError, match=r"^rows True: expected a whole number ≥ 0$"):
        fsdp_shard_rows(True, 2)


@pytest.mark.parametrize(("rows", "world_size"), [(0, 1), (0, 3), (1, 4), (5, 4), (7, 3), (8, 8), (9, 2)])
def test_fsdp_rows_are_torch_chunk(rows, world_size):
    chunks = [chunk.shape[0] for chunk in torch.chunk(torch.empty(rows, 1), world_size)] if rows else []
    assert fsdp_shard_rows(rows, world_size) == chunks + [0] * (world_size - len(chunks))


def test_a_scalar_parameter_is_one_element_on_every_rank():
    assert fsdp_padded_shard_numel((), 4) == torch.empty(()).numel() == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "float8_e4m3fn"])
def test_state_recipe_bytes_are_torch_element_sizes(dtype):
    recipe = StateRecipe(name="custom", parameter_dtype=dtype, gradient_dtype=dtype, optimizer_state_dtype=dtype, description="test")
    size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    sharded = sharding_recipe_from_state_recipe(recipe, "adamw")
    assert (sharded.parameter_bytes_per_parameter, sharded.gradient_bytes_per_parameter, sharded.optimizer_state_bytes_per_parameter) == (size, size, 2 * size)
    with_master = sharding_recipe_from_state_recipe(StateRecipe(name="m", parameter_dtype=dtype, gradient_dtype=dtype, master_dtype="float64", optimizer_state_dtype=dtype, description="t"), "sgd")
    assert with_master.optimizer_state_bytes_per_parameter == 8  # the float64 master; plain SGD keeps no state tensors


def test_sub_byte_dtypes_are_refused_not_counted_as_zero_bytes():
    recipe = StateRecipe(name="fp4", parameter_dtype="fp4", gradient_dtype="float32", optimizer_state_dtype="float32", description="test")
    with pytest.raises(ResacctError, match=r"^dtype 'fp4' has 4 bits; training state needs whole bytes per element$"):
        sharding_recipe_from_state_recipe(recipe)


@pytest.mark.parametrize(
    ("memory_bytes", "devices", "recipe", "stage"),
    [
        (950318833924.7411, 367, "fp32-sgd-momentum", 3),  # memory / bytes-per-parameter rounds one parameter too high
        (4.780523895610332e16, 435, "fp32-adamw", 1),
        (9.392278519296379e18, 478, "fp32-sgd-momentum", 1),  # beyond 2**53 parameters: steps of one ulp, not of 1
    ],
)
def test_largest_model_is_the_largest_that_fits_where_division_rounds_up(memory_bytes, devices, recipe, stage):
    import math

    from resacct.formulas.sharding import largest_model_parameters, per_rank_bytes, per_rank_bytes_per_parameter

    quotient = math.floor(memory_bytes / per_rank_bytes_per_parameter(recipe, stage, devices))
    assert per_rank_bytes(float(quotient), recipe, stage, devices).total_bytes > memory_bytes  # the case the correction is for
    largest = largest_model_parameters(memory_bytes, devices, recipe, stage)
    assert per_rank_bytes(largest, recipe, stage, devices).total_bytes <= memory_bytes
    assert per_rank_bytes(largest + max(1.0, math.ulp(largest)), recipe, stage, devices).total_bytes > memory_bytes


def test_custom_recipes_say_what_they_are():
    from resacct.formulas.sharding import get_sharding_recipe

    assert get_sharding_recipe("1+2+3").description == "custom: parameters + gradients + optimizer state bytes per parameter"


def test_bools_are_not_counts():
    from resacct.formulas.sharding import per_rank_bytes, zero_redundancy_partition

    with pytest.raises(ResacctError, match=r"^parameter count True: expected a finite number greater than 0$"):
        per_rank_bytes(True, "fp32-adamw", 0, 1)
    with pytest.raises(ResacctError, match=r"^parameter size True in \[True\]: expected whole numbers of elements ≥ 0$"):
        zero_redundancy_partition([True], 1)


def test_refusals_say_everything():
    from resacct.formulas.sharding import per_rank_bytes, zero_redundancy_partition

    with pytest.raises(ResacctError) as error:
        per_rank_bytes(3, "fp32-adamw", 1, 8)
    assert str(error.value) == (
        "parameter count 3 is smaller than world size 8: every rank needs at least one parameter to shard; use fewer ranks or more parameters"
    )
    with pytest.raises(ResacctError) as error:
        zero_redundancy_partition([1, 2, 3, 4, 5, 6, 7, 8, 9, -1], 2)
    assert str(error.value) == "parameter size -1 in [1, 2, 3, 4, 5, 6, 7, 8]: expected whole numbers of elements ≥ 0"


def test_custom_recipe_names_and_bad_numbers():
    from resacct.formulas.sharding import get_sharding_recipe

    assert get_sharding_recipe("2 + 2 + 12").name == "2+2+12"
    with pytest.raises(ResacctError) as error:
        get_sharding_recipe("1.2.3+2+3")
    assert str(error.value) == "recipe '1.2.3+2+3': '1.2.3' is not a number of bytes"


def test_an_unknown_recipe_lists_the_custom_form():
    from resacct.errors import UnknownNameError
    from resacct.formulas.sharding import get_sharding_recipe

    with pytest.raises(UnknownNameError) as error:
        get_sharding_recipe("nonsense")
    assert str(error.value).startswith("unknown precision recipe 'nonsense'")
    assert "w+g+k (e.g. 2+2+12)" in error.value.known


def test_the_recipe_says_which_optimizer_and_moment_its_bytes_are_for():
    from resacct.formulas.sharding import get_sharding_recipe

    assert (get_sharding_recipe("2+2+12").optimizer, get_sharding_recipe("2+2+12").moment) == (None, "after_backward")  # custom: no optimizer
    at_step = get_sharding_recipe("mixed-adam", moment="at_step")
    assert (at_step.optimizer, at_step.moment) == ("adam", "at_step")
    assert get_sharding_recipe("fp32", optimizer="sgd").optimizer == "sgd"


def test_sharding_recipes_is_built_when_asked_for():
    import resacct.formulas.sharding
    from resacct.facts.recipes import RECIPE_NAMES
    from resacct.formulas.sharding import get_sharding_recipe

    recipes = getattr(resacct.formulas.sharding, "SHARDING_RECIPES")  # the module's __getattr__, at run time
    assert list(recipes) == list(RECIPE_NAMES)
    assert all(recipe == get_sharding_recipe(name) for name, recipe in recipes.items())
    with pytest.raises(AttributeError) as error:
        getattr(resacct.formulas.sharding, "NO_SUCH_TABLE")
    assert str(error.value) == "module 'resacct.formulas.sharding' has no attribute 'NO_SUCH_TABLE'"
