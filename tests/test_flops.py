"""Unit tests of resacct.formulas.flops: formulas, errors, tracing, tracer gaps — and the requirement that
resacct's exact per-matmul prediction equals FlopCounterMode's count (ratio 1.000) for the
Cruncher and the two-layer network, forward and backward, over many sizes."""

from __future__ import annotations

import doctest

import einops
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Float
from torch.utils.flop_counter import FlopCounterMode

import resacct.formulas.flops as flops
from resacct.errors import ResacctError
from resacct.formulas.flops import (
    backward_flops_rule,
    build_on_meta,
    einsum_flops,
    elementwise_flops,
    estimate_uncounted_flops,
    flop_counter_counts,
    forward_flops_rule,
    matmul_flops,
    matmul_output_shape,
    predict_cruncher_flops,
    predict_linear_chain_flops,
    predict_two_layer_network_flops,
    rule_deviation,
    step_flops_rule,
    trace_flops,
)
from resacct.training.models import Cruncher, TwoLayerNetwork

sizes = st.integers(1, 96)
FEW = settings(max_examples=25, deadline=None)


def bare_flop_counter(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) with nothing but FlopCounterMode — the reference resacct must match."""
    with FlopCounterMode(display=False) as forward:
        output = model(inputs)
        loss = torch.nn.functional.mse_loss(output, torch.zeros_like(output))
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


# ── matmul ───────────────────────────────────────────────────────────────────────────────


def test_matmul_flops_of_the_lecture_examples() -> None:
    assert matmul_flops((16, 32), (32, 2)) == 2048
    assert matmul_flops((16384, 32768), (32768, 8192)) == 8_796_093_022_208
    assert matmul_flops((4, 8, 16, 32), (32, 2)) == 4 * 8 * 2 * 16 * 32 * 2
    assert matmul_flops((4, 8, 16, 32), (4, 8, 32, 64)) == 32 * 2 * 16 * 32 * 64


def test_matmul_broadcasts_batch_dimensions_like_torch() -> None:
    assert matmul_output_shape((7, 1, 16, 32), (5, 32, 2)) == (7, 5, 16, 2)
    assert matmul_flops((7, 1, 16, 32), (5, 32, 2)) == 2 * 35 * 16 * 32 * 2


def test_matmul_vectors_follow_torch_and_are_a_tracer_gap() -> None:
    assert matmul_output_shape((32,), (32,)) == ()
    assert matmul_output_shape((5, 16, 32), (32,)) == (5, 16)
    assert matmul_flops((32,), (32,)) == 64
    assert matmul_flops((3, 5), (5,)) == 30
    with FlopCounterMode(display=False) as counter:
        torch.empty(3, 5, device="meta") @ torch.empty(5, device="meta")
    assert counter.get_total_flops() == 0  # aten.mv has no formula: resacct reports it, see below


@given(
    batch=st.lists(st.integers(1, 3), max_size=3),
    drop=st.integers(0, 3),
    ones=st.lists(st.booleans(), min_size=3, max_size=3),
    m=st.integers(1, 5),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    vector=st.sampled_from(["none", "first", "second"]),
)
@FEW
def test_matmul_shape_and_flops_match_torch(batch: list, drop: int, ones: list, m: int, k: int, n: int, vector: str) -> None:
    a_batch = [1 if one else size for size, one in zip(batch, ones)][drop:]
    a_shape = (k,) if vector == "first" else (*a_batch, m, k)
    b_shape = (k,) if vector == "second" else (*batch, k, n)
    result = torch.empty(a_shape, device="meta") @ torch.empty(b_shape, device="meta")
    assert matmul_output_shape(a_shape, b_shape) == tuple(result.shape)
    if vector == "none":
        with FlopCounterMode(display=False) as counter:
            torch.empty(a_shape, device="meta") @ torch.empty(b_shape, device="meta")
        assert matmul_flops(a_shape, b_shape) == counter.get_total_flops()


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "message"),
    [
        ((16, 32), (31, 2), r"a_shape \(16, 32\) has k=32 .* b_shape \(31, 2\) has k=31"),
        ((4, 8, 16, 32), (3, 8, 32, 2), r"batch dimensions \(4, 8\) .* \(3, 8\) .* do not broadcast: 4 vs 3"),
        ((), (3, 2), r"at least 1 dimension"),
        ((2, -3), (3, 2), r"non-negative integer sizes"),
    ],
)
def test_bad_matmul_shapes_raise_resacct_error_with_the_shapes(a_shape: object, b_shape: object, message: str) -> None:
    with pytest.raises(ResacctError, match=message):
        matmul_flops(a_shape, b_shape)  # type: ignore[arg-type]


@pytest.mark.parametrize(("a_shape", "message"), [((2, 3.0), "non-negative integer sizes"), ("23", "sequence of dimension sizes")])
def test_wrongly_typed_shapes_are_refused(a_shape: object, message: str) -> None:
    """In this suite beartype (via jaxtyping's hook) refuses them first; without it resacct does."""
    with pytest.raises((ResacctError, TypeError)) as refused:
        matmul_flops(a_shape, (3, 2))  # type: ignore[arg-type]
    if isinstance(refused.value, ResacctError):
        assert message in str(refused.value)
    else:
        assert "a_shape" in str(refused.value)
    with pytest.raises(ResacctError, match=message):
        flops._as_shape(a_shape, "a_shape")  # type: ignore[arg-type]


def test_incompatible_shapes_are_also_refused_by_torch() -> None:
    with pytest.raises(RuntimeError):
        torch.empty(16, 32, device="meta") @ torch.empty(31, 2, device="meta")


# ── einsum and element-wise ──────────────────────────────────────────────────────────────


@given(batch=st.integers(1, 4), seq1=st.integers(1, 8), seq2=st.integers(1, 8), hidden=st.integers(2, 8))
@FEW
def test_einsum_flops_match_flop_counter_for_contractions(batch: int, seq1: int, seq2: int, hidden: int) -> None:
    x, y = torch.empty(batch, seq1, hidden, device="meta"), torch.empty(batch, seq2, hidden, device="meta")
    with FlopCounterMode(display=False) as counter:
        einops.einsum(x, y, "batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2")
    assert einsum_flops("batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2", x.shape, y.shape) == counter.get_total_flops()


def test_einsum_without_summed_axis_counts_multiplies_and_is_a_tracer_gap() -> None:
    assert einsum_flops("b s h1, b s h2 -> b s h1 h2", (2, 3, 4), (2, 3, 5)) == 2 * 3 * 4 * 5
    assert einsum_flops("b i h, b j h -> b i j", (2, 3, 1), (2, 5, 1)) == 2 * 3 * 5  # summed axis of size 1

    class OuterProduct(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return einops.einsum(x, x, "b s h1, b s h2 -> b s h1 h2")

    trace = trace_flops(OuterProduct(), torch.randn(2, 3, 4, requires_grad=True), loss="none")
    assert trace.forward_flops == 0  # torch runs a mul; FlopCounterMode has no formula for it
    (mul,) = [op for op in trace.uncounted_ops if op.phase == "forward"]
    assert (mul.op, mul.estimated_flops) == ("aten.mul.Tensor", einsum_flops("b s h1, b s h2 -> b s h1 h2", (2, 3, 4), (2, 3, 4)))


def test_einsum_with_ellipsis_broadcasts() -> None:
    assert einsum_flops("... hidden1, hidden1 hidden2 -> ... hidden2", (2, 3, 2, 4), (4, 4)) == 2 * 2 * 3 * 2 * 4 * 4
    assert einsum_flops("... i k, ... k j -> ... i j", (1, 3, 2, 4), (5, 1, 4, 6)) == 2 * 5 * 3 * 2 * 4 * 6


@pytest.mark.parametrize(
    ("pattern", "shapes", "message"),
    [
        ("b i k, b k j", [(2, 3, 4), (2, 4, 5)], "exactly one '->'"),
        ("b i k -> b i", [(2, 3, 4)], "two-operand einsums; .* has 1 operand"),
        ("b i k, b k j -> b i j", [(2, 3, 4), (2, 5, 6)], "axis 'k' is 4 in one operand and 5 in another"),
        ("b i k, b k j -> b i z", [(2, 3, 4), (2, 4, 5)], "output axis 'z' is in no input"),
        ("b i k, b k j -> b i j", [(2, 3), (2, 4, 5)], "names 3 axes, but its shape"),
        ("b i i, b i j -> b j", [(2, 3, 3), (2, 3, 5)], "repeats an axis"),
        ("b (i k), b k j -> b i j", [(2, 12), (2, 4, 5)], "is not an axis name"),
    ],
)
def test_bad_einsum_patterns_raise_resacct_error(pattern: str, shapes: list, message: str) -> None:
    with pytest.raises(ResacctError, match=message):
        einsum_flops(pattern, *shapes)


def test_elementwise_flops_count_output_elements_which_the_flop_counter_misses() -> None:
    assert elementwise_flops((3, 4)) == 12
    assert elementwise_flops((3, 4), flops_per_element=2) == 24
    with FlopCounterMode(display=False) as counter:
        torch.ones(3, 4) + torch.ones(3, 4)
    assert counter.get_total_flops() == 0


def test_flop_counter_counts_matmuls_only() -> None:
    assert flop_counter_counts("aten.mm.default") and flop_counter_counts(torch.ops.aten.bmm.default)
    assert not flop_counter_counts("aten.add.Tensor") and not flop_counter_counts("aten.mv.default")


def test_estimates_for_uncounted_ops() -> None:
    assert estimate_uncounted_flops("aten.add.Tensor", 12, 12) == 12
    assert estimate_uncounted_flops("aten.mean.dim", 12, 3) == 12  # 9 adds + 3 divisions
    assert estimate_uncounted_flops("aten.mv.default", 15, 3) == matmul_flops((3, 5), (5,))
    assert estimate_uncounted_flops("aten.view.default", 12, 12) == 0
    assert estimate_uncounted_flops("aten.clone.default", 12, 12) == 0  # tagged pointwise, but only copies
    assert estimate_uncounted_flops("aten.topk.default", 12, 3) is None


# ── exact prediction == FlopCounterMode (ratio 1.000) ────────────────────────────────────


@given(tokens=sizes, dim=sizes, num_layers=st.integers(0, 4), input_requires_grad=st.booleans())
@FEW
def test_cruncher_prediction_equals_flop_counter(tokens: int, dim: int, num_layers: int, input_requires_grad: bool) -> None:
    model = build_on_meta(lambda: Cruncher(dim, num_layers))
    inputs = torch.empty(tokens, dim, device="meta", requires_grad=input_requires_grad)
    prediction = predict_cruncher_flops(tokens, dim, num_layers, input_requires_grad=input_requires_grad)
    forward, backward = bare_flop_counter(model, inputs)
    assert prediction.forward_flops / forward == 1.0
    assert prediction.backward_flops / backward == 1.0
    trace = trace_flops(model, inputs)
    assert (trace.forward_flops, trace.backward_flops, trace.step_flops) == (forward, backward, forward + backward)
    assert prediction.params == sum(p.numel() for p in model.parameters())


@given(tokens=sizes, dim=sizes, outputs=sizes, input_requires_grad=st.booleans())
@FEW
def test_two_layer_prediction_equals_flop_counter(tokens: int, dim: int, outputs: int, input_requires_grad: bool) -> None:
    model = build_on_meta(lambda: TwoLayerNetwork(dim, outputs))
    inputs = torch.empty(tokens, dim, device="meta", requires_grad=input_requires_grad)
    prediction = predict_two_layer_network_flops(tokens, dim, outputs, input_requires_grad=input_requires_grad)
    forward, backward = bare_flop_counter(model, inputs)
    assert prediction.forward_flops / forward == 1.0
    assert prediction.backward_flops / backward == 1.0
    trace = trace_flops(model, inputs)
    assert (trace.forward_flops, trace.backward_flops) == (forward, backward)


def test_prediction_on_real_cpu_tensors_equals_flop_counter() -> None:
    torch.manual_seed(0)
    model = Cruncher(dim=16, num_layers=3)
    trace = trace_flops(model, torch.randn(5, 16))
    prediction = predict_cruncher_flops(5, 16, 3)
    assert (trace.forward_flops, trace.backward_flops) == (prediction.forward_flops, prediction.backward_flops)


def test_lecture_sized_linear_model_on_meta() -> None:
    model = build_on_meta(lambda: TwoLayerNetwork(32768, 8192))
    trace = trace_flops(model, torch.empty(16384, 32768, device="meta"))
    prediction = predict_two_layer_network_flops(16384, 32768, 8192)
    assert trace.forward_flops == prediction.forward_flops == 2 * 16384 * (32768 * 32768 + 32768 * 8192)
    assert trace.backward_flops == prediction.backward_flops


# ── the autograd facts behind the deviations ─────────────────────────────────────────────


def test_first_layer_backward_is_2bdd_without_input_grad_and_4bdd_with_it() -> None:
    tokens, dim = 8, 16
    without = predict_linear_chain_flops(tokens, (dim, dim), biases=False)
    with_input = predict_linear_chain_flops(tokens, (dim, dim), biases=False, input_requires_grad=True)
    assert (without.backward_flops, with_input.backward_flops) == (2 * tokens * dim * dim, 4 * tokens * dim * dim)
    assert [term.what for term in without.matmuls if term.phase == "skipped"] == ["layers.0 input gradient"]
    model = build_on_meta(lambda: TwoLayerNetwork(dim, dim))
    _, backward_without = bare_flop_counter(model, torch.empty(tokens, dim, device="meta"))
    _, backward_with = bare_flop_counter(model, torch.empty(tokens, dim, device="meta", requires_grad=True))
    assert backward_with - backward_without == 2 * tokens * dim * dim


@given(tokens=sizes, dim=sizes, num_layers=st.integers(0, 4))
@FEW
def test_rule_shortfall_explains_the_measured_gap_exactly(tokens: int, dim: int, num_layers: int) -> None:
    model = build_on_meta(lambda: Cruncher(dim, num_layers))
    forward, backward = bare_flop_counter(model, torch.empty(tokens, dim, device="meta"))
    params = sum(p.numel() for p in model.parameters())
    prediction = predict_cruncher_flops(tokens, dim, num_layers)
    assert sum(prediction.rule_shortfall().values()) == step_flops_rule(tokens, params) - (forward + backward)
    assert rule_deviation("forward", forward, tokens, params).shortfall_flops == prediction.rule_shortfall()["bias params in forward"]


def test_rule_functions_and_deviation() -> None:
    assert (forward_flops_rule(3, 10), backward_flops_rule(3, 10), step_flops_rule(3, 10)) == (60, 120, 180)
    deviation = rule_deviation("backward", actual_flops=90, tokens=3, params=10)
    assert (deviation.rule_flops, deviation.shortfall_flops, deviation.ratio) == (120, 30, 0.75)
    with pytest.raises(ResacctError, match="phase 'sideways'"):
        rule_deviation("sideways", 1, 1, 1)


def test_law_holds_exactly_for_bias_free_layers_when_input_requires_grad() -> None:
    prediction = predict_two_layer_network_flops(16, 32, 8, input_requires_grad=True)
    assert prediction.rule_shortfall() == {"bias params in forward": 0, "bias params in backward": 0, "input gradients not computed": 0}
    assert prediction.step_flops == step_flops_rule(16, prediction.params)


# ── the per-op breakdown and the tracer gaps ─────────────────────────────────────────────


def test_trace_breakdown_and_tracer_gaps_of_the_cruncher() -> None:
    tokens, dim, num_layers = 2, 4, 2
    model = build_on_meta(lambda: Cruncher(dim, num_layers))
    trace = trace_flops(model, torch.empty(tokens, dim, device="meta"))
    assert trace.forward_ops == {"aten.mm": 144} and trace.backward_ops == {"aten.mm": 224}
    gaps = {(op.phase, op.op): op for op in trace.uncounted_ops}
    assert set(gaps) == {
        ("forward", "aten.add.Tensor"),
        ("forward", "aten.mse_loss.default"),
        ("backward", "aten.mse_loss_backward.default"),
        ("backward", "aten.sum.dim_IntList"),
    }
    prediction = predict_cruncher_flops(tokens, dim, num_layers)
    bias_adds, bias_sums = gaps["forward", "aten.add.Tensor"], gaps["backward", "aten.sum.dim_IntList"]
    assert (bias_adds.calls, bias_sums.calls) == (num_layers + 1, num_layers + 1)
    assert bias_adds.estimated_flops == prediction.forward_elementwise_flops
    assert bias_sums.estimated_flops == prediction.backward_elementwise_flops
    assert gaps["forward", "aten.mse_loss.default"].estimated_flops == 3 * tokens
    assert trace.uncounted_estimated_flops("forward") == prediction.forward_elementwise_flops + 3 * tokens


def test_trace_lists_vector_matmul_as_a_gap_with_resacct_estimate() -> None:
    class VectorHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight  # aten.mv

    trace = trace_flops(VectorHead(), torch.randn(3, 5), loss="sum")
    assert trace.forward_flops == 0
    mv = next(op for op in trace.uncounted_ops if op.phase == "forward" and op.op == "aten.mv.default")
    assert mv.estimated_flops == matmul_flops((3, 5), (5,))
    assert "aten.sum.default" in trace.uncounted_op_names("forward")


def test_trace_restores_gradients_and_repeats_exactly() -> None:
    model = Cruncher(dim=4, num_layers=1)
    inputs = torch.randn(3, 4, requires_grad=True)
    sentinel = torch.full((4, 4), 7.0)
    model.layers[0].weight.grad = sentinel
    first, second = trace_flops(model, inputs), trace_flops(model, inputs)
    assert first == second  # no leftover .grad turns the second backward into accumulations
    assert model.layers[0].weight.grad is sentinel and inputs.grad is None


def test_trace_loss_choices() -> None:
    model = build_on_meta(lambda: TwoLayerNetwork(4, 2))
    inputs = torch.empty(3, 4, device="meta")
    assert trace_flops(model, inputs, loss="none").uncounted_ops == ()
    assert trace_flops(model, inputs, loss="sum").uncounted_op_names() == ["aten.sum.default"]
    with pytest.raises(ResacctError, match="loss 'cross_entropy'"):
        trace_flops(model, inputs, loss="cross_entropy")


# ── jaxtyping: checked inside resacct, documentation outside ─────────────────────────────


def annotated_outside_resacct(x: Float[torch.Tensor, "batch seq"]) -> list:
    """Defined in a test module: jaxtyping's import hook covers only the resacct package."""
    return list(x.shape)


def test_annotation_outside_the_hook_is_documentation() -> None:
    assert annotated_outside_resacct(torch.ones(2, 1, 3)) == [2, 1, 3]


def test_resacct_functions_are_checked_by_the_hook_in_this_suite() -> None:
    if not hasattr(trace_flops, "__wrapped__"):
        pytest.skip("jaxtyping's import hook is off (conftest.py installs it unless RESACCT_TYPECHECK=0 or the plain quick tier)")
    with pytest.raises(TypeError, match="inputs"):
        trace_flops(build_on_meta(lambda: TwoLayerNetwork(4, 2)), torch.tensor(1.0))  # 0-D: no "*batch features"


def test_annotated_only_check_function_really_carries_the_annotation() -> None:
    from resacct.checks import einops_ops

    annotation = einops_ops._annotated_only.__annotations__["x"]
    assert "batch seq" in str(annotation)
    assert einops_ops._annotated_only(torch.ones(2, 1, 3)) == [2, 1, 3]
    with pytest.raises(TypeError):
        einops_ops._annotated_and_checked(torch.ones(2, 1, 3))


# ── docs stay true ───────────────────────────────────────────────────────────────────────


def test_docstring_examples_of_resacct_flops() -> None:
    from resacct.formulas import flop_rules

    results = doctest.testmod(flops, optionflags=doctest.ELLIPSIS)
    rules = doctest.testmod(flop_rules, optionflags=doctest.ELLIPSIS)
    assert results.attempted + rules.attempted >= 25 and results.failed == rules.failed == 0
