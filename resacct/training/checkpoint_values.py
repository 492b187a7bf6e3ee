"""What a checkpoint may hold: tensors and plain values that ``torch.load(weights_only=True)``
reads back. Checked (and numpy scalars converted) *before* anything is written, so a save never
replaces a good checkpoint with one that :func:`resacct.training.checkpoint.load_checkpoint`
refuses (issue 26: ``extra={"val_loss": np.float64(1.5)}`` used to do exactly that).

Kept as they are: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
``bytearray``, tensors, ``torch.dtype``, ``torch.device``, ``torch.Size``, and ``dict``,
``OrderedDict``, ``list``, ``tuple`` and ``set`` of them (at most :data:`MAX_DEPTH` levels deep).

Converted losslessly: numpy scalars — ``np.bool_`` → ``bool``, any numpy integer → ``int``,
``np.float16/32/64`` → ``float`` (exact: a Python float holds each of them), ``np.complex64/128``
→ ``complex``, ``np.str_`` → ``str``, ``np.bytes_`` → ``bytes``; a ``np.longdouble`` only when
``float`` holds it exactly. They load back as the Python type.

Refused, in one line naming the key and what to store instead: an ndarray, a path, an enum, a
function or lambda, a ``frozenset``, any other object, a structure deeper than
:data:`MAX_DEPTH` or one that contains itself.

>>> plain_value({"loss": np.float64(1.5), "n": [np.int64(3)]}, "extra", path="c.pt")
{'loss': 1.5, 'n': [3]}
>>> plain_value({"a": np.zeros(2)}, "extra", path="c.pt")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
resacct.errors.CheckpointError: c.pt: refusing to save: extra['a'] is a numpy.ndarray of shape (2,) and dtype float64; ...: store torch.from_numpy(value) or value.tolist(); nothing was written
"""

from __future__ import annotations

import enum
import os
import types
from collections import OrderedDict
from pathlib import PurePath
from typing import Any, no_type_check

import numpy as np
import torch

from resacct.errors import CheckpointError

__all__ = ["MAX_DEPTH", "plain_value"]

MAX_DEPTH = 100
"""Containers nested deeper than this are refused (pickle itself fails near 1,000 levels)."""

_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
_PLAIN = "a checkpoint holds only tensors and plain values (None, bool, int, float, complex, str, bytes, and lists, tuples, sets and dicts of them)"


def _shown_where(where: str) -> str:
    return where if len(where) <= 120 else where[:100] + "…" + where[-16:]


def _refuse(path: str | os.PathLike, where: str, problem: str, instead: str) -> CheckpointError:
    return CheckpointError(f"{path}: refusing to save: {_shown_where(where)} {problem}; {instead}; nothing was written")


def _numpy_scalar(value: np.generic, where: str, path: str | os.PathLike) -> Any:
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.str_):
        return str(value)
    if isinstance(value, np.bytes_):
        return bytes(value)
    if isinstance(value, (np.floating, np.complexfloating)):
        converted = complex(value) if isinstance(value, np.complexfloating) else float(value)
        exact = converted == value or (value != value and converted != converted)  # NaN stays NaN
        if exact:
            return converted
        kind = "complex" if isinstance(value, np.complexfloating) else "float"
        raise _refuse(path, where, f"is a numpy.{type(value).__name__} ({value!r}) that a Python {kind} cannot hold exactly", f"store {kind}(value) or a tensor")
    raise _refuse(path, where, f"is a numpy.{type(value).__name__} ({value!r})", f"{_PLAIN}: store value.item()")


def _describe(value: Any) -> tuple[str, str]:
    """(what the value is, what to store instead)."""
    if isinstance(value, np.ndarray):
        return f"is a numpy.ndarray of shape {value.shape} and dtype {value.dtype}", f"{_PLAIN}: store torch.from_numpy(value) or value.tolist()"
    if isinstance(value, PurePath):
        return f"is a path ({type(value).__name__}('{value}'))", f"{_PLAIN}: store str(value)"
    if isinstance(value, enum.Enum):
        return f"is an enum member ({value!r})", f"{_PLAIN}: store value.value or value.name"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.LambdaType)) or callable(value) and isinstance(value, type):
        name = getattr(value, "__qualname__", type(value).__name__)
        return f"is a function or class ({name})", f"{_PLAIN}: store its result, or its name as a str"
    if isinstance(value, frozenset):
        return "is a frozenset", f"{_PLAIN}: store a set or a sorted list"
    if isinstance(value, str):
        return f"is a {type(value).__module__}.{type(value).__qualname__} (a str subclass)", f"{_PLAIN}: store str(value)"
    if isinstance(value, (int, float)):
        return f"is a {type(value).__module__}.{type(value).__qualname__} (a number subclass)", f"{_PLAIN}: store int(value) or float(value)"
    if isinstance(value, (dict, list, tuple, set)):
        return f"is a {type(value).__module__}.{type(value).__qualname__} (a container subclass)", f"{_PLAIN}: store a plain dict, list, tuple or set"
    shown = " ".join(repr(value).split()) if type(value).__repr__ is not object.__repr__ else ""
    shown = f" ({shown[:57]}...)" if len(shown) > 60 else (f" ({shown})" if shown else "")
    return f"is a {type(value).__module__}.{type(value).__qualname__}{shown}", f"{_PLAIN}: store a plain form of it"


def plain_value(value: Any, where: str, *, path: str | os.PathLike) -> Any:
    """``value`` as a checkpoint can hold it (numpy scalars converted; the same object when
    nothing needed converting), or a :class:`CheckpointError` naming ``where`` (e.g.
    ``extra['val_loss']``) and what to store instead."""
    return _plain(value, where, path, 0, set())


@no_type_check  # per-element recursion (277,796 checked calls in the CI quick tier): its caller is checked (docs/suite_time.md)
def _plain(value: Any, where: str, path: str | os.PathLike, depth: int, active: set[int]) -> Any:
    kind = type(value)
    if kind in _LEAVES or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.generic):
        return _numpy_scalar(value, where, path)
    if kind not in (dict, OrderedDict, list, tuple, set):
        problem, instead = _describe(value)
        raise _refuse(path, where, problem, instead)
    if id(value) in active:
        raise _refuse(path, where, "contains itself", "store a structure without cycles")
    if depth >= MAX_DEPTH:
        raise _refuse(path, where, f"is nested deeper than {MAX_DEPTH} levels", "store a flatter structure")
    active.add(id(value))
    try:
        if kind in (dict, OrderedDict):
            items = []
            changed = False
            for key, item in value.items():
                new_key = _plain(key, f"{where} key {key!r}"[:200], path, depth + 1, active)
                new_item = _plain(item, f"{where}[{key!r}]", path, depth + 1, active)
                changed = changed or new_key is not key or new_item is not item
                items.append((new_key, new_item))
            if not changed:
                return value
            rebuilt = kind(items)
            if hasattr(value, "_metadata"):  # a state_dict() keeps module versions here
                rebuilt._metadata = value._metadata  # type: ignore[attr-defined]
            return rebuilt
        elements = [_plain(item, f"{where}[{index}]", path, depth + 1, active) for index, item in enumerate(value)]
        if all(new is old for new, old in zip(elements, value)):
            return value
        return kind(elements)
    finally:
        active.discard(id(value))
