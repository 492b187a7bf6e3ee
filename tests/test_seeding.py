"""Unit tests of resacct.training.seeding."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from resacct.errors import ResacctError
from resacct.training.seeding import MAX_SEED, derive_seed, preserved_global_rng, seed_everything, seed_torch, seeded_generator


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_same_seed_same_draws_different_seed_different_draws():
    with preserved_global_rng():
        seed_everything(123)
        first = _draws()
        seed_everything(123)
        assert _draws() == first
        seed_everything(124)
        assert all(a != b for a, b in zip(_draws(), first))


@pytest.mark.parametrize("seed", [0, MAX_SEED])
def test_seed_range_edges_are_accepted(seed):
    with preserved_global_rng():
        seed_everything(seed)
        first = (random.random(), float(np.random.rand()), torch.rand(3))
        seed_everything(seed)
        again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 2**64])
def test_out_of_range_seeds_are_refused_with_the_value(seed):
    with pytest.raises(ResacctError, match=rf"seed {seed}: expected a whole number in \[0, 2\*\*32 - 1\]"):
        seed_everything(seed)


def test_non_integer_seeds_are_refused():
    import beartype.roar
    import jaxtyping

    with pytest.raises((ResacctError, jaxtyping.TypeCheckError, beartype.roar.BeartypeException)):
        seed_everything(1.5)  # type: ignore[arg-type]
    with pytest.raises((ResacctError, jaxtyping.TypeCheckError, beartype.roar.BeartypeException)):
        seed_everything(True)


def test_derive_seed_is_stable_distinct_and_in_range():
    assert derive_seed(0, "init") == derive_seed(0, "init")
    seeds = {derive_seed(s, purpose) for s in range(20) for purpose in ("init", "data", "dropout")}
    assert len(seeds) == 60
    assert all(0 <= s <= MAX_SEED for s in seeds)
    with pytest.raises(ResacctError, match="purpose ''"):
        derive_seed(0, "")


def test_seeded_generator_does_not_touch_the_global_generator():
    before = torch.get_rng_state()
    generator = seeded_generator(5, "init")
    torch.rand(10, generator=generator)
    assert torch.equal(before, torch.get_rng_state())
    assert torch.equal(torch.rand(3, generator=seeded_generator(5)), torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_preserved_global_rng_restores_after_an_exception():
    state = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with pytest.raises(RuntimeError), preserved_global_rng():
        seed_everything(9)
        _draws()
        raise RuntimeError("boom")
    assert random.getstate() == state[0]
    assert np.array_equal(np.random.get_state()[1], state[1])
    assert torch.equal(torch.get_rng_state(), state[2])


@pytest.mark.parametrize("seed", [0, 7, MAX_SEED, 2**63, -1])
def test_seed_torch_draws_what_torch_manual_seed_draws(seed):
    with preserved_global_rng():
        torch.manual_seed(seed)
        expected = torch.rand(5), torch.randint(0, 1000, (5,))
        torch.rand(3)  # move the generator on, so the next draws depend on seeding again
        seed_torch(seed)
        drawn = torch.rand(5), torch.randint(0, 1000, (5,))
    assert torch.equal(expected[0], drawn[0]) and torch.equal(expected[1], drawn[1])


def test_seed_torch_without_an_accelerator_leaves_torch_manual_seed_alone(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present here: seed_torch is torch.manual_seed")

    def refuse(seed):
        raise AssertionError("torch.manual_seed called where no accelerator is present")

    monkeypatch.setattr(torch, "manual_seed", refuse)
    with preserved_global_rng():
        seed_torch(11)
        first = torch.rand(4)
        seed_torch(11)
        assert torch.equal(first, torch.rand(4))


def test_seed_torch_with_an_accelerator_is_torch_manual_seed(monkeypatch):
    seeds = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "manual_seed", seeds.append)
    seed_torch(5)
    assert seeds == [5]
