"""Python's cyclic collector, tuned for a claims run.

Importing torch, transformers and torch._dynamo and collecting ~1,000 claims leaves several hundred
thousand long-lived objects, and the claims keep as many again alive (models and traces their areas
share, modules imported on the way); each full collection scans every one of them.
``python benchmarks/collector_time.py --rounds 2`` (``resacct verify --workers 1``, 2-core AMD EPYC,
2026-11-29): with Python's defaults 12 full collections took 2.6-2.7 s, the collector 3.6 s in all.

Two changes, both inside :func:`claims_collector`:

- :func:`freeze_alive` moves what is alive into the permanent generation (``gc.freeze``) once the
  claims are collected and again before the workers fork (they inherit it frozen): no full
  collection scans the imports again. Nothing is collected first: garbage alive at that moment (a
  few cycles from the imports) stays, as Python's documentation suggests before a fork. What was
  frozen stays frozen for the process's life (``gc.unfreeze`` at the end would make the next full
  collection scan all of it again).
- A full collection waits for 100 collections of the middle generation instead of 10
  (``gc.set_threshold``'s third value). With both, the same benchmark: 6 full collections, 0.58-0.61 s;
  the collector 1.5 s in all. The young generations are collected as before, so a claim's short-lived cycles go as
  before; a measured step pauses the collector anyway
  (:func:`resacct.measurement.memory_timeline.gc_paused`). The threshold is restored after the run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Generator, Iterator

import pytest

__all__ = ["FULL_COLLECTION_THRESHOLD", "TunedCollector", "claims_collector", "freeze_alive"]

#: Collections of the middle generation between two full collections during a claims run (Python's default: 10).
FULL_COLLECTION_THRESHOLD = 100


def freeze_alive() -> None:
    """Everything alive now joins the permanent generation: no later collection scans it."""
    gc.freeze()


@contextlib.contextmanager
def claims_collector() -> Iterator[None]:
    """The block runs with full collections :data:`FULL_COLLECTION_THRESHOLD` middle-generation
    collections apart (at least as far apart as they were); the thresholds are restored after it."""
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, max(full, FULL_COLLECTION_THRESHOLD))
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)


class TunedCollector:
    """The pytest plugin of both: freezes what is alive once collection ends, and runs the test loop
    inside :func:`claims_collector`. ``resacct verify``'s pytest run and this repository's test
    suite (the root conftest.py) register it."""

    def pytest_collection_finish(self, session: object) -> None:
        freeze_alive()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: object) -> Generator[None, object, object]:
        with claims_collector():
            return (yield)
