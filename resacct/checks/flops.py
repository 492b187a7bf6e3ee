"""Measuring FLOPs with torch: FlopCounterMode for matmuls and models, a dispatch mode for
element-wise ops (which FlopCounterMode counts as 0), autograd for gradients.

Every measurement here is torch's own: ``FlopCounterMode.get_total_flops()``, the aten ops torch
dispatches (seen through a ``TorchDispatchMode``), ``.grad`` and ``.shape``. resacct's formulas
(:mod:`resacct.formulas.flops`) only supply the ``predicted`` side. Big shapes run on the meta device.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from jaxtyping import Float
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from resacct.formulas.flops import (
    PredictedFlops,
    einsum_flops,
    elementwise_flops,
    flop_counter_counts,
    matmul_flops,
    matmul_output_shape,
    predict_cruncher_flops,
    predict_linear_flops,
    predict_two_layer_network_flops,
)
from resacct.harness.registry import Outcome, check
from resacct.harness.strategies import strategy
from resacct.measurement.meta_op_cache import MetaOpCacheMode, shared_meta_cache
from resacct.training.models import Cruncher, Linear, TwoLayerNetwork

# ───────────────────────────── measuring tools (torch's own counts) ─────────────────────────────


def _flop_counter_total(run: Callable[[], Any]) -> int:
    """FLOPs FlopCounterMode counts while ``run()`` executes (meta calls seen before answered from the
    process's cache under it: :func:`~resacct.measurement.meta_op_cache.shared_meta_cache`)."""
    with MetaOpCacheMode(shared_meta_cache()), FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


class _PointwiseOps(TorchDispatchMode):
    """Records (op name, output elements) of every aten op torch tags ``pointwise`` that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        if torch.Tag.pointwise in func.tags:
            elements = sum(leaf.numel() for leaf in tree_leaves(result) if isinstance(leaf, torch.Tensor))
            self.calls.append((str(func), elements))
        return result


def _meta(*shape: int, requires_grad: bool = False) -> Float[torch.Tensor, "..."]:
    return torch.empty(shape, device="meta", requires_grad=requires_grad)


# ───────────────────────────── matmul ─────────────────────────────


@strategy("matmul_broadcast_pair")
def _broadcast_matmul_shapes() -> st.SearchStrategy:
    """[a_shape, b_shape]: 0–2 batch dims each, broadcastable (equal sizes or 1), m, k, n in 1–16."""

    @st.composite
    def pairs(draw: Any) -> list:  # not list[list[int]]: beartype would sample an item with `random`, which hypothesis forbids
        m, k, n = (draw(st.integers(1, 16)) for _ in range(3))
        batch = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
        a_batch = [size if draw(st.booleans()) else 1 for size in batch]
        b_batch = [size if draw(st.booleans()) else 1 for size in batch]
        a_batch = a_batch[draw(st.integers(0, len(a_batch))) :]  # drop leading dims: they broadcast too
        return [a_batch + [m, k], b_batch + [k, n]]

    return pairs()


@check("flops.matmul", evidence="measured")
def matmul(m: int, k: int, n: int) -> Outcome:
    """FlopCounterMode's count for an m×k @ k×n matmul on the meta device."""
    measured = _flop_counter_total(lambda: _meta(m, k) @ _meta(k, n))
    return Outcome(measured=measured, predicted=matmul_flops((m, k), (k, n)))


@check("flops.matmul_shapes", evidence="measured", quantities=("batch", "m", "k", "n"))
def matmul_shapes(shapes: list) -> Outcome:
    """FlopCounterMode's count for ``a @ b`` with ``shapes = [a_shape, b_shape]`` (meta device);
    quantities from torch's output shape: batch (product of its batch dims), m, n, and k."""
    a_shape, b_shape = (tuple(shape) for shape in shapes)
    outputs: list[torch.Tensor] = []
    measured = _flop_counter_total(lambda: outputs.append(_meta(*a_shape) @ _meta(*b_shape)))
    output_shape = tuple(outputs[0].shape)
    return Outcome(
        measured=measured,
        predicted=matmul_flops(a_shape, b_shape),
        quantities={"batch": math.prod(output_shape[:-2]), "m": output_shape[-2], "k": a_shape[-1], "n": output_shape[-1]},
    )


@check("flops.matmul_output_shape", evidence="measured")
def matmul_output_shape_of_ones(shapes: list) -> Outcome:
    """``(torch.ones(a_shape) @ torch.ones(b_shape)).size()``, as in the lecture's code."""
    a_shape, b_shape = (tuple(shape) for shape in shapes)
    result = torch.ones(a_shape) @ torch.ones(b_shape)
    return Outcome(measured=list(result.size()), predicted=list(matmul_output_shape(a_shape, b_shape)))


@check("flops.per_multiply_accumulate", evidence="measured")
def flops_per_multiply_accumulate(m: int, k: int, n: int) -> Outcome:
    """FlopCounterMode's count for ``torch.addmm(c, a, b)`` (c + a@b: m·k·n multiply-accumulates
    ``a×b + c``) divided by m·k·n."""
    measured = _flop_counter_total(lambda: torch.addmm(_meta(m, n), _meta(m, k), _meta(k, n)))
    return Outcome(measured=measured / (m * k * n), predicted=matmul_flops((m, k), (k, n)) / (m * k * n))


# ───────────────────────────── element-wise ops ─────────────────────────────

_ELEMENTWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "pow": lambda a, b: a.pow(2),
    "sqrt": lambda a, b: a.sqrt(),
    "relu": lambda a, b: torch.relu(a),
}


