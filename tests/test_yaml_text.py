"""resacct.facts.yaml_text: libyaml's parse, where PyYAML has it, gives what PyYAML's own gives."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest
import yaml

from resacct.facts.yaml_text import safe_load_text

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "resacct" / "hf_configs" / "known.yaml", Path(str(importlib.resources.files("resacct.facts").joinpath("datasheets", "accelerators.yaml")))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_the_shipped_tables_read_the_same_as_pyyamls_own_parse(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert safe_load_text(text) == yaml.safe_load(text) and len(safe_load_text(text)) >= 20


def test_it_is_a_safe_load_with_yaml_1_1_scalars() -> None:
    assert safe_load_text("a: 1.0e-05\nb: yes\nc: [1, 2]\nd: ~\n") == {"a": 1e-05, "b": True, "c": [1, 2], "d": None}
    with pytest.raises(yaml.YAMLError):
        safe_load_text("!!python/object/apply:os.system ['true']")
