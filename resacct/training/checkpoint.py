"""Checkpoints that resume exactly, written so that a crash never destroys the last good one,
and read back only when they are intact and fit what they are loaded into.

A checkpoint is one ``torch.save`` file holding a plain dict::

    format          "resacct-checkpoint"
    format_version  2
    step            optimizer steps taken
    model           model.state_dict()
    optimizer       optimizer.state_dict() (or None)
    optimizer_class the optimizer's class name, e.g. "AdamW" (or None)
    rng             python random, numpy, torch CPU and (if present) CUDA generator states
    data            the batch source's state_dict() — its data position (or None)
    grad_scaler     torch.amp.GradScaler.state_dict() (or None)
    extra           anything else the caller wants kept (plain values)

Everything in it is a tensor or a plain Python value, so it loads with
``torch.load(..., weights_only=True)`` — numpy's RNG state is stored as an int64 tensor, not
as the ndarray that ``np.random.get_state()`` returns (that would need allowlisting).

The archive's zip comment holds its SHA-256 (:mod:`resacct.training.checkpoint_file`); a file whose
bytes do not match is refused before anything is unpickled. It is written atomically
(:mod:`resacct.training.atomic_files`): a crash at any moment leaves the old checkpoint or the new one.
Loading checks everything first (:mod:`resacct.training.checkpoint_fit`) and only then changes the
model, optimizer, data position, scaler and generators.

>>> import tempfile, os
>>> model = torch.nn.Linear(2, 1); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
>>> path = save_checkpoint(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model, optimizer=optimizer, step=7)
>>> load_checkpoint(path, model=model, optimizer=optimizer)
7
"""

from __future__ import annotations

import contextlib
import numbers
import os
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from resacct.training.atomic_files import write_atomically
from resacct.training.checkpoint_file import CheckpointError, load_verified, write_checkpoint_file
from resacct.training.checkpoint_values import plain_value
from resacct.training.checkpoint_fit import check_model_fits, check_optimizer_fits, optimizer_class_name, validate_content
from resacct.errors import ResacctError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "REQUIRED_KEYS",
    "RESUME_STATE_PARTS",
    "CheckpointError",
    "missing_resume_state",
    "SupportsStateDict",
    "write_atomically",
    "write_checkpoint_file",
    "capture_rng_states",
    "restore_rng_states",
    "save_checkpoint",
    "read_checkpoint",
    "load_checkpoint",
]

CHECKPOINT_FORMAT = "resacct-checkpoint"
CHECKPOINT_FORMAT_VERSION = 2  # 2: SHA-256 trailer, optimizer_class
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


def _state_or_none(stateful: SupportsStateDict | None) -> Any:  # checked by save_checkpoint, in one line naming the part
    return None if stateful is None else stateful.state_dict()


def _check_parts(path: str | os.PathLike, doing: str, model: Any, parts: dict[str, Any], method: str) -> None:
    """Refuse, in one line naming the part, a ``model`` that is no ``nn.Module`` or another part
    (optimizer, data, grad_scaler) without a callable ``method`` (``state_dict`` to save,
    ``load_state_dict`` to load): ``save_checkpoint(model=42)`` raised a raw AttributeError."""
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{path}: refusing to {doing}: model is {type(model).__name__} {model!r:.60}; expected an nn.Module; nothing was "
                              f"{'written' if doing == 'save' else 'read'}")
    for name, part in parts.items():
        if part is not None and not callable(getattr(part, method, None)):
            raise CheckpointError(f"{path}: refusing to {doing}: {name} is {type(part).__name__} {part!r:.60}, which has no {method}(); "
                                  f"expected None or an object with {method}() (a torch optimizer, a loader's state, a GradScaler)")




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
    optimizer (and its class), every RNG state, the data position (``data.state_dict()``) and
    the loss scaler, with a SHA-256 of the whole archive.

    Everything saved must load back with ``torch.load(weights_only=True)``: tensors and plain
    values (:mod:`resacct.training.checkpoint_values`). Numpy scalars in ``extra``, the data or
    scaler state (or any other part) are converted losslessly — ``np.float64(1.5)`` loads back as
    the ``float`` 1.5, ``np.int64(3)`` as the ``int`` 3, ``np.bool_`` as ``bool`` — and anything
    else (an ndarray, a ``Path``, a lambda, any other object, ``extra`` nested more than 100
    levels deep) is refused in one line naming the key and what to store instead, before
    anything is written: the checkpoint already at ``path`` stays as it was. A file that would
    still not load back is removed before it replaces anything.

    Refused in one line naming the path: a path with a NUL byte; a target that is a directory,
    FIFO or device; a name longer than the file system allows; a directory that cannot be written
    (read-only, no permission); a write that fails (disk full: the previous checkpoint at the
    path is untouched). Temporaries left by a killed earlier save are removed."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise CheckpointError(f"step {step!r}: expected the number of optimizer steps taken (an int ≥ 0)")
    _check_parts(path, "save", model, {"optimizer": optimizer, "data": data, "grad_scaler": grad_scaler}, "state_dict")
    if extra is not None and not isinstance(extra, Mapping):
        raise CheckpointError(f"{path}: refusing to save: extra is a {type(extra).__name__}; expected a dict of plain values; nothing was written")
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "step": int(step),
        "model": model.state_dict(),
        "optimizer": _state_or_none(optimizer),
        "optimizer_class": None if optimizer is None else optimizer_class_name(optimizer),
        "rng": capture_rng_states(),
        "data": _state_or_none(data),
        "grad_scaler": _state_or_none(grad_scaler),
        "extra": dict(extra or {}),
    }
    checkpoint = {key: plain_value(value, key, path=path) for key, value in checkpoint.items()}
    try:
        validate_content(Path(path), checkpoint)
    except CheckpointError as error:
        problem = str(error).removeprefix(f"{Path(path)}: ")
        raise CheckpointError(f"{path}: refusing to save: {problem}; nothing was written") from None
    return write_checkpoint_file(path, checkpoint)