def _run_elementwise(operation: str, m: int, n: int) -> _PointwiseOps:
    if operation not in _ELEMENTWISE:
        raise ValueError(f"operation {operation!r}: expected one of {', '.join(_ELEMENTWISE)}")
    a, b = _meta(m, n), _meta(m, n)
    with _PointwiseOps() as recorder:
        _ELEMENTWISE[operation](a, b)
    return recorder


@check("flops.elementwise", evidence="measured", quantities=("aten_ops",))
def elementwise(operation: str, m: int, n: int) -> Outcome:
    """Operations torch performs for an element-wise op on m×n matrices: the output elements of
    the pointwise aten ops it dispatches (one arithmetic operation each), seen through a dispatch
    mode. FlopCounterMode cannot measure this: it counts 0 for every element-wise op."""
    recorder = _run_elementwise(operation, m, n)
    return Outcome(
        measured=sum(elements for _, elements in recorder.calls),
        predicted=elementwise_flops((m, n)),
        quantities={"aten_ops": len(recorder.calls)},
    )


@check("flops.flop_counter_elementwise", evidence="measured", quantities=("dispatched_elements",))
def flop_counter_on_elementwise(operation: str, m: int, n: int) -> Outcome:
    """FlopCounterMode's count for an element-wise op on m×n matrices; resacct predicts it from
    whether FlopCounterMode has a formula for each aten op torch dispatched."""
    recorder = _run_elementwise(operation, m, n)
    measured = _flop_counter_total(lambda: _ELEMENTWISE[operation](_meta(m, n), _meta(m, n)))
    predicted = sum(elements for op, elements in recorder.calls if flop_counter_counts(op))
    return Outcome(measured=measured, predicted=predicted, quantities={"dispatched_elements": sum(e for _, e in recorder.calls)})


# ───────────────────────────── einsum ─────────────────────────────


@check("flops.einsum", evidence="measured")
def einsum(pattern: str, a_shape: list, b_shape: list) -> Outcome:
    """FlopCounterMode's count for ``einops.einsum(a, b, pattern)`` on the meta device."""
    import einops

    measured = _flop_counter_total(lambda: einops.einsum(_meta(*a_shape), _meta(*b_shape), pattern))
    return Outcome(measured=measured, predicted=einsum_flops(pattern, a_shape, b_shape))


@check("flops.attention_scores_einsum", evidence="measured")
def attention_scores_einsum(batch: int, seq1: int, seq2: int, hidden: int) -> Outcome:
    """FlopCounterMode's count for ``einsum(x, y, "batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2")``."""
    pattern = "batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2"
    return einsum(pattern, [batch, seq1, hidden], [batch, seq2, hidden])


# ───────────────────────────── models: forward, backward, step ─────────────────────────────


def _build_model(model: str, dim: int, num_layers: int, outputs: int) -> nn.Module:
    builders: dict[str, Callable[[], nn.Module]] = {
        "linear": lambda: Linear(dim, outputs, bias=False),
        "two_layer_network": lambda: TwoLayerNetwork(dim, outputs),
        "cruncher": lambda: Cruncher(dim, num_layers),
    }
    if model not in builders:
        raise ValueError(f"model {model!r}: expected one of {', '.join(builders)}")
    with torch.device("meta"):
        return builders[model]()


