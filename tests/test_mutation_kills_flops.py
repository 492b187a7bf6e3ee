"""resacct.formulas.flops against torch's FlopCounterMode and torch's own shape rules, written to kill the
mutants mutmut left alive (docs/mutation.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from resacct.formulas import flops
from resacct.measurement import flop_tracing
from resacct.errors import ResacctError
from resacct.training.models import Cruncher, TwoLayerNetwork


def counted(function, *tensors) -> int:
    with FlopCounterMode(display=False) as counter:
        function(*tensors)
    return counter.get_total_flops()


# ── shapes ─────────────────────────────────────────────────────────────────────────────────


def test_zero_sizes_are_valid_as_in_torch():
    a, b = torch.empty(0, 3), torch.empty(3, 4)
    assert flops.matmul_output_shape((0, 3), (3, 4)) == tuple((a @ b).shape)
    assert flops.matmul_flops((0, 3), (3, 4)) == counted(torch.matmul, a, b) == 0
    assert flops.matmul_flops((2, 0), (0, 4)) == counted(torch.matmul, torch.empty(2, 0), torch.empty(0, 4)) == 0
    assert flops.elementwise_flops((0, 3)) == torch.empty(0, 3).numel() == 0


@pytest.mark.parametrize(("a_shape", "b_shape", "message"), [
    ((2, -3), (3, 4), r"^a_shape \(2, -3\) must hold non-negative integer sizes$"),
    ((2, 3), (3, -4), r"^b_shape \(3, -4\) must hold non-negative integer sizes$"),
    ((2, 3), (4,), r"b_shape \(4,\) has k=4 \(its only size\); expected them equal$"),
    ((2, 3), (4, 5), r"b_shape \(4, 5\) has k=4 \(its second-to-last size\); expected them equal$"),
    ((2, 1, 4, 5), (3, 1, 5, 6), r"do not broadcast: 2 vs 3 at batch position -2 \(sizes must be equal or one of them 1\)$"),
    ((2, 4, 4, 5), (2, 3, 5, 6), r"do not broadcast: 4 vs 3 at batch position -1 "),
])
def test_bad_matmul_shapes_name_the_operand_and_torch_refuses_them_too(a_shape, b_shape, message):
    if min(a_shape + b_shape) >= 0:
        with pytest.raises(RuntimeError):
            torch.matmul(torch.empty(a_shape), torch.empty(b_shape))
    with pytest.raises(ResacctError, match=message):
        flops.matmul_flops(a_shape, b_shape)


def test_bad_elementwise_and_width_shapes_name_the_argument():
    with pytest.raises(ResacctError, match=r"^shape \(2, -1\) must hold non-negative integer sizes$"):
        flops.elementwise_flops((2, -1))
    with pytest.raises(ResacctError, match=r"^widths \(3, -1\) must hold non-negative integer sizes$"):
        flops.predict_linear_chain_flops(2, (3, -1), biases=False)


# ── einsum ─────────────────────────────────────────────────────────────────────────────────


def test_ellipsis_dimensions_align_from_the_right_like_torch_matmul():
    a, b = torch.empty(2, 3, 4, 5), torch.empty(3, 5, 6)
    measured = counted(torch.matmul, a, b)
    assert flops.einsum_flops("... i k, ... k j -> ... i j", tuple(a.shape), tuple(b.shape)) == measured == 2 * 2 * 3 * 4 * 5 * 6
    # '...' standing for no dimension at all
    assert flops.einsum_flops("... i k, k j -> ... i j", (4, 5), (5, 6)) == counted(torch.matmul, torch.empty(4, 5), torch.empty(5, 6))


def test_summed_and_kept_ellipsis_dimensions():
    # summed only over the '...' dimensions: multiply-accumulates, 2 per point
    assert flops.einsum_flops("... i, ... i -> i", (2, 3, 4), (2, 3, 4)) == 2 * 2 * 3 * 4
    # nothing summed, '...' kept: one multiply per point (torch runs it as mul)
    assert flops.einsum_flops("... i, ... i -> ... i", (2, 3), (2, 3)) == 2 * 3
    assert counted(lambda x, y: torch.einsum("...i,...i->...i", x, y), torch.empty(2, 3), torch.empty(2, 3)) == 0


@pytest.mark.parametrize(("pattern", "shapes", "message"), [
    ("... i ..., i j -> j", [(2, 3, 4), (3, 5)], r"'\.\.\. i \.\.\.' repeats an axis or '\.\.\.'$"),
    ("... i ... ..., i j -> j", [(2, 3, 4, 5), (3, 5)], r"repeats an axis or '\.\.\.'$"),
    ("a ... b c, c d -> a d", [(2, 3), (3, 4)], r"operand 'a \.\.\. b c' needs at least 3 dimensions, shape \(2, 3\) has 2$"),
    ("i j, j k -> i k", [(2, 3, 4), (3, 4)], r"operand 'i j' names 2 axes, but its shape \(2, 3, 4\) has 3$"),
    ("... i, ... i -> ... i", [(2, 4), (3, 4)], r"a dimension under '\.\.\.' is 2 in one operand and 3 in another$"),
    ("i j, j k -> i k", [(2, 1), (3, 4)], r"axis 'j' is 1 in one operand and 3 in another$"),
    ("a, a, a -> a", [(2,), (2,)], r"has 3 operand\(s\) and 2 shape\(s\) were given$"),
])
def test_bad_einsums_are_refused_with_what_is_wrong(pattern, shapes, message):
    with pytest.raises(ResacctError, match=message):
        flops.einsum_flops(pattern, *shapes)


# ── estimates for ops FlopCounterMode does not count ──────────────────────────────────────


@pytest.mark.parametrize("name", ["sum", "amax", "amin", "max", "min", "prod"])
def test_reductions_given_as_op_packets_fold_each_extra_input_once(name):
    """A reduction of 12 numbers into 4 combines 8 times; packets (no overload) carry no tags."""
    packet = getattr(torch.ops.aten, name)
    assert not hasattr(packet, "tags")
    assert flops.estimate_uncounted_flops(packet, 12, 4) == 8


def test_reduction_estimates():
    assert flops.estimate_uncounted_flops(torch.ops.aten.mean, 12, 4) == 8 + 4  # and one division per output
    assert flops.estimate_uncounted_flops(torch.ops.aten.logsumexp.default, 12, 4) == 8  # tagged, not listed
    assert flops.estimate_uncounted_flops("aten.sum.default", 1, 1) == 0  # summing one number adds nothing


def test_op_names_resolve_to_their_default_overload_and_unknown_ones_have_no_estimate():
    assert flops.estimate_uncounted_flops("aten.relu", 12, 12) == 12
    assert flops.estimate_uncounted_flops("aten.relu.default", 12, 12) == 12
    assert flops.estimate_uncounted_flops("aten.no_such_op.default", 4, 4) is None
    assert flops.estimate_uncounted_flops(torch.ops.aten.diagonal.default, 9, 3) == 0  # a view: no arithmetic
    assert flops.estimate_uncounted_flops("aten.mse_loss_backward.default", 8, 8) == 16


class _NoMatmul(nn.Module):
    def forward(self, x):
        return torch.relu(x) + torch.relu(x[:0]).sum()


class _Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(x)


class _ToDouble(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x):
        return self.linear(x.to(torch.float64))


def test_trace_of_a_model_without_matmuls_counts_nothing_and_estimates_relu():
    x = torch.randn(2, 4, requires_grad=True)
    trace = flops.trace_flops(_NoMatmul(), x, loss="sum")
    assert trace.forward_flops == 0 and trace.forward_ops == {} and trace.backward_ops == {}
    relu = [op for op in trace.uncounted_ops if op.phase == "forward" and op.op == "aten.relu.default"]
    assert len(relu) == 1 and relu[0].calls == 2
    assert relu[0].estimated_flops == x.numel()  # one per output element: 8 + 0


def test_trace_records_elements_of_tuple_outputs_and_no_estimate_as_none():
    x = torch.randn(2, 4)
    trace = flops.trace_flops(_Norm(), x, loss="sum")
    norm = [op for op in trace.uncounted_ops if op.op == "aten.native_layer_norm.default"]
    assert len(norm) == 1
    output, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)
    assert norm[0].output_elements == output.numel() + mean.numel() + rstd.numel()
    assert norm[0].estimated_flops is None
    none_only = flops.FlopTrace(0, 0, uncounted_ops=(flops.UncountedOp("forward", "aten.x", 1, 4, 4, None),))
    assert none_only.uncounted_estimated_flops() == 0


def test_trace_passes_keyword_arguments_to_the_ops():
    x = torch.randn(2, 4)
    trace = flops.trace_flops(_ToDouble(), x)
    assert trace.forward_ops == {"aten.addmm": counted(_ToDouble(), x)}


def test_trace_of_a_non_leaf_input_leaves_its_grad_alone():
    x = torch.randn(2, 4, requires_grad=True) * 2  # not a leaf: reading .grad warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = flops.trace_flops(Cruncher(dim=4, num_layers=1), x)
    assert trace.forward_flops > 0


def test_tensor_element_helpers_count_tensors_inside_containers():
    a, b = torch.empty(2, 3), torch.empty(5)
    assert flop_tracing._first_tensor_elements(([a, b], 7)) == a.numel()
    assert flop_tracing._first_tensor_elements((1, 2.0)) == 0
    assert flop_tracing._tensor_elements((a, [b])) == a.numel() + b.numel()


# ── predictions ────────────────────────────────────────────────────────────────────────────


def _layer_names(prediction) -> set[str]:
    return {term.what.rsplit(" ", 2)[0] for term in prediction.matmuls}


def test_prediction_terms_are_named_after_the_modules_torch_builds():
    cruncher = Cruncher(dim=4, num_layers=2)
    linear_modules = {name for name, module in cruncher.named_modules() if hasattr(module, "weight")}
    assert _layer_names(flops.predict_cruncher_flops(2, 4, 2)) == linear_modules == {"layers.0", "layers.1", "final"}
    network = TwoLayerNetwork(dim=4, outputs=2)
    assert _layer_names(flops.predict_two_layer_network_flops(2, 4, 2)) == {name for name, _ in network.named_parameters()}
    assert _layer_names(flops.predict_linear_flops(2, 3, 4)) == {"linear"}


def test_zero_tokens_cost_nothing_like_an_empty_batch():
    layer = nn.Linear(3, 4)
    prediction = flops.predict_linear_flops(0, 3, 4, bias=True)
    assert prediction.forward_flops == counted(layer, torch.empty(0, 3)) == 0
    assert prediction.forward_elementwise_flops == 0 and prediction.backward_elementwise_flops == 0
    assert flops.predict_linear_flops(1, 3, 4, bias=True).backward_elementwise_flops == 0  # a sum of one row


@pytest.mark.parametrize(("call", "message"), [
    (lambda: flops.predict_linear_chain_flops(-1, (3, 4), biases=False), r"^tokens must be a non-negative integer \(rows of x\), got -1$"),
    (lambda: flops.predict_linear_chain_flops(True, (3, 4), biases=False), r"got True$"),
    (lambda: flops.predict_linear_chain_flops(2, (3,), biases=False), r"^widths \(3,\) must list at least an input and an output width$"),
    (lambda: flops.predict_linear_chain_flops(2, (3, 4, 5), biases=False, names=("a",)), r"^1 names given for 2 layers$"),
    (lambda: flops.rule_deviation("sideways", 1, 1, 1), r"^phase 'sideways': expected one of forward, backward, step$"),
])
def test_bad_prediction_inputs_are_refused_with_the_value(call, message):
    with pytest.raises(ResacctError, match=message):
        call()


def test_linear_prediction_defaults_describe_a_bias_free_layer_on_a_plain_input():
    from resacct.training.models import Linear

    layer = Linear(3, 4, bias=False)
    prediction = flops.predict_linear_flops(5, 3, 4)
    assert prediction.params == sum(p.numel() for p in layer.parameters())
    assert prediction.bias_params == 0
    trace = flops.trace_flops(layer, torch.randn(5, 3), loss="sum")
    assert (prediction.forward_flops, prediction.backward_flops) == (trace.forward_flops, trace.backward_flops)
