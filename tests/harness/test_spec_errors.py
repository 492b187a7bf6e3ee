"""Malformed specs: each problem is one line naming file, line and claim, as a failing item,
while the other claims and files still run."""

from __future__ import annotations

import pytest

from tests.harness.test_plugin import outcomes

HEADER = "area: demo\nsource: test\nclaims:\n"


def claim(body: str) -> str:
    """One claim's YAML (indented under claims:), starting at line 4 of the file."""
    lines = body.strip("\n").splitlines()
    return HEADER + "\n".join("  " + line for line in lines) + "\n"


VALID = "- id: ok\n  says: fine.\n  measure: testing.echo\n  given: {value: 1}\n  law: 1"

CASES = [
    (
        "unknown-key",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  lawz: 1"),
        "specs/demo.claims.yaml:8: claim 'c': unknown key 'lawz'",
    ),
    (
        "missing-says",
        claim("- id: c\n  measure: testing.echo\n  given: {value: 1}\n  law: 1"),
        "specs/demo.claims.yaml:4: claim 'c': missing required key 'says'",
    ),
    (
        "wrong-type-says",
        claim("- id: c\n  says: [a, b]\n  measure: testing.echo\n  given: {value: 1}\n  law: 1"),
        "specs/demo.claims.yaml:5: claim 'c': says: Input should be a valid string (got ['a', 'b'])",
    ),
    (
        "unknown-check",
        claim("- id: c\n  says: s\n  measure: testing.ecko\n  given: {value: 1}\n  law: 1"),
        "specs/demo.claims.yaml:6: claim 'c': unknown check 'testing.ecko'; did you mean 'testing.echo'?*",
    ),
    (
        "unknown-strategy",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  forall: {value: dimm}\n  law: value"),
        "specs/demo.claims.yaml:7: claim 'c': forall.value: unknown strategy 'dimm'; did you mean 'dim'*",
    ),
    (
        "unknown-name-in-law",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: valu * 2"),
        "specs/demo.claims.yaml:8: claim 'c': law names 'valu', which is neither an input nor a quantity measured by 'testing.echo' (known: prediction_offset, twice, value)",
    ),
    (
        "law-calls-a-function",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: open('x')"),
        "specs/demo.claims.yaml:8: claim 'c': law \"open('x')\" contains a function call to 'open'; only arithmetic over names and numbers is allowed",
    ),
    (
        "law-reads-an-attribute",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: value.real"),
        "specs/demo.claims.yaml:8: claim 'c': law 'value.real' contains attribute access of 'real'; only arithmetic over names and numbers is allowed",
    ),
    (
        "law-imports",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: __import__('os')"),
        "specs/demo.claims.yaml:8: claim 'c': law \"__import__('os')\" contains a function call to '__import__'; only arithmetic over names and numbers is allowed",
    ),
    (
        "law-huge-power",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: 10**10**10"),
        "specs/demo.claims.yaml:8: claim 'c': law '10**10**10' raises to a power of a power; at most one level of '**' is allowed",
    ),
    (
        "given-wrong-type",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: seven}\n  law: 7"),
        "specs/demo.claims.yaml:7: claim 'c': given.value: check 'testing.echo' expects int, got str 'seven'",
    ),
    (
        "given-unknown-input",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1, colour: red}\n  law: 1"),
        "specs/demo.claims.yaml:7: claim 'c': check 'testing.echo' takes no input 'colour'; it takes prediction_offset, value",
    ),
    (
        "missing-input",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  law: 1"),
        "specs/demo.claims.yaml:4: claim 'c': check 'testing.echo' needs the input 'value' in given or forall",
    ),
    (
        "refuted-without-truth",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: 2\n  status: refuted"),
        "specs/demo.claims.yaml:4: claim 'c': a refuted claim needs 'truth': what measurement shows instead, and why",
    ),
    (
        "no-law-no-expect",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}"),
        "specs/demo.claims.yaml:4: claim 'c': a claim needs a law or an expect: what must be true of the measurement?",
    ),
    (
        "unknown-mark",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: 1\n  marks: [tpu]"),
        "specs/demo.claims.yaml:9: claim 'c': marks: unknown mark 'tpu'; allowed: gpu, slow, distributed",
    ),
    (
        "nan-in-expectation",
        claim("- id: c\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  expect: {at_least: .nan}"),
        "specs/demo.claims.yaml:8: claim 'c': expect.at_least: must be a finite number, got nan",
    ),
    (
        "bad-id",
        claim("- id: Has Spaces\n  says: s\n  measure: testing.echo\n  given: {value: 1}\n  law: 1"),
        "specs/demo.claims.yaml:4: claim 'Has Spaces': id: String should match pattern *",
    ),
    (
        "duplicate-key",
        claim("- id: c\n  says: s\n  says: t\n  measure: testing.echo\n  given: {value: 1}\n  law: 1"),
        "specs/demo.claims.yaml:6: claim 'c': duplicate key 'says'",
    ),
    ("invalid-yaml", HEADER + "  - id: [unclosed\n", "specs/demo.claims.yaml:5: invalid YAML: *"),
    ("tab", HEADER + "  - id: c\n\tsays: s\n", "specs/demo.claims.yaml:5: tab character; YAML indentation must use spaces"),
    ("empty-file", "", "specs/demo.claims.yaml:1: file is empty; expected keys 'area', 'source' and 'claims'"),
    ("not-a-mapping", "- just\n- a list\n", "specs/demo.claims.yaml:1: top level must be a mapping with keys 'area', 'source' and 'claims'"),
    ("no-claims", "area: demo\nsource: test\n", "specs/demo.claims.yaml:1: missing required key 'claims'"),
    (
        "alias",
        "area: demo\nsource: test\nbase: &b {value: 1}\nclaims:\n  - id: c\n    says: s\n    measure: testing.echo\n    given: *b\n    law: 1\n",
        "specs/demo.claims.yaml:3: YAML anchors (&b) are not allowed in claims files",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), CASES, ids=[case[0] for case in CASES])
