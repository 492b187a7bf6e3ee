"""libyaml composes the claims files (15 times faster); the pure-Python composer, which words
every hostile input as a SpecError on its line, decides wherever the two could differ. Both must
give the same data for every shipped spec, and the same outcome for every hostile one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from resacct.errors import SpecError
from resacct.harness import yaml_nodes

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "resacct" / "specs").glob("*.claims.yaml"))
HOSTILE = sorted((ROOT / "tests" / "hostile_specs").glob("*.yaml"))


def checked_path_only(text: str, path: str):  # type: ignore[no-untyped-def]
    """What compose() gave before the fast path: the pure-Python composer alone."""
    original = yaml_nodes._fast_compose
    yaml_nodes._fast_compose = lambda text: None
    try:
        return outcome(text, path)
    finally:
        yaml_nodes._fast_compose = original


def outcome(text: str, path: str):  # type: ignore[no-untyped-def]
    try:
        node = yaml_nodes.compose(text, path)
        return ("empty", None) if node is None else ("data", yaml_nodes.to_python(node, path))
    except SpecError as error:
        return ("error", str(error))


def test_libyaml_is_there() -> None:
    assert yaml.__with_libyaml__, "PyYAML without libyaml: every claims file takes the slow path"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_every_shipped_spec_reads_the_same_either_way(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert outcome(text, path.name) == checked_path_only(text, path.name)


def test_the_shipped_specs_take_the_fast_path() -> None:
    slow = [path.name for path in SHIPPED if yaml_nodes._fast_compose(path.read_text(encoding="utf-8")) is None]
    assert slow == []


@pytest.mark.parametrize("path", HOSTILE, ids=lambda path: path.name)
def test_every_hostile_spec_gets_the_same_outcome(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    assert outcome(text, path.name) == checked_path_only(text, path.name)


@pytest.mark.parametrize("text, message", [
    ("a: &x 1\nb: *x\n", "YAML anchors (&x) are not allowed"),
    ("a: *x\n", "YAML aliases (*x) are not allowed"),
    ("a: [" * 40 + "]" * 40 + "\n", "nested more than 32 levels"),
    ("".join("  " * depth + "k:\n" for depth in range(40)) + "  " * 40 + "k: 1\n", "nested more than 32 levels"),
    ("a: 1\na: 2\n", "duplicate key 'a'"),
    ("a: !!python/object:os.system x\n", "is not allowed"),
])
def test_what_the_fast_path_leaves_to_the_checked_one_is_still_refused(text: str, message: str) -> None:
    kind, value = outcome(text, "demo.claims.yaml")
    assert kind == "error" and message in value, value


def test_an_ampersand_in_prose_is_no_anchor() -> None:
    assert yaml_nodes._fast_compose('says: "Parameters & Optimizer States"\n') is not None
    assert yaml_nodes._fast_compose("a: &x 1\n") is None


TABS_READ = {  # where YAML allows a tab: libyaml reads each, and so must the checked path
    "quoted": 'a: "x\ty"\n', "single-quoted": "a: 'x\ty'\n", "comment": "a: 1 #\tc\n", "before a comment": "a: 1\t# c\n",
    "after the colon": "a:\tb\n", "plain scalar": "a: x \t y z\n", "flow": "a: [\t1,\t2\t]\n", "block scalar": "a: |\n  x\ty\n",
    "trailing": "a: 1\t\n", "before the colon": "a\t: 1\n", "continued plain scalar": "a: x\n  y\tz\n",
}
TABS_REFUSED = {  # a tab as indentation is not YAML: one line, on the tab's line
    "indentation": ("a:\n\tb: 1\n", 2), "after a dash": ("-\tx\n", 1), "in a list's indentation": ("a:\n  - x\n\t- y\n", 3),
}


@pytest.mark.parametrize("text", TABS_READ.values(), ids=TABS_READ.keys())
def test_a_tab_where_yaml_allows_one_reads_the_same_either_way(text: str) -> None:
    """Issue 26: a tab in a quoted string or a comment refused the whole file."""
    fast = outcome(text, "demo.claims.yaml")
    assert fast[0] == "data"
    assert fast == checked_path_only(text, "demo.claims.yaml")


@pytest.mark.parametrize("text, line", TABS_REFUSED.values(), ids=TABS_REFUSED.keys())
def test_a_tab_as_indentation_is_one_line_either_way(text: str, line: int) -> None:
    expected = ("error", f"demo.claims.yaml:{line}: tab character; YAML indentation must use spaces")
    assert outcome(text, "demo.claims.yaml") == checked_path_only(text, "demo.claims.yaml") == expected
