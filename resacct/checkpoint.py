"""Checkpoints that resume exactly, written so that a crash never destroys the last good one.

A checkpoint is one ``torch.save`` file holding a plain dict::

    format          "resacct-checkpoint"
    format_version  1
    step            optimizer steps taken
    model           model.state_dict()
    optimizer       optimizer.state_dict() (or None)
    rng             python random, numpy, torch CPU and (if present) CUDA generator states
    data            the batch source's state_dict() — its data position (or None)
    grad_scaler     torch.amp.GradScaler.state_dict() (or None)
    extra           anything else the caller wants kept (plain values)

Everything in it is a tensor or a plain Python value, so it loads with
``torch.load(..., weights_only=True)`` — numpy's RNG state is stored as an int64 tensor, not
as the ndarray that ``np.random.get_state()`` returns (that would need allowlisting).

It is written atomically: to a temporary file in the same directory, flushed and fsynced,
``os.replace``-d over the old file, then the directory is fsynced. A crash at any moment
leaves either the old checkpoint or the new one, never a torn file.

>>> import tempfile, os
>>> model = torch.nn.Linear(2, 1); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
>>> path = save_checkpoint(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model, optimizer=optimizer, step=7)
>>> load_checkpoint(path, model=model, optimizer=optimizer)
7
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import uuid
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from resacct.errors import ResacctError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "REQUIRED_KEYS",
    "RESUME_STATE_PARTS",
    "missing_resume_state",
    "SupportsStateDict",
    "write_atomically",
    "capture_rng_states",
    "restore_rng_states",
    "save_checkpoint",
    "read_checkpoint",
    "load_checkpoint",
]

CHECKPOINT_FORMAT = "resacct-checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "format_version", "step", "model", "optimizer", "rng", "data")


RESUME_STATE_PARTS = ("model", "optimizer", "step", "python_rng", "numpy_rng", "torch_rng", "cuda_rng", "data")
"""The state an exact resume may depend on; a resacct checkpoint saves all of it."""


def missing_resume_state(saved: Iterable[str], needed: Iterable[str]) -> list[str]:
    """The parts a run ``needed`` (what its randomness and updates depend on) that the
    checkpoint did not save; an exact resume needs this list empty.

    >>> missing_resume_state({"model", "optimizer", "step", "torch_rng"}, {"model", "optimizer", "numpy_rng"})
    ['numpy_rng']
    """
    saved, needed = set(saved), set(needed)
    unknown = sorted((saved | needed) - set(RESUME_STATE_PARTS))
    if unknown:
        raise ResacctError(f"unknown resume state {unknown}: expected parts of {list(RESUME_STATE_PARTS)}")
    return [part for part in RESUME_STATE_PARTS if part in needed and part not in saved]


@runtime_checkable
class SupportsStateDict(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``: a batch source, a scaler…"""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, make it durable, then move it
    over ``path`` in one ``os.replace``. If anything fails, ``path`` is untouched and the
    temporary file is removed.

    >>> import tempfile, os
    >>> target = os.path.join(tempfile.mkdtemp(), "note.bin")
    >>> write_atomically(target, lambda file: file.write(b"hello")).read_bytes()
    b'hello'
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ResacctError(f"{path}: the directory {directory} does not exist")
    temporary = directory / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    _fsync_directory(directory)
    return path


def _numpy_rng_state() -> dict[str, Any]:
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),  # uint32[624] as int64: weights_only-safe
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _restore_numpy_rng_state(state: dict[str, Any]) -> None:
    keys = np.asarray(state["keys"].numpy(), dtype=np.uint32)
    np.random.set_state((state["bit_generator"], keys, state["position"], state["has_gauss"], state["cached_gaussian"]))


