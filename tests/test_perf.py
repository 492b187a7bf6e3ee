"""resacct.measurement.perf: timing, FLOP/s, MFU, intensity, the roofline, this machine's ceilings."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from resacct.errors import ResacctError, UnknownNameError
from resacct.measurement.perf import (
    ELEMENTWISE_OPERATIONS,
    Roofline,
    Timing,
    achieved_flops_per_sec,
    bound_by,
    elementwise_intensity_flops_per_byte,
    matmul_bytes,
    matmul_flops,
    matmul_intensity_flops_per_byte,
    measure_ceilings,
    measure_operation,
    measured_bytes,
    mfu,
    ridge_point_flops_per_byte,
    roofline_attainable_flops_per_sec,
    save_roofline_png,
    threads,
    time_callable,
)


def test_time_callable_warms_up_and_keeps_every_sample():
    calls = []
    timing = time_callable(lambda: calls.append(1), warmup=3, repeats=4, min_sample_sec=0.0)
    assert len(timing.samples_sec) == 4 and timing.calls_per_sample == 1
    assert len(calls) == 3 + 1 + 4  # warm-up, one calibration call, the samples
    assert timing.best_sec <= timing.median_sec <= max(timing.samples_sec)
    assert timing.spread >= 1


def test_time_callable_batches_calls_too_short_for_the_clock():
    timing = time_callable(lambda: None, repeats=2, min_sample_sec=1e-3, max_calls_per_sample=50)
    assert 1 < timing.calls_per_sample <= 50


@pytest.mark.parametrize(("keyword", "value"), [("repeats", 0), ("warmup", -1), ("max_calls_per_sample", 0)])
def test_time_callable_refuses_bad_counts(keyword, value):
    with pytest.raises(ResacctError, match=f"{keyword} is {value!r}"):
        time_callable(lambda: None, **{keyword: value})


def test_timing_statistics():
    timing = Timing(samples_sec=(3.0, 1.0, 2.0), calls_per_sample=1, warmup_calls=1, device="cpu")
    assert (timing.median_sec, timing.best_sec, timing.spread) == (2.0, 1.0, 3.0)


def test_achieved_flops_and_mfu_of_the_lecture():
    achieved = achieved_flops_per_sec(2 * 16384 * 32768 * 8192, 0.163)
    assert achieved == pytest.approx(5.4e13, rel=0.01)
    assert mfu(5.4e13, 6.75e13) == pytest.approx(0.8)
    assert mfu(2.735e14, 9.895e14) == pytest.approx(0.276, rel=0.01)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True])
def test_mfu_refuses_bad_numbers_and_echoes_them(bad):
    with pytest.raises(ResacctError, match=rf"peak_flops_per_sec is {bad!r}".replace("(", r"\(").replace(")", r"\)")):
        mfu(1e12, bad)


def test_mfu_above_one_is_returned_not_hidden():
    assert mfu(2e15, 989.5e12) > 1


def test_seconds_must_be_positive():
    with pytest.raises(ResacctError, match="seconds is 0"):
        achieved_flops_per_sec(1e9, 0)


def test_matmul_counts():
    assert matmul_flops(2, 3, 4) == 48
    assert matmul_bytes(2, 3, 4, 4) == (6 + 12 + 8) * 4
    assert matmul_intensity_flops_per_byte(1024, 1024, 1024, 2) == pytest.approx(2 * 1024 / 6)
    with pytest.raises(ResacctError, match="k is 0"):
        matmul_flops(2, 0, 4)


@given(st.integers(1, 4096), st.sampled_from([1, 2, 4]))
def test_square_matmul_intensity_grows_with_size(n, element):
    assert matmul_intensity_flops_per_byte(n + 1, n + 1, n + 1, element) > matmul_intensity_flops_per_byte(n, n, n, element)


def test_matrix_vector_intensity_stays_near_two_over_bytes():
    assert matmul_intensity_flops_per_byte(8192, 8192, 1, 2) == pytest.approx(1.0, rel=1e-3)


def test_elementwise_intensity():
    assert elementwise_intensity_flops_per_byte("add", 4) == pytest.approx(1 / 12)
    assert elementwise_intensity_flops_per_byte("relu", 2) == pytest.approx(1 / 4)
    assert elementwise_intensity_flops_per_byte("copy", 4) == 0
    for operation in ("add", "mul", "relu"):
        assert elementwise_intensity_flops_per_byte(operation, 1) < 1
    with pytest.raises(UnknownNameError, match="did you mean 'relu'"):
        elementwise_intensity_flops_per_byte("reluu", 4)


def test_roofline_arithmetic():
    assert ridge_point_flops_per_byte(989.5e12, 3.35e12) == pytest.approx(295.37, rel=1e-4)
    assert roofline_attainable_flops_per_sec(0.25, 989.5e12, 3.35e12) == pytest.approx(0.8375e12)
    assert roofline_attainable_flops_per_sec(1e4, 989.5e12, 3.35e12) == 989.5e12
    assert bound_by(1.0, 989.5e12, 3.35e12) == "memory"
    assert bound_by(1000.0, 989.5e12, 3.35e12) == "compute"
    with pytest.raises(ResacctError, match="intensity_flops_per_byte is -1"):
        bound_by(-1, 1e12, 1e12)


def test_roofline_of_a_datasheet():
    h100 = Roofline.of_accelerator("h100", "bf16")
    assert (h100.peak_flops_per_sec, h100.bandwidth_bytes_per_sec) == (989.5e12, 3.35e12)
    assert h100.bound(matmul_intensity_flops_per_byte(8192, 8192, 8192, 2)) == "compute"
    assert h100.bound(elementwise_intensity_flops_per_byte("gelu", 2)) == "memory"
    sparse = Roofline.of_accelerator("h100", "bf16", sparse=True)
    assert sparse.ridge_point_flops_per_byte == pytest.approx(2 * h100.ridge_point_flops_per_byte)


def test_threads_restores_the_setting():
    before = torch.get_num_threads()
    with threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ResacctError, match="threads is 0"):
        with threads(0):
            pass


def test_measured_bytes_reads_storages():
    x = torch.empty(4, 8)
    assert measured_bytes(x, x.t()) == 2 * 128
    assert measured_bytes(torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")) == 2 * 2**20


def test_measure_ceilings_small():
    ceilings = measure_ceilings(matmul_size=128, copy_bytes=2**20, thread_count=1, repeats=3)
    assert ceilings.peak_flops_per_sec > 1e8 and ceilings.bandwidth_bytes_per_sec > 1e8
    assert len(ceilings.copy_timing.samples_sec) == 3 and ceilings.threads == 1
    assert ceilings.roofline.ridge_point_flops_per_byte == pytest.approx(ceilings.peak_flops_per_sec / ceilings.bandwidth_bytes_per_sec)
    assert "1 thread)" in ceilings.roofline.name


@pytest.mark.parametrize(("operation", "size"), [("add", 4096), ("relu", 4096), ("gelu", 1024), ("copy", 4096), ("matmul", 32), ("matvec", 64)])
def test_measure_operation(operation, size):
    measured = measure_operation(operation, size, thread_count=1, repeats=2)
    assert measured.timing.median_sec > 0
    if operation in ELEMENTWISE_OPERATIONS:
        expected = elementwise_intensity_flops_per_byte(operation, 4)
    else:
        expected = matmul_intensity_flops_per_byte(size, size, size if operation == "matmul" else 1, 4)
    assert measured.intensity_flops_per_byte == pytest.approx(expected)


def test_measure_operation_refuses_unknown_names():
    with pytest.raises(UnknownNameError, match="operation"):
        measure_operation("conv", 8)


def test_save_roofline_png(tmp_path):
    path = tmp_path / "roofline.png"
    roofline = Roofline("test", 1e11, 1e10)
    save_roofline_png(str(path), roofline, [("add", 1 / 12, 5e8), ("matmul", 100.0, 8e10), ("copy", 0.0, 0.0), ("bad", 1.0, math.nan)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matmul_timed_with_partial_is_not_slowed_by_type_checks():
    """time_callable must time torch, not Python wrappers: a tiny matmul stays well under 1 ms."""
    a = torch.randn(8, 8)
    timing = time_callable(functools.partial(torch.matmul, a, a), repeats=3)
    assert timing.best_sec < 1e-3


@pytest.mark.parametrize("shape", [(3, 4), (5, 70000), (1 << 16,), (2, 1 << 16)])
def test_the_roofline_arrays_hold_normal_random_values_of_their_shape(shape):
    """The roofline's out-of-cache arrays are one random block tiled (drawing 16 M values a call took
    a second of its 2.6 s): contiguous float32 of the shape asked, no value left unset, normal values."""
    from resacct.measurement.triad import tiled_random

    torch.manual_seed(0)
    tensor = tiled_random(shape, "cpu")
    assert tensor.shape == shape and tensor.dtype == torch.float32 and tensor.is_contiguous()
    flat = tensor.flatten()
    block = flat[: min(flat.numel(), 1 << 16)]
    assert torch.equal(flat, block[torch.arange(flat.numel()) % block.numel()])  # every element set, from the one block
    assert torch.isfinite(flat).all() and block.unique().numel() > 0.99 * block.numel()
    assert abs(float(tensor.mean())) < 0.6 and 0.5 < float(tensor.std()) < 1.5


@pytest.mark.parametrize(("cache_mib", "array_mib"), [(1, 64), (32, 64), (100, 200), (128, 256), (300, 256), (1152, 256)])
def test_the_out_of_cache_triad_arrays_are_twice_the_cache_within_64_to_256_mib(cache_mib, array_mib):
    """Twice the last-level cache per array, at least 64 MiB, at most 256 MiB: a 300 MiB-L3 Xeon took
    600 MiB arrays (3 s a roof) for the bandwidth 256 MiB ones give; and the triad's three arrays
    together always overflow the cache they are sized for, up to 384 MiB."""
    from resacct.measurement.triad import out_of_cache_elements

    elements = out_of_cache_elements(4, cache_bytes=cache_mib * 2**20)
    assert elements * 4 == array_mib * 2**20
    assert 3 * elements * 4 > min(cache_mib, 384) * 2**20


def test_the_triad_uses_the_out_of_cache_size_of_this_machine(monkeypatch):
    from resacct.measurement import triad

    monkeypatch.setattr(triad, "last_level_cache_bytes", lambda: 300 * 2**20)
    monkeypatch.setattr(triad, "tiled_random", lambda shape, device: torch.empty(shape[0] // 1024, device=device))
    _, array_bytes = triad.stream_triad("cpu", None)
    assert array_bytes == 256 * 2**20
