"""The boards people rent now (B300, MI355X, TPU v5p int8, Gaudi 2 fp8), per-peak confidence, and
each board's TDP with its source — in the table and in ``resacct devices``."""

from __future__ import annotations

import json

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.facts.hardware import accelerators, get_accelerator, peak_flops_per_sec, peak_source_text, raw_accelerator_entry, raw_accelerator_table

#: board → TDP in watts, as the cited pages print it (tdp_source)
TDP_WATTS = {"a100-sxm-40gb": 400, "a100-sxm-80gb": 400, "h100-sxm": 700, "h200-sxm": 700, "b200": 1000, "b300": 1400, "gh200": 1000,
             "v100-pcie-16gb": 250, "tpu-v4": 192, "gaudi2": 600, "gaudi3": 900, "mi300x": 750, "mi355x": 1400}


def test_tdps_are_the_cited_figures_and_every_one_has_its_source() -> None:
    assert {name: board.tdp_watts for name, board in accelerators().items() if board.tdp_watts is not None} == TDP_WATTS
    for name, watts in TDP_WATTS.items():
        board = accelerators()[name]
        assert f"{watts}" in board.tdp_source.replace(",", "") or f"{watts / 1000:g} kW" in board.tdp_source, name
    assert all(not board.tdp_source for board in accelerators().values() if board.tdp_watts is None)


def test_a_tdp_without_its_source_or_a_source_without_a_tdp_is_refused() -> None:
    from resacct.facts.hardware import _parse_accelerator

    good = raw_accelerator_table()["h100-sxm"]
    with pytest.raises(ResacctError, match="x.tdp_watts is given without tdp_source"):
        _parse_accelerator("x", {**good, "tdp_source": ""})
    with pytest.raises(ResacctError, match="x.tdp_source is given without tdp_watts"):
        _parse_accelerator("x", {**good, "tdp_watts": None})
    with pytest.raises(ResacctError, match="x.tdp_watts is -700"):
        _parse_accelerator("x", {**good, "tdp_watts": -700})


def test_a_peaks_own_confidence_is_checked() -> None:
    from resacct.facts.hardware import _parse_accelerator

    good = raw_accelerator_table()["h100-sxm"]
    bad = {**good, "peaks_tera_per_sec": {"bf16": {"dense": 1, "sparse": None, "confidence": "rumour"}}}
    with pytest.raises(ResacctError, match="x.bf16.confidence is 'rumour'; expected one of datasheet, derived, third-party"):
        _parse_accelerator("x", bad)
    with pytest.raises(ResacctError, match="x.bf16 has the unknown key 'colour'"):
        _parse_accelerator("x", {**good, "peaks_tera_per_sec": {"bf16": {"dense": 1, "sparse": None, "colour": "red"}}})


@pytest.mark.parametrize("name, fmt, tera, board_confidence", [
    ("tpu-v5p", "int8", 918, "datasheet"),   # Google's launch figure, read only in third-party reports
    ("gaudi2", "fp8", 835, "derived"),       # one third-party page; Intel's own figure not read
])
def test_third_party_peaks_on_better_sourced_boards_are_flagged(name, fmt, tera, board_confidence) -> None:
    board = get_accelerator(name)
    assert peak_flops_per_sec(board, fmt) == tera * 1e12
    assert board.confidence == board_confidence and board.peak_confidence(fmt) == "third-party" and board.caveat == ""
    assert peak_source_text(board, fmt).endswith("(third-party table, unconfirmed by the vendor)")
    assert peak_source_text(board, "bf16") == f"{board.name} bf16 dense peak"  # the board's own peaks stay unflagged


