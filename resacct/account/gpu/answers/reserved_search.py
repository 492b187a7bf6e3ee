"""The largest batch on a board by the CUDA caching allocator's **reserved** peak — what a GPU runs out of.

A command's batch search runs on the CPU kernels' traced step (:mod:`resacct.account.fit.lines`); on a
board the step is another one: the allocator rounds and caches (reserved ≥ allocated), and CUDA's kernels
keep other tensors (flash attention saves a logsumexp where the CPU's math path saves the probabilities).
So ``lora --device BOARD`` judges the CPU search's answer again by the board's predicted reserved peak
(:func:`largest_by_reserved`): the CPU answer traced first, then a bracket — the largest batch known to
fit, the smallest known not to — closed by the line through what is known (the reserved peak is nearly
affine in the batch: the activations), each guess traced as the board runs it, until two neighbouring
batches are known (``exact``) or :data:`MAX_RESERVED_TRACES` batches are traced. ``fit --device`` searches
its batch, or its sequence length (``what="seq"``), the same way (:func:`resacct.account.gpu.answers.device_answer.fit_gpu_answer`),
up to its limit (``--max-batch``, the context length).

>>> reserved = lambda batch: 1000 + 97 * batch
>>> search = largest_by_reserved(reserved, 50, 5000)            # the CPU kernels said 50: the board holds more
>>> search.largest, search.exact, [batch for batch, _ in search.traced]
(41, True, [50, 42, 41])
>>> largest_by_reserved(reserved, 30, 5000).largest             # the CPU kernels said 30: the board holds less
41
>>> largest_by_reserved(reserved, 1, 1050).largest              # not even one sequence
0
>>> capped = largest_by_reserved(reserved, 30, 5000, limit=35)  # no batch above the limit searched
>>> capped.largest, capped.at_limit, max(batch for batch, _ in capped.traced)
(35, True, 35)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ReservedSearch", "largest_by_reserved", "MAX_RESERVED_TRACES"]

#: At most this many batches traced on the board's step (each a whole step on meta tensors).
MAX_RESERVED_TRACES = 6


@dataclass(frozen=True)
class ReservedSearch:
    """The largest batch whose reserved peak fits ``budget_bytes``: ``largest`` (0: not even batch 1;
    None: none of the batches traced fits and smaller ones were not traced), ``exact`` (the batch after
    it was traced and does not fit), from ``start`` (the CPU kernels' answer); ``traced``: (batch,
    reserved bytes) in the order traced."""

    budget_bytes: float
    start: int
    largest: int | None
    exact: bool
    traced: tuple[tuple[int, int], ...]
    limit: int | None = None  # the largest batch asked about: none above it is traced
    what: str = "batch"  # what is searched: "batch", or "seq" (the sequence length)

    @property
    def at_limit(self) -> bool:
        """The limit fits: the board may hold more, but no more was asked."""
        return self.limit is not None and self.largest == self.limit

    def reserved_of(self, batch: int) -> int | None:
        return dict(self.traced).get(batch)

    def line(self, bytes_text: Callable[[float], str]) -> str:
        """One line for the command's output."""
        budget, what = bytes_text(self.budget_bytes), self.what
        said = "" if self.largest == self.start else f" — the CPU kernels' step said {self.start:,}"
        if self.largest is None:
            sizes = [size for size, _ in self.traced]
            many = "batches" if what == "batch" else f"{what} lengths"
            return f"by the reserved peak: none of {many} {min(sizes):,}-{max(sizes):,} fits the {budget} budget ({len(self.traced)} traced)"
        if self.largest == 0:
            return f"by the reserved peak: not even {what} 1 fits the {budget} budget (reserved {bytes_text(self.reserved_of(1) or 0)})"
        reserved = self.reserved_of(self.largest) or 0
        head = f"by the reserved peak: the largest {what} that fits the {budget} budget is {self.largest:,} (reserved {bytes_text(reserved)})"
        if self.at_limit:
            return f"{head}: the limit searched{said}"
        if not self.exact:
            above = [batch for batch, held in self.traced if held > self.budget_bytes]
            if above:
                return (f"by the reserved peak: the largest {what} that fits the {budget} budget lies between {self.largest:,} (reserved "
                        f"{bytes_text(reserved)}) and {min(above) - 1:,} ({min(above):,} does not: {bytes_text(self.reserved_of(min(above)) or 0)}; "
                        f"{len(self.traced)} traced){said}")
            return f"{head}, at least: {what} {self.largest:,} still fits after {len(self.traced)} traces{said}"
        after = self.reserved_of(self.largest + 1) or 0
        return f"{head}; {what} {self.largest + 1:,} does not ({bytes_text(after)}){said}"

    def headline(self, board_name: str, bytes_text: Callable[[float], str], *, noun: str | None = None, at: str = "") -> str | None:
        """The line a command puts first under ``--device BOARD``: this search's answer — what a GPU runs out of is its reserved
        memory — ahead of the CPU kernels' answer, which the command's lines give first. ``noun``: the size's name
        ("micro-batch"; default: ``what``), ``at``: what is fixed (" at seq 2048"). None where nothing was answered."""
        if self.largest is None:
            return None
        noun = noun or ("batch" if self.what == "batch" else "sequence length")
        budget = bytes_text(self.budget_bytes)
        if self.largest == 0:
            return (f"  answer on {board_name}: no {noun}{at} fits — {self.what} 1 is predicted at {bytes_text(self.reserved_of(1) or 0)} "
                    f"reserved, over the {budget} budget (the board's step, below)")
        qualifier = "" if self.exact or self.at_limit else " at least"
        return (f"  answer on {board_name}: {noun}{qualifier} {self.largest:,}{at}, by the predicted reserved peak "
                f"({bytes_text(self.reserved_of(self.largest) or 0)} of the {budget} budget; the board's step, below the CPU kernels' answer)")

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "cpu_engine_largest": self.start, "largest": self.largest, "exact": self.exact,
                "limit": self.limit, "traced": [{self.what: size, "reserved_bytes": reserved} for size, reserved in self.traced]}


