"""Randomness under control: seed every global generator at once, derive a separate seed for
each use of randomness, and leave the process's generators as they were.

Randomness enters training in parameter initialisation, dropout and data order, drawn from
three global generators — Python's ``random``, numpy's legacy ``np.random`` and torch's
(CPU and each CUDA device). :func:`seed_everything` seeds them all.

>>> seed_everything(0)
>>> first = (random.random(), float(np.random.rand()), torch.rand(1).item())
>>> seed_everything(0)
>>> first == (random.random(), float(np.random.rand()), torch.rand(1).item())
True
>>> derive_seed(0, "init") != derive_seed(0, "data")
True
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator

import numpy as np
import torch

from resacct.errors import ResacctError

__all__ = [
    "MAX_SEED",
    "seed_everything",
    "seed_torch",
    "derive_seed",
    "seeded_generator",
    "preserved_global_rng",
]

MAX_SEED = 2**32 - 1  # numpy's legacy seed is 32-bit; python and torch accept these too


def _checked_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ResacctError(f"seed {seed!r}: expected a whole number in [0, 2**32 - 1]")
    return seed


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator, torch's CPU generator and every
    CUDA device's generator (when CUDA is available) with ``seed``.

    ``np.random.default_rng()`` generators are not global and take their own seed.
    """
    _checked_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    seed_torch(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, without its cost where no accelerator is there to seed.

    On a machine with no CUDA, XPU, MTIA, MPS or custom device, ``torch.manual_seed`` still queues a
    seeding of each for a later initialisation that cannot come, formatting the caller's whole stack
    three times to keep with the queue (``torch.cuda._lazy_call``): ~1 ms a call 80 frames deep
    (``python benchmarks/seed_cost.py``), and the claims seed often. There only the CPU generator is seeded (the same draws
    follow: tests/test_seeding.py); with any accelerator present this is ``torch.manual_seed``.
    """
    if _accelerator_present():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(int(seed))


def _accelerator_present() -> bool:
    """Whether any device ``torch.manual_seed`` seeds besides the CPU could be seeded in this process."""
    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        return True
    backends = (torch.cuda, getattr(torch, "xpu", None), getattr(torch, "mtia", None), getattr(torch.backends, "mps", None))
    return any(backend is not None and backend.is_available() for backend in backends)


def derive_seed(seed: int, purpose: str) -> int:
    """A seed for one use of randomness (``"init"``, ``"dropout"``, ``"data"`` …), derived from
    ``seed`` and ``purpose`` by SHA-256 — stable across processes (unlike ``hash()``).

    >>> derive_seed(1234, "init") == derive_seed(1234, "init")
    True
    """
    _checked_seed(seed)
    if not isinstance(purpose, str) or not purpose:
        raise ResacctError(f"purpose {purpose!r}: expected a non-empty name such as 'init' or 'data'")
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def seeded_generator(seed: int, purpose: str | None = None, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` of its own for one use of randomness, seeded with ``seed`` (or with
    ``derive_seed(seed, purpose)``): draws from it do not move the global generator.

    >>> a, b = seeded_generator(7, "init"), seeded_generator(7, "init")
    >>> torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))
    True
    """
    chosen = derive_seed(seed, purpose) if purpose is not None else _checked_seed(seed)
    return torch.Generator(device=device).manual_seed(chosen)


@contextlib.contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Run the block, then put Python's, numpy's and torch's (CPU and CUDA) global generators
    back in the state they had before it.

    >>> before = torch.get_rng_state()
    >>> with preserved_global_rng():
    ...     seed_everything(3); _ = torch.rand(5)
    >>> torch.equal(before, torch.get_rng_state())
    True
    """
    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
