"""tools/gpu_tier.sh, the GPU tier's one script (issue 25; docs/gpu.md): its ``--dry-run`` on the
CPU checks every step a lent GPU machine would run, so the script cannot rot between loans.

The dry run here is a fresh CI clone's: no carried wheels (``GPU_TIER_WHEELS`` points at an empty
folder), so it must warn with what ``tools/gpu_tier_wheels.sh`` would fetch, and still pass.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

#: the module's dry run (a fixture, ~10 s) is made once: every test of this file on one xdist worker
pytestmark = pytest.mark.xdist_group("gpu-tier-dry-run")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_tier.sh"
WHEELS_SCRIPT = REPO / "tools" / "gpu_tier_wheels.sh"


def _gpu_claim_ids() -> list[str]:
    ids = []
    for path in sorted((REPO / "resacct" / "specs").glob("*.claims.yaml")):
        for claim in yaml.safe_load(path.read_text()).get("claims", []):
            if "gpu" in (claim.get("marks") or []):
                ids.append(claim["id"])
    return ids


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("gpu-tier-out")
    no_wheels = tmp_path_factory.mktemp("no-wheels")
    home = tmp_path_factory.mktemp("home")  # matplotlib's config folder goes there, not into $OUT
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "GPU_TIER_WHEELS": str(no_wheels), "PYTHON": sys.executable, "HOME": str(home)}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return done, out


@pytest.mark.slow
def test_dry_run_passes_without_wheels_and_collects_every_gpu_claim(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    expected = _gpu_claim_ids()
    assert len(expected) >= 18
    count = re.search(r"^gpu claims collected: (\d+)$", done.stdout, re.M)
    assert count is not None and int(count.group(1)) == len(expected), done.stdout[-3000:]
    for claim_id in expected:
        assert f"::{claim_id}" in done.stdout
    # CI has no wheels: a warning naming what the wheels script would fetch, not a failure
    warning = next(line for line in done.stdout.splitlines() if line.startswith("WARNING:"))
    for requirement in subprocess.run(["bash", str(WHEELS_SCRIPT), "--list"], capture_output=True, text=True, check=True).stdout.split():
        assert requirement in warning
    assert "resacct (built from this checkout)" in warning


@pytest.mark.slow
def test_dry_run_writes_the_out_layout(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, out = dry_run
    assert sorted(p.name for p in out.iterdir()) == ["gpu-tier.log", "machine.json", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True and summary["failed"] == []
    assert [step["name"] for step in summary["steps"]] == ["wheels", "imports", "machine", "collect-gpu-claims", "commands"]
    assert all(step["status"] == "ok" and step["exit"] == 0 for step in summary["steps"])
    machine = json.loads((out / "machine.json").read_text())
    assert machine["machine"]["cpu_model"] and "gpu" in machine["machine"]  # `resacct machine --json`: the profile the claims are decided on
    log = (out / "gpu-tier.log").read_text()
    assert "gpu claims collected:" in log and "== GPU tier: every step ok" in log


def test_wheels_list_pins_what_the_device_image_lacks() -> None:
    listed = subprocess.run(["bash", str(WHEELS_SCRIPT), "--list"], capture_output=True, text=True, check=True).stdout.split()
    names = {line.split("==")[0] for line in listed}
    assert {"beartype", "pydantic", "pydantic-core", "annotated-types", "typing-inspection"} <= names
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9][0-9a-z.]*", line) for line in listed)


def test_bad_argument_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--bogus"], cwd=REPO, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr
