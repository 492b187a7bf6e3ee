"""Issue 32: every torch pyproject admits is proven on every landing. The gate (.ci/run) runs the
floor torch and tox.ini's hf-floor commands in cached venvs made from tox.ini's own pins
(tools/matrix_venv.sh); docs/matrix.md is written by tools/matrix.sh, never by hand."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    return tox


def _torch_floor() -> Version:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (torch,) = [Requirement(text) for text in dependencies if Requirement(text).name == "torch"]
    (floor,) = [Version(spec.version) for spec in torch.specifier if spec.operator == ">="]
    return floor


def test_the_floor_env_installs_the_floor_torch_pyproject_admits():
    """Raising pyproject's torch floor without moving torch24 (or the reverse) fails here."""
    pins = [line.strip() for line in _tox()["testenv"]["deps"].splitlines() if line.strip().startswith("torch24: torch==")]
    assert len(pins) == 1, pins
    pinned = Version(pins[0].split("==")[1])
    assert pinned.release[:2] == _torch_floor().release[:2], f"tox torch24 pins {pinned}, pyproject admits torch>={_torch_floor()}"


def test_the_torch_envs_install_the_hf_extras_and_use_every_core():
    base = _tox()["testenv"]
    assert {extra.strip() for extra in base["extras"].replace("\n", ",").split(",") if extra.strip()} >= {"test", "hf", "finetune"}
    assert "-n auto" in base["commands"] and "--run-slow" in base["commands"]
    assert "pytest -n auto" in _tox()["testenv:hf-floor"]["commands"], "hf-floor's tests run on one core"


def test_the_gate_runs_the_floor_torch_and_hf_floor_from_cached_venvs():
    gate = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "tools/matrix_venv.sh torch24" in gate and "tools/matrix_venv.sh hf-floor" in gate
    assert "--commands hf-floor" in gate and '"$floor_status" "$hf_floor_status"' in gate


def test_the_venv_script_reads_the_tox_envs_commands():
    listed = subprocess.run(["bash", str(ROOT / "tools" / "matrix_venv.sh"), "--commands", "hf-floor"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    commands = listed.stdout.strip().splitlines()
    own = [line.strip() for line in _tox()["testenv:hf-floor"]["commands"].splitlines() if line.strip()]
    assert len(commands) == len(own) == 2
    assert commands[0].split() == own[0].replace("{posargs}", "").split()
    assert commands[1] == own[1].replace("{toxinidir}", str(ROOT)).replace("{envname}", "hf-floor")
    unknown = subprocess.run(["bash", str(ROOT / "tools" / "matrix_venv.sh"), "--commands", "torch99"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0 and "no env 'torch99' in tox.ini" in unknown.stderr


def test_the_workflow_runs_the_tox_envs_on_python_3_11_to_3_13():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "claims.yml").read_text(encoding="utf-8"))
    matrix = workflow["jobs"]["cpu-matrix"]["strategy"]["matrix"]
    envs = [env.strip() for env in _tox()["tox"]["envlist"].split(",")]
    assert matrix["toxenv"] == envs and {"3.11", "3.12", "3.13"} <= set(matrix["python"])


def test_the_matrix_document_was_written_by_a_run_on_a_commit_of_this_repository():
    document = json.loads((ROOT / "docs" / "matrix.json").read_text(encoding="utf-8"))
    markdown = (ROOT / "docs" / "matrix.md").read_text(encoding="utf-8")
    assert f"at commit `{document['commit']}`" in markdown and "Written by `tools/matrix.sh" in markdown
    floors = [env for env in document["envs"] if Version(env["torch"]).release[:2] == _torch_floor().release[:2]]
    assert floors, f"docs/matrix.json has no env on the floor torch {_torch_floor()}: {[env['torch'] for env in document['envs']]}"
    for env in document["envs"]:
        assert env["claims"] == sum(env[outcome] for outcome in ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid"))
        assert f"| {env['env']} | " in markdown and f" | {env['torch']} | " in markdown
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git checkout (a shallow clone may lack the matrix's commit)")
    known = subprocess.run(["git", "cat-file", "-e", f"{document['commit']}^{{commit}}"], cwd=ROOT, capture_output=True, timeout=60)
    assert known.returncode == 0, f"docs/matrix.json names commit {document['commit']}, which this repository does not have"


def test_the_gate_and_the_matrix_measure_every_claim_afresh():
    """No verify in the gate or a tox env replays what an earlier run stored (resacct.harness.replay), nor writes under
    ~/.cache: .ci/run exports RESACCT_NO_CACHE=1 before its first verify, and tox's envs set it."""
    gate = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export RESACCT_NO_CACHE=1" in gate
    assert gate.index("export RESACCT_NO_CACHE=1") < gate.index("tools/matrix_venv.sh --commands hf-floor") < gate.index("bash tools/machine_kinds.sh")
    setenv = _tox()["testenv"]["setenv"]
    assert "RESACCT_NO_CACHE = 1" in setenv
    assert "RESACCT_NO_CACHE=1" in (ROOT / "tools" / "machine_kinds.sh").read_text(encoding="utf-8")
