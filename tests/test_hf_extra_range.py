"""Issue 26: the declared ``transformers>=4.40`` let pip pick 4.57.6, with which every
``--hf-config`` crashed ("unsupported scalarType"). The ``hf`` extra declares the tested range."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def hf_requirement() -> Requirement:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]["hf"]
    (requirement,) = [Requirement(text) for text in extras if Requirement(text).name == "transformers"]
    return requirement


@pytest.mark.parametrize("version", ["4.40.0", "4.57.6", "6.0.0"])
def test_the_hf_extra_excludes_untested_and_broken_transformers(version: str):
    assert not hf_requirement().specifier.contains(Version(version))


def test_the_hf_extra_admits_the_tested_floor_and_the_installed_transformers():
    specifier = hf_requirement().specifier
    assert specifier.contains(Version("5.23.0"))
    transformers = pytest.importorskip("transformers")
    assert specifier.contains(Version(transformers.__version__)), f"transformers {transformers.__version__} is installed but outside {specifier}"


def test_the_tox_floor_env_installs_the_lowest_versions_the_extras_admit():
    """``tox -e hf-floor`` tests the floor of the declared range: its pins must be that floor, so
    raising (or lowering) the floor in pyproject.toml without moving the env fails here."""
    import configparser
    import tomllib

    tox = configparser.ConfigParser()
    tox.read(PYPROJECT.parent / "tox.ini", encoding="utf-8")
    pins = dict(line.strip().split("==") for line in tox["testenv:hf-floor"]["deps"].split("\n") if "==" in line)
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for name in ("transformers", "peft"):
        requirements = [Requirement(text) for group in ("hf", "finetune") for text in extras[group] if Requirement(text).name == name]
        floors = {spec.version for requirement in requirements for spec in requirement.specifier if spec.operator == ">="}
        assert len(floors) == 1, f"{name}: expected one >= floor across the extras, got {floors}"
        (floor,) = floors
        assert Version(pins[name]) == Version(floor), f"tox hf-floor pins {name}=={pins[name]}, the extras' floor is {floor}"
