"""Issue 36, part A: the reproductions of round four of the reliability attacks, one test each.

Each test failed on main before its fix (a traceback, a hang, a wrong exit code, or a silently
accepted value); each now asserts one clear line and the right exit code, and that nothing is lost.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.reporting.documents import format_value


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = 2) -> str:
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
    return captured.err


# ── the crash: a law whose value is beyond a float ──

HUGE_LAW_SPEC = """\
area: huge
source: x.txt — "y"
claims:
  - id: huge-law
    says: A law whose value no float can hold.
    measure: dtypes.bits
    given: {dtype: float32}
    law: "10**128*10**128*10**128"
  - id: float32-has-32-bits
    says: float32 uses 32 bits.
    measure: dtypes.bits
    given: {dtype: float32}
    law: "32"
"""


def test_integers_beyond_a_float_are_written_like_the_others():
    assert format_value(10**384) == "1e+384"
    assert format_value(-(10**384)) == "-1e+384"
    assert format_value(123456789 * 10**400) == "1.23457e+408"
    assert format_value(999999999 * 10**400) == "1e+409"  # rounding carries into the exponent
    assert format_value(2**2000) == f"{Decimal(2**2000):.6g}" == "1.14813e+602"
    assert format_value(123456789012345) == f"{123456789012345:.6g}"  # within a float's range: as before


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_a_law_beyond_a_float_fails_its_claim_and_loses_no_other(tmp_path, capsys, json_output):
    spec = tmp_path / "huge.claims.yaml"
    spec.write_text(HUGE_LAW_SPEC, encoding="utf-8")
    report = tmp_path / "report"
    argv = ["verify", "--specs", str(spec), "--report-dir", str(report), "--no-roofline", "--no-timeline"]
    assert main(argv + (["--json"] if json_output else [])) == 1
    out = capsys.readouterr().out
    if json_output:
        printed = json.loads(out)
        assert printed["counts"]["holds"] == 1 and printed["counts"]["failed"] == 1
    else:
        assert "1e+384" in out and "1 holds" in out
    written = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert {claim["id"]: claim["outcome"] for claim in written["claims"]} == {"huge-law": "failed", "float32-has-32-bits": "holds"}
    assert "10**128*10**128*10**128 = 1e+384" in (report / "report.md").read_text(encoding="utf-8")
    assert "1e+384" in (report / "report.html").read_text(encoding="utf-8")
