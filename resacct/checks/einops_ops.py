"""Measuring einops against traditional torch code, and jaxtyping annotations against real calls.

Each *form* below is one line of the lecture notes: an einops call (the "new way") and the torch
code it is said to replace (the "old way"), run on the same random tensors. A form that einops
refuses is measured as the error einops (or torch) raises; a claim about it stays in the spec,
refuted, with that message as the truth.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import torch
from beartype import beartype
from einops import einsum, rearrange, reduce
from hypothesis import strategies as st
from jaxtyping import Float, jaxtyped

from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.harness.strategies import strategy

Sizes = dict[str, int]
Pair = tuple[Float[torch.Tensor, "..."], Float[torch.Tensor, "..."]]  # (einops result, torch result)


def _random(generator: torch.Generator, *shape: int) -> Float[torch.Tensor, "..."]:
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


# ── the forms: (new way, old way) on the same inputs ────────────────────────────────────────


def _attention_scores(s: Sizes, g: torch.Generator) -> Pair:
    x, y = _random(g, s["batch"], s["seq"], s["hidden"]), _random(g, s["batch"], s["seq2"], s["hidden"])
    return einsum(x, y, "batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2"), x @ y.transpose(-2, -1)


def _attention_scores_seed_ellipsis(s: Sizes, g: torch.Generator) -> Pair:
    x, y = _random(g, s["batch"], s["seq"], s["hidden"]), _random(g, s["batch"], s["seq2"], s["hidden"])
    return einsum(x, y, "..., seq1 hidden, ... hidden -> ... seq1 seq2"), x @ y.transpose(-2, -1)


def _attention_scores_ellipsis(s: Sizes, g: torch.Generator) -> Pair:
    x, y = _random(g, s["batch"], s["seq"], s["hidden"]), _random(g, s["batch"], s["seq2"], s["hidden"])
    return einsum(x, y, "... seq1 hidden, ... seq2 hidden -> ... seq1 seq2"), x @ y.transpose(-2, -1)


def _seed004_outer(s: Sizes, g: torch.Generator) -> Pair:
    x, w = _random(g, s["batch"], s["seq"], s["hidden"]), _random(g, s["batch"], s["seq"], s["hidden"])
    return einsum(x, w, "b s h1, b s h2 -> b s h1 h2"), x @ w.transpose(-2, -1)


def _reduce_sum_for_mean(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "... hidden -> ...", "sum"), x.mean(dim=-1)


def _reduce_sum(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "... hidden -> ...", "sum"), x.sum(dim=-1)


def _reduce_mean(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "batch seq hidden -> batch seq", "mean"), x.mean(dim=-1)


def _reduce_mean_ellipsis(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "... hidden -> ...", "mean"), x.mean(dim=-1)


def _reduce_max(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "... hidden -> ...", "max"), x.max(dim=-1).values


def _reduce_min(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["hidden"])
    return reduce(x, "... hidden -> ...", "min"), x.min(dim=-1).values


def _split_heads(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["heads"] * s["hidden"])
    return rearrange(x, "batch seq (heads hidden) -> batch seq heads hidden", heads=s["heads"]), x.view(s["batch"], s["seq"], s["heads"], s["hidden"])


def _split_heads_seed_comma(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["heads"] * s["hidden"])
    return rearrange(x, "..., (heads hidden1) -> ... heads hidden1", heads=s["heads"]), x.unflatten(-1, (s["heads"], s["hidden"]))


def _split_heads_ellipsis(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["heads"] * s["hidden"])
    return rearrange(x, "... (heads hidden1) -> ... heads hidden1", heads=s["heads"]), x.unflatten(-1, (s["heads"], s["hidden"]))


def _per_head_transform_seed_comma(s: Sizes, g: torch.Generator) -> Pair:
    x, w = _random(g, s["batch"], s["seq"], s["heads"], s["hidden"]), _random(g, s["hidden"], s["hidden"])
    return einsum(x, w, "..., hidden1, hidden1 hidden2 -> ... hidden2"), x @ w


def _per_head_transform(s: Sizes, g: torch.Generator) -> Pair:
    x, w = _random(g, s["batch"], s["seq"], s["heads"], s["hidden"]), _random(g, s["hidden"], s["hidden"])
    return einsum(x, w, "... hidden1, hidden1 hidden2 -> ... hidden2"), x @ w


def _merge_heads_seed_comma(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["heads"], s["hidden"])
    return rearrange(x, "..., heads hidden2 -> (heads hidden2)"), x.flatten(-2)


def _merge_heads(s: Sizes, g: torch.Generator) -> Pair:
    x = _random(g, s["batch"], s["seq"], s["heads"], s["hidden"])
    return rearrange(x, "... heads hidden2 -> ... (heads hidden2)"), x.flatten(-2)


def _per_head_pipeline(s: Sizes, g: torch.Generator) -> Pair:
    """Split heads, transform each head by w, merge back = multiply by a block-diagonal (w, w, …)."""
    x, w = _random(g, s["batch"], s["seq"], s["heads"] * s["hidden"]), _random(g, s["hidden"], s["hidden"])
    split = rearrange(x, "... (heads hidden1) -> ... heads hidden1", heads=s["heads"])
    transformed = einsum(split, w, "... hidden1, hidden1 hidden2 -> ... hidden2")
    merged = rearrange(transformed, "... heads hidden2 -> ... (heads hidden2)")
    return merged, x @ torch.block_diag(*[w] * s["heads"])


FORMS: dict[str, Callable[[Sizes, torch.Generator], Pair]] = {
    "einsum batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2 | x @ y.transpose(-2, -1)": _attention_scores,
    "einsum ..., seq1 hidden, ... hidden -> ... seq1 seq2 | x @ y.transpose(-2, -1)": _attention_scores_seed_ellipsis,
    "einsum ... seq1 hidden, ... seq2 hidden -> ... seq1 seq2 | x @ y.transpose(-2, -1)": _attention_scores_ellipsis,
    "einsum b s h1, b s h2 -> b s h1 h2 | x @ w.transpose(-2, -1)": _seed004_outer,
    "reduce ... hidden -> ... sum | x.mean(dim=-1)": _reduce_sum_for_mean,
    "reduce ... hidden -> ... sum | x.sum(dim=-1)": _reduce_sum,
    "reduce batch seq hidden -> batch seq mean | x.mean(dim=-1)": _reduce_mean,
    "reduce ... hidden -> ... mean | x.mean(dim=-1)": _reduce_mean_ellipsis,
    "reduce ... hidden -> ... max | x.max(dim=-1).values": _reduce_max,
    "reduce ... hidden -> ... min | x.min(dim=-1).values": _reduce_min,
    "rearrange batch seq (heads hidden) -> batch seq heads hidden | x.view(batch, seq, heads, hidden)": _split_heads,
    "rearrange ..., (heads hidden1) -> ... heads hidden1 | x.unflatten(-1, (heads, hidden1))": _split_heads_seed_comma,
    "rearrange ... (heads hidden1) -> ... heads hidden1 | x.unflatten(-1, (heads, hidden1))": _split_heads_ellipsis,
    "einsum ..., hidden1, hidden1 hidden2 -> ... hidden2 | x @ w": _per_head_transform_seed_comma,
    "einsum ... hidden1, hidden1 hidden2 -> ... hidden2 | x @ w": _per_head_transform,
    "rearrange ..., heads hidden2 -> (heads hidden2) | x.flatten(-2)": _merge_heads_seed_comma,
    "rearrange ... heads hidden2 -> ... (heads hidden2) | x.flatten(-2)": _merge_heads,
    "split heads, einsum by w, merge heads | x @ block_diag(w, …, w)": _per_head_pipeline,
}


_MATCHING_REDUCTIONS = [
    "reduce ... hidden -> ... sum | x.sum(dim=-1)",
    "reduce ... hidden -> ... mean | x.mean(dim=-1)",
    "reduce ... hidden -> ... max | x.max(dim=-1).values",
    "reduce ... hidden -> ... min | x.min(dim=-1).values",
]


@strategy("reduction_form")
def _reduction_forms() -> st.SearchStrategy:
    """einops reductions (sum, mean, max, min) with the torch reduction of the same name."""
    return st.sampled_from(_MATCHING_REDUCTIONS)


def _error_text(error: Exception) -> str:
    """'EinopsError: first meaningful line … last line' — einops puts the reason on later lines."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} {lines[-1]}"
    return f"{type(error).__name__}: {text}"