def capture_rng_states() -> dict[str, Any]:
    """Every global random number generator's state, as tensors and plain values.

    >>> states = capture_rng_states(); a = random.random(); restore_rng_states(states)
    >>> random.random() == a
    True
    """
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_rng_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng_states` captured (CUDA only if both sides have it)."""
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    _restore_numpy_rng_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _state_or_none(stateful: SupportsStateDict | None) -> dict[str, Any] | None:
    return None if stateful is None else stateful.state_dict()


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    data: SupportsStateDict | None = None,
    grad_scaler: SupportsStateDict | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Atomically write everything needed to resume after ``step`` optimizer steps: model,
    optimizer, every RNG state, the data position (``data.state_dict()``) and the loss scaler."""
    if step < 0:
        raise ResacctError(f"step {step}: expected the number of optimizer steps taken (≥ 0)")
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "step": int(step),
        "model": model.state_dict(),
        "optimizer": _state_or_none(optimizer),
        "rng": capture_rng_states(),
        "data": _state_or_none(data),
        "grad_scaler": _state_or_none(grad_scaler),
        "extra": dict(extra or {}),
    }
    return write_atomically(path, lambda file: torch.save(checkpoint, file))


def _load_weights_only(path: Path) -> Any:
    if not zipfile.is_zipfile(path):  # reads only the end of the file, where the zip directory is
        size = path.stat().st_size
        kind = "an empty file" if size == 0 else f"{size} bytes that are not a torch.save archive"
        raise ResacctError(f"{path}: not a checkpoint: {kind} (truncated, or a different kind of file)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ResacctError(
            f"{path}: holds objects other than tensors and plain values, refused by torch.load(weights_only=True): {first_line}"
        ) from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise ResacctError(f"{path}: a damaged torch.save archive (truncated?): {error}") from None


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The validated contents of the checkpoint at ``path`` (loaded with ``weights_only=True``).

    Refuses, naming the file: a missing file, a truncated or foreign file, objects that are not
    tensors or plain values, a dict that is not a resacct checkpoint, missing keys, and a
    newer format version.
    """
    path = Path(path)
    if not path.is_file():
        raise ResacctError(f"{path}: no checkpoint there")
    content = _load_weights_only(path)
    if not isinstance(content, dict):
        raise ResacctError(f"{path}: not a resacct checkpoint: it holds a {type(content).__name__}, expected a dict")
    if content.get("format") != CHECKPOINT_FORMAT:
        keys = sorted(map(str, content))[:8]
        raise ResacctError(f"{path}: not a resacct checkpoint: 'format' is {content.get('format')!r}, expected {CHECKPOINT_FORMAT!r} (keys: {keys})")
    version = content.get("format_version")
    if not isinstance(version, int) or version > CHECKPOINT_FORMAT_VERSION:
        raise ResacctError(
            f"{path}: checkpoint format version {version!r} is newer than this resacct reads (≤ {CHECKPOINT_FORMAT_VERSION}); upgrade resacct"
        )
    missing = [key for key in REQUIRED_KEYS if key not in content]
    if missing:
        raise ResacctError(f"{path}: checkpoint is missing {', '.join(repr(key) for key in missing)}")
    return content


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    data: SupportsStateDict | None = None,
    grad_scaler: SupportsStateDict | None = None,
    restore_rng: bool = True,
) -> int:
    """Restore ``model`` (and ``optimizer``, ``data``, ``grad_scaler`` when given, and every
    global RNG when ``restore_rng``) from ``path``; returns the step to continue from."""
    content = read_checkpoint(path)
    _restore_part(path, "model", model, content["model"])
    if optimizer is not None:
        _restore_part(path, "optimizer", optimizer, content["optimizer"])
    if data is not None:
        _restore_part(path, "data", data, content["data"])
    if grad_scaler is not None:
        _restore_part(path, "grad_scaler", grad_scaler, content.get("grad_scaler"))
    if restore_rng:
        restore_rng_states(content["rng"])
    return int(content["step"])


def _restore_part(path: str | os.PathLike, key: str, target: Any, state: Any) -> None:
    if state is None:
        raise ResacctError(f"{path}: the checkpoint holds no {key} state, but a {type(target).__name__} was given to restore")
    try:
        target.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        raise ResacctError(f"{path}: the {key} state does not fit this {type(target).__name__}: {error}") from None
