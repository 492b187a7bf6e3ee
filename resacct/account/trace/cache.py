"""Answers kept on disk: a second ``resacct account --hf-config`` or ``resacct fit --hf-config`` of
the same question reads the first one's traced answer instead of tracing the step again.

The key is the whole question — the config's values, the shapes, the recipe, the optimizer, the
attention implementation and the device kind the command names — and what answered it: the
versions of torch and transformers, resacct's version and a hash of the source and data files of
resacct's answering parts (account, measurement, formulas, facts, training, the shipped configs: an
edited resacct never reads an answer its older self traced). One file per answer,
``<kind>-<sha256 of the key>.pickle``, in the folder of :func:`cache_dir`:
``$RESACCT_CACHE_DIR``, else ``$XDG_CACHE_HOME/resacct/traces``, else ``~/.cache/resacct/traces``.

Caching is off unless a command turns it on (:func:`caching`): library calls, the claims and the
tests trace afresh. ``--no-cache`` or ``RESACCT_NO_CACHE=1`` keeps it off in the commands too
(the test suite sets the variable; the cache tests point ``RESACCT_CACHE_DIR`` at a temporary folder).
A file that cannot be read back whole — truncated, corrupt, another key's, from another format — is
ignored, the answer traced and the file written again; every write goes to a temporary file that is
renamed over the old one, so a reader never sees half a file. A folder keeps the
:data:`MAX_ANSWERS` answers used last. The files are pickles: read only your own cache folder.

Nothing here imports torch.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as folder, caching(True, folder=folder):
...     first = cached("demo", {"n": 3}, lambda: [3, 4])
...     second = cached("demo", {"n": 3}, lambda: ["traced again"])
>>> first, second, last_outcome()
([3, 4], [3, 4], 'hit')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["CACHE_DIR_ENV", "MAX_ANSWERS", "NO_CACHE_ENV", "cache_dir", "cache_key", "cache_wanted", "cached", "caching", "last_outcome", "read_stored", "source_fingerprint", "user_cache_root", "write_stored"]

CACHE_DIR_ENV = "RESACCT_CACHE_DIR"
NO_CACHE_ENV = "RESACCT_NO_CACHE"
_FORMAT = 1
#: The most answers a cache folder keeps (the least recently used go first).
MAX_ANSWERS = 256
_PACKAGE = Path(__file__).resolve().parents[2]

T = TypeVar("T")

_state: dict[str, Any] = {"enabled": False, "folder": None, "outcome": None}


def cache_dir() -> Path:
    """Where answers are kept: ``$RESACCT_CACHE_DIR``, else ``$XDG_CACHE_HOME/resacct/traces``,
    else ``~/.cache/resacct/traces`` (created when the first answer is written)."""
    if _state["folder"] is not None:
        return Path(_state["folder"])
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    return user_cache_root() / "traces"


def user_cache_root() -> Path:
    """resacct's folder in the user's cache: ``$XDG_CACHE_HOME/resacct``, else ``~/.cache/resacct`` (the trace cache's
    ``traces``, verify's ``measurements``: :mod:`resacct.harness.replay`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "resacct"


@contextlib.contextmanager
def caching(enabled: bool = True, *, folder: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Answers read from and written to the cache inside the block (``enabled`` False: traced
    afresh, nothing written); ``folder`` overrides :func:`cache_dir`."""
    saved = (_state["enabled"], _state["folder"])
    _state["enabled"] = enabled
    _state["folder"] = folder
    try:
        yield
    finally:
        _state["enabled"], _state["folder"] = saved  # the last outcome stays readable after the block


def cache_wanted(no_cache: bool) -> bool:
    """Whether a command caches: not with ``--no-cache`` (``no_cache``), nor with ``RESACCT_NO_CACHE``
    set to anything but empty or ``0``."""
    return not no_cache and os.environ.get(NO_CACHE_ENV, "") in ("", "0")


def last_outcome() -> str | None:
    """What the last :func:`cached` call did: ``hit``, ``stored`` (traced, then written), ``unwritable``
    (traced; the folder refused the file), ``off`` (caching off) — None before any call."""
    return _state["outcome"]


#: The parts of resacct an answer is computed by (the commands render it afresh; claims, checks, harness and reports never touch it).
_ANSWERING = ("account", "measurement", "formulas", "facts", "training", "hf_configs", "errors.py", "__init__.py")
#: The GPU records a ``--device BOARD`` answer is calibrated by (resacct.account.gpu.records.recorded): the copies an installed
#: resacct ships and, in a checkout, the committed ones under docs/gpu — a record edited or added gives new keys.
_RECORDS = (_PACKAGE / "specs" / "gpu_records", _PACKAGE.parent / "docs" / "gpu")


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over the ``.py``, ``.yaml`` and ``.json`` files of the parts of resacct that compute an
    answer and the GPU records (paths and contents): any edit of them gives new keys."""
    digest = hashlib.sha256()
    files = [p for part in _ANSWERING for p in ((_PACKAGE / part).rglob("*") if (_PACKAGE / part).is_dir() else [_PACKAGE / part])]
    files += [p for folder in _RECORDS if folder.is_dir() for p in folder.glob("*.json")]
    for path in sorted(p for p in files if p.suffix in (".py", ".yaml", ".json") and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(_PACKAGE.parent) if path.is_relative_to(_PACKAGE.parent) else path).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def cache_key(kind: str, question: dict[str, Any]) -> str:
    """The JSON text that names an answer: ``kind``, the ``question`` (JSON-able values; anything
    else by its ``repr``) and the versions and source hash that answered it."""
    versions = {"torch": _version("torch"), "transformers": _version("transformers"), "resacct": _version("resacct"),
                "resacct_source": source_fingerprint(), "format": _FORMAT}
    return json.dumps({"kind": kind, "question": question, "versions": versions}, sort_keys=True, default=repr)


#: An answer file's name (:func:`_path`): the only files :func:`_prune` removes.
_ANSWER_NAME = re.compile(r"[A-Za-z0-9_-]+-[0-9a-f]{40}\.pickle")


def _path(kind: str, key: str) -> Path:
    return cache_dir() / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:40]}.pickle"


