"""resacct.facts.hardware: the datasheet table, lookups by name and CUDA name, peaks, intensity."""

from __future__ import annotations

import math
import re

import pytest
import torch

from resacct.errors import ResacctError, UnknownNameError
from resacct.facts.hardware import (
    CONFIDENCE_FLAGS,
    PEAK_FORMATS,
    accelerator_for_cuda_name,
    accelerator_intensity_flops_per_byte,
    accelerator_names,
    accelerators,
    current_accelerator,
    format_bytes,
    get_accelerator,
    peak_flops_per_sec,
    peak_format,
    peak_source_text,
    raw_accelerator_table,
)


def _left_out(board, fmt: str) -> bool:
    """A third-party entry may lack a format no cited page prints; its note must say so."""
    return board.confidence == "third-party" and re.search(rf"\b{fmt}\b[^.]*\bleft out", board.note) is not None


def test_table_has_the_boards_of_the_lecture_and_their_successors():
    assert {"a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200"} <= set(accelerators())


@pytest.mark.parametrize("name", list(accelerators()))
def test_every_entry_is_sourced_and_positive(name):
    board = accelerators()[name]
    assert board.source and board.confidence in CONFIDENCE_FLAGS
    assert board.memory_bytes > 0 and board.memory_bandwidth_bytes_per_sec > 0
    assert set(board.peaks) <= set(PEAK_FORMATS)
    # every board has a 16-bit matrix peak; the V100 (Volta) predates bf16 and has only fp16
    assert "bf16" in board.peaks or (board.family == "volta" and "fp16" in board.peaks) or _left_out(board, "bf16")
    # NVIDIA datasheets print a CUDA-core fp32 peak; Google's TPU pages and Intel's Gaudi 3 table
    # list only their matrix formats
    assert "fp32" in board.peaks or board.family in ("tpu", "gaudi") or _left_out(board, "fp32")
    for peak in board.peaks.values():
        assert peak.dense_flops_per_sec > 0 and math.isfinite(peak.dense_flops_per_sec)
        if peak.sparse_flops_per_sec is not None:
            assert peak.sparse_flops_per_sec == pytest.approx(2 * peak.dense_flops_per_sec)


@pytest.mark.parametrize("name", list(accelerators()))
def test_non_tensor_formats_have_no_sparse_peak(name):
    board = accelerators()[name]
    for fmt in ("fp64", "fp32"):
        if fmt in board.peaks:
            assert board.peaks[fmt].sparse_flops_per_sec is None
        else:  # only TPUs and Gaudi print no fp64/fp32; elsewhere the entry's note says why it is left out
            assert board.family in ("tpu", "gaudi") or (fmt == "fp64" and "fp64 is left out" in board.note) or _left_out(board, fmt)


def test_lecture_peaks():
    assert peak_flops_per_sec("a100", "bf16") == 312e12
    assert peak_flops_per_sec("h100", "bf16") == 989.5e12
    assert peak_flops_per_sec("h100", "bf16", sparse=True) == 1979e12
    assert peak_flops_per_sec("h100", "fp32") == 67e12
    assert peak_flops_per_sec("h100-pcie", "fp32") == 51e12
    assert peak_flops_per_sec("h100-pcie", "bf16") == 756.5e12
    assert peak_flops_per_sec("h100", "fp8") == 1979e12
    assert peak_flops_per_sec("h200", "bf16") == peak_flops_per_sec("h100", "bf16")


def test_memory_and_bandwidth():
    h100, h200 = get_accelerator("h100"), get_accelerator("h200")
    assert (h100.memory_bytes, h100.memory_bandwidth_bytes_per_sec) == (80e9, 3.35e12)
    assert (h200.memory_bytes, h200.memory_bandwidth_bytes_per_sec) == (141e9, 4.8e12)


@pytest.mark.parametrize(
    ("cuda_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-sxm"),
    ],
)
def test_cuda_device_names_resolve(cuda_name, expected):
    assert get_accelerator(cuda_name).name == expected
    assert accelerator_for_cuda_name(cuda_name).name == expected


def test_longest_cuda_name_wins():
    assert accelerator_for_cuda_name("NVIDIA H200 NVL").name == "h200-nvl"
    assert accelerator_for_cuda_name("NVIDIA H200").name == "h200-sxm"


def test_unknown_cuda_name_is_none():
    assert accelerator_for_cuda_name("NVIDIA GeForce RTX 3090") is None
    assert accelerator_for_cuda_name("NVIDIA H2000") is None


@pytest.mark.parametrize("spelling", ["h100", "H100", " h100-sxm ", "h100_sxm", "H100 SXM5", "NVIDIA H100 SXM5 80GB"])
def test_names_aliases_and_spellings(spelling):
    assert get_accelerator(spelling).name == "h100-sxm"


