"""The recipe, optimizer, moment and ZeRO-stage arguments ``memory`` and ``fit`` share, parsed
once into a :class:`resacct.facts.recipes.Recipe` and a :class:`resacct.formulas.sharding.ShardingRecipe`;
and the words every output uses for them.

>>> parameters_in_words(40e9), parameters_in_words(7.5e9), parameters_in_words(125e6)
('40 billion parameters', '7.5 billion parameters', '125 million parameters')
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from resacct.cli.output import amount_text
from resacct.errors import ResacctError
from resacct.facts.recipes import ALIASES, DEFAULT_ZERO_STAGE, MOMENT_WORDS, OPTIMIZER_CHOICES, RECIPES, Recipe, parse_recipe
from resacct.formulas.sharding import ShardingRecipe, get_sharding_recipe

__all__ = [
    "recipe_type",
    "named_recipe_type",
    "add_recipe_arguments",
    "ChosenRecipe",
    "chosen_recipe",
    "parameters_in_words",
    "zero_words",
    "RECIPES_EPILOG",
]

_MOMENT_FLAGS = {"between-steps": "after_backward", "at-step": "at_step"}


def recipe_type(text: str) -> Recipe:
    """argparse type: a recipe name, an alias, or ``w+g+k`` bytes per parameter."""
    try:
        return parse_recipe(text)
    except ResacctError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def named_recipe_type(text: str) -> Recipe:
    """argparse type: a recipe name or alias (a command that runs the recipe needs its dtypes)."""
    try:
        return parse_recipe(text, allow_custom=False)
    except ResacctError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


RECIPES_EPILOG = (
    "recipes (resacct.facts.recipes: one table for every command; the output gives the bytes at both moments):\n"
    + "\n".join(f"  {name:<34}{recipe.description}" for name, recipe in RECIPES.items())
    + "\n  aliases: " + ", ".join(f"{alias} = {name}" + (f" with {optimizer}" if optimizer else "") for alias, (name, optimizer) in ALIASES.items())
    + "\n  w+g+k: your own bytes per parameter, e.g. 2+2+12"
)


def add_recipe_arguments(parser: argparse.ArgumentParser, *, recipe_default: str | None = "fp32") -> None:
    """``--recipe``, ``--optimizer``, ``--moment`` and ``--zero``, with the same defaults everywhere."""
    parser.add_argument("--recipe", type=recipe_type, default=None if recipe_default is None else parse_recipe(recipe_default), metavar="NAME",
                        help=f"precision recipe (see below) or w+g+k bytes per parameter (default: {recipe_default or 'none'})")
    parser.add_argument("--optimizer", choices=OPTIMIZER_CHOICES, default=None,
                        help="optimizer whose state counts (default: the one the recipe name pins, else adamw)")
    parser.add_argument("--moment", choices=tuple(_MOMENT_FLAGS), default="between-steps",
                        help="between-steps: the state kept from one step to the next (the ZeRO paper's count); at-step: while "
                             "optimizer.step() runs, with a master-weight recipe's fp32 gradients (default: between-steps)")
    parser.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, metavar="{0,1,2,3}",
                        help=f"ZeRO stage: 0 nothing sharded (plain data parallel), 1 optimizer state, 2 + gradients, 3 + parameters "
                             f"(default: {DEFAULT_ZERO_STAGE}, in every command)")


@dataclass(frozen=True)
class ChosenRecipe:
    """What the arguments chose: bytes at the chosen moment, and the other moment's total."""

    recipe: Recipe
    sharding: ShardingRecipe
    other_moment_total_bytes: float
    zero_stage: int
    zero_is_default: bool

    def recipe_words(self) -> str:
        """Two lines: ``bf16-fp32-master with Adam`` and ``  bytes/param: 2 + 2 + 12 = 16 between steps, 20 at the optimizer step``."""
        from resacct.facts.optimizer_state import OPTIMIZER_DISPLAY_NAMES  # not resacct.account's: that loads torch

        s = self.sharding
        with_optimizer = f" with {OPTIMIZER_DISPLAY_NAMES.get(s.optimizer, s.optimizer)}" if s.optimizer else ""
        bytes_text = (f"\n  bytes/param: {s.parameter_bytes_per_parameter:g} + {s.gradient_bytes_per_parameter:g} + "
                      f"{s.optimizer_state_bytes_per_parameter:g} = {s.total_bytes_per_parameter:g}")
        if self.recipe.is_custom:
            return f"{s.name} (custom bytes){bytes_text}, the same at every moment"
        other = "at_step" if s.moment == "after_backward" else "after_backward"
        return f"{s.name}{with_optimizer}{bytes_text} {MOMENT_WORDS[s.moment]}, {self.other_moment_total_bytes:g} {MOMENT_WORDS[other]}"


def chosen_recipe(args: argparse.Namespace) -> ChosenRecipe:
    """The recipe of ``add_recipe_arguments``' arguments, split at the chosen moment."""
    moment = _MOMENT_FLAGS[args.moment]
    other = "at_step" if moment == "after_backward" else "after_backward"
    sharding = get_sharding_recipe(args.recipe, args.optimizer, moment)
    other_total = get_sharding_recipe(args.recipe, args.optimizer, other).total_bytes_per_parameter  # type: ignore[arg-type]
    zero_is_default = args.zero is None
    return ChosenRecipe(args.recipe, sharding, other_total, DEFAULT_ZERO_STAGE if zero_is_default else args.zero, zero_is_default)


_SHARDED = {0: "nothing sharded: plain data parallel", 1: "optimizer state sharded", 2: "optimizer state and gradients sharded",
            3: "parameters, gradients and optimizer state sharded"}


def zero_words(stage: int, is_default: bool) -> str:
    """``ZeRO stage 0 (default; nothing sharded: plain data parallel)``."""
    return f"ZeRO stage {stage} ({'default; ' if is_default else ''}{_SHARDED[stage]})"


def parameters_in_words(count: float) -> str:
    """A parameter count as people say it: ``40 billion parameters`` (never ``40 B``, which reads as bytes)."""
    if not math.isfinite(count) or not 1 <= count < 1e15:
        return amount_text(count, "parameters")
    for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if count >= scale:
            return f"{count / scale:.3g} {word} parameters"
    return f"{count:.3g} parameters"