def largest_by_reserved(reserved_at: Callable[[int], int | None], start: int, budget_bytes: float, *,
                        max_traces: int = MAX_RESERVED_TRACES, limit: int | None = None, what: str = "batch") -> ReservedSearch | None:
    """From batch ``start`` (the CPU kernels' answer; 0 — not even one sequence — starts at 1), the largest batch whose ``reserved_at(batch)`` — the
    board's predicted reserved peak, None where there is none — fits ``budget_bytes`` (see the module doc), at most ``limit``
    (None: no limit); ``what``: the size's name in the lines ("batch", "seq"). None where the first call has no prediction."""
    known: dict[int, int] = {}
    lo, hi = 0, None  # the largest batch known to fit (0: none yet), the smallest known not to (None: none yet)
    batch, sides = max(1, start if limit is None else min(start, limit)), []
    while len(known) < max_traces:
        reserved = reserved_at(batch)
        if reserved is None:
            break
        known[batch] = reserved
        sides.append(reserved <= budget_bytes)
        if sides[-1]:
            lo = max(lo, batch)
        else:
            hi = batch if hi is None else min(hi, batch)
        if (hi is not None and hi - lo <= 1) or lo == limit:
            break
        # the line's guess; halving the bracket where two guesses in a row landed on one side of the budget, or on one
        # flat step (the allocator's segments make the reserved peak a staircase: the line alone can creep along a step)
        flat = len(known) >= 2 and reserved == known[list(known)[-2]]
        halve = hi is not None and ((lo > 0 and len(sides) >= 3 and sides[-1] == sides[-2]) or flat)
        batch = max(1, (lo + hi) // 2) if halve else _next_guess(known, lo, hi, budget_bytes)
        batch = batch if limit is None else min(batch, limit)
    if not known:
        return None
    exact = hi is not None and hi - lo <= 1
    return ReservedSearch(budget_bytes, start, lo if (lo or exact or lo == limit) else None, exact, tuple(known.items()), limit, what)


def _next_guess(known: dict[int, int], lo: int, hi: int | None, budget_bytes: float) -> int:
    """The next batch to trace: on the line through the two nearest known points (through the origin while
    nothing fits), kept strictly inside the bracket."""
    if hi is None:  # every batch traced fits: the next one, then the line through the two largest, upward
        if len(known) < 2:
            return lo + 1
        below = max(batch for batch in known if batch < lo)
        slope = (known[lo] - known[below]) / (lo - below)
        return lo + max(1, int((budget_bytes - known[lo]) // slope)) if slope > 0 else 2 * lo
    if lo == 0:  # nothing fits yet: the line through the origin and the smallest batch that does not
        guess = int(hi * budget_bytes // known[hi])
    else:
        rise = known[hi] - known[lo]
        guess = lo + int((budget_bytes - known[lo]) * (hi - lo) // rise) if rise > 0 else (lo + hi) // 2
    return min(hi - 1, max(lo + 1, guess))
