"""Errors raised inside a user's code (a ``--model module:factory`` factory, the model's forward,
its loss or backward) turned into one line: what raised, the message, and the user's frame.

>>> def factory():
...     raise ValueError("width must be even")
>>> try:
...     with calling_user_code("factory 'pkg:factory'"):
...         factory()
... except UserCodeError as error:
...     print(str(error).split(" (at ")[0])
factory 'pkg:factory' raised ValueError: width must be even
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from types import TracebackType

from resacct.errors import ResacctError

__all__ = ["UserCodeError", "user_frame", "code_location", "calling_user_code", "MAX_MESSAGE_CHARS"]

MAX_MESSAGE_CHARS = 300
_TYPE_CHECK_WRAPPERS = ("jaxtyping", "beartype", "typeguard")  # run-time type checks wrap resacct's functions


class UserCodeError(ResacctError):
    """A user's factory, forward, loss or backward raised: one line naming the frame it came from."""


#: resacct's own folder (this module lives in it; not ``import resacct``, which would point the
#: import graph from here back up at the package's API).
_RESACCT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def _is_library(filename: str) -> bool:
    import torch

    if filename.startswith((os.path.join(os.path.dirname(torch.__file__), ""), _RESACCT_DIR)):
        return True
    if any(f"{os.sep}{wrapper}{os.sep}" in filename for wrapper in _TYPE_CHECK_WRAPPERS):
        return True
    standard_library = os.path.join(os.path.dirname(contextlib.__file__), "")
    return filename.startswith(standard_library) and "-packages" not in filename


def user_frame(trace: TracebackType | None, fallback: str | None = None) -> str | None:
    """``file:line in function`` of the innermost frame outside torch, resacct and the standard
    library (the user's, or a library such as transformers when the error is raised there). When
    every frame is library code (a forward called with missing arguments): ``fallback`` if given,
    else the innermost frame of all."""
    frames = traceback.extract_tb(trace)
    outside = [frame for frame in frames if not _is_library(frame.filename)]
    if not outside and fallback:
        return fallback
    if not frames:
        return None
    chosen = (outside or frames)[-1]
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def code_location(function: object) -> str | None:
    """``file:line in name`` where ``function`` is defined (None when Python cannot tell).

    >>> code_location(code_location).endswith("in code_location")
    True
    """
    import inspect

    try:
        target = inspect.unwrap(function)  # type: ignore[arg-type]
        lines = inspect.getsourcelines(target)
        return f"{inspect.getsourcefile(target)}:{lines[1]} in {getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
    except (TypeError, OSError):
        return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 1] + "…"


@contextlib.contextmanager
def calling_user_code(what: str, *, hint: str = "", fallback: str | None = None) -> Iterator[None]:
    """Run user code; any exception that is not a :class:`ResacctError` becomes a
    :class:`UserCodeError`: ``<what> raised <Type>: <first line of the message> (at file:line in
    function)<hint>``. ``RecursionError`` and ``MemoryError`` included; ``KeyboardInterrupt`` and
    ``SystemExit`` pass through. ``fallback``: the location to name when no frame is the user's
    (e.g. :func:`code_location` of the model's forward)."""
    try:
        yield
    except ResacctError:
        raise
    except Exception as error:  # the user's code may raise anything
        frame = user_frame(sys.exc_info()[2], fallback)
        where = f" (at {frame})" if frame else ""
        raise UserCodeError(f"{what} raised {type(error).__name__}: {_first_line(error)}{where}{hint}") from None
