"""``resacct lora --device BOARD``'s board steps (:func:`~resacct.account.gpu.answers.command_answers.lora_gpu_answer`: the CUDA
caching allocator's peaks and the step time at a batch), traced on the second core while the CPU kernels' batch search
runs on the first — as ``fit --device`` does (:mod:`resacct.account.gpu.answers.traced_beside`, issue 34): the board's answer at
the command's batch first, then each batch the CPU search is about to probe, which is where the board's own search by
the reserved peak starts. What the child finished is used; anything else is traced here, as before.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["LoraBoardSteps"]


class LoraBoardSteps:
    """``steps(batch, timed=True)``: the board's :class:`~resacct.account.gpu.answers.device_answer.GpuStepAnswer` for the LoRA step
    at ``batch`` (``timed``: with its step time; a timed answer also serves a peaks-only question)."""

    def __init__(self, config: Any, args: argparse.Namespace, board: Any) -> None:
        self.config, self.args, self.board = config, args, board
        self.traced: dict[tuple[int, bool], Any] = {}
        self._beside: Any = None

    def __call__(self, batch: int, timed: bool = True) -> Any:
        found = self.traced.get((batch, timed)) or (None if timed else self.traced.get((batch, True)))
        if found is not None:
            return found
        from resacct.account.gpu.answers.command_answers import lora_gpu_answer

        args = self.args
        return lora_gpu_answer(self.config, rank=args.rank, targets=tuple(args.targets), base=args.base, batch=batch, seq=args.seq,
                               dropout=args.dropout, gradient_checkpointing=args.gradient_checkpointing, board=self.board, timed=timed)

    @contextlib.contextmanager
    def beside_search(self) -> Iterator[None]:
        """Inside: a child traces the board's step at the command's batch, then at each batch :meth:`ask` names; at the
        end what it finished is kept (a failure inside stops it, and nothing is kept). Nothing forked for a board that
        does not run the CUDA caching allocator, on one core, or without fork."""
        from resacct.account.gpu.answers.command_answers import cuda_board_gap
        from resacct.account.gpu.answers.traced_beside import TracedBeside

        if cuda_board_gap(self.board) is not None:
            yield
            return
        with TracedBeside(self) as beside:
            self._beside = beside
            beside.ask(self.args.batch, True)
            try:
                yield
                self.traced.update(beside.collect())
            finally:
                self._beside = None

    def ask(self, batch: int) -> None:
        """The CPU search is about to probe ``batch``: the child traces the board's peaks there (inside :meth:`beside_search`)."""
        if self._beside is not None:
            self._beside.ask(batch, False)