@check("einops.same_as_torch", evidence="measured", quantities=("new_shape", "old_shape"))
def same_as_torch(form: str, seed: int = 0, batch: int = 2, seq: int = 3, seq2: int = 3, hidden: int = 4, heads: int = 2) -> Outcome:
    """Whether the einops call of ``form`` equals its traditional torch code on the same random
    float64 tensors (same shape and ``torch.allclose``). If einops or torch refuses the call, the
    measurement is the error, ``'EinopsError: …'``. Shapes of both results are quantities."""
    if form not in FORMS:
        raise ResacctError(f"form {form!r} is not one of the {len(FORMS)} known forms: {', '.join(sorted(FORMS))}")
    sizes = {"batch": batch, "seq": seq, "seq2": seq2, "hidden": hidden, "heads": heads}
    try:
        new, old = FORMS[form](sizes, torch.Generator().manual_seed(seed))
    except Exception as error:  # einops' EinopsError, or torch's RuntimeError passed through einsum
        return Outcome(measured=_error_text(error), quantities={"new_shape": [], "old_shape": []})
    same = new.shape == old.shape and torch.allclose(new, old)
    return Outcome(measured=bool(same), quantities={"new_shape": list(new.shape), "old_shape": list(old.shape)})


_REARRANGE_PATTERNS = {
    "batch seq (heads hidden) -> batch seq heads hidden": lambda x, heads: rearrange(x, "batch seq (heads hidden) -> batch seq heads hidden", heads=heads),
    "batch seq (heads hidden) -> batch heads seq hidden": lambda x, heads: rearrange(x, "batch seq (heads hidden) -> batch heads seq hidden", heads=heads),
}