def read_checkpoint(path: str | os.PathLike, *, require_checksum: bool = True) -> dict[str, Any]:
    """The validated contents of the checkpoint at ``path`` (loaded with ``weights_only=True``).

    Refuses, in one line naming the file: a missing file or one that is not a regular file; a
    checksum mismatch; no checksum (unless ``require_checksum=False``, for an older resacct
    checkpoint or a plain torch.save file you trust); a truncated or foreign file; objects that
    are not tensors or plain values; a dict that is not a resacct checkpoint; missing keys; a
    newer format version; a field of the wrong type (``step: "abc"``, a malformed RNG state).
    """
    path = Path(path)
    content = load_verified(path, require_checksum=require_checksum)
    if not isinstance(content, dict):
        raise CheckpointError(f"{path}: not a resacct checkpoint: it holds a {type(content).__name__}, expected a dict")
    if content.get("format") != CHECKPOINT_FORMAT:
        keys = sorted(map(str, content))[:8]
        raise CheckpointError(f"{path}: not a resacct checkpoint: 'format' is {content.get('format')!r}, expected {CHECKPOINT_FORMAT!r} (keys: {keys})")
    version = content.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version!r} is not one this resacct reads (1..{CHECKPOINT_FORMAT_VERSION}); a newer resacct wrote it?"
        )
    missing = [key for key in REQUIRED_KEYS if key not in content]
    if missing:
        raise CheckpointError(f"{path}: checkpoint is missing {', '.join(repr(key) for key in missing)}")
    validate_content(path, content)
    return content


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    data: SupportsStateDict | None = None,
    grad_scaler: SupportsStateDict | None = None,
    restore_rng: bool = True,
    require_checksum: bool = True,
) -> int:
    """Restore ``model`` (and ``optimizer``, ``data``, ``grad_scaler`` when given, and every
    global RNG when ``restore_rng``) from ``path``; returns the step to continue from.

    Everything is checked first — the file (:func:`read_checkpoint`), the model's keys and
    shapes, the optimizer's class, param groups and state shapes, every RNG state — and only
    then is anything changed. A refusal is one :class:`CheckpointError` line and leaves the
    model, optimizer, data position, scaler and global generators as they were (a data source
    or scaler whose own ``load_state_dict`` raises is put back from its earlier state)."""
    path = Path(path)
    _check_parts(path, "load", model, {"optimizer": optimizer, "data": data, "grad_scaler": grad_scaler}, "load_state_dict")
    content = read_checkpoint(path, require_checksum=require_checksum)
    check_model_fits(path, model, content["model"])
    parts: list[tuple[str, Any, Any]] = []
    for key, target in (("optimizer", optimizer), ("data", data), ("grad_scaler", grad_scaler)):
        if target is None:
            continue
        if content.get(key) is None:
            raise CheckpointError(f"{path}: the checkpoint holds no {key} state, but a {type(target).__name__} was given to restore")
        parts.append((key, target, content[key]))
    if optimizer is not None:
        check_optimizer_fits(path, optimizer, content["optimizer"], content.get("optimizer_class"))
    _restore_all(path, [*parts, ("model", model, content["model"])])
    if restore_rng:
        restore_rng_states(content["rng"])
    return content["step"]


def _restore_all(path: Path, parts: list[tuple[str, Any, Any]]) -> None:
    """Load each part; if one fails, put the ones already loaded back as they were."""
    done: list[tuple[Any, Any]] = []
    for key, target, state in parts:
        before = target.state_dict() if key != "model" else None  # references, not copies: loading replaces them
        try:
            target.load_state_dict(state)
        except Exception as error:
            for loaded, earlier in reversed([*done, (target, before)]):
                if earlier is not None:
                    with contextlib.suppress(Exception):
                        loaded.load_state_dict(earlier)
            text = str(error).strip()
            first_line = text.splitlines()[0] if text else type(error).__name__
            raise CheckpointError(f"{path}: the {key} state does not fit this {type(target).__name__}: {first_line}") from None
        done.append((target, before))
