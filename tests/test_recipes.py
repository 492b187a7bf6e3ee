"""One recipe vocabulary for every command (issue 11): names and aliases parse once into a
Recipe; ``memory``/``fit`` and ``account`` agree at both moments with what torch holds; the ZeRO
stage and the moment are stated in every output; bad recipes are one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from resacct.cli import main
from resacct.facts.recipes import ALIASES, RECIPE_NAMES, RECIPES, get_recipe, parse_recipe
from resacct.account.trace.step_measurements import measure_training_state

NAMED = sorted(name for name in RECIPE_NAMES)


def _memory_json(capsys, *arguments: str) -> dict:
    assert main(["memory", "--params", "1B", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_optimizer_choices_are_the_ones_account_can_build():
    from resacct.account.load.optimizers import OPTIMIZER_NAMES
    from resacct.facts.recipes import OPTIMIZER_CHOICES

    assert OPTIMIZER_CHOICES == OPTIMIZER_NAMES


@pytest.mark.parametrize("name", NAMED)
def test_every_name_and_alias_parses_for_every_command(name):
    from resacct.cli.app import build_parser, subparsers_of
    from resacct.cli import _command_modules

    parser = build_parser()
    subparsers = subparsers_of(parser)
    for module in _command_modules():
        module.register(subparsers)  # type: ignore[attr-defined]
    expected = get_recipe(name)
    plan = ["plan", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "4096"]
    for command in (["memory", "--params", "1B"], ["fit", "--devices", "8", "--device", "h100"], ["account"], plan):
        args = parser.parse_args([*command, "--recipe", name])
        assert args.recipe == expected, command


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_is_its_recipe_with_the_optimizer_it_names(alias):
    target, optimizer = ALIASES[alias]
    recipe = get_recipe(alias)
    assert recipe.name == target and recipe.optimizer_for() == (optimizer or "adamw")
    assert recipe.state_bytes(moment="at_step") == RECIPES[target].state_bytes(optimizer or "adamw", "at_step")


def _linear_loss(module: nn.Module) -> torch.Tensor:
    first = next(module.parameters())
    return module(torch.ones(3, 16, dtype=first.dtype)).float().sum()


@pytest.mark.parametrize("name", ["fp32", "bf16", "bf16-fp32-master", "bf16-fp32-master-free-bf16-grads", "mixed-adam", "fp32-sgd-momentum"])
def test_memory_states_both_moments_as_torch_measures_them(capsys, name):
    """memory's bytes per parameter, between steps and at the optimizer step, against the bytes a
    real torch.optim run of that recipe holds (the same measurement ``resacct account`` shows)."""
    report = _memory_json(capsys, "--recipe", name)
    optimizer = get_recipe(name).optimizer_for()
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8))
    measured = measure_training_state(model, _linear_loss, name, optimizer)
    per_parameter = {
        "after_backward": (measured.after_backward_bytes - measured.step_counter_bytes) / measured.parameters,
        "at_step": (measured.at_step_bytes - measured.step_counter_bytes) / measured.parameters,
    }
    assert report["total_bytes_per_parameter_by_moment"] == per_parameter
    assert report["moment"] == "after_backward" and report["total_bytes_per_rank"] == 1e9 * per_parameter["after_backward"]
    assert _memory_json(capsys, "--recipe", name, "--moment", "at-step")["total_bytes_per_rank"] == 1e9 * per_parameter["at_step"]


def test_bf16_fp32_master_is_16_between_steps_and_20_at_the_step_in_the_text(capsys):
    assert main(["memory", "--params", "1B", "--recipe", "bf16-fp32-master"]) == 0
    out = capsys.readouterr().out
    assert "  recipe: bf16-fp32-master with AdamW\n  bytes/param: 2 + 2 + 12 = 16 between steps, 20 at the optimizer step\n" in out
    assert "ZeRO stage 0 (default; nothing sharded" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("command", [["memory", "--params", "40B"], ["fit", "--devices", "8"]])
def test_memory_and_fit_share_one_default_zero_stage_and_say_it(capsys, command):
    assert main([*command, "--device", "h100", "--recipe", "fp32-adamw"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 0 (default; nothing sharded: plain data parallel)" in out and "5 billion parameters" in out
    assert main([*command, "--device", "h100", "--recipe", "fp32-adamw", "--zero", "3"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 3 (parameters, gradients and optimizer state sharded)" in out and "default" not in out
    assert "40 B" not in out and "40B" not in out


@pytest.mark.parametrize("command", [["memory", "--params", "1B"], ["fit", "--devices", "8", "--device", "h100"]])
@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ("0+0+0", "recipe '0+0+0': a parameter must cost more than 0 bytes in all (e.g. 2+2+12)"),
        ("2+x+12", "recipe '2+x+12': 'x' is not a number of bytes"),
        ("2+-1+12", "recipe '2+-1+12': '-1' bytes must be a finite number ≥ 0"),
        ("2+inf+12", "recipe '2+inf+12': 'inf' bytes must be a finite number ≥ 0"),
    ],
)
def test_bad_custom_recipes_are_one_line_exit_2(capsys, command, recipe, message):
    assert main([*command, "--recipe", recipe]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument --recipe: {message}" in err[0], err


def test_account_refuses_custom_bytes_and_a_contradicting_optimizer(capsys):
    assert main(["account", "--recipe", "2+2+12"]) == 2
    assert "recipe '2+2+12': bytes per parameter have no dtypes to run with" in capsys.readouterr().err
    assert main(["account", "--recipe", "mixed-adam", "--optimizer", "sgd", "--model", "gpt-nano"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["resacct account: error: recipe 'mixed-adam' is trained with adam, but the optimizer given is 'sgd'; "
                   "drop one, or use the recipe's plain name"]


def test_parse_recipe_passes_a_recipe_through_and_refuses_non_strings():
    recipe = parse_recipe("mixed")
    assert parse_recipe(recipe) is recipe and parse_recipe("bf16-fp32-master") is RECIPES["bf16-fp32-master"]
    assert recipe.state_bytes() == RECIPES["bf16-fp32-master"].state_bytes() and recipe.alias == "mixed"
    from resacct.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match=r"^unknown precision recipe 'mixed-adamw'; did you mean 'mixed-adam'"):
        parse_recipe("mixed-adamw")
