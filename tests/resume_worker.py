"""A small training run that checkpoints every few steps; ``tests/test_checkpoint.py`` kills it
with SIGKILL and resumes it, and checks the result is bit-identical to an uninterrupted run.

Every source of randomness a real run has is used, so that a resume is exact only when all of
them are restored: batch windows come from a ``TokenBatchSampler`` (its own generator: the
data position), and the inputs get noise from torch's global generator, numpy and Python's
``random``. The learning rate follows a warm-up + cosine schedule (so the step matters) and
AdamW keeps moments (so the optimizer state matters).

    python tests/resume_worker.py --checkpoint ckpt.pt --output final.pt --steps 12 --checkpoint-every 3 \
        [--resume] [--step-delay 0.05] [--start-when-exists go.flag]

Prints ``step N`` after each step and ``done`` at the end (flushed), then writes the final
``model.state_dict()`` to ``--output``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from resacct.training.data import TokenBatchSampler
from resacct.training.models import Cruncher
from resacct.training.train import StepRecord, cosine_schedule, train

DIM = 8
VOCAB = 97


class NoisyTokenFeatures:
    """Token windows as float features: x = window / vocab (+ noise from torch, numpy and
    Python random), y = the next token after the window / vocab. Its state is the sampler's."""

    def __init__(self, seed: int, step_delay_seconds: float = 0.0):
        tokens = (np.arange(500, dtype=np.int64) * 31 % VOCAB).astype(np.uint16)
        self.windows = TokenBatchSampler(tokens, batch_size=4, context_length=DIM, seed=seed)
        self.step_delay_seconds = step_delay_seconds

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.step_delay_seconds:
            time.sleep(self.step_delay_seconds)
        x_tokens, y_tokens = self.windows()
        x = x_tokens.float() / VOCAB + 0.01 * torch.randn(x_tokens.shape)
        x = x + 0.01 * torch.from_numpy(np.random.standard_normal(x_tokens.shape).astype(np.float32))
        x = x * (1.0 + 0.01 * random.random())
        return x, y_tokens[:, -1:].float() / VOCAB

    def state_dict(self) -> dict[str, Any]:
        return self.windows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.windows.load_state_dict(state)


class SimulatedCrash(Exception):
    """Raised by :func:`run` after ``crash_after_step`` steps (an in-process stand-in for a kill)."""


def run(
    checkpoint: Path,
    steps: int,
    checkpoint_every: int,
    *,
    resume: bool = False,
    step_delay_seconds: float = 0.0,
    announce: bool = False,
    crash_after_step: int | None = None,
) -> dict[str, torch.Tensor]:
    """Seed everything, build the run, train (resuming from ``checkpoint`` if asked and it
    exists); returns the final parameters. ``crash_after_step`` raises :class:`SimulatedCrash`
    once that step is logged (before its checkpoint, if one was due)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = Cruncher(dim=DIM, num_layers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    batches = NoisyTokenFeatures(seed=1234, step_delay_seconds=step_delay_seconds)

    def announce_step(record: object) -> None:
        if not isinstance(record, StepRecord):
            return
        if announce:
            print(f"step {record.step}", flush=True)
        if record.step == crash_after_step:
            raise SimulatedCrash(f"crashed after step {record.step}")

    train(
        model,
        optimizer,
        batches,
        F.mse_loss,
        steps=steps,
        grad_clip_norm=1.0,
        lr_schedule=cosine_schedule(1e-2, 1e-3, warmup_steps=2, total_steps=steps),
        checkpoint_every=checkpoint_every,
        checkpoint_path=checkpoint,
        resume_from=checkpoint if resume and checkpoint.exists() else None,
        on_log=announce_step,
    )
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per batch, so a kill lands mid-run")
    parser.add_argument("--start-when-exists", type=Path, default=None, help="import everything, then wait for this file before training")
    arguments = parser.parse_args(argv)
    torch.set_num_threads(1)
    if arguments.start_when_exists is not None:
        deadline = time.monotonic() + 300
        while not arguments.start_when_exists.exists():
            if time.monotonic() > deadline:
                print(f"gave up waiting for {arguments.start_when_exists}", file=sys.stderr)
                return 1
            time.sleep(0.01)
    final = run(
        arguments.checkpoint,
        arguments.steps,
        arguments.checkpoint_every,
        resume=arguments.resume,
        step_delay_seconds=arguments.step_delay,
        announce=True,
    )
    torch.save(final, arguments.output)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
