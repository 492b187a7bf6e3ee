"""A board record's claims as ``tools/gpu_record.py --claims`` writes them, decided by ``resacct verify`` in processes of
their own (tests/test_board_record.py, tests/test_board_record_serving.py)."""

from __future__ import annotations

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
