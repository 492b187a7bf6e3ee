"""Measurements a ``resacct verify`` made, kept on disk and replayed by the next run on the same setup
(issue 34: "measurements and traces are cached ... on disk, shared by every claim ... that asks the
same thing").

A claim's measurement — its check's :class:`~resacct.harness.registry.Outcome`: PyTorch's value,
resacct's prediction, the quantities — is a function of the check, its inputs and the setup it ran
on. When every part of that setup is the same, the next run reads the stored outcome and judges it
(law, expect, tolerance and status are read from the spec afresh, so an edited spec is judged anew).
The key names the whole setup, and anything else makes a new key:

- the check's name and inputs, and torch's intra-op thread count when it ran;
- :func:`setup_fingerprint`: every ``.py``, ``.yaml`` and ``.json`` file of the resacct package but the
  claims' own ``*.claims.yaml`` (their inputs are in the key), the GPU records under ``docs/gpu``,
  every installed distribution's name and version, the Python version, this machine's profile
  (:func:`resacct.measurement.machine_profile.this_machine`: ISA, bf16 kernels, cores, faked or not),
  its CPU model and flags and memory, and every environment variable that steers torch's kernels,
  threads, libraries or resacct itself (``ONEDNN_*``, ``ATEN_*``, ``OMP_*``, ``MKL_*``, ``TORCH_*``, ``RESACCT_*``, ``LD_LIBRARY_PATH``,
  ``PYTHONPATH``…).

A ``forall`` claim's examples are replayed one by one, each under its own inputs, where they repeat from run to run (the
derandomised ``ci`` Hypothesis profile: ``resacct verify``'s default, ``CI=true``'s); the ``dev`` profile's (``verify
--explore``) are new every run and always measured. Never replayed: a timed claim (its value is this moment's), a GPU
claim, a check declared ``replay=False``, and a measurement that raised (a check declared ``replay=f`` adds
``f(inputs)`` to its key: the recorded claims, the sha256 of the record file they name). ``resacct verify
--no-cache`` (or ``RESACCT_NO_CACHE=1``) measures every claim afresh and stores nothing; pytest runs
(the test suite, ``.ci/run``) never replay. Each report names the claims replayed and when their
measurement was made (``replayed_from`` in report.json).

Files: ``<cache>/measurements/<setup fingerprint>/<sha256 of the key>.pickle`` (the cache folder of
:mod:`resacct.account.trace.cache`: ``$RESACCT_CACHE_DIR``, else ``~/.cache/resacct``); a file that
cannot be read back whole, or holds another key, is measured again and rewritten (written to a
temporary file, then renamed). The :data:`KEPT_SETUPS` setups used last are kept, older ones removed.
Pickles: read only your own cache folder.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import pickle
import platform
import re
import shutil
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from resacct.account.trace.cache import CACHE_DIR_ENV, cache_wanted, read_stored, user_cache_root, write_stored

__all__ = ["KEPT_SETUPS", "StoredMeasurement", "is_stored", "measurements_dir", "replaying", "replay_folder", "replay_key",
           "setup_fingerprint", "stored_measurement", "store_measurement"]

_FORMAT = 1
#: How many setups' folders a cache keeps (the least recently used go first): every edit of resacct is a new setup.
KEPT_SETUPS = 3
_PACKAGE = Path(__file__).resolve().parents[1]
#: Environment variables whose values can change what a check measures (kernels, threads, allocators, resacct's switches).
_STEERING_PREFIXES = ("ONEDNN_", "DNNL_", "ATEN_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_",
                      "HF_", "TRANSFORMERS_", "RESACCT_", "LD_PRELOAD", "LD_LIBRARY_PATH", "MALLOC_", "PYTHONPATH", "PYTHONHASHSEED")
#: Of those, the ones that only say where files go, whether to replay, or which examples a forall claim draws (each
#: example's measurement is keyed by its own inputs): not part of the setup.
_NOT_STEERING = {CACHE_DIR_ENV, "RESACCT_NO_CACHE", "RESACCT_HYPOTHESIS_PROFILE"}

#: Fields of the machine profile that describe the moment, not the machine (the load when the run began).
_MOMENTARY_PROFILE_FIELDS = {"load_average_start"}

#: A setup folder's name: the fingerprint's first 32 hex digits (the only folders :func:`_prune_setups` removes).
_SETUP_NAME = re.compile(r"[0-9a-f]{32}")

_state: dict[str, Any] = {"folder": None, "run": None}


def measurements_dir() -> Path:
    """Where measurements are kept: ``$RESACCT_CACHE_DIR/measurements``, else ``$XDG_CACHE_HOME/resacct/measurements``,
    else ``~/.cache/resacct/measurements``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser() / "measurements"
    return user_cache_root() / "measurements"


@contextlib.contextmanager
def replaying(no_cache: bool, *, folder: str | os.PathLike[str] | None = None) -> Iterator[Path | None]:
    """Store and replay measurements inside the block (``resacct verify``), unless ``no_cache`` or
    ``RESACCT_NO_CACHE`` says not to; ``folder`` overrides :func:`measurements_dir`. Yields the setup's
    folder (None: off). Forked workers inherit the switch."""
    saved = dict(_state)
    _state.update(folder=None, run=uuid.uuid4().hex)  # this run's measurements, shared by its claims, are not "earlier"
    if cache_wanted(no_cache):
        _state["folder"] = Path(folder) if folder is not None else measurements_dir()
        setup_fingerprint()  # hashed once here, before any worker is forked
        with contextlib.suppress(OSError):
            os.utime(replay_folder())  # used now: the last setup to be pruned
    try:
        yield replay_folder()
    finally:
        _state.update(saved)


def replay_folder() -> Path | None:
    """This setup's folder of stored measurements while :func:`replaying` is on, else None."""
    return None if _state["folder"] is None else _state["folder"] / setup_fingerprint()[:32]


def _package_files() -> list[Path]:
    files = [path for path in _PACKAGE.rglob("*") if path.suffix in (".py", ".yaml", ".json") and "__pycache__" not in path.parts
             and not path.name.endswith(".claims.yaml")]
    records = _PACKAGE.parent / "docs" / "gpu"
    return sorted(files + (sorted(records.glob("*.json")) if records.is_dir() else []))


def _distributions() -> list[str]:
    from importlib.metadata import distributions

    return sorted({f"{dist.metadata['Name']}=={dist.version}" for dist in distributions() if dist.metadata['Name']})


def _machine() -> dict[str, Any]:
    from resacct.measurement.machine_profile import this_machine

    cpu: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "flags", "Features", "CPU part") and name.strip() not in cpu:
                cpu[name.strip()] = value.strip()
    with contextlib.suppress(OSError):
        cpu["memory"] = next((line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")), "")
    profile = {name: value for name, value in asdict(this_machine()).items() if name not in _MOMENTARY_PROFILE_FIELDS}
    return {"profile": profile, "cpu": cpu, "platform": platform.platform(), "cores": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def _steering_environment() -> dict[str, str]:
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith(_STEERING_PREFIXES) and name not in _NOT_STEERING}


@functools.lru_cache(maxsize=1)
def setup_fingerprint() -> str:
    """sha256 over everything but the check and its inputs that a measurement depends on (module docstring)."""
    digest = hashlib.sha256()
    for path in _package_files():
        digest.update(str(path.relative_to(_PACKAGE.parent) if path.is_relative_to(_PACKAGE.parent) else path).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    setup = {"python": sys.version, "distributions": _distributions(), "machine": _machine(), "environment": _steering_environment()}
    digest.update(json.dumps(setup, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def replay_key(check: str, inputs: Mapping[str, Any], *, threads: int | None = None) -> str:
    """The JSON text that names one measurement: the check, its inputs (anything not JSON by its ``repr``),
    torch's thread count (``threads``, else this process's now) and the setup's fingerprint."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return json.dumps({"check": check, "inputs": dict(inputs), "threads": threads, "setup": setup_fingerprint(),
                       "format": _FORMAT}, sort_keys=True, default=repr)


def _path(folder: Path, key: str) -> Path:
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.pickle"


class StoredMeasurement:
    """A stored outcome, when it was measured (ISO 8601, UTC) and whether an earlier run measured it (False: another claim of
    this run asked the same check the same thing first)."""

    __slots__ = ("outcome", "measured_at", "earlier")

    def __init__(self, outcome: Any, measured_at: str, earlier: bool) -> None:
        self.outcome = outcome
        self.measured_at = measured_at
        self.earlier = earlier


def stored_measurement(check: str, inputs: Mapping[str, Any]) -> StoredMeasurement | None:
    """The outcome stored for this check and these inputs on this setup, or None (off, not stored, unreadable)."""
    folder = replay_folder()
    if folder is None:
        return None
    key = replay_key(check, inputs)
    found, stored = read_stored(_path(folder, key), key)
    if not found or not isinstance(stored, dict) or "outcome" not in stored:
        return None
    return StoredMeasurement(stored["outcome"], str(stored.get("measured_at", "an unknown time")), stored.get("run") != _state["run"])


def is_stored(check: str, inputs: Mapping[str, Any], *, threads: int) -> bool:
    """Whether this setup holds a stored measurement for the check and inputs, made with ``threads`` torch threads — its
    file is there (whether it reads back whole is found when the claim runs): the cheap question a run's scheduling asks
    of every claim before any runs (:mod:`resacct.harness.workers`)."""
    folder = replay_folder()
    return folder is not None and _path(folder, replay_key(check, inputs, threads=threads)).is_file()


def store_measurement(check: str, inputs: Mapping[str, Any], outcome: Any) -> bool:
    """Keep ``outcome`` for the next run (when :func:`replaying` is on); whether it was written."""
    folder = replay_folder()
    if folder is None or not _reads_back_equal(outcome):
        return False
    key = replay_key(check, inputs)
    measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    first = not folder.exists()
    written = write_stored(_path(folder, key), key, {"outcome": outcome, "measured_at": measured_at, "run": _state["run"]})
    if written and first:
        _prune_setups(folder.parent, keep=KEPT_SETUPS, current=folder)
    return written


def _reads_back_equal(outcome: Any) -> bool:
    """Whether ``outcome`` survives a pickle round trip equal to itself (a NaN, a tensor or an object without
    ``==`` does not: such an outcome is measured every run)."""
    try:
        return bool(pickle.loads(pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)) == outcome)
    except Exception:  # noqa: BLE001 - unpicklable, or == that raises (a tensor's): not stored
        return False


def _prune_setups(parent: Path, *, keep: int, current: Path) -> None:
    """Remove all but the ``keep`` setup folders used last (``current`` always stays). Only folders named as this module
    names them (32 hex digits) are ever removed: a ``$RESACCT_CACHE_DIR`` pointed at a folder of the user's loses nothing else."""
    try:
        folders = sorted((path for path in parent.iterdir() if path.is_dir() and path != current and _SETUP_NAME.fullmatch(path.name)),
                         key=lambda path: path.stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for old in folders[keep - 1:]:
        shutil.rmtree(old, ignore_errors=True)
