"""Tests that kill mutants of resacct/measurement/flop_tracing.py (see docs/mutation.md): its docstring
examples (torch's own counts on the meta device) and edges of the op classification, each
checked against what torch itself reports."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

from resacct.measurement import flop_tracing
from resacct.measurement.flop_tracing import (
    UncountedOp,
    build_on_meta,
    estimate_uncounted_flops,
    flop_counter_counts,
    flop_warnings,
    is_matmul_class,
    trace_flops,
    uncounted_ops,
)
from resacct.training.models import Cruncher


def test_docstring_examples():
    assert doctest.testmod(flop_tracing, optionflags=doctest.ELLIPSIS).failed == 0


def _aten(name: str) -> str:
    """A real aten op's name (fails if this torch has no such op)."""
    return str(getattr(torch.ops.aten, name).default)


def test_matmul_class_by_name_against_torchs_own_ops():
    for name in ("_weight_int8pack_mm", "_cslt_sparse_mm", "_int_mm", "convolution", "_convolution", "mv", "dot", "_efficient_attention_forward"):
        assert is_matmul_class(_aten(name)), name
    for name in ("add", "relu", "sum", "mul", "copy_"):
        assert not is_matmul_class(_aten(name)), name
    assert is_matmul_class("mylib.int8_gemm")  # other libraries' GEMMs (fbgemm, cutlass …) by name
    assert not is_matmul_class("convlib.add")  # only the op's own name counts, not its namespace
    assert not is_matmul_class("attention_ops.relu")
    assert is_matmul_class("convolution")  # a bare name, no namespace


def test_a_warning_without_an_estimate_says_so():
    assert flop_warnings([UncountedOp("backward", _aten("convolution"), 3, 10, 20, None)]) == [
        "FlopCounterMode counted 0 FLOPs for aten.convolution.default ×3 (backward), a matmul-class op: the FLOPs above miss it (no estimate)"
    ]
    assert flop_warnings([UncountedOp("forward", "aten.add.Tensor", 1, 4, 4, 4)]) == []


def test_ops_a_custom_mapping_already_counts_are_not_listed_as_uncounted():
    from resacct.measurement.flop_tracing import DispatchedOps

    with DispatchedOps() as recorded:
        _ = torch.ones(2, 3) + 1
        _ = torch.ones(4).relu()
    names = [op.op for op in uncounted_ops("forward", recorded.calls)]
    assert "aten.add.Tensor" in names and "aten.relu.default" in names
    filled = [op.op for op in uncounted_ops("forward", recorded.calls, filled=frozenset({"aten.add"}))]  # as step_measurements passes them
    assert "aten.add.Tensor" not in filled and "aten.relu.default" in filled


@pytest.mark.skipif(not hasattr(torch.Tag, "reduction"),
                    reason=f"torch {torch.__version__} has no torch.Tag.reduction (torch 2.4 and 2.8 lack it; 2.13 has it): "
                           "resacct estimates only its named reductions (sum, mean, amax …) there")
def test_ops_torch_tags_as_reductions_are_estimated_as_reductions():
    for name in ("var", "std", "linalg_vector_norm", "nansum", "argmax"):
        op = getattr(torch.ops.aten, name).default
        assert torch.Tag.reduction in op.tags, name  # torch's own classification
        assert estimate_uncounted_flops(str(op), input_elements=12, output_elements=4) == 8, name
        assert estimate_uncounted_flops(op, input_elements=12, output_elements=4) == 8, name