def read_stored(path: Path, key: str) -> tuple[bool, Any]:
    """(True, the answer) when ``path`` holds ``key``'s answer whole; (False, None) otherwise (missing, truncated,
    corrupt, another key's or format's). Also :mod:`resacct.harness.replay`'s measurements."""
    try:
        with open(path, "rb") as handle:
            stored = pickle.load(handle)
    except Exception:  # missing, truncated, corrupt, a class that moved: traced again  # noqa: BLE001
        return False, None
    if not isinstance(stored, dict) or stored.get("format") != _FORMAT or stored.get("key") != key:
        return False, None
    return True, stored.get("answer")


def write_stored(path: Path, key: str, answer: Any) -> bool:
    """Write ``answer`` under ``key`` to a temporary file beside ``path``, then rename it over ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = pickle.dumps({"format": _FORMAT, "key": key, "answer": answer}, protocol=pickle.HIGHEST_PROTOCOL)
        handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _prune(folder: Path, keep: int) -> None:
    """Keep the ``keep`` answers used last (a hit touches its file), removing the rest: every edit
    of resacct makes new keys, so old answers would pile up. Only files named as :func:`_path` names them
    (``<kind>-<40 hex digits>.pickle``) are removed: a ``$RESACCT_CACHE_DIR`` shared with other files loses none of them."""
    try:
        files = sorted((path for path in folder.glob("*.pickle") if _ANSWER_NAME.fullmatch(path.name)),
                       key=lambda path: path.stat().st_mtime_ns, reverse=True)
        for path in files[keep:]:
            path.unlink()
    except OSError:
        pass  # another process pruned it first, or the folder is not ours to clean: leave it


def cached(kind: str, question: dict[str, Any], compute: Callable[[], T]) -> T:
    """``compute()``'s answer to ``question``, read from the cache when :func:`caching` is on and a
    whole file holds it; else computed (and, caching on, written)."""
    if not _state["enabled"]:
        _state["outcome"] = "off"
        return compute()
    key = cache_key(kind, question)
    path = _path(kind, key)
    found, answer = read_stored(path, key)
    if found:
        _state["outcome"] = "hit"
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be pruned
        return answer  # type: ignore[no-any-return]
    answer = compute()
    _state["outcome"] = "stored" if write_stored(path, key, answer) else "unwritable"
    if _state["outcome"] == "stored":
        _prune(path.parent, MAX_ANSWERS)
    return answer
