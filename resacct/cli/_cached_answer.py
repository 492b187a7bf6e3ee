"""A command's whole answer read back from the trace cache (:mod:`resacct.account.trace.cache`) when
the same question was answered before: the question names everything the answer depends on (the
config's values, every size, budget and choice, the units of its text), the cache adds the versions
of torch and transformers and a hash of resacct's answering sources and GPU records. One line on
stderr says the answer was read back and how long it took when first traced; ``--no-cache`` (or
``RESACCT_NO_CACHE=1``) traces afresh and writes nothing. A question that raised is never stored.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["add_no_cache_flag", "cached_command_answer", "hf_config_question"]

T = TypeVar("T")


def add_no_cache_flag(parser: Any, what: str = "trace afresh") -> None:
    """``--no-cache``: neither read nor write the trace cache."""
    parser.add_argument("--no-cache", action="store_true",
                        help=f"with --hf-config: {what}, neither reading nor writing the trace cache ($RESACCT_CACHE_DIR, else "
                             "~/.cache/resacct/traces; RESACCT_NO_CACHE=1 does the same)")


def hf_config_question(args: Any, board: Any, memory_bytes: float | None, **choices: Any) -> dict[str, Any]:
    """The trace cache's key for a ``--hf-config`` answer: the config's values, name and source, the board or memory, the
    units of its text, and the command's own ``choices`` (sizes, formats, engine …)."""
    from resacct.account.load.hf_models import load_hf_config

    spec = load_hf_config(args.hf_config)
    return {"config": spec.values, "name": spec.name, "source": spec.source, "board": None if board is None else board.name,
            "memory_bytes": memory_bytes, "units": args.units, **choices}


def cached_command_answer(command: str, kind: str, question: dict[str, Any] | None, compute: Callable[[], T], *, no_cache: bool) -> T:
    """``compute()``, or — ``question`` given and caching wanted — the answer stored for ``question``
    under ``kind`` (then one line on stderr: ``resacct <command>: answered from the trace cache …``)."""
    if question is None:
        return compute()
    from resacct.account.trace.cache import cache_wanted, cached, caching, last_outcome
    from resacct.account.trace.pass_profile import collector_off

    def timed() -> tuple[T, float]:
        started = time.perf_counter()
        answer = compute()
        return answer, time.perf_counter() - started

    with caching(cache_wanted(no_cache)), collector_off():
        answer, seconds = cached(kind, question, timed)
    if last_outcome() == "hit":
        print(f"resacct {command}: answered from the trace cache ({seconds:.1f} s when first traced; --no-cache traces afresh)", file=sys.stderr)
    return answer
