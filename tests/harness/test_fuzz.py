"""Fuzzing the loader and the law evaluator: whatever the document, loading returns claims or
one-line SpecErrors — never another exception — and every valid document loads completely."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from resacct.errors import LawError
from resacct.harness.laws import Law
from resacct.harness.loader import load_claims_file
from resacct.harness.yaml_nodes import EXPONENT_FLOAT


class ClaimsDumper(yaml.SafeDumper):
    """Writes YAML as a careful author would for resacct's loader: a string such as '0E0', which the
    loader reads as a number (YAML 1.2's 1e-8), is quoted (PyYAML's YAML 1.1 dumper leaves it bare)."""


ClaimsDumper.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def dump(document: object) -> str:
    return yaml.dump(document, Dumper=ClaimsDumper, allow_unicode=True, sort_keys=False)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FUZZ_HOSTILE = settings(FUZZ, max_examples=40)

claim_ids = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)  # "0e0" would be a number: this loader reads 1e-8 as YAML 1.2 does
plain_text = st.text(alphabet=string.ascii_letters + string.digits + " .,;()-×²'", min_size=1, max_size=40).filter(str.strip)


def arithmetic(names: list[str]) -> st.SearchStrategy[str]:
    leaves = st.one_of(st.sampled_from(names), st.integers(0, 1000).map(str), st.floats(0.5, 100, allow_nan=False).map(repr))
    return st.recursive(
        leaves,
        lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        max_leaves=8,
    )


@st.composite
def valid_claims(draw) -> dict:
    claim = {"id": draw(claim_ids), "says": draw(plain_text), "measure": "testing.echo"}
    if draw(st.booleans()):
        claim["given"] = {"value": draw(st.integers(-10**6, 10**6))}
    else:
        claim["forall"] = {"value": draw(st.sampled_from(["dim", "small_dim", "integers(-5, 5)"]))}
    if draw(st.booleans()):
        claim["law"] = draw(arithmetic(["value", "twice"]))
    else:
        claim["expect"] = draw(st.sampled_from([{"at_least": -1e9}, {"at_most": 1e9}, {"equals": 1}]))
    if draw(st.booleans()):
        claim["tolerance"] = {"rel": draw(st.floats(0, 1)), "abs": draw(st.floats(0, 10))}
    if draw(st.booleans()):
        claim["marks"] = draw(st.lists(st.sampled_from(["gpu", "slow"]), unique=True))
    return claim


@st.composite
def valid_documents(draw) -> dict:
    claims = draw(st.lists(valid_claims(), min_size=1, max_size=5, unique_by=lambda claim: claim["id"]))
    return {"area": draw(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)), "source": draw(plain_text), "claims": claims}


json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


def write(tmp_path_factory, text: str) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.claims.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
@FUZZ
@given(document=valid_documents())
@example(document={"area": "a", "source": "0E0", "claims": [{"id": "c", "says": "1e-8", "measure": "testing.echo", "given": {"value": 1}, "law": "value"}]})
def test_every_valid_document_loads_completely(tmp_path_factory, document):
    path = write(tmp_path_factory, dump(document))
    loaded = load_claims_file(path)
    assert [str(error) for error in loaded.errors] == []
    assert [claim.id for claim in loaded.claims] == [claim["id"] for claim in document["claims"]]


@pytest.mark.slow
@FUZZ
@given(document=valid_documents(), key=st.sampled_from(["id", "says", "measure"]), junk=json_like)
def test_a_broken_claim_is_reported_not_raised(tmp_path_factory, document, key, junk):
    document["claims"][0][key] = junk
    path = write(tmp_path_factory, dump(document))
    loaded = load_claims_file(path)  # never raises
    assert len(loaded.claims) + len(loaded.errors) == len(document["claims"])


@FUZZ
@given(data=json_like)
@pytest.mark.slow  # ~1.5 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_arbitrary_yaml_data_never_raises(tmp_path_factory, data):
    path = write(tmp_path_factory, dump(data))
    loaded = load_claims_file(path)
    assert loaded.errors or loaded.claims


@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_raises(tmp_path_factory, text):
    path = write(tmp_path_factory, text)
    loaded = load_claims_file(path)
    assert all(str(error).startswith(str(path)) for error in loaded.errors)


@FUZZ
@given(text=arithmetic(["a", "b"]), a=st.integers(-10**6, 10**6), b=st.floats(allow_nan=False, allow_infinity=False))
def test_generated_arithmetic_evaluates_or_raises_law_error(text, a, b):
    law = Law.parse(text)  # every generated expression is valid arithmetic
    try:
        value = law.evaluate({"a": a, "b": b})
    except LawError:
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)


# --- tagged scalars, huge scalars, deep nesting: each costs one claim (or its file), one line ---

TAGS = ["!!int", "!!float", "!!bool", "!!null", "!!str", "!!binary", "!!timestamp", "!!set", "!!python/object/apply:os.system", "!local"]
POSITIONS = {  # where the value goes, in a claim that is valid with a plain number there
    "given": "  - id: c\n    says: s\n    measure: testing.echo\n    given: {{value: {value}}}\n    law: value\n",
    "equals": "  - id: c\n    says: s\n    measure: testing.echo\n    given: {{value: 1}}\n    expect: {{equals: {value}}}\n",
    "id": "  - id: {value}\n    says: s\n    measure: testing.echo\n    given: {{value: 1}}\n    law: 1\n",
    "tolerance": "  - id: c\n    says: s\n    measure: testing.echo\n    given: {{value: 1}}\n    law: 1\n    tolerance: {{abs: {value}}}\n",
    "examples": "  - id: c\n    says: s\n    measure: testing.echo\n    forall: {{value: small_dim}}\n    examples: {value}\n    law: value\n",
    "strategy-bound": "  - id: c\n    says: s\n    measure: testing.echo\n    forall: {{value: \"integers(0, {value})\"}}\n    law: value\n",
    "sampled-from": "  - id: c\n    says: s\n    measure: testing.echo\n    forall: {{value: \"sampled_from(1, {value})\"}}\n    law: value\n",
    "law": "  - id: c\n    says: s\n    measure: testing.echo\n    given: {{value: 1}}\n    law: \"value * {value}\"\n",
}
GOOD_CLAIM = "  - id: good\n    says: s\n    measure: testing.echo\n    given: {value: 2}\n    law: 2\n"


def hostile_document(position: str, value: str) -> str:
    """A file with the hostile claim first and a good claim after it."""
    return "area: fuzz\nsource: s\nclaims:\n" + POSITIONS[position].format(value=value) + GOOD_CLAIM


def assert_one_line_errors(loaded, path: Path) -> None:
    for error in loaded.errors:
        text = str(error)
        assert "\n" not in text and text.startswith(f"{path}:"), text
        assert len(text) < 600, text


@FUZZ_HOSTILE
@given(tag=st.sampled_from(TAGS), value=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,11}", fullmatch=True), position=st.sampled_from(["given", "equals", "id", "tolerance", "examples"]))
def test_tagged_scalars_cost_one_claim_never_the_file(tmp_path_factory, tag, value, position):
    path = write(tmp_path_factory, hostile_document(position, f"{tag} {value}"))
    loaded = load_claims_file(path)  # never raises
    assert_one_line_errors(loaded, path)
    assert "good" in [claim.id for claim in loaded.claims], loaded.errors


@FUZZ_HOSTILE
@example(digits=400, position="given", sign="-")
@example(digits=4301, position="id", sign="")
@given(digits=st.integers(1, 6000), position=st.sampled_from(sorted(POSITIONS)), sign=st.sampled_from(["", "-"]))
def test_huge_integers_are_one_line_anywhere(tmp_path_factory, digits, position, sign):
    path = write(tmp_path_factory, hostile_document(position, sign + "7" * digits))
    loaded = load_claims_file(path)  # never raises (Python refuses int() of more than 4,300 digits)
    assert_one_line_errors(loaded, path)
    assert "good" in [claim.id for claim in loaded.claims], loaded.errors
    if digits > 400:
        assert len(loaded.errors) == 1, loaded.errors
        assert any(limit in str(loaded.errors[0]) for limit in ("at most 400 are allowed", "more than 400 digits", "at most 500 are allowed")), loaded.errors


@FUZZ_HOSTILE
@example(depth=28, opener="[", position="given")  # the deepest that loads
@example(depth=29, opener="{a: ", position="equals")  # the shallowest that does not
@given(depth=st.integers(1, 3000), opener=st.sampled_from(["[", "{a: "]), position=st.sampled_from(["given", "equals", "tolerance"]))
def test_deep_nesting_is_one_line_and_bounded(tmp_path_factory, depth, opener, position):
    closer = "]" if opener == "[" else "}"
    path = write(tmp_path_factory, hostile_document(position, opener * depth + "1" + closer * depth))
    loaded = load_claims_file(path)  # no RecursionError, and no scan quadratic in the depth
    assert_one_line_errors(loaded, path)
    if depth + 4 > 32:  # claims → claim → given → … : too deep costs the file, with one line
        assert [str(error).split(": ", 1)[1] for error in loaded.errors] == ["lists and mappings nested more than 32 levels deep; claims need a few"]
    else:
        assert "good" in [claim.id for claim in loaded.claims], loaded.errors
