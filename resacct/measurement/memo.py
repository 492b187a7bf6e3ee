"""One measurement per process for every caller that asks the same thing (issue 34).

Several claims often measure one model: four claims on a tiny architecture (its FLOPs, its state,
its saved activations, its peak), a claim and its phase twin on one step. :func:`shared_measurement`
makes such a measuring function pay once per process: the first call measures, the next ones
with the same inputs get a **copy** of that result (``copy.deepcopy``: a caller that changes what
it got changes nothing another caller sees) — or the result itself where nothing in it can be changed
(numbers, strings, tuples, frozensets and frozen dataclasses of them, dtypes: :func:`is_frozen`, asked
once when it is stored: a recorded GPU step's thousands of ops and events were copied for each of its
claims, session 33).

The key is everything that decides the result: the function, its arguments bound to its
signature with the defaults filled in (``f(m, 2)`` and ``f(m, 2, recipe="fp32")`` are one key when
``recipe`` defaults to ``"fp32"``), and what torch itself brings — its version, its default dtype
and its intra-op thread count (the CPU flash-attention kernel's scratch grows with the threads).
Inputs that differ never share: a hypothesis example measures its own inputs. Arguments must be
hashable (numbers, strings, tuples); a function that builds its model from a name and numbers is
the shape this is made for.

The memo is per process: ``resacct verify``'s workers (:mod:`resacct.harness.workers`) run the
claims of one area in one process, so the claims that share a measurement find it there.

``RESACCT_MEMO=0`` turns sharing off (every call measures afresh: what
``benchmarks/claim_sharing.py`` compares against); :func:`memo_stats` counts hits and misses per
function; :func:`forget_shared_measurements` empties every memo (a fresh measurement, e.g. in a
test that patches what the measurement calls).

>>> calls = []
>>> @shared_measurement
... def measure(size: int, scale: int = 1) -> dict:
...     calls.append(size)
...     return {"bytes": size * scale}
>>> first = measure(4)
>>> first["bytes"] = -1  # the caller's copy
>>> measure(4, scale=1), len(calls)
({'bytes': 4}, 1)
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from resacct.errors import ResacctError

__all__ = ["shared_measurement", "memo_enabled", "memo_stats", "forget_shared_measurements", "on_forget", "MemoStats", "MEMO_VARIABLE",
           "is_frozen"]

MEMO_VARIABLE = "RESACCT_MEMO"
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class MemoStats:
    """Calls of one memoised function in this process: ``hits`` answered from the memo, ``misses`` measured."""

    function: str
    hits: int
    misses: int
    entries: int


def memo_enabled() -> bool:
    """Whether sharing is on: ``RESACCT_MEMO`` unset, empty or anything but ``0`` / ``off`` / ``false`` / ``no``."""
    return os.environ.get(MEMO_VARIABLE, "").strip().lower() not in {"0", "off", "false", "no"}


_ATOMS = (int, float, complex, str, bytes, type(None), range, enum.Enum)  # bool is an int


def is_frozen(value: Any, _depth: int = 0) -> bool:
    """Whether nothing reachable from ``value`` can be changed in place: a number, string, bytes, None, enum member, torch
    dtype or device, or a tuple, frozenset or frozen dataclass (no attribute beyond its fields) of such. A caller may then
    share it instead of copying it.

    >>> is_frozen((1, "a", (2.5, None))), is_frozen((1, [2])), is_frozen({"a": 1})
    (True, False, False)
    """
    if isinstance(value, _ATOMS) or _is_torch_atom(value):
        return True
    if _depth > 50:  # a structure that deep is copied rather than walked
        return False
    if type(value) is tuple or type(value) is frozenset or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return all(is_frozen(item, _depth + 1) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        names = {field.name for field in dataclasses.fields(value)}
        extra = set(getattr(value, "__dict__", {})) - names
        return not extra and all(is_frozen(getattr(value, name), _depth + 1) for name in names)
    return False


def _is_torch_atom(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a dtype or device exists only where torch is imported already
    return torch is not None and isinstance(value, (torch.dtype, torch.device))


class _Memo:
    def __init__(self, function: Callable[..., Any], switchable: bool = True) -> None:
        self.function = function
        self.switchable = switchable  # False: shared whatever RESACCT_MEMO says (a launch one run pays once by design)
        self.name = f"{function.__module__}.{function.__qualname__}"
        self.signature = inspect.signature(function)
        self.results: dict[tuple[Any, ...], tuple[Any, bool]] = {}  # key → (result, nothing in it can change: handed out uncopied)
        self.hits = 0
        self.misses = 0
        self.lock = threading.Lock()

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        import torch

        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise ResacctError(f"{self.name}: arguments {args!r} {kwargs!r} do not fit {self.signature}: {error}") from None
        bound.apply_defaults()
        key = (tuple(bound.arguments.items()), torch.__version__, torch.get_default_dtype(), torch.get_num_threads())
        try:
            hash(key)
        except TypeError:
            raise ResacctError(f"{self.name}: arguments {dict(bound.arguments)!r} are not hashable; expected numbers, strings, tuples") from None
        return key

    def enabled(self) -> bool:
        return not self.switchable or memo_enabled()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled():
            self.misses += 1
            return self.function(*args, **kwargs)
        key = self.key(args, kwargs)
        with self.lock:
            if key in self.results:
                self.hits += 1
                return self._handed_out(key)
        result = self.function(*args, **kwargs)  # outside the lock: a measurement may call another memoised one
        with self.lock:
            self.misses += 1
            if key not in self.results:
                self.results[key] = (result, is_frozen(result))
            return self._handed_out(key)

    def _handed_out(self, key: tuple[Any, ...]) -> Any:
        """The stored result itself where nothing in it can change, else a deep copy for this caller."""
        result, frozen = self.results[key]
        return result if frozen else copy.deepcopy(result)

    def clear(self) -> None:
        with self.lock:
            self.results.clear()
            self.hits = self.misses = 0

    def stats(self) -> MemoStats:
        return MemoStats(function=self.name, hits=self.hits, misses=self.misses, entries=len(self.results))


_MEMOS: list[_Memo] = []


def shared_measurement(function: Callable[..., _Result] | None = None, *, switchable: bool = True) -> Any:
    """``function`` measured once per process per key (see the module doc); each caller gets a copy.
    The wrapper has ``cache_clear()`` (this function's memo) and ``memo_stats()``.
    ``@shared_measurement(switchable=False)``: shared even under ``RESACCT_MEMO=0`` — for a launch
    of ranks whose one run serves several claims by design."""
    if function is None:
        return functools.partial(shared_measurement, switchable=switchable)
    memo = _Memo(function, switchable)
    _MEMOS.append(memo)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> _Result:
        return memo(*args, **kwargs)  # type: ignore[no-any-return]

    wrapper.cache_clear = memo.clear  # type: ignore[attr-defined]
    wrapper.memo_stats = memo.stats  # type: ignore[attr-defined]
    return wrapper


def memo_stats() -> list[MemoStats]:
    """Hits and misses of every memoised function imported in this process, in definition order."""
    return [memo.stats() for memo in _MEMOS]


def forget_shared_measurements() -> None:
    """Empty every memo (and its counts), and what :func:`on_forget` registered (the results a shared
    gloo launch ran along and keeps for their callers): the next call of each function measures afresh."""
    for memo in _MEMOS:
        memo.clear()
    for forget in _FORGET_ALSO:
        forget()


_FORGET_ALSO: list[Callable[[], None]] = []


def on_forget(forget: Callable[[], None]) -> None:
    """Have :func:`forget_shared_measurements` call ``forget()`` too: for measurements kept outside a memo."""
    if forget not in _FORGET_ALSO:
        _FORGET_ALSO.append(forget)
