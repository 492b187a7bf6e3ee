"""Measuring checkpoints with torch: does a resumed run end bit-identical to an uninterrupted
one, what does ``torch.load`` accept by default, and does a crash while saving lose the last
checkpoint?"""

from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from resacct.training.checkpoint import (
    RESUME_STATE_PARTS,
    load_checkpoint,
    missing_resume_state,
    read_checkpoint,
    save_checkpoint,
)
from resacct.harness.registry import Outcome, check
from resacct.training.models import Cruncher
from resacct.training.seeding import preserved_global_rng
from resacct.training.seeding import seed_torch

__all__: list[str] = []

DATASET_ROWS = 64
DIM = 8
BATCH_SIZE = 4

# What each way of checkpointing saves, in the terms of RESUME_STATE_PARTS.
SAVED_PARTS: dict[str, set[str]] = {
    "lecture-001-dict": {"model", "optimizer", "step", "torch_rng"},  # model, optimizer, step, rng_state
    "lecture-003-dict": {"model", "optimizer"},
    "resacct": set(RESUME_STATE_PARTS),
    "resacct-without-optimizer": set(RESUME_STATE_PARTS) - {"optimizer"},
}
# Which random number generator each sampler draws batch indices from.
SAMPLER_NEEDS = {"global-torch": "torch_rng", "own-generator": "data", "numpy": "numpy_rng", "python": "python_rng"}


class _IndexSampler:
    """Batches of a fixed regression dataset; the row indices come from the ``kind`` generator:
    ``global-torch`` (the lecture's ``torch.randint``), ``own-generator`` (a seeded
    ``torch.Generator``, as resacct's sampler), ``numpy`` or ``python``."""

    def __init__(self, kind: str):
        if kind not in SAMPLER_NEEDS:
            raise ValueError(f"sampler {kind!r}: expected one of {sorted(SAMPLER_NEEDS)}")
        data = torch.Generator().manual_seed(99)
        self.inputs = torch.randn(DATASET_ROWS, DIM, generator=data)
        self.targets = torch.randn(DATASET_ROWS, 1, generator=data)
        self.kind = kind
        self.generator = torch.Generator().manual_seed(1234)

    def indices(self) -> torch.Tensor:
        if self.kind == "global-torch":
            return torch.randint(DATASET_ROWS, (BATCH_SIZE,))
        if self.kind == "own-generator":
            return torch.randint(DATASET_ROWS, (BATCH_SIZE,), generator=self.generator)
        if self.kind == "numpy":
            return torch.from_numpy(np.random.randint(DATASET_ROWS, size=BATCH_SIZE))
        return torch.tensor([random.randrange(DATASET_ROWS) for _ in range(BATCH_SIZE)])

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.indices()
        return self.inputs[rows], self.targets[rows]

    def state_dict(self) -> dict[str, Any]:
        return {"generator_state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator_state"])


def _start_process(sampler_kind: str) -> tuple[Cruncher, torch.optim.Optimizer, _IndexSampler]:
    """What a training script does when it starts: seed everything, build model and optimizer."""
    random.seed(0)
    np.random.seed(0)
    seed_torch(0)
    model = Cruncher(dim=DIM, num_layers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, _IndexSampler(sampler_kind)


def _train_steps(model: Cruncher, optimizer: torch.optim.Optimizer, sampler: _IndexSampler, steps: int) -> None:
    for _ in range(steps):
        x, y = sampler()
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        optimizer.step()


def _save(saved_as: str, path: Path, model: Cruncher, optimizer: torch.optim.Optimizer, sampler: _IndexSampler, step: int) -> None:
    if saved_as == "lecture-001-dict":
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "rng_state": torch.get_rng_state()}, path)
    elif saved_as == "lecture-003-dict":
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    elif saved_as in ("resacct", "resacct-without-optimizer"):
        save_checkpoint(path, model=model, optimizer=optimizer, step=step, data=sampler)
    else:
        raise ValueError(f"saved_as {saved_as!r}: expected one of {sorted(SAVED_PARTS)}")


def _load(saved_as: str, path: Path, model: Cruncher, optimizer: torch.optim.Optimizer, sampler: _IndexSampler) -> None:
    if saved_as.startswith("lecture-"):
        checkpoint = torch.load(path)  # the lecture's call, defaults and all
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if "rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["rng_state"])
    else:
        load_checkpoint(path, model=model, optimizer=optimizer if saved_as == "resacct" else None, data=sampler)