def test_accelerator_passes_through():
    board = get_accelerator("a100")
    assert get_accelerator(board) is board


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UnknownNameError, match=r"unknown accelerator 'h100sxm'; did you mean 'h100-sxm'"):
        get_accelerator("h100sxm")


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_name_is_refused(bad):
    with pytest.raises(ResacctError, match="empty"):
        get_accelerator(bad)


def test_every_listed_name_resolves():
    canonical = set(accelerators())
    for name in accelerator_names():
        resolved = get_accelerator(name)
        assert resolved.name in canonical
        assert name == resolved.name or name in resolved.aliases


@pytest.mark.parametrize(
    ("dtype", "key"),
    [(torch.bfloat16, "bf16"), ("bfloat16", "bf16"), ("float32", "fp32"), (torch.float16, "fp16"), ("half", "fp16"),
     (torch.float8_e4m3fn, "fp8"), ("float8_e5m2", "fp8"), ("tf32", "tf32"), ("int8", "int8"), ("fp64", "fp64")],
)
def test_peak_format(dtype, key):
    assert peak_format(dtype) == key


def test_unknown_format_is_refused():
    with pytest.raises(UnknownNameError, match="peak format"):
        peak_format("float7")


def test_sparse_peak_of_a_format_without_sparsity_is_refused():
    with pytest.raises(ResacctError, match="no structured-sparsity peak"):
        peak_flops_per_sec("h100", "fp32", sparse=True)


def test_missing_format_is_refused_with_what_exists():
    with pytest.raises(ResacctError, match="a100-sxm-80gb has no fp8 peak"):
        peak_flops_per_sec("a100", "fp8")


def test_accelerator_intensity():
    assert accelerator_intensity_flops_per_byte("h100", "bf16") == pytest.approx(989.5e12 / 3.35e12)
    assert round(accelerator_intensity_flops_per_byte("h100")) == 295
    # Same arithmetic, more bandwidth: the H200 is easier to keep compute-bound.
    assert accelerator_intensity_flops_per_byte("h200") < accelerator_intensity_flops_per_byte("h100")


def test_format_bytes():
    assert (format_bytes("bf16"), format_bytes("tf32"), format_bytes(torch.float8_e4m3fn), format_bytes("fp4")) == (2, 4, 1, 0.5)


def test_format_bytes_is_always_a_float():
    """Issue 26: 2 (an int) for bf16 but 0.5 (a float) for fp4, in --json too; now a float for every format."""
    from resacct.facts.hardware import PEAK_FORMATS

    assert {type(format_bytes(name)) for name in PEAK_FORMATS} == {float}
    assert repr(format_bytes("bf16")) == "2.0" and format_bytes(torch.bfloat16) == format_bytes("BF16") == format_bytes(" bf16 ")


@pytest.mark.parametrize("value, shown", [(16, "16"), (16.0, "16.0"), (1024, "1024"), (1024.0, "1024.0"), (-1, "-1"), (float("nan"), "nan"),
                                          (True, "True"), (None, "None"), (10**5000, "<an integer of about 5001 digits>")],
                         ids=["16", "16.0", "1024", "1024.0", "negative", "nan", "bool", "none", "5000-digits"])
def test_a_number_is_no_format_name_whatever_its_type(value, shown):
    """format_bytes(16) suggested 'fp16' while format_bytes(16.0) did not, and 10**5000 raised
    ValueError from str(); every number is now the same one line."""
    unchecked = getattr(format_bytes, "__wrapped__", format_bytes)  # what a user calls, without the test hook's type check
    with pytest.raises(ResacctError) as error:
        unchecked(value)
    assert str(error.value) == (f"peak format {shown}: expected a format name such as 'bf16', 'fp8' or 'tf32', or a torch.dtype "
                                f"(got type {type(value).__name__})")


def test_a_long_unknown_format_name_is_cut_in_the_message():
    with pytest.raises(UnknownNameError) as error:
        format_bytes("x" * 5000)
    assert len(str(error.value)) < 600 and "\n" not in str(error.value)


def test_raw_table_is_a_copy():
    table = raw_accelerator_table()
    table["h100-sxm"]["memory_bytes"] = 1
    assert raw_accelerator_table()["h100-sxm"]["memory_bytes"] == 80_000_000_000


