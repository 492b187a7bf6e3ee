"""resacct.formulas.napkin: 6ND, days on a cluster, the largest model that fits, thresholds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resacct.errors import ResacctError, UnknownNameError
from resacct.facts.hardware import get_accelerator, peak_flops_per_sec
from resacct.formulas.napkin import (
    COMPUTE_THRESHOLDS,
    REPORTED_TRAINING_FLOPS,
    SECONDS_PER_DAY,
    cluster_flops,
    compare_to_thresholds,
    device_hours,
    flops_per_day,
    get_threshold,
    max_parameters,
    throughput_mfu,
    training_days,
    training_flops,
    training_seconds,
    training_time,
)

H100_DENSE = 989.5e12


def test_seventy_billion_on_fifteen_trillion_tokens():
    total = training_flops(70e9, 15e12)
    assert total == pytest.approx(6.3e24)
    assert flops_per_day(1024, H100_DENSE, 0.5) == pytest.approx(4.377e22, rel=1e-3)
    assert training_days(total, 1024, H100_DENSE, 0.5) == pytest.approx(143.9, rel=1e-3)


def test_the_sparse_peak_would_halve_the_days():
    total = training_flops(70e9, 15e12)
    sparse = peak_flops_per_sec("h100", "bf16", sparse=True)
    assert training_days(total, 1024, sparse, 0.5) == pytest.approx(143.9 / 2, rel=1e-3)


def test_training_time_bundles_the_estimate():
    estimate = training_time(6.3e24, 1024, H100_DENSE, 0.5)
    assert estimate.devices == 1024 and estimate.training_days == pytest.approx(143.93, rel=1e-4)
    assert estimate.device_hours == pytest.approx(estimate.training_days * 24 * 1024)
    assert device_hours(6.3e24, H100_DENSE, 0.5) == pytest.approx(estimate.device_hours)


def test_gpt3():
    assert training_flops(175e9, 300e9) == pytest.approx(3.15e23)
    assert training_flops(175e9, 300e9) == pytest.approx(REPORTED_TRAINING_FLOPS["gpt-3"][0], rel=0.005)


def test_largest_model_on_eight_h100s():
    assert max_parameters(8, get_accelerator("h100").memory_bytes, 16) == pytest.approx(40e9)
    assert max_parameters(8, 80e9, 20) == pytest.approx(32e9)


def test_eight_h100s_for_two_weeks():
    assert cluster_flops(8, 14 * SECONDS_PER_DAY, H100_DENSE) == pytest.approx(9.575e21, rel=1e-3)
    assert cluster_flops(8, 7 * SECONDS_PER_DAY, H100_DENSE) == pytest.approx(4.788e21, rel=1e-3)


def test_thresholds():
    eu, us = (comparison for comparison in compare_to_thresholds(6.3e24))
    assert (eu.threshold.threshold_flops, us.threshold.threshold_flops) == (1e25, 1e26)
    assert eu.ratio == pytest.approx(0.63) and not eu.above
    assert us.ratio == pytest.approx(0.063) and not us.above and not us.threshold.in_force
    assert compare_to_thresholds(1e25)[0].above  # "≥ 10^25"
    assert COMPUTE_THRESHOLDS["eu_ai_act"].in_force
    with pytest.raises(UnknownNameError, match="did you mean 'eu_ai_act'"):
        get_threshold("eu_ai_ac")


def test_throughput_mfu():
    # 7B parameters at 3000 tokens/s on one H100: 6 · 7e9 · 3000 = 1.26e14 FLOP/s
    assert throughput_mfu(7e9, 3000, H100_DENSE) == pytest.approx(1.26e14 / H100_DENSE)
    assert throughput_mfu(7e9, 3000 * 8, H100_DENSE, devices=8) == pytest.approx(1.26e14 / H100_DENSE)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True])
def test_sizes_must_be_positive_finite_numbers(bad):
    with pytest.raises(ResacctError, match=r"parameters is .*; expected a finite number > 0"):
        training_flops(bad, 15e12)


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, float("nan")])
def test_mfu_must_be_a_fraction(bad):
    with pytest.raises(ResacctError, match=r"mfu is .*; expected a fraction in \(0, 1\]"):
        training_days(6.3e24, 1024, H100_DENSE, bad)


@pytest.mark.parametrize("bad", [0, 2.5, -8])
def test_devices_must_be_whole(bad):
    with pytest.raises(ResacctError, match=rf"devices is {bad!r}; expected a whole number"):
        flops_per_day(bad, H100_DENSE, 0.5)


def test_error_messages_echo_the_value():
    with pytest.raises(ResacctError, match=r"bytes_per_parameter is -16"):
        max_parameters(8, 80e9, -16)
    with pytest.raises(ResacctError, match=r"total_flops is nan"):
        training_seconds(float("nan"), 8, H100_DENSE, 0.5)


@given(st.floats(1e20, 1e27), st.integers(1, 100_000), st.floats(0.01, 1.0))
def test_days_scale_inversely_with_devices(total, devices, utilization):
    one = training_days(total, 1, H100_DENSE, utilization)
    assert training_days(total, devices, H100_DENSE, utilization) == pytest.approx(one / devices)


def test_the_shared_number_checks_run_their_examples_and_keep_one_wording():
    """napkin, scaling, utilization and parallelism check numbers through resacct.formulas.validation."""
    import doctest

    import resacct.formulas.validation
    from resacct.formulas import parallelism
    from resacct.formulas import scaling, utilization
    from resacct.errors import ResacctError

    failed, attempted = doctest.testmod(resacct.formulas.validation)
    assert attempted >= 4 and failed == 0
    with pytest.raises(ResacctError, match=r"^goodput is True; expected a finite number > 0$"):
        scaling._positive("goodput", True)
    with pytest.raises(ResacctError, match=r"^tensor_parallel is 0; expected a whole number ≥ 1$"):
        parallelism._whole("tensor_parallel", 0)
    assert utilization._whole("layers", 96.0) == 96