@check("checkpoint.resume_is_exact", evidence="measured")
def resume_is_exact(saved_as: str, sampler: str, steps_before: int = 3, steps_after: int = 3) -> Outcome:
    """Train a Cruncher with AdamW, batches drawn by ``sampler``; save after ``steps_before``
    steps as ``saved_as``; start a fresh "process" (seed everything as at start, rebuild model
    and optimizer), load and train ``steps_after`` more. Measures whether every parameter is
    bit-identical (``torch.equal``) to an uninterrupted run. resacct predicts it from what the
    checkpoint saves and which generator the sampler uses."""
    with preserved_global_rng(), tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.pt"
        model, optimizer, batches = _start_process(sampler)
        _train_steps(model, optimizer, batches, steps_before + steps_after)
        uninterrupted = [parameter.detach().clone() for parameter in model.parameters()]

        model, optimizer, batches = _start_process(sampler)
        _train_steps(model, optimizer, batches, steps_before)
        _save(saved_as, path, model, optimizer, batches, steps_before)
        model, optimizer, batches = _start_process(sampler)  # the crash: everything in memory is gone
        _load(saved_as, path, model, optimizer, batches)
        _train_steps(model, optimizer, batches, steps_after)
        identical = all(torch.equal(a, b) for a, b in zip(uninterrupted, model.parameters()))
    predicted = not missing_resume_state(SAVED_PARTS[saved_as], {"model", "optimizer", SAMPLER_NEEDS[sampler]})
    return Outcome(measured=identical, predicted=predicted)


def _trained_model_and_optimizer() -> tuple[Cruncher, torch.optim.Optimizer]:
    with preserved_global_rng():
        model, optimizer, batches = _start_process("own-generator")
        _train_steps(model, optimizer, batches, 1)
    return model, optimizer


@check("checkpoint.torch_load_with_defaults", evidence="measured")
def torch_load_with_defaults(content: str) -> Outcome:
    """``torch.save`` a checkpoint holding ``content`` (``lecture-003-dict``: model and optimizer
    state; ``with-numpy-rng-state``: plus ``np.random.get_state()`` and ``random.getstate()``;
    ``resacct``: resacct's format with every RNG state), then ``torch.load(path)`` with its
    defaults. Measures ``loaded`` or the name of the error torch raises."""
    model, optimizer = _trained_model_and_optimizer()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.pt"
        if content == "lecture-003-dict":
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        elif content == "with-numpy-rng-state":
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "rng_state": torch.get_rng_state(),
                    "numpy_rng_state": np.random.get_state(),
                    "python_rng_state": random.getstate(),
                },
                path,
            )
        elif content == "resacct":
            save_checkpoint(path, model=model, optimizer=optimizer, step=1)
        else:
            raise ValueError(f"content {content!r}: expected lecture-003-dict, with-numpy-rng-state or resacct")
        try:
            torch.load(path)
        except Exception as error:  # the error is the measurement
            return Outcome(measured=type(error).__name__)
    return Outcome(measured="loaded")


class _SimulatedCrash(Exception):
    """Raised from inside ``torch.save`` while it writes, standing in for a crash."""


class _CrashWhilePickled:
    def __reduce__(self) -> Any:
        raise _SimulatedCrash("the job died while the checkpoint was being written")


class _CrashingTensor(torch.Tensor):
    """A tensor whose pickling raises: ``save_checkpoint`` refuses a plain object such as
    :class:`_CrashWhilePickled` before it writes anything (issue 26), so the crash mid-write comes
    from a value it accepts."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise _SimulatedCrash("the job died while the checkpoint was being written")


@check("checkpoint.previous_survives_crash_while_saving", evidence="measured")
def previous_survives_crash_while_saving(writer: str) -> Outcome:
    """Save a checkpoint at step 1; then save step 2 to the same path and make ``torch.save``
    fail half-way (an object whose pickling raises). ``writer``: ``torch.save`` (the lecture's
    ``torch.save(checkpoint, path)``) or ``resacct`` (``save_checkpoint``, atomic). Measures
    whether the file at the path still loads as the step-1 checkpoint."""
    model, optimizer = _trained_model_and_optimizer()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.pt"
        if writer == "torch.save":
            torch.save({"model": model.state_dict(), "step": 1}, path)
            with contextlib.suppress(_SimulatedCrash):
                torch.save({"model": model.state_dict(), "crash": _CrashWhilePickled(), "step": 2}, path)
            try:
                survived = torch.load(path)["step"] == 1
            except Exception:
                survived = False
        elif writer == "resacct":
            save_checkpoint(path, model=model, optimizer=optimizer, step=1)
            with contextlib.suppress(_SimulatedCrash):
                save_checkpoint(path, model=model, optimizer=optimizer, step=2, extra={"crash": torch.zeros(1).as_subclass(_CrashingTensor)})
            survived = read_checkpoint(path)["step"] == 1
            survived = survived and [entry.name for entry in Path(directory).iterdir()] == ["checkpoint.pt"]
        else:
            raise ValueError(f"writer {writer!r}: expected torch.save or resacct")
    return Outcome(measured=survived)