def _predict(model: str, batch: int, dim: int, num_layers: int, outputs: int, input_requires_grad: bool) -> PredictedFlops:
    if model == "linear":
        return predict_linear_flops(batch, dim, outputs, input_requires_grad=input_requires_grad)
    if model == "two_layer_network":
        return predict_two_layer_network_flops(batch, dim, outputs, input_requires_grad=input_requires_grad)
    return predict_cruncher_flops(batch, dim, num_layers, input_requires_grad=input_requires_grad)


def _measure_phases(network: nn.Module, inputs: Float[torch.Tensor, "batch dim"]) -> tuple[int, int]:
    """(forward, backward) FLOPs FlopCounterMode counts for ``mse_loss(network(x), target)`` and its backward."""
    losses: list[torch.Tensor] = []

    def forward() -> None:
        output = network(inputs)
        losses.append(nn.functional.mse_loss(output, torch.zeros_like(output)))

    forward_flops = _flop_counter_total(forward)
    backward_flops = _flop_counter_total(lambda: losses[0].backward())
    return forward_flops, backward_flops


@check("flops.model", evidence="measured", quantities=("params", "weight_params", "tokens"))
def model_flops(
    model: str,
    phase: str,
    batch: int,
    dim: int,
    num_layers: int = 2,
    outputs: int = 1,
    input_requires_grad: bool = False,
) -> Outcome:
    """FlopCounterMode's count for one phase (forward, backward, step, or backward_over_forward) of
    a model of the lecture (linear: one bias-free layer dim→outputs; two_layer_network; cruncher)
    built on the meta device, trained with an MSE loss on x of shape (batch, dim). Quantities:
    params (all parameters' numel), weight_params (2-D ones only), tokens (rows of x)."""
    network = _build_model(model, dim, num_layers, outputs)
    inputs = _meta(batch, dim, requires_grad=input_requires_grad)
    forward_flops, backward_flops = _measure_phases(network, inputs)
    prediction = _predict(model, batch, dim, num_layers, outputs, input_requires_grad)
    measured_by_phase = {
        "forward": (forward_flops, prediction.forward_flops),
        "backward": (backward_flops, prediction.backward_flops),
        "step": (forward_flops + backward_flops, prediction.step_flops),
        "backward_over_forward": (backward_flops / forward_flops, prediction.backward_flops / prediction.forward_flops),
    }
    if phase not in measured_by_phase:
        raise ValueError(f"phase {phase!r}: expected one of {', '.join(measured_by_phase)}")
    measured, predicted = measured_by_phase[phase]
    parameters = list(network.parameters())
    return Outcome(
        measured=measured,
        predicted=predicted,
        quantities={
            "params": sum(p.numel() for p in parameters),
            "weight_params": sum(p.numel() for p in parameters if p.dim() == 2),
            "tokens": inputs.shape[0],
        },
    )


# ───────────────────────────── gradients of the two-layer network ─────────────────────────────

_GRADIENT_TERMS = {
    "w2": ("w2 weight gradient",),
    "h1": ("w2 input gradient",),
    "w1": ("w2 input gradient", "w1 weight gradient"),
}


@check("flops.two_layer_gradient", evidence="measured")
def two_layer_gradient(target: str, batch: int, dim: int, outputs: int) -> Outcome:
    """FlopCounterMode's count for ``torch.autograd.grad(h2, target, dL/dh2)`` in x → w1 → h1 → w2 → h2
    (meta device): only what autograd needs for that one gradient (target: w2, h1 or w1)."""
    network = _build_model("two_layer_network", dim, 2, outputs)
    inputs = _meta(batch, dim)
    h1 = inputs @ network.w1  # (batch, dim)
    h2 = h1 @ network.w2  # (batch, outputs)
    wanted = {"w2": network.w2, "h1": h1, "w1": network.w1}[target]
    measured = _flop_counter_total(lambda: torch.autograd.grad(h2, [wanted], grad_outputs=_meta(batch, outputs)))
    terms = predict_two_layer_network_flops(batch, dim, outputs).matmuls
    predicted = sum(term.flops for term in terms if term.what in _GRADIENT_TERMS[target])
    return Outcome(measured=measured, predicted=predicted)