def test_bad_spec_gives_one_clear_line(pytester, write_spec, name, text, message):
    write_spec("demo.claims.yaml", text)
    result = pytester.runpytest("-q")
    assert outcomes(result).get("failed") == 1, result.stdout.str()
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str()


def test_a_bad_claim_does_not_stop_the_good_ones_or_other_files(pytester, write_spec):
    write_spec("demo.claims.yaml", claim(VALID + "\n- id: bad\n  says: s\n  measure: nope\n  law: 1"))
    write_spec("other.claims.yaml", "area: other\nsource: test\nclaims:\n  - id: fine\n    says: s\n    measure: testing.echo\n    given: {value: 2}\n    law: 2\n")
    write_spec("broken.claims.yaml", "area: [\n")
    result = pytester.runpytest("-q")
    assert outcomes(result) == {"passed": 2, "failed": 2}
    result.stdout.fnmatch_lines(["claims: 2 holds, 0 refuted, 0 skipped, 0 inconclusive, 0 failed, 2 invalid"])


def test_duplicate_ids_within_and_across_files(pytester, write_spec):
    write_spec("a.claims.yaml", claim(VALID + "\n" + VALID))
    write_spec("b.claims.yaml", claim(VALID))
    result = pytester.runpytest("-q", "-p", "no:randomly")
    assert outcomes(result) == {"passed": 1, "failed": 2}
    result.stdout.fnmatch_lines(
        [
            "specs/a.claims.yaml:9: claim 'ok': duplicate claim id (first defined at specs/a.claims.yaml:4)",
            "specs/b.claims.yaml:4: claim 'ok': duplicate claim id (first defined at specs/a.claims.yaml:4)",
        ],
        consecutive=False,
    )


def test_oversized_file_is_refused_quickly(pytester, write_spec):
    write_spec("big.claims.yaml", HEADER + "#" * 2_000_000 + "\n")
    result = pytester.runpytest("-q")
    result.stdout.fnmatch_lines(["specs/big.claims.yaml: file is * bytes; claims files may be at most 1000000"])


def test_billion_laughs_is_refused_without_expanding(pytester, write_spec):
    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        bomb += f"{level}: &{level} [" + ",".join([f"*{previous}"] * 9) + "]\n"
    write_spec("bomb.claims.yaml", bomb)
    result = pytester.runpytest("-q")
    result.stdout.fnmatch_lines(["specs/bomb.claims.yaml:1: YAML anchors (&a) are not allowed in claims files"])
