"""resacct as an installed package: the wheel carries every claims file and datasheet, and
``resacct verify --specs`` takes a folder or one file.

The full path a user takes (fresh venv outside the repository, ``pip install`` of the wheel,
``resacct verify`` and ``pytest --pyargs resacct`` from an empty folder) is
``tools/fresh_venv_install.sh``; its measured run is in the README.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from resacct.cli import main

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "resacct"
DATA_FILES = sorted(
    path.relative_to(PACKAGE).as_posix() for folder in ("specs", "facts/datasheets") for path in (PACKAGE / folder).iterdir() if path.is_file()
)


def test_the_package_has_claims_and_datasheets_to_ship():
    assert sum(name.endswith(".claims.yaml") for name in DATA_FILES) >= 15
    assert "facts/datasheets/accelerators.yaml" in DATA_FILES and "specs/claims.schema.json" in DATA_FILES


def test_every_data_file_matches_a_package_data_glob():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["resacct"]
    unshipped = [name for name in DATA_FILES if not any(fnmatch.fnmatch(name, glob) for glob in globs)]
    assert unshipped == []


@pytest.mark.slow
@pytest.mark.slow
def test_the_built_wheel_holds_every_claims_file_and_datasheet(tmp_path):
    (backend,) = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]  # "setuptools>=68"
    minimum = backend.removeprefix("setuptools>=")
    assert minimum != backend, f"the test reads only a 'setuptools>=X' build requirement, pyproject.toml has {backend!r}"
    setuptools = pytest.importorskip("setuptools", reason="building the wheel without isolation needs setuptools in this environment")
    if Version(setuptools.__version__) < Version(minimum):
        pytest.skip(f"building the wheel without isolation needs {backend} (pyproject.toml's build-system); this environment has setuptools {setuptools.__version__}")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "pytest_resacct.py"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "resacct", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("resacct-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"resacct/{name}" for name in DATA_FILES} <= names
    assert {"pytest_resacct.py", "resacct/cli/verify.py", "resacct/checks/flops.py"} <= names
    entry_points = zipfile.ZipFile(wheel).read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    assert "[pytest11]\nresacct = pytest_resacct" in entry_points and "resacct = resacct.cli:entry_point" in entry_points


DEVICES_CLAIMS = PACKAGE / "specs" / "devices.claims.yaml"


def test_verify_takes_one_claims_file_or_a_folder(tmp_path):
    from resacct.cli.verify import _claim_files

    assert _claim_files(DEVICES_CLAIMS, []) == [DEVICES_CLAIMS]
    assert DEVICES_CLAIMS in _claim_files(PACKAGE / "specs", []) and len(_claim_files(PACKAGE / "specs", [])) >= 15
    assert _claim_files(DEVICES_CLAIMS, ["devices"]) == [DEVICES_CLAIMS]


def test_verify_refuses_a_file_that_is_not_a_claims_file(tmp_path, capsys):
    other = tmp_path / "notes.yaml"
    other.write_text("claims: []\n")
    assert main(["verify", "--specs", str(other), "--report-dir", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"resacct verify: error: --specs '{other}' is not a *.claims.yaml file; pass a folder of them or one such file"]