def _two_layer_with_gradients(batch: int, dim: int, outputs: int, seed: int) -> dict[str, Float[torch.Tensor, "..."]]:
    """Forward and backward of 0.5·‖x·w1·w2 − y‖² in float64, keeping every tensor and gradient."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, generator=generator, dtype=torch.float64)
    target = torch.randn(batch, outputs, generator=generator, dtype=torch.float64)
    w1 = torch.randn(dim, dim, generator=generator, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(dim, outputs, generator=generator, dtype=torch.float64, requires_grad=True)
    h1 = x @ w1  # (batch, dim)
    h2 = h1 @ w2  # (batch, outputs)
    h1.retain_grad()
    h2.retain_grad()
    loss = 0.5 * (h2 - target).pow(2).sum()
    loss.backward()
    return {"x": x, "target": target, "w1": w1, "w2": w2, "h1": h1, "h2": h2}


@check("flops.two_layer_manual_gradients", evidence="measured")
def two_layer_manual_gradients(batch: int, dim: int, outputs: int, seed: int) -> Outcome:
    """Whether the chain rule by hand — dL/dh2 = h2 − y, dL/dw2 = h1ᵀ·dL/dh2, dL/dh1 = dL/dh2·w2ᵀ,
    dL/dw1 = xᵀ·dL/dh1 — equals autograd's gradients (float64, torch.allclose) for L = ½‖h2 − y‖²."""
    t = _two_layer_with_gradients(batch, dim, outputs, seed)
    with torch.no_grad():
        grad_h2 = t["h2"] - t["target"]  # (batch, outputs)
        grad_w2 = t["h1"].T @ grad_h2  # (dim, outputs)
        grad_h1 = grad_h2 @ t["w2"].T  # (batch, dim)
        grad_w1 = t["x"].T @ grad_h1  # (dim, dim)
    pairs = [(grad_h2, t["h2"].grad), (grad_w2, t["w2"].grad), (grad_h1, t["h1"].grad), (grad_w1, t["w1"].grad)]
    return Outcome(measured=all(torch.allclose(manual, automatic) for manual, automatic in pairs))


@check("flops.two_layer_gradient_shapes", evidence="measured")
def two_layer_gradient_shapes(batch: int, dim: int, outputs: int) -> Outcome:
    """Shapes autograd gives dL/dw1, dL/dw2, dL/dh1, dL/dh2 in x → w1 → h1 → w2 → h2."""
    t = _two_layer_with_gradients(batch, dim, outputs, seed=0)
    gradients = [t["w1"].grad, t["w2"].grad, t["h1"].grad, t["h2"].grad]
    return Outcome(measured=[list(gradient.shape) for gradient in gradients])


# ───────────────────────────── the lecture's autograd examples ─────────────────────────────


def _x_squared_plus_3x() -> float:
    x = torch.tensor([2.0], requires_grad=True)
    y = x * x + 3 * x
    y.backward()
    return float(x.grad.item())


def _gradients_basics() -> dict[str, Any]:
    """Seed 003's gradients_basics, line by line: loss = 0.5·(x @ w − 5)², x = [1, 2, 3], w = [1, 1, 1]."""
    x = torch.tensor([1.0, 2, 3])
    w = torch.tensor([1.0, 1, 1], requires_grad=True)
    pred_y = x @ w
    loss = 0.5 * (pred_y - 5).pow(2)
    loss.backward()
    with warnings.catch_warnings():  # reading .grad of a non-leaf tensor warns; the value is the point
        warnings.simplefilter("ignore")
        grads_are_none = [loss.grad is None, pred_y.grad is None, x.grad is None]
    return {
        "pred_y": float(pred_y.item()),
        "w.grad": w.grad.tolist(),
        "torch.equal(w.grad, torch.tensor([1, 2, 3]))": torch.equal(w.grad, torch.tensor([1, 2, 3])),
        "loss.grad, pred_y.grad, x.grad are None": grads_are_none,
    }


@check("flops.autograd_example", evidence="measured")
def autograd_example(example: str) -> Outcome:
    """What autograd computes for the lecture's small examples (picked by name, never evaluated):
    ``x*x + 3*x at x=2`` (x.grad), or a line of seed 003's gradients_basics."""
    if example == "x*x + 3*x at x=2":
        return Outcome(measured=_x_squared_plus_3x())
    results = _gradients_basics()
    if example not in results:
        raise ValueError(f"example {example!r}: expected 'x*x + 3*x at x=2' or one of {', '.join(results)}")
    return Outcome(measured=results[example])
