"""Unit tests of resacct.training.init: the formulas agree with what torch.nn.init draws."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.training.init import (
    deep_linear_output_rms,
    kaiming_uniform_std,
    linear_default_weight_std,
    matmul_output_std,
    scaled_normal_std,
    trunc_normal_init_,
    truncated_fraction,
    truncated_normal_std,
    xavier_normal_std,
)


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_scaled_and_output_std():
    assert scaled_normal_std(256) == 1 / 16
    assert matmul_output_std(256, 1.0) == 16.0
    assert matmul_output_std(256, scaled_normal_std(256)) == 1.0
    assert deep_linear_output_rms(4, 1.0, depth=3) == 8.0
    assert deep_linear_output_rms(4, 0.5, depth=0, input_rms=3.0) == 3.0


@pytest.mark.parametrize("fan_in, fan_out", [(64, 256), (256, 64), (128, 128)])
def test_xavier_formula_matches_torch(fan_in, fan_out):
    weight = nn.init.xavier_normal_(torch.empty(fan_out, fan_in), generator=_generator())
    assert weight.std().item() == pytest.approx(xavier_normal_std(fan_in, fan_out), rel=0.05)


@pytest.mark.parametrize("a", [0.0, 1.0, math.sqrt(5)])
def test_kaiming_uniform_formula_matches_torch_std_and_bound(a):
    weight = nn.init.kaiming_uniform_(torch.empty(256, 512), a=a, generator=_generator())
    std = kaiming_uniform_std(512, a=a)
    assert weight.std().item() == pytest.approx(std, rel=0.02)
    assert weight.abs().max().item() <= math.sqrt(3) * std * (1 + 1e-6)


def test_nn_linear_default_is_one_over_sqrt_three_fan_in():
    torch.manual_seed(0)
    layer = nn.Linear(1024, 256)
    assert linear_default_weight_std(1024) == pytest.approx(1 / math.sqrt(3 * 1024))
    assert layer.weight.std().item() == pytest.approx(linear_default_weight_std(1024), rel=0.02)


@pytest.mark.parametrize("std, a, b", [(1.0, -2.0, 2.0), (0.5, -0.3, 1.0), (0.02, -2.0, 2.0), (2.0, -1.0, 1.0)])
def test_truncated_normal_std_matches_trunc_normal(std, a, b):
    x = nn.init.trunc_normal_(torch.empty(200_000), std=std, a=a, b=b, generator=_generator())
    assert x.std().item() == pytest.approx(truncated_normal_std(std, a, b), rel=0.01)
    assert a <= x.min().item() and x.max().item() <= b


def test_truncated_fraction():
    assert truncated_fraction(0.02, -2.0, 2.0) == 0.0
    assert truncated_fraction(1.0, -2.0, 2.0) == pytest.approx(0.0455, abs=1e-4)
    assert truncated_fraction(1.0, 0.0, math.inf) == pytest.approx(0.5)


def test_trunc_normal_init_cuts_at_sigmas_std():
    weight = trunc_normal_init_(torch.empty(64, 1024), generator=_generator())
    std = scaled_normal_std(64)
    assert weight.abs().max().item() <= 3 * std
    assert weight.std().item() == pytest.approx(truncated_normal_std(std, -3 * std, 3 * std), rel=0.02)
    narrow = trunc_normal_init_(torch.empty(16, 256), sigmas=1.0, generator=_generator())
    assert narrow.abs().max().item() <= scaled_normal_std(16)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: scaled_normal_std(0), "fan_in 0: expected a whole number ≥ 1"),
        (lambda: xavier_normal_std(4, -1), "fan_out -1"),
        (lambda: matmul_output_std(4, -0.5), "weight_std -0.5: expected a finite number > 0"),
        (lambda: truncated_normal_std(1.0, 2.0, -2.0), "a=2.0, b=-2.0"),
        (lambda: truncated_normal_std(0.0, -2.0, 2.0), "std 0.0"),
        (lambda: deep_linear_output_rms(4, 1.0, depth=-1), "depth -1"),
        (lambda: trunc_normal_init_(torch.empty(4, 4), sigmas=0.0), "sigmas 0.0"),
    ],
)
def test_bad_arguments_echo_the_value(call, message):
    with pytest.raises(ResacctError) as error:
        call()
    assert message in str(error.value)


@pytest.mark.typecheck
def test_weight_must_be_a_float_matrix():
    import beartype.roar
    import jaxtyping

    with pytest.raises((jaxtyping.TypeCheckError, beartype.roar.BeartypeException)):
        trunc_normal_init_(torch.empty(4, 4, 4))
