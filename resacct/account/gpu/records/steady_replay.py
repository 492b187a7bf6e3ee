"""A steady training step's allocator calls, logged once and replayed as the next step (issue 34: the recorded steps'
processes traced two steps where they traced three).

The recorder on the board runs two warm-up steps, then the measured one (tools/gpu_record_step.py). The first warm-up step
differs from the others (AdamW makes its state inside it, the cuBLAS workspaces appear at its first matmuls); the second
and the measured one run the same ops on the same live tensors, so they ask the allocator for the same blocks in the same
order — the allocator's answers (which cached block, which new segment) differ, and the model gives those itself when the
calls are replayed through it. :class:`SteadyStepLog` logs the last warm-up step's ``malloc`` and ``free`` calls and
:meth:`SteadyStepLog.replay` makes them again, with fresh owners, as the measured step.

The replay is exact only for a **closed** step: one that frees nothing made before it and leaves nothing it made alive
(so the next step starts from the same live blocks); :meth:`SteadyStepLog.closed` says whether the logged step was, and
where it was not the caller traces the measured step as before. Checked on every step of the committed H200 record:
the measured step's events replayed are the traced step's, event for event (tests/test_steady_replay.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, no_type_check

__all__ = ["SteadyStepLog"]


@dataclass
class SteadyStepLog:
    """The allocator calls of one step: ``("malloc", owner, size, stream, op)`` and ``("free", owner, op)``, ``op`` the
    index of the op (in ``op_names``) during which the call was made, -1 before the step's first op."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    op_names: list[str] = field(default_factory=list)
    _made: set[Hashable] = field(default_factory=set)
    _freed_older = False

    @no_type_check  # per allocator call of a traced step (docs/suite_time.md, session 24)
    def malloc(self, owner: Hashable, size: int, stream: int = 0) -> None:
        self._made.add(owner)
        self.calls.append(("malloc", owner, size, stream, len(self.op_names) - 1))

    @no_type_check  # per allocator call of a traced step (docs/suite_time.md, session 24)
    def free(self, owner: Hashable) -> None:
        if owner in self._made:
            self._made.discard(owner)
        else:
            self._freed_older = True
        self.calls.append(("free", owner, len(self.op_names) - 1))

    def closed(self) -> bool:
        """Whether the logged step freed only what it made and left none of it alive: the next identical step then asks
        for the same blocks from the same live set."""
        return not self._freed_older and not self._made

    def replay(self, allocator: Any, ids: Iterator[int], op_starts: list[tuple[int, str]] | None = None) -> None:
        """Make the logged calls again on ``allocator``, each owner replaced by a fresh one (``("steady replay",
        next(ids))``); ``op_starts`` (when a list) receives ``(events before it, op name)`` for each logged op that made a
        call, as :class:`~resacct.account.gpu.records.recorded_history.WorkspaceRecorder` records them."""
        fresh: dict[Hashable, tuple[str, int]] = {}
        last_op = -2
        for call in self.calls:
            op = call[-1]
            if op_starts is not None and op != last_op and op >= 0:
                op_starts.append((len(allocator.events), self.op_names[op]))
            last_op = op
            if call[0] == "malloc":
                _, owner, size, stream, _ = call
                fresh[owner] = ("steady replay", next(ids))
                allocator.malloc(fresh[owner], size, stream)
            else:
                allocator.free(fresh.pop(call[1]))
