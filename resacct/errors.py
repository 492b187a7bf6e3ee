"""The one root error class of resacct, and the few kinds a caller may want to tell apart.

Every error a user can provoke (a bad spec, a bad argument, a bad file) is a ``ResacctError``;
its message echoes the offending value and says what was expected.
"""

from __future__ import annotations

__all__ = ["ResacctError", "SpecError", "LawError", "UnknownNameError", "CheckpointError"]


class ResacctError(Exception):
    """Root of every error resacct raises on purpose."""


class SpecError(ResacctError):
    """A claims file or one claim in it is malformed.

    ``str(error)`` reads ``resacct/specs/x.claims.yaml:12: claim 'id': what is wrong``.
    """

    def __init__(self, problem: str, *, path: str = "", line: int | None = None, claim_id: str | None = None):
        self.problem = problem
        self.path = path
        self.line = line
        self.claim_id = claim_id
        super().__init__(self.location_prefix() + problem)

    def location_prefix(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
        prefix = f"{where}: " if where else ""
        if self.claim_id:
            prefix += f"claim '{self.claim_id}': "
        return prefix


class LawError(ResacctError):
    """A law (an arithmetic expression in a spec) is not allowed or cannot be evaluated."""


class UnknownNameError(ResacctError):
    """A name (device, dtype, check, strategy …) is not known; the message lists close matches."""

    def __init__(self, kind: str, name: object, known: list[str]):
        import difflib

        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listing = f"known: {', '.join(sorted(known))}" if len(known) <= 30 else f"one of {len(known)} known {kind} names"
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} {name!r}{hint} ({listing})")


class CheckpointError(ResacctError):
    """A checkpoint file is missing, damaged, foreign, or does not fit what it is loaded into;
    ``str(error)`` is one line that names the file. Raised by :mod:`resacct.training.checkpoint` and
    :mod:`resacct.training.checkpoint_file` (both re-export it)."""
