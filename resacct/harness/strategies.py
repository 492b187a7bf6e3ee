"""Named hypothesis strategies that a claim's ``forall`` may use.

Built in: ``dim`` (1–64), ``small_dim`` (1–8), ``large_dim`` (1–65536, for the meta device),
``shape`` (1–4 dims of 1–8), ``float_dtype``, ``dtype`` (every dtype a tensor can be made of
here), ``seed``. Two parametrised forms need no Python at all::

    forall: {n: "integers(1, 100)", dtype: "sampled_from(float16, bfloat16)"}

Areas add their own with ``@strategy("name")``. Strategies only produce valid inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from hypothesis import strategies as st

from resacct.errors import ResacctError, UnknownNameError

__all__ = ["strategy", "get_strategy", "strategy_names"]

_FACTORIES: dict[str, Callable[[], st.SearchStrategy]] = {}

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
ALL_DTYPES = FLOAT_DTYPES + ("int8", "uint8", "int16", "int32", "int64", "bool", "complex64", "float8_e4m3fn", "float8_e5m2")

_INTEGERS = re.compile(r"^integers\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")
_SAMPLED = re.compile(r"^sampled_from\(\s*([^()]*?)\s*\)$")
_WORD = re.compile(r"^[A-Za-z0-9_.+-]+$")


def strategy(name: str) -> Callable[[Callable[[], st.SearchStrategy]], Callable[[], st.SearchStrategy]]:
    """Register a zero-argument function returning a hypothesis strategy under ``name``."""

    def register(factory: Callable[[], st.SearchStrategy]) -> Callable[[], st.SearchStrategy]:
        _FACTORIES[name] = factory
        return factory

    return register


strategy("dim")(lambda: st.integers(1, 64))
strategy("small_dim")(lambda: st.integers(1, 8))
strategy("large_dim")(lambda: st.integers(1, 65536))
strategy("shape")(lambda: st.lists(st.integers(1, 8), min_size=1, max_size=4))
strategy("float_dtype")(lambda: st.sampled_from(FLOAT_DTYPES))
strategy("dtype")(lambda: st.sampled_from(ALL_DTYPES))
strategy("seed")(lambda: st.integers(0, 2**32 - 1))


MAX_BOUND_DIGITS = 400  # as for integers in a claims file (resacct.harness.loader.MAX_INTEGER_DIGITS)


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 4] + "…" + text[-3:])


def _integer(word: str, spec: str) -> int:
    digits = len(word.lstrip("+-"))
    if digits > MAX_BOUND_DIGITS:
        raise ResacctError(f"{_shown(spec)}: the number {_shown(word)} has {digits} digits; at most {MAX_BOUND_DIGITS} are allowed")
    return int(word)


def _parse_scalar(word: str, spec: str) -> int | float | str:
    """A sampled_from value: an integer, a finite float, or else the word itself."""
    if re.fullmatch(r"[-+]?\d+(?:_\d+)*", word):
        return _integer(word, spec)
    try:
        number = float(word)
    except ValueError:
        return word
    if not math.isfinite(number):
        raise ResacctError(f"{_shown(spec)}: the value {word!r} is not a finite number; sampled_from values must be")
    return number


def get_strategy(spec: str) -> st.SearchStrategy:
    """The strategy named (or described) by ``spec``; ResacctError if there is none."""
    from resacct.harness.registry import all_checks

    all_checks()  # importing the check modules registers their areas' strategies
    spec = spec.strip()
    if spec in _FACTORIES:
        return _FACTORIES[spec]()
    if match := _INTEGERS.match(spec):
        low, high = _integer(match.group(1), spec), _integer(match.group(2), spec)
        if low > high:
            raise ResacctError(f"integers({low}, {high}) is empty: the lower bound is above the upper")
        return st.integers(low, high)
    if match := _SAMPLED.match(spec):
        words = [word.strip() for word in match.group(1).split(",") if word.strip()]
        if not words or not all(_WORD.match(word) for word in words):
            raise ResacctError(f"sampled_from needs plain comma-separated values, got {_shown(spec, 80)}")
        return st.sampled_from([_parse_scalar(word, spec) for word in words])
    raise UnknownNameError("strategy", spec if len(spec) <= 80 else spec[:79] + "…", strategy_names() + ["integers(lo, hi)", "sampled_from(a, b, …)"])


def strategy_names() -> list[str]:
    return sorted(_FACTORIES)