def test_bad_data_entries_are_refused():
    from resacct.facts.hardware import _parse_accelerator

    good = raw_accelerator_table()["h100-sxm"]
    with pytest.raises(ResacctError, match="unknown key 'colour'"):
        _parse_accelerator("x", {**good, "colour": "green"})
    with pytest.raises(ResacctError, match="x.memory_bytes is -1"):
        _parse_accelerator("x", {**good, "memory_bytes": -1})
    for confidence in CONFIDENCE_FLAGS:  # datasheet, derived, third-party
        assert _parse_accelerator("x", {**good, "confidence": confidence}).confidence == confidence
    for bad in ("rumour", "third party", None):
        expected = rf"resacct/facts/datasheets/accelerators.yaml: x.confidence is {re.escape(repr(bad))}; expected one of datasheet, derived, third-party"
        with pytest.raises(ResacctError, match=expected):
            _parse_accelerator("x", {**good, "confidence": bad})
    with pytest.raises(UnknownNameError, match="peak format"):
        _parse_accelerator("x", {**good, "peaks_tera_per_sec": {"fp7": {"dense": 1, "sparse": None}}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_current_accelerator_without_gpu_is_none():
    assert current_accelerator() is None


def test_mi300x_is_amds_rocm_table():
    mi300x = get_accelerator("AMD Instinct MI300X")
    assert mi300x.name == "mi300x" and mi300x.family == "cdna3"
    assert (peak_flops_per_sec(mi300x, "bf16"), peak_flops_per_sec(mi300x, "fp8"), peak_flops_per_sec(mi300x, "fp32")) == (1307.4e12, 2614.9e12, 163.4e12)
    assert (mi300x.memory_bytes, mi300x.memory_bandwidth_bytes_per_sec) == (192 * 2**30, 5.3e12)
    # the ROCm table prints no 2:4-sparse figure, so none is handed out
    with pytest.raises(ResacctError, match="no structured-sparsity peak"):
        peak_flops_per_sec(mi300x, "bf16", sparse=True)


@pytest.mark.parametrize(("cuda_name", "memory_bytes"), [("Tesla V100-SXM2-32GB", 32e9), ("Tesla V100-SXM2-16GB", 16e9)])
def test_v100_has_fp16_but_no_bf16(cuda_name, memory_bytes):
    v100 = get_accelerator(cuda_name)
    assert (peak_flops_per_sec(v100, "fp16"), peak_flops_per_sec(v100, "fp32"), v100.memory_bytes) == (125e12, 15.7e12, memory_bytes)
    assert v100.confidence == "derived"
    with pytest.raises(ResacctError, match="has no bf16 peak"):
        peak_flops_per_sec(v100, "bf16")


def test_gb200_is_half_a_superchip_and_derived():
    """GB200 per GPU: one half of the superchip column NVIDIA prints (read in transcriptions)."""
    gb200 = get_accelerator("gb200-nvl72")
    assert gb200.confidence == "derived" and "fp64" not in gb200.peaks
    assert peak_flops_per_sec(gb200, "bf16", sparse=True) * 2 == 10e15  # FP16/BF16 Tensor Core 10 PFLOPS per superchip
    assert peak_flops_per_sec(gb200, "fp8") > peak_flops_per_sec("b200", "fp8")


# --- boards with third-party figures only (no vendor document could be read) ----------------------

THIRD_PARTY = {  # name: (aliases and CUDA names that must resolve to it, {format: dense TFLOP/s}, memory bytes, bandwidth bytes/s)
    "h800-sxm": (["h800", "H800 SXM5", "NVIDIA H800 80GB HBM3", "NVIDIA H800 80GB HBM3 MIG 1g.10gb"], {"bf16": 990, "fp8": 1979, "fp64": 1}, 80e9,
                 3.35e12),
    "h20": (["h20", "h20-96gb", "NVIDIA H20", "NVIDIA H20 MIG 1g.12gb"], {"fp16": 148, "fp8": 296, "int8": 296, "tf32": 74, "fp32": 44, "fp64": 1},
            96e9, 4.0e12),
    "v100-pcie-16gb": (["v100-pcie", "Tesla V100-PCIE-16GB"], {"fp16": 112, "fp32": 14, "fp64": 7}, 16e9, 0.9e12),
    "mi325x": (["mi325x", "AMD Instinct MI325X", "instinct-mi325x"], {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4},
               256 * 2**30, 6.0e12),
}


@pytest.mark.parametrize("name", list(THIRD_PARTY))
def test_third_party_boards_resolve_and_carry_their_pages_figures(name):
    spellings, peaks, memory_bytes, bandwidth = THIRD_PARTY[name]
    for spelling in spellings:
        assert get_accelerator(spelling).name == name, spelling
    board = accelerators()[name]
    assert board.confidence == "third-party" and board.flag == "[third-party: unconfirmed by the vendor]"
    assert "https://" in board.source and board.note
    assert {fmt: peak.dense_flops_per_sec / 1e12 for fmt, peak in board.peaks.items()} == pytest.approx(peaks)
    assert (board.memory_bytes, board.memory_bandwidth_bytes_per_sec) == (memory_bytes, bandwidth)
    assert board.caveat.startswith(f"note: {name}'s figures are from third-party tables, unconfirmed by the vendor")
    assert peak_source_text(board, "fp16").endswith("(third-party table, unconfirmed by the vendor)")


def test_vendor_boards_carry_no_third_party_caveat():
    assert all(board.caveat == "" for board in accelerators().values() if board.confidence != "third-party")
    assert (get_accelerator("h100").flag, get_accelerator("b200").flag) == ("", "[derived]")
    assert peak_source_text("h100", "bf16") == "h100-sxm bf16 dense peak"


def test_third_party_formats_no_page_prints_are_refused_not_guessed():
    # No cited page prints a bf16 figure for the H20: resacct does not borrow the H100's. (The H800's
    # bf16 990 is DeepSeek's own figure, cited; its fp16 is still refused.)
    with pytest.raises(ResacctError, match=r"has no bf16 peak in the table \(its source prints none"):
        peak_flops_per_sec("h20", "bf16")
    with pytest.raises(ResacctError, match=r"has no fp16 peak in the table \(its source prints none"):
        peak_flops_per_sec("h800", "fp16")
    assert peak_flops_per_sec("h800", "bf16") == 990e12
    assert peak_flops_per_sec("mi325x", "fp8", sparse=True) == 5229.8e12  # the page's "FP8 with sparsity"
    with pytest.raises(ResacctError, match="no structured-sparsity peak"):
        peak_flops_per_sec("mi325x", "bf16", sparse=True)


def test_a_hyphenated_cuda_variant_is_another_board():
    """torch's "NVIDIA H20-3e" is a different board (141 GB): it must not read as the H20."""
    assert accelerator_for_cuda_name("NVIDIA H20-3e") is None
    assert accelerator_for_cuda_name("Tesla V100-PCIE-32GB") is None  # not in the table
    assert accelerator_for_cuda_name("NVIDIA H20").name == "h20"


# --- the 24 GB boards (A10, L4, RTX 4090): NVIDIA's tables read in transcriptions ----------------

TWENTY_FOUR_GB = {  # name: ({format: (dense, sparse) TFLOP/s}, bandwidth bytes/s)
    "a10": ({"fp32": (31.2, None), "tf32": (62.5, None), "bf16": (125, 250), "fp16": (125, 250), "int8": (250, None)}, 600e9),
    "l4": ({"fp32": (30.3, None), "tf32": (60, 120), "bf16": (121, 242), "fp16": (121, 242), "fp8": (242.5, 485), "int8": (242.5, 485)}, 300e9),
    "rtx-4090": ({"fp32": (82.6, None), "tf32": (82.6, 165.2), "bf16": (165.2, 330.4), "fp16": (165.2, 330.4), "fp8": (330.3, 660.6),
                  "int8": (660.6, 1321.2)}, 1008e9),
}


@pytest.mark.parametrize("name", list(TWENTY_FOUR_GB))
def test_24gb_boards_carry_nvidias_figures(name):
    peaks, bandwidth = TWENTY_FOUR_GB[name]
    board = accelerators()[name]
    assert (board.memory_bytes, board.memory_bandwidth_bytes_per_sec, board.confidence, board.flag) == (24e9, bandwidth, "derived", "[derived]")
    got = {fmt: (round(peak.dense_flops_per_sec / 1e12, 6), None if peak.sparse_flops_per_sec is None else round(peak.sparse_flops_per_sec / 1e12, 6))
           for fmt, peak in board.peaks.items()}
    assert got == peaks and "fp64" not in board.peaks and "fp64 is left out" in board.note
    assert board.caveat == "" and "not in the PDF itself" in board.source  # read in transcriptions: derived


def test_geforce_peaks_are_the_fp32_accumulate_rows():
    """The Ada whitepaper prints the RTX 4090's fp16 at 330.3 dense with FP16 accumulate and 165.2 with
    FP32 accumulate (what torch's matmuls use): the table keeps 165.2, equal to bf16's only row."""
    assert peak_flops_per_sec("rtx-4090", "fp16") == peak_flops_per_sec("rtx-4090", "bf16") == 165.2e12
    assert peak_flops_per_sec("rtx-4090", "fp8") == 330.3e12  # FP32 accumulate; 660.6 with FP16 accumulate
    assert "FP16-accumulate rows (fp16 330.3, fp8 660.6 dense)" in get_accelerator("4090").note


def test_24gb_variants_are_other_boards():
    """AWS's A10G and the China-market RTX 4090 D report other names; neither borrows a neighbour's peaks."""
    assert accelerator_for_cuda_name("NVIDIA A10G") is None and accelerator_for_cuda_name("NVIDIA GeForce RTX 4090 D") is None
    assert accelerator_for_cuda_name("NVIDIA L40S") is None and accelerator_for_cuda_name("NVIDIA L4 MIG 1g.6gb").name == "l4"
    with pytest.raises(UnknownNameError, match="unknown accelerator 'nvidia-a10g'"):
        get_accelerator("NVIDIA A10G")
