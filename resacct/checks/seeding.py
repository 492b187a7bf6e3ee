"""Measuring reproducibility: draw from the real generators (Python ``random``, numpy, torch
CPU and CUDA) and from real torch users of randomness (init, dropout, DataLoader order) after
seeding, and compare runs. Every check restores the process's global generators afterwards."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import strategies as st
from torch import nn

from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.harness.strategies import strategy
from resacct.training.seeding import MAX_SEED, derive_seed, preserved_global_rng, seed_everything


@strategy("seed_offset")
def _seed_offsets() -> st.SearchStrategy:
    return st.integers(1, MAX_SEED)


def _python_draws() -> list[float]:
    return [random.random() for _ in range(8)]


def _numpy_draws() -> list[float]:
    return np.random.rand(8).tolist()


def _torch_draws() -> list[float]:
    return torch.rand(8).tolist()


def _cuda_draws() -> list[float]:
    if not torch.cuda.is_available():
        raise NotMeasurable(f"needs a CUDA GPU; torch {torch.__version__} sees none")
    return torch.rand(8, device="cuda").tolist()


def _numpy_default_rng_draws() -> list[float]:
    return np.random.default_rng().random(8).tolist()


def _init_draws() -> list[float]:
    return nn.Linear(8, 4).weight.flatten().tolist()


def _dropout_draws() -> list[float]:
    return nn.functional.dropout(torch.ones(64), p=0.5, training=True).tolist()


def _data_order_draws() -> list[float]:
    loader = torch.utils.data.DataLoader(list(range(16)), batch_size=16, shuffle=True)
    return [float(index) for index in next(iter(loader)).tolist()]


_DRAWS: dict[str, Callable[[], list[float]]] = {
    "python": _python_draws,
    "numpy": _numpy_draws,
    "torch": _torch_draws,
    "cuda": _cuda_draws,
    "numpy_default_rng": _numpy_default_rng_draws,
    "init": _init_draws,
    "dropout": _dropout_draws,
    "data_order": _data_order_draws,
}


@check("seeding.same_seed_same_draws", evidence="measured")
def same_seed_same_draws(seed: int, draws: str) -> Outcome:
    """Whether two runs of ``seed_everything(seed)`` followed by the same draws (8 numbers from
    a generator, an nn.Linear init, a dropout mask or a shuffled DataLoader order) give
    identical values; something else is drawn between the runs."""
    draw = _DRAWS[draws]
    with preserved_global_rng():
        seed_everything(seed)
        first = draw()
        _DRAWS["python"](), _DRAWS["numpy"](), _DRAWS["torch"]()  # move every stream on
        seed_everything(seed)
        second = draw()
    return Outcome(measured=first == second)


@check("seeding.different_seeds_differ", evidence="measured")
def different_seeds_differ(seed: int, offset: int, draws: str) -> Outcome:
    """Whether ``seed_everything(seed)`` and ``seed_everything(seed + offset mod 2³²)`` lead to
    different draws."""
    draw = _DRAWS[draws]
    with preserved_global_rng():
        seed_everything(seed)
        first = draw()
        seed_everything((seed + offset) % (MAX_SEED + 1))
        second = draw()
    return Outcome(measured=first != second)


@check("seeding.torch_seed_alone", evidence="measured")
def torch_seed_alone(seed: int, draws: str) -> Outcome:
    """Whether ``torch.manual_seed(seed)`` alone, set twice, reproduces draws from ``draws``
    (python, numpy, torch)."""
    draw = _DRAWS[draws]
    with preserved_global_rng():
        torch.manual_seed(seed)
        first = draw()
        torch.manual_seed(seed)
        second = draw()
    return Outcome(measured=first == second)


@check("seeding.generator_isolated", evidence="measured")
def generator_isolated(seed: int) -> Outcome:
    """Whether draws from a ``torch.Generator`` seeded with ``seed`` are the same whether or not
    the global generator (and another generator) are used in between."""
    with preserved_global_rng():
        alone = torch.Generator().manual_seed(seed)
        reference = [torch.rand(4, generator=alone).tolist() for _ in range(3)]
        mixed = torch.Generator().manual_seed(seed)
        other = torch.Generator().manual_seed(derive_seed(seed, "other"))
        interleaved = []
        for _ in range(3):
            torch.rand(5), torch.rand(2, generator=other)
            interleaved.append(torch.rand(4, generator=mixed).tolist())
    return Outcome(measured=reference == interleaved)


@check("seeding.derived_seeds_differ", evidence="measured")
def derived_seeds_differ(seed: int, purpose: str, other_purpose: str) -> Outcome:
    """Whether torch generators seeded with ``derive_seed(seed, purpose)`` and
    ``derive_seed(seed, other_purpose)`` draw different numbers."""
    first = torch.rand(8, generator=torch.Generator().manual_seed(derive_seed(seed, purpose)))
    second = torch.rand(8, generator=torch.Generator().manual_seed(derive_seed(seed, other_purpose)))
    return Outcome(measured=not torch.equal(first, second))
