"""``resacct formats`` / ``resacct dtypes``: the number-format table, as text and strict JSON."""

from __future__ import annotations

import json

import pytest

from resacct.cli import main
from resacct.facts.number_formats import block_formats, format_row, number_formats


def test_json_lists_at_least_eight_formats_with_units_of_their_own(capsys) -> None:
    assert main(["formats", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    names = [row["name"] for row in fields["formats"]]
    assert len(names) >= 8
    assert {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "e8m0"} <= set(names)
    e8m0 = next(row for row in fields["formats"] if row["name"] == "e8m0")
    assert e8m0["smallest_subnormal"] is None  # strict JSON: null, not NaN
    assert {b["name"] for b in fields["block_formats"]} >= {"mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4"}


def test_dtypes_is_the_same_command_and_takes_an_alias(capsys) -> None:
    assert main(["dtypes", "bfloat16", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["formats"]
    assert (row["name"], row["exponent_bits"], row["mantissa_bits"], row["eps"]) == ("bf16", 8, 7, 2**-7)


def test_text_has_one_line_a_format(capsys) -> None:
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    assert all(any(line.startswith(name + " ") for line in out.splitlines()) for name in number_formats())


def test_unknown_format_is_one_line_exit_2(capsys) -> None:
    assert main(["formats", "fp7"]) == 2
    err = capsys.readouterr().err
    assert "unknown number format 'fp7'" in err and err.count("\n") == 1


@pytest.mark.parametrize("name, bits_per_value", [("mxfp4", 4.25), ("nvfp4", 4.5), ("mxfp6_e3m2", 6.25), ("mxfp8_e5m2", 8.25)])
def test_block_formats_carry_their_scale(name, bits_per_value) -> None:
    assert next(b for b in block_formats() if b.name == name).bits_per_value == bits_per_value


def test_fp8_e4m3_has_no_infinity_and_e5m2_has() -> None:
    assert not format_row("e4m3").infinities and format_row("e5m2").infinities
    assert format_row("fp4").nan is False
