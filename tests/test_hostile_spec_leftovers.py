"""Issue 26, spec leftovers: what YAML allows is read, and what a claim may not hold costs that
claim only — one line naming file, line and claim — while the other claims of the file load.

The corpus (tests/hostile_specs/) checks each refusal's exact line in a real run; these tests
check the neighbours in the same file, and the inputs that are now accepted.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from resacct.errors import LawError
from resacct.harness.laws import Law
from resacct.harness.loader import load_claims_file

HEAD = "area: leftovers\nsource: tests — issue 26\nclaims:\n"
GOOD = "  - id: good\n    says: float32 has 32 bits.\n    measure: dtypes.bits\n    given: {dtype: float32}\n    law: 32\n"


def claim(claim_id: str, *lines: str, measure: str = "dtypes.bits", given: str = "{dtype: float32}") -> str:
    return f"  - id: {claim_id}\n    says: s.\n    measure: {measure}\n    given: {given}\n" + "".join(f"    {line}\n" for line in lines)


def load(tmp_path, text: str):
    path = tmp_path / "leftovers.claims.yaml"
    path.write_text(text, encoding="utf-8")
    loaded = load_claims_file(path, display_path="specs/leftovers.claims.yaml")
    return [c.id for c in loaded.claims], [str(error) for error in loaded.errors], loaded


# --- tabs: legal YAML is read as libyaml reads it --------------------------------------------

@pytest.mark.parametrize("line", [
    'source: "a\tquoted\tsource"',   # a tab in a double-quoted string
    "source: 'a\tsingle-quoted'",    # ... in a single-quoted one
    "law: 32  #\ta comment",          # in a comment
    "law: 32\t# a comment",           # between a value and its comment
    "source: plain\twords",           # between the words of a plain scalar
    "law:\t32",                       # after the colon
])
def test_a_tab_where_yaml_allows_one_is_read(tmp_path, line):
    lines = [line] if line.startswith("law") else [line, "law: 32"]
    ids, errors, loaded = load(tmp_path, HEAD + claim("tabbed", *lines) + GOOD)
    assert errors == []
    assert ids == ["tabbed", "good"]


def test_a_tab_in_a_quoted_string_keeps_its_tab(tmp_path):
    _, _, loaded = load(tmp_path, HEAD + claim("tabbed", 'source: "a\tb"', "law: 32"))
    assert loaded.claims[0].source == "a\tb"


def test_the_checked_path_reads_tabs_as_the_fast_path_does(tmp_path):
    """An anchor sends the file down the pure-Python path; its tabs must read the same there."""
    text = HEAD + claim("anchored", "law: &x 32") + claim("tabbed", "source: plain\twords", "law:\t32  #\tnote") + GOOD
    ids, errors, loaded = load(tmp_path, text)
    assert ids == ["tabbed", "good"]
    assert errors == ["specs/leftovers.claims.yaml:8: claim 'anchored': YAML anchors (&x) are not allowed in claims files"]
    assert loaded.claims[0].source == "plain\twords"


def test_a_tab_in_indentation_is_still_one_line(tmp_path):
    ids, errors, _ = load(tmp_path, HEAD + "  - id: c\n\tsays: s\n" + GOOD)
    assert ids == []
    assert errors == ["specs/leftovers.claims.yaml:5: tab character; YAML indentation must use spaces"]


# --- anchors and aliases: refused per claim, never expanded ----------------------------------

def test_an_anchor_and_its_alias_cost_their_claims_only(tmp_path):
    text = HEAD + claim("anchored", "law: &x 32") + GOOD + claim("aliased", "law: *x")
    ids, errors, _ = load(tmp_path, text)
    assert ids == ["good"]
    assert errors == [
        "specs/leftovers.claims.yaml:8: claim 'anchored': YAML anchors (&x) are not allowed in claims files",
        "specs/leftovers.claims.yaml:18: claim 'aliased': YAML aliases (*x) are not allowed in claims files",
    ]


def test_an_alias_bomb_inside_a_claim_is_refused_cheaply_and_the_rest_loads(tmp_path):
    levels = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&l{depth} [" + ", ".join([f"*l{depth - 1}"] * 9) + "]" for depth in range(1, 12)]  # 9**12 if expanded
    text = HEAD + claim("bomb", "law: 32", "marks: [" + ", ".join(levels) + "]") + GOOD
    tracemalloc.start()
    started = time.perf_counter()
    ids, errors, _ = load(tmp_path, text)
    elapsed = time.perf_counter() - started
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ids == ["good"]
    assert errors == ["specs/leftovers.claims.yaml:9: claim 'bomb': YAML anchors (&l0) are not allowed in claims files"]
    assert elapsed < 2.0 and peak_bytes < 20 * 2**20


def test_an_anchor_on_the_claims_list_is_refused_as_any_anchor_outside_a_claim(tmp_path):
    ids, errors, _ = load(tmp_path, HEAD.replace("claims:", "claims: &all") + GOOD)
    assert ids == []
    assert errors == ["specs/leftovers.claims.yaml:3: YAML anchors (&all) are not allowed in claims files"]


# --- laws -----------------------------------------------------------------------------------

def test_a_negative_number_to_a_fractional_power_is_a_law_error_not_a_complex_number():
    with pytest.raises(LawError, match=r"^law '\(-8\)\*\*0.5' produces a complex number"):
        Law.parse("(-8)**0.5").evaluate({})
    with pytest.raises(LawError, match="complex number"):
        Law.parse("m**0.5 * 2").evaluate({"m": -4})
    assert Law.parse("m**-0.5").evaluate({"m": 4}) == 0.5


@pytest.mark.parametrize("text", ["()", "[]", "[cols, ()]"])
def test_an_empty_list_is_not_a_law(text):
    with pytest.raises(LawError, match="contains an empty list"):
        Law.parse(text)


@pytest.mark.parametrize("text, character", [("2*ｍ*k*n", "ｍ"), ("2 × m", "×"), ("m²", "²")])
def test_a_law_is_ascii_so_it_computes_what_it_shows(text, character):
    """Python reads 'ｍ' as 'm' (NFKC normalisation of identifiers): the law would not say what it computes."""
    with pytest.raises(LawError, match=f"non-ASCII character '{character}'"):
        Law.parse(text)


def test_a_fullwidth_law_costs_its_claim_only(tmp_path):
    text = HEAD + claim("wide", 'law: "2*ｍ*k*n"', measure="flops.matmul", given="{m: 2, k: 3, n: 4}") + GOOD
    ids, errors, _ = load(tmp_path, text)
    assert ids == ["good"]
    assert errors == ["specs/leftovers.claims.yaml:8: claim 'wide': law '2*ｍ*k*n' contains the non-ASCII character 'ｍ' (U+FF4D); "
                      "write names, numbers and operators in ASCII"]


# --- numbers are numbers ----------------------------------------------------------------------

@pytest.mark.parametrize("lines, where, number", [
    (["law: 32", "tolerance: {rel: '0.1'}"], "tolerance.rel", "a number"),
    (["law: 32", "tolerance: {abs: '1'}"], "tolerance.abs", "a number"),
    (["expect: {at_least: '5'}"], "expect.at_least", "a number"),
    (["expect: {approx: '32'}", "tolerance: {rel: 0.1}"], "expect.approx", "a number"),
    (["law: 32", "examples: '5'"], "examples", "an integer"),
])
def test_a_quoted_number_is_refused_not_converted(tmp_path, lines, where, number):
    ids, errors, _ = load(tmp_path, HEAD + claim("quoted", *lines) + GOOD)
    assert ids == ["good"]
    assert len(errors) == 1
    assert errors[0].startswith("specs/leftovers.claims.yaml:")
    assert f"claim 'quoted': {where}: must be {number}, got the string " in errors[0]
    assert errors[0].endswith("; write it without quotes")


def test_unquoted_numbers_still_load(tmp_path):
    ids, errors, loaded = load(tmp_path, HEAD + claim("plain", "law: 32", "tolerance: {rel: 1, abs: 0.5}", "examples: 5"))
    assert (ids, errors) == (["plain"], [])
    assert loaded.claims[0].claim.tolerance.rel == 1.0


# --- expect.raises ------------------------------------------------------------------------------

def test_an_unknown_exception_type_costs_its_claim_at_load(tmp_path):
    ids, errors, _ = load(tmp_path, HEAD + claim("typo", "expect: {raises: {type: RuntimError}}") + GOOD)
    assert ids == ["good"]
    assert errors == ["specs/leftovers.claims.yaml:8: claim 'typo': expect.raises.type 'RuntimError' is not a known exception class; "
                      "did you mean 'RuntimeError'? (expected a builtin such as ValueError, a resacct error, or a class the check's module defines)"]


@pytest.mark.parametrize("name", ["ValueError", "RuntimeError", "ResacctError", "UnknownNameError", "TypeCheckError",
                                  "torch.OutOfMemoryError", "builtins.NotImplementedError", "KeyboardInterrupt"])
def test_known_exception_types_load(tmp_path, name):
    ids, errors, _ = load(tmp_path, HEAD + claim("known", f"expect: {{raises: {{type: {name}}}}}"))
    assert (ids, errors) == (["known"], [])


@pytest.mark.parametrize("pattern, reason", [
    ("a{4294967295}", "repeat count too big"),   # re raises OverflowError here: it asked for a bug report
    ("(unclosed", "missing )"),
    ("[z-a]", "bad character range"),
])
def test_a_match_the_regex_engine_cannot_compile_costs_its_claim(tmp_path, pattern, reason):
    ids, errors, _ = load(tmp_path, HEAD + claim("bad-match", f"expect: {{raises: {{type: RuntimeError, match: '{pattern}'}}}}") + GOOD)
    assert ids == ["good"]
    assert len(errors) == 1
    assert errors[0].startswith(f"specs/leftovers.claims.yaml:8: claim 'bad-match': expect.raises.match: match {pattern!r} "
                                f"is not a valid regular expression: {reason}")
    assert "report" not in errors[0]


# --- law and expect together --------------------------------------------------------------------

def test_a_refuted_claim_with_both_law_and_expect_is_refused(tmp_path):
    text = HEAD + claim("both", "law: 32", "expect: {equals: 16}", "status: refuted", "truth: t") + GOOD
    ids, errors, _ = load(tmp_path, text)
    assert ids == ["good"]
    assert errors == ["specs/leftovers.claims.yaml:4: claim 'both': a refuted claim has both 'law' and 'expect'; refute one statement "
                      "per claim (with both, the claim passes when either is false, hiding the other)"]


def test_a_holding_claim_may_state_a_law_and_a_published_figure(tmp_path):
    """Both must agree with the measurement (the ZeRO-paper claims: the formula and the paper's GB)."""
    ids, errors, _ = load(tmp_path, HEAD + claim("both", "law: 32", "expect: {approx: 32.0}", "tolerance: {rel: 0.01}"))
    assert (ids, errors) == (["both"], [])