def test_b300_carries_its_pages_figures() -> None:
    board = get_accelerator("blackwell-ultra")
    assert board.name == "b300" and board.confidence == "third-party" and "https://" in board.source
    assert {fmt: peak.dense_flops_per_sec / 1e12 for fmt, peak in board.peaks.items()} == {
        "fp64": 1.25, "fp32": 75, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500, "fp4": 13125}
    assert board.peaks["fp4"].sparse_flops_per_sec is None  # the pages' 18000 is not twice 13125: not mixed in
    assert (board.memory_bytes, board.memory_bandwidth_bytes_per_sec) == (288e9, 8e12)
    with pytest.raises(ResacctError, match="b300 has no int8 peak"):  # the pages disagree: left out
        peak_flops_per_sec(board, "int8")


def test_mi355x_carries_its_pages_figures_and_refuses_the_formats_none_prints() -> None:
    board = get_accelerator("AMD Instinct MI355X")
    assert board.name == "mi355x" and board.confidence == "third-party"
    assert (peak_flops_per_sec(board, "fp8"), peak_flops_per_sec(board, "fp4"), peak_flops_per_sec(board, "fp4", sparse=True)) == (5000e12, 10050e12, 20100e12)
    for fmt in ("bf16", "fp16", "fp32"):
        with pytest.raises(ResacctError, match=f"mi355x has no {fmt} peak"):
            peak_flops_per_sec(board, fmt)


def test_devices_lists_the_new_boards_with_sources_and_tdp(capsys) -> None:
    assert main(["devices"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "int8 918*" in lines["tpu-v5p"] and "Google Cloud TPU v5p system architecture" in lines["tpu-v5p"]
    assert " 835* " in lines["gaudi2"] and "Intel Gaudi 3 AI Accelerator" in lines["gaudi2"]
    assert "glennklockwood.com" in lines["b300"] and "[third-party: unconfirmed by the vendor]" in lines["b300"]
    assert "Tom's Hardware" in lines["mi355x"] and " 1400 " in lines["mi355x"] and " 700 " in lines["h100-sxm"]
    assert "wikimili.com on the Hopper microarchitecture [third-party" in lines["gh200"] and " 1000 " in lines["gh200"]
    assert main(["devices", "gaudi2", "--json"]) == 0
    gaudi2 = json.loads(capsys.readouterr().out)["devices"][0]
    assert gaudi2["peak_confidence"] == {"bf16": "derived", "fp8": "third-party"}
    assert gaudi2["tdp_watts"] == 600 and "600W (Gaudi 2)" in gaudi2["tdp_source"] and "pcguia.pt" in gaudi2["note"]
    assert main(["devices", "mi355x"]) == 0
    assert "tdp_source: Tom's Hardware" in capsys.readouterr().out


def test_gh200_is_an_h100_with_its_own_memory_and_a_module_tdp() -> None:
    board = get_accelerator("NVIDIA GH200 96GB HBM3")
    assert board.name == "gh200" and board.confidence == "third-party" and "https://" in board.source
    h100 = get_accelerator("h100-sxm")
    assert {fmt: (p.dense_flops_per_sec, p.sparse_flops_per_sec) for fmt, p in board.peaks.items()} == \
        {fmt: (p.dense_flops_per_sec, p.sparse_flops_per_sec) for fmt, p in h100.peaks.items()}
    assert (board.memory_bytes, board.memory_bandwidth_bytes_per_sec, board.tdp_watts) == (96e9, 4.0e12, 1000)
    assert "taken, not read for this board" in board.note and "module" in board.tdp_source
    with pytest.raises(ResacctError, match="unknown accelerator"):  # the 480GB name may be either HBM variant
        get_accelerator("NVIDIA GH200 480GB")


def test_raw_accelerator_entry_is_a_fresh_copy_of_the_tables_entry():
    entry = raw_accelerator_entry("h100-sxm")
    assert entry == raw_accelerator_table()["h100-sxm"]
    entry["peaks_tera_per_sec"].clear()
    assert raw_accelerator_entry("h100-sxm") == raw_accelerator_table()["h100-sxm"] != entry
    assert raw_accelerator_entry("no-such-board") is None
