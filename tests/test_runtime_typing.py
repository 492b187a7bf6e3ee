"""Runtime type checking: the root conftest.py installs jaxtyping's import hook with beartype on
resacct's tensor-handling layers, so a wrong shape, dtype or type raises at the call."""

from __future__ import annotations

import pytest
import torch

from resacct.measurement import tensors
from resacct.training.models import Cruncher, TwoLayerNetwork

pytestmark = pytest.mark.typecheck  # the hook is off in the plain quick tier (conftest.py): these skip there


def type_errors() -> tuple[type[BaseException], ...]:
    import beartype.roar
    import jaxtyping

    return (jaxtyping.TypeCheckError, beartype.roar.BeartypeException, TypeError)


def test_wrong_shape_is_refused():
    model = Cruncher(dim=4, num_layers=2)
    assert model(torch.randn(3, 4)).shape == (3, 1)
    with pytest.raises(type_errors()) as error:
        model(torch.randn(3, 5, 2))
    assert "batch dim" in str(error.value) or "dim" in str(error.value)


def test_wrong_dtype_is_refused():
    network = TwoLayerNetwork(dim=4, outputs=2)
    with pytest.raises(type_errors()):
        network.forward(torch.ones(3, 4, dtype=torch.int64))


def test_wrong_python_type_is_refused():
    with pytest.raises(type_errors()):
        tensors.storage_bytes([1, 2, 3])  # a list is not a tensor


def test_the_hook_instruments_resacct_only_when_configured():
    """The hook wraps functions at import; a plain call with the right types still works."""
    assert tensors.storage_bytes(torch.zeros(4, 8)) == 128


def test_the_tensor_layers_are_checked_and_the_harness_is_not():
    """conftest.py instruments every resacct module but the harness, report writers and CLI
    (no tensors there, and wrapping the YAML loader's hot loop cost 30 % of the claims' time)."""
    from conftest import UNCHECKED_SUBPACKAGES, type_checked_modules
    from resacct.harness import yaml_nodes
    from resacct.training import models

    checked = type_checked_modules()
    layers = {"resacct.facts", "resacct.formulas", "resacct.measurement", "resacct.training", "resacct.checks"}
    assert {"resacct.account"} | layers <= set(checked)  # the layer folders and the account package: every module in them
    assert not {f"resacct.{name}" for name in UNCHECKED_SUBPACKAGES} & set(checked)
    assert hasattr(tensors.storage_bytes, "__wrapped__"), "resacct.measurement.tensors is not type-checked"
    assert hasattr(models.cruncher_parameter_count, "__wrapped__"), "a module inside a layer folder is not type-checked"
    assert not hasattr(yaml_nodes.to_python, "__wrapped__"), "the harness's YAML loader is wrapped"