@check("einops.rearrange_is_view", evidence="measured")
def rearrange_is_view(pattern: str, batch: int, seq: int, heads: int, hidden: int) -> Outcome:
    """Whether ``rearrange(x, pattern)`` of a contiguous x returns a view: same untyped storage."""
    x = torch.zeros(batch, seq, heads * hidden)
    result = _REARRANGE_PATTERNS[pattern](x, heads)
    return Outcome(measured=result.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())


# ── jaxtyping: annotations are documentation unless something checks them ──────────────────
# jaxtyping's import hook (on in the tests: --jaxtyping-packages=resacct,…) decorates every
# function in this package, except those marked typing.no_type_check. So each function below is
# in the same state with and without the hook.


@typing.no_type_check
def _annotated_only(x: Float[torch.Tensor, "batch seq"]) -> list:
    """Annotated, never checked: no decorator, and no_type_check keeps the import hook away."""
    return list(x.shape)


@jaxtyped(typechecker=beartype)
def _annotated_and_checked(x: Float[torch.Tensor, "batch seq"]) -> list:
    """Annotated and checked at every call by jaxtyping + beartype."""
    return list(x.shape)


@jaxtyped(typechecker=beartype)
def _annotates_a_local_variable() -> list:
    """A checked function whose local variable carries the seed's annotation (4 named dims, 3-D value)."""
    x: Float[torch.Tensor, "batch seq heads hidden"] = torch.ones(2, 1, 3)
    return list(x.shape)


@check("einops.jaxtyping_annotation", evidence="measured")
def jaxtyping_annotation(function: str) -> Outcome:
    """Whether a function annotated ``Float[torch.Tensor, "batch seq"]`` accepts a wrong-shaped
    (2×1×3) tensor: ``annotated_only`` (no checking), ``jaxtyped_beartype`` (decorated with
    ``jaxtyped(typechecker=beartype)``; its error propagates), or ``local_variable_in_checked_function``
    (a wrong-shaped local variable annotation inside a decorated function). Measured: True when the
    call returned. A right-shaped call must pass first, or the check itself is broken."""
    wrong, right = torch.ones(2, 1, 3), torch.ones(2, 3)
    if function == "local_variable_in_checked_function":
        _annotates_a_local_variable()
        return Outcome(measured=True)
    functions: dict[str, Callable[[Any], list]] = {"annotated_only": _annotated_only, "jaxtyped_beartype": _annotated_and_checked}
    if function not in functions:
        raise ResacctError(f"function {function!r}: expected annotated_only, jaxtyped_beartype or local_variable_in_checked_function")
    try:
        shape_of_right = functions[function](right)
    except Exception as error:
        raise ResacctError(f"{function} refused a right-shaped 2×3 tensor ({error!r}); its refusals would mean nothing") from error
    if shape_of_right != [2, 3]:
        raise ResacctError(f"{function} returned {shape_of_right} for a 2×3 tensor; expected [2, 3]")
    functions[function](wrong)
    return Outcome(measured=True)
