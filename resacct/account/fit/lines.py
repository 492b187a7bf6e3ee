"""Fit by few traces: the largest size whose step peak (one trace per probe) stays within a budget,
from lines through the probes — a step's peak is the largest of a few phase peaks (forward,
backward, optimizer step …), each affine in the batch, so two traces name the answer and two more
confirm it (:func:`largest_fitting`). :mod:`resacct.account.fit.search` builds the model and the
probes; nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["FitProbe", "GROWTH", "affine_answer", "affine_deviation_bytes", "largest_fitting", "probed_peak_bytes"]

#: The farthest a line's answer is trusted before a size that fails: × the largest size that fits.
GROWTH = 64


@dataclass(frozen=True)
class FitProbe:
    """One prediction of the search: the size tried, its predicted step peak, whether it fits."""

    size: int
    peak_bytes: int
    fits: bool
    seconds: float


def probed_peak_bytes(probes: Sequence[FitProbe], size: int | None) -> int | None:
    """The predicted peak the search traced at ``size`` (None: not traced, or no size)."""
    return next((probe.peak_bytes for probe in probes if probe.size == size), None)


def _crossing(low: int, low_peak: int, high: int, high_peak: int, budget_bytes: float) -> float | None:
    """Where the line through (low, low_peak) and (high, high_peak) reaches the budget (None: it does not rise)."""
    if high_peak <= low_peak:
        return None
    return low + (budget_bytes - low_peak) * (high - low) / (high_peak - low_peak)


def affine_answer(first: FitProbe, second: FitProbe, budget_bytes: float) -> int | None:
    """The largest size the line through two probes keeps within the budget (None: the line does not rise).

    >>> affine_answer(FitProbe(1, 1010, True, 0.0), FitProbe(2, 1020, True, 0.0), 1095)
    9
    """
    if second.peak_bytes <= first.peak_bytes:
        return None
    slope = (second.peak_bytes - first.peak_bytes) / (second.size - first.size)
    return first.size + math.floor((budget_bytes - first.peak_bytes) / slope + 1e-9)


def affine_deviation_bytes(probes: list[FitProbe]) -> int | None:
    """How far the farthest probe lies from the line through the first two (0: every probe on it to
    the byte; None: fewer than three probes). A step's peak is the largest of a few phase peaks, each
    affine in the batch: where one phase holds the peak at every probe, this is 0 or a few bytes of rounding."""
    if len(probes) < 3:
        return None
    first, second = probes[0], probes[1]
    slope = Fraction(second.peak_bytes - first.peak_bytes, second.size - first.size)  # exact: peaks past 2**53 bytes lose bytes in floats
    return max(round(abs(p.peak_bytes - (first.peak_bytes + slope * (p.size - first.size)))) for p in probes[2:])


class _Probing:
    """The probes of one :func:`largest_fitting` search, by size. A class, not defs in the search: the
    type-checking hook decorates its methods once, not at each search (docs/suite_time.md, session 7)."""

    def __init__(self, peak_of: Callable[[int], int], budget_bytes: float, on_probe: Callable[[FitProbe], None] | None,
                 phase_peaks_of: Callable[[int], dict[str, int]] | None) -> None:
        self.peak_of, self.budget_bytes, self.on_probe, self.phase_peaks_of = peak_of, budget_bytes, on_probe, phase_peaks_of
        self.probes: dict[int, FitProbe] = {}

    def fits(self, size: int) -> bool:
        """Trace ``size`` (timed; reported to ``on_probe``): whether its peak is within the budget."""
        started = time.perf_counter()
        peak = self.peak_of(size)
        self.probes[size] = FitProbe(size=size, peak_bytes=peak, fits=peak <= self.budget_bytes, seconds=time.perf_counter() - started)
        if self.on_probe is not None:
            self.on_probe(self.probes[size])
        return self.probes[size].fits

    def line(self, first: int, second: int) -> int | None:
        """The answer of the line through two probes — of each phase's line, the smallest, where the
        phases' peaks are known (the step's peak is the largest of them, each affine in the batch)."""
        if self.phase_peaks_of is None:
            return affine_answer(self.probes[first], self.probes[second], self.budget_bytes)
        ones, twos = self.phase_peaks_of(first), self.phase_peaks_of(second)
        answers = [affine_answer(FitProbe(first, ones[name], True, 0.0), FitProbe(second, twos[name], True, 0.0), self.budget_bytes)
                   for name in ones if name in twos]
        return min((answer for answer in answers if answer is not None), default=None)


def largest_fitting(peak_of: Callable[[int], int], budget_bytes: float, *, limit: int,
                    on_probe: Callable[[FitProbe], None] | None = None,
                    phase_peaks_of: Callable[[int], dict[str, int]] | None = None, second: int = 2,
                    first: int = 1) -> tuple[int | None, list[FitProbe]]:
    """The largest n in 1..``limit`` with ``peak_of(n) ≤ budget_bytes`` (None: not even 1), for a
    ``peak_of`` that grows with n, and every probe made (n + 1 among them unless n is the limit).

    Few traces: the step's peak is affine in the batch wherever one phase holds it, so the line
    through the probes at 1 and 2 names the answer b, and two more probes confirm it — b fits and
    b + 1 does not: **four traces** for an affine peak (two when 2 does not fit), one more per × 64
    beyond 128 (the line is trusted up to 64 × the largest size that fits).
    Where the peak is not affine (a phase that takes over at a larger batch, a curved peak) the line
    misses: the search goes on from the probes made — by the line through the two largest sizes
    that fit while none has failed (× 8 while it does not rise, at most × 64); after a miss, by the line
    through two sizes side by side that do not fit (exact where one phase holds the peak there);
    last, between the largest that fits and the smallest that does not, by their line, bisecting
    when the line would not halve the gap. ``second``: the size probed after 1 (default 2; a caller
    with a guess at the answer names it: where the line through 1 and the guess answers the guess,
    the guess + 1 is the one more probe — **three traces**). ``first``: the size probed first (default
    1; a caller that holds one size's peak already names it, so the line runs through it and the guess:
    where that size fits, every smaller one does, and 1 is never traced; where it does not, 1 is).

    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 1095, limit=10**6)
    >>> answer, [p.size for p in probes]
    (9, [1, 2, 9, 10])
    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 10**6, limit=10**7)
    >>> answer, [p.size for p in probes]
    (99900, [1, 2, 128, 8192, 99900, 99901])
    >>> largest_fitting(lambda n: 10 * n, 5, limit=8)[0], largest_fitting(lambda n: n, 100, limit=8)[0]
    (None, 8)
    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 1095, limit=10**6, second=9)
    >>> answer, [p.size for p in probes]
    (9, [1, 9, 10])
    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 1095, limit=10**6, first=4, second=9)
    >>> answer, [p.size for p in probes]
    (9, [4, 9, 10])
    >>> answer, probes = largest_fitting(lambda n: 1000 + 10 * n, 1035, limit=10**6, first=4, second=9)
    >>> answer, sorted(p.size for p in probes)
    (3, [1, 3, 4])
    """
    if not 1 <= first <= limit:
        raise ValueError(f"first size {first}: expected 1 to the limit {limit}")
    search = _Probing(peak_of, budget_bytes, on_probe, phase_peaks_of)
    probes, fits, line = search.probes, search.fits, search.line
    low, previous, high = first, None, None  # low fits; high (when known) does not; previous: the size that fit before low
    if not fits(first):
        if first == 1 or not fits(1):
            return None, list(probes.values())
        low, high = 1, first
    while high is None and low < limit:
        guess = None if previous is None else line(previous, low)
        if guess is None or guess < low:  # the line's second size, or × 8 while the line does not rise (or low fits above it)
            size = max(second, low + 1) if previous is None else 8 * low
        else:  # the line's answer (at most GROWTH × low: a line from small sizes may miss by far); when that is low itself, one more
            size = min(max(guess, low + 1), GROWTH * low)
        size = min(size, limit)
        previous = low
        if not fits(size):
            high = size
            break
        low = size
        if size == guess and size < limit:  # the line's answer fits: one more must not
            if not fits(size + 1):
                high = size + 1
                break
            previous, low = size, size + 1
    if high is not None:
        low, high = _from_the_right(fits, probes, low, high, line)
    steer = True  # by the line; after a step it narrowed by less than half, one bisection
    while high is not None and high - low > 1:
        gap = high - low
        crossing = _crossing(low, probes[low].peak_bytes, high, probes[high].peak_bytes, budget_bytes) if steer else None
        size = (low + high) // 2 if crossing is None else min(max(int(crossing), low + 1), high - 1)
        if fits(size):
            low = size
        else:
            high = size
        steer = crossing is None or high - low <= gap // 2 or high - low == 1
    return low, list(probes.values())


def _from_the_right(fits: Callable[[int], bool], probes: dict[int, FitProbe], low: int, high: int,
                    line: Callable[[int, int], int | None]) -> tuple[int, int]:
    """Narrow ``low`` (fits) … ``high`` (does not) by the line through two sizes that do not fit, side
    by side: where one phase's affine peak holds there, its answer ``c`` is exact, and a peak that is
    the largest of affine phase peaks (convex) lies above that line, so ``c + 1`` does not fit — traced,
    with ``c``. A few rounds (one per phase the line crosses); the caller bisects whatever is left."""
    for _ in range(4):
        if high - low <= 1:
            break
        if high + 1 not in probes:  # the line at high needs a second size that does not fit: the one below
            if fits(high - 1):
                return high - 1, high
            high -= 1
            if high - low <= 1:
                break
        answer = line(high, high + 1)
        if answer is None or answer >= high:  # flat, or not convex: bisection
            break
        answer = max(answer, low)
        if answer + 1 < high:
            if fits(answer + 1):  # above the line's answer yet within the budget: not convex
                return answer + 1, high
            high = answer + 1
        if answer > low:
            if fits(answer):
                low = answer
            else:
                high = answer
    return low, high
