"""How many processes ``resacct verify`` runs its claims in (``--workers N``): the default for this
machine and the argument's parser. Nothing here imports pytest or torch at import time, so the
command line parses ``--workers`` before either is loaded."""

from __future__ import annotations

import os
import sys

__all__ = ["default_workers", "workers_count"]


def default_workers() -> int:
    """``resacct verify``'s default: 2 processes where the machine has 2 cores or more and can fork
    (Linux) and torch sees no GPU, else 1 (every claim in this process). With a GPU, ``--workers N``
    forks all the same (the GPU claims run in this process), but a CPU claim that touches CUDA in a
    forked worker fails there: not a default until a GPU host has run it."""
    import torch

    if (os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux") or torch.cuda.is_available():
        return 1
    return 2


def workers_count(text: str) -> int:
    """``resacct verify --workers N`` (an argparse type): 1 (every claim in this process) up to the
    machine's CPU count."""
    import argparse

    cpus = os.cpu_count() or 1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: expected a whole number of processes, 1 to {cpus} (1: every claim in this process)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers must be 1 or more (1: every claim in this process), got {value}")
    if value > cpus:
        raise argparse.ArgumentTypeError(f"--workers {value}: this machine has {cpus} CPUs and the claims are CPU-bound; expected 1 to {cpus}")
    return value
