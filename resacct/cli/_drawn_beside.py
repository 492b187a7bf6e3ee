"""A figure of ``resacct verify``'s report drawn while the claims run, where the run can (beside its
workers at idle priority: :func:`resacct.harness.run.run_claims`' ``beside_jobs``), else at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["DrawnBeside"]


class DrawnBeside:
    """A figure drawn while the claims run (beside the workers at idle priority, when the run has
    them: :func:`resacct.harness.run.run_claims`' ``beside_jobs``), else, or where that failed, at the end."""

    def __init__(self, draw: Callable[[], Path]) -> None:
        self.draw = draw
        self.drawn: Path | None = None

    def __call__(self) -> None:
        try:
            self.drawn = self.draw()
        except Exception:  # noqa: BLE001 - drawn again at the end, where its error is the run's as before
            self.drawn = None

    def path(self) -> Path:
        return self.drawn if self.drawn is not None else self.draw()
