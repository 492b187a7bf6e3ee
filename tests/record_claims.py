"""A board record's claims as ``tools/gpu_record.py --claims`` writes them, decided by ``resacct verify`` in processes of
their own (tests/test_board_record.py, tests/test_board_record_serving.py); the scripts under tools/ and benchmarks/
imported by name, and a synthetic board record written from dry-run entries (tests/test_board_record_anchors.py,
tests/test_board_op_times.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def generated_claims(record: str) -> str:
    """The YAML claims the generator prints for ``record`` (it must succeed)."""
    done = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_record.py"), "--claims", record], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


def verified(claims: str, folder: Path, source: str) -> dict[str, Any]:
    """``claims`` in a spec of area gpu_recorded under ``folder``, decided by ``resacct verify --json``: its report."""
    spec = folder / "gpu_recorded.claims.yaml"
    spec.write_text(f"area: gpu_recorded\nsource: {source}\nclaims:\n" + claims)
    done = subprocess.run([sys.executable, "-m", "resacct", "verify", "--specs", str(spec), "--json", "--no-roofline", "--no-timeline",
                           "--report-dir", str(folder / "report")], capture_output=True, text=True, timeout=300, cwd=folder)
    return json.loads(done.stdout)


def script_module(name: str) -> Any:
    """A script of tools/ or benchmarks/ (``gpu_record_step``, ``board_op_times`` …) imported as a module, both folders on
    the path while it imports (they import each other by name)."""
    folders = [str(REPO / "tools"), str(REPO / "benchmarks")]
    sys.path[:0] = folders
    try:
        return __import__(name)
    finally:
        for folder in folders:
            sys.path.remove(folder)


def synthetic_record(path: Path, *, steps: list[dict[str, Any]], ceilings: dict[str, Any], serving: list[dict[str, Any]] | None = None) -> str:
    """A board record at ``path`` holding ``steps`` (and ``serving``) as an H200's, with ``ceilings`` written by hand: a dry
    run's entries relabelled — the plumbing and the rules, not a board's numbers. Returns the path as a string."""
    import torch

    from resacct.account.gpu.records.record import RECORD_FORMAT

    record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "torch": torch.__version__,
              "allocator_settings": {}, "steps": steps, "ceilings": ceilings, "library_probe": {}, **({"serving": serving} if serving else {})}
    with gzip.open(path, "wt") as handle:
        json.dump(record, handle)
    return str(path)
