"""Unit tests of resacct.training.models: the counting formulas against real modules, and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.training.models import (
    Cruncher,
    Linear,
    TwoLayerNetwork,
    count_parameter_tensors,
    count_parameters,
    cruncher_linear_layer_count,
    cruncher_parameter_count,
    cruncher_parameter_tensor_count,
    cruncher_state_dict_sizes,
)


@pytest.mark.parametrize("dim, num_layers", [(1, 0), (4, 2), (64, 2), (7, 5)])
def test_cruncher_counts_match_the_real_module(dim, num_layers):
    model = Cruncher(dim=dim, num_layers=num_layers)
    assert count_parameters(model) == cruncher_parameter_count(dim, num_layers) == model.parameter_count()
    assert count_parameter_tensors(model) == cruncher_parameter_tensor_count(num_layers)
    assert [(name, t.numel()) for name, t in model.state_dict().items()] == cruncher_state_dict_sizes(dim, num_layers)
    linear_layers = [module for module in model.modules() if isinstance(module, Linear)]
    assert len(linear_layers) == cruncher_linear_layer_count(num_layers)


def test_lecture_state_dict_for_d64():
    d = 64
    assert cruncher_state_dict_sizes(d, 2) == [
        ("layers.0.weight", d * d), ("layers.0.bias", d),
        ("layers.1.weight", d * d), ("layers.1.bias", d),
        ("final.weight", d), ("final.bias", 1),
    ]  # fmt: skip


def test_linear_stores_weight_in_by_out_and_computes_x_at_w_plus_b():
    layer = Linear(3, 2)
    assert layer.weight.shape == (3, 2) and layer.bias.shape == (2,)
    x = torch.randn(5, 3)
    torch.testing.assert_close(layer(x), x @ layer.weight + layer.bias)
    assert Linear(3, 2, bias=False).bias is None


def test_cruncher_and_two_layer_network_shapes():
    assert Cruncher(dim=8, num_layers=3)(torch.randn(5, 8)).shape == (5, 1)
    assert TwoLayerNetwork(dim=4, outputs=2)(torch.randn(3, 4)).shape == (3, 2)


def test_shared_parameters_are_counted_once():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, shared)
    assert count_parameters(model) == 20 and count_parameter_tensors(model) == 2


@pytest.mark.parametrize("dim, num_layers, message", [(0, 2, "dim 0"), (4, -1, "num_layers -1"), (2.5, 1, "dim 2.5"), (True, 1, "dim True")])
def test_bad_shapes_are_refused_with_the_value(dim, num_layers, message):
    with pytest.raises((ResacctError, TypeError)) as error:  # beartype may refuse a float before resacct does
        cruncher_parameter_count(dim, num_layers)
    if isinstance(error.value, ResacctError):
        assert message in str(error.value) and "expected" in str(error.value)


def test_bad_layer_count_message():
    with pytest.raises(ResacctError, match=r"num_layers -2: expected a whole number ≥ 0"):
        cruncher_parameter_tensor_count(-2)
