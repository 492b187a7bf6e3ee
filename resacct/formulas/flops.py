"""FLOPs of matmuls, einsums, element-wise ops and whole training steps: by formula and by trace.

Three numbers for every model, as everywhere in resacct:

- the **law**, the lecture's rule of thumb: forward = 2·tokens·params, backward = 4·tokens·params,
  step = 6·tokens·params (:func:`forward_flops_rule`, :func:`backward_flops_rule`, :func:`step_flops_rule`);
- the **prediction**, an exact per-matmul formula (:func:`predict_cruncher_flops`,
  :func:`predict_two_layer_network_flops`, :func:`predict_linear_flops`) that knows what autograd
  really does: it never computes the gradient of an input that does not require grad, and bias
  parameters are added, never multiplied;
- the **measurement**, the real aten ops traced by ``torch.utils.flop_counter.FlopCounterMode``
  (:func:`trace_flops`, in :mod:`resacct.measurement.flop_tracing`), forward and backward separately, with a per-op breakdown and the list of
  ops the counter has no formula for (element-wise adds, reductions, losses: its *tracer gaps*),
  each with a call count and resacct's own estimate where one exists.

FLOPs count a multiply-accumulate as 2 (the ``2mkn`` convention FlopCounterMode uses).

>>> matmul_flops((16, 32), (32, 2))
2048
>>> matmul_flops((4, 8, 16, 32), (4, 8, 32, 64))  # 32 batched 16×32 @ 32×64 matmuls
2097152
>>> einsum_flops("batch seq1 hidden, batch seq2 hidden -> batch seq1 seq2", (2, 3, 4), (2, 5, 4))
240
>>> prediction = predict_cruncher_flops(tokens=2, dim=4, num_layers=2)
>>> prediction.step_flops, step_flops_rule(tokens=2, params=prediction.params)
(368, 540)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from resacct.errors import ResacctError

__all__ = [
    "DispatchedOps",
    "uncounted_ops",
    "matmul_output_shape",
    "matmul_flops",
    "einsum_flops",
    "elementwise_flops",
    "MatmulTerm",
    "PredictedFlops",
    "predict_linear_chain_flops",
    "predict_linear_flops",
    "predict_cruncher_flops",
    "predict_two_layer_network_flops",
    "forward_flops_rule",
    "backward_flops_rule",
    "step_flops_rule",
    "RuleDeviation",
    "rule_deviation",
    "flop_counter_counts",
    "estimate_uncounted_flops",
    "UncountedOp",
    "FlopTrace",
    "trace_flops",
    "build_on_meta",
]

# ───────────────────────────── shapes and single operations ─────────────────────────────


def _as_shape(shape: object, name: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise ResacctError(f"{name} must be a sequence of dimension sizes such as (16, 32), got {shape!r}")
    if any(isinstance(size, bool) or not isinstance(size, int) or size < 0 for size in shape):
        raise ResacctError(f"{name} {tuple(shape)!r} must hold non-negative integer sizes")
    return tuple(shape)


def _broadcast_batch(a_batch: tuple[int, ...], b_batch: tuple[int, ...], a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast two batch shapes by torch's rule: align on the right; sizes equal or one of them 1."""
    length = max(len(a_batch), len(b_batch))
    a_padded = (1,) * (length - len(a_batch)) + a_batch
    b_padded = (1,) * (length - len(b_batch)) + b_batch
    result = []
    for position, (a_size, b_size) in enumerate(zip(a_padded, b_padded)):
        if a_size != b_size and 1 not in (a_size, b_size):
            raise ResacctError(
                f"matmul batch dimensions {a_batch} of a_shape {a_shape} and {b_batch} of b_shape {b_shape} "
                f"do not broadcast: {a_size} vs {b_size} at batch position {position - length} "
                f"(sizes must be equal or one of them 1)"
            )
        result.append(b_size if a_size == 1 else a_size)
    return tuple(result)


def _matmul_operands(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[tuple[int, ...], int, int, int, bool, bool]:
    """(broadcast batch, m, k, n, a was 1-D, b was 1-D) following ``torch.matmul``'s rules."""
    a, b = _as_shape(a_shape, "a_shape"), _as_shape(b_shape, "b_shape")
    if not a or not b:
        raise ResacctError(f"matmul needs tensors of at least 1 dimension, got a_shape {a} and b_shape {b}")
    a_is_vector, b_is_vector = len(a) == 1, len(b) == 1
    a_matrix = (1,) + a if a_is_vector else a  # a 1-D first operand is a row: prepend 1
    b_matrix = b + (1,) if b_is_vector else b  # a 1-D second operand is a column: append 1
    (m, k), (k_of_b, n) = a_matrix[-2:], b_matrix[-2:]
    if k != k_of_b:
        raise ResacctError(
            f"matmul inner dimensions differ: a_shape {a} has k={k} (its last size) but b_shape {b} has "
            f"k={k_of_b} ({'its only size' if b_is_vector else 'its second-to-last size'}); expected them equal"
        )
    batch = _broadcast_batch(a_matrix[:-2], b_matrix[:-2], a, b)
    return batch, m, k, n, a_is_vector, b_is_vector


def matmul_output_shape(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of ``a @ b`` by ``torch.matmul``'s rules (1-D operands, broadcast batch dimensions).

    >>> matmul_output_shape((4, 8, 16, 32), (32, 2))
    (4, 8, 16, 2)
    >>> matmul_output_shape((7, 1, 16, 32), (5, 32, 2))
    (7, 5, 16, 2)
    >>> matmul_output_shape((32,), (32,))
    ()
    """
    batch, m, _, n, a_is_vector, b_is_vector = _matmul_operands(a_shape, b_shape)
    return batch + ((m,) if not a_is_vector else ()) + ((n,) if not b_is_vector else ())


def matmul_flops(a_shape: Sequence[int], b_shape: Sequence[int]) -> int:
    """FLOPs of ``a @ b``: 2·batch·m·k·n, batch being the product of the broadcast batch dimensions.

    Each of the m·n outputs of each batch element takes k multiply-accumulates of 2 FLOPs.
    1-D operands follow torch: a vector first is a 1×k row, a vector second is a k×1 column.

    >>> matmul_flops((16384, 32768), (32768, 8192)) == 2 * 16384 * 32768 * 8192
    True
    >>> matmul_flops((1, 16, 32), (5, 32, 2))  # the batch of 1 broadcasts to 5
    10240
    >>> matmul_flops((16, 32), (31, 2))
    Traceback (most recent call last):
    ...
    resacct.errors.ResacctError: matmul inner dimensions differ: a_shape (16, 32) has k=32 (its last size) but b_shape (31, 2) has k=31 (its second-to-last size); expected them equal
    """
    batch, m, k, n, _, _ = _matmul_operands(a_shape, b_shape)
    return 2 * math.prod(batch) * m * k * n


_AXIS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _einsum_operands(pattern: str) -> tuple[list[list[str]], list[str]]:
    if not isinstance(pattern, str) or pattern.count("->") != 1:
        raise ResacctError(f"einsum pattern {pattern!r} must have exactly one '->', as in 'b i k, b k j -> b i j'")
    left, right = pattern.split("->")
    operands = [operand.split() for operand in left.split(",")]
    output = right.split()
    for axes in [*operands, output]:
        for axis in axes:
            if axis != "..." and not _AXIS.match(axis):
                raise ResacctError(f"einsum pattern {pattern!r}: {axis!r} is not an axis name (letters, digits, _) or '...'")
        if axes.count("...") > 1 or len(set(axes) - {"..."}) != len([a for a in axes if a != "..."]):
            raise ResacctError(f"einsum pattern {pattern!r}: {' '.join(axes)!r} repeats an axis or '...'")
    return operands, output


def _expand_ellipsis(axes: list[str], shape: tuple[int, ...], pattern: str) -> list[str]:
    """Name the dimensions '...' stands for by their position from the right (…0 is the last)."""
    if "..." not in axes:
        if len(axes) != len(shape):
            raise ResacctError(f"einsum pattern {pattern!r}: operand '{' '.join(axes)}' names {len(axes)} axes, but its shape {shape} has {len(shape)}")
        return axes
    named = len(axes) - 1
    if len(shape) < named:
        raise ResacctError(f"einsum pattern {pattern!r}: operand '{' '.join(axes)}' needs at least {named} dimensions, shape {shape} has {len(shape)}")
    where = axes.index("...")
    covered = len(shape) - named
    return axes[:where] + [f"…{covered - 1 - index}" for index in range(covered)] + axes[where + 1 :]


def _merged_axis_size(axis: str, known: int | None, size: int, pattern: str) -> int:
    """An axis keeps one size; dimensions under '...' may broadcast (one of them 1)."""
    if known is None or known == size:
        return size
    if axis.startswith("…") and 1 in (known, size):
        return max(known, size)
    shown = "a dimension under '...'" if axis.startswith("…") else f"axis {axis!r}"
    raise ResacctError(f"einsum pattern {pattern!r}: {shown} is {known} in one operand and {size} in another")


def einsum_flops(pattern: str, *shapes: Sequence[int]) -> int:
    """FLOPs of a two-operand einsum (einops syntax): the naive loop over every distinct axis.

    With a summed axis (one named in the inputs, not in the output) every point of the loop is a
    multiply-accumulate: 2 × the product of all distinct axis sizes. With none, or when the summed
    axes all have size 1 (an outer or element-wise product), every point is one multiply: 1 × that
    product — torch runs those as an element-wise ``mul``, which FlopCounterMode counts as 0.
    Dimensions under ``...`` broadcast like torch's (equal sizes or 1).

    >>> einsum_flops("b s1 h, b s2 h -> b s1 s2", (2, 3, 4), (2, 5, 4))  # 2·b·s1·s2·h
    240
    >>> einsum_flops("... hidden1, hidden1 hidden2 -> ... hidden2", (2, 3, 2, 4), (4, 4))
    384
    >>> einsum_flops("b s h1, b s h2 -> b s h1 h2", (2, 3, 4), (2, 3, 4))  # no axis summed: multiplies only
    96
    """
    operands, output = _einsum_operands(pattern)
    if len(operands) != 2 or len(shapes) != 2:
        raise ResacctError(f"einsum_flops counts two-operand einsums; pattern {pattern!r} has {len(operands)} operand(s) and {len(shapes)} shape(s) were given")
    sizes: dict[str, int] = {}
    for position, (axes, raw_shape) in enumerate(zip(operands, shapes)):
        shape = _as_shape(raw_shape, f"shape of operand {position}")
        for axis, size in zip(_expand_ellipsis(axes, shape, pattern), shape):
            sizes[axis] = _merged_axis_size(axis, sizes.get(axis), size, pattern)
    output_axes = {axis for axis in output if axis != "..."} | ({axis for axis in sizes if axis.startswith("…")} if "..." in output else set())
    unknown = output_axes - set(sizes)
    if unknown:
        raise ResacctError(f"einsum pattern {pattern!r}: output axis {sorted(unknown)[0]!r} is in no input")
    summed_size = math.prod(sizes[axis] for axis in set(sizes) - output_axes)
    return (2 if summed_size > 1 else 1) * math.prod(sizes.values())


def elementwise_flops(shape: Sequence[int], flops_per_element: int = 1) -> int:
    """FLOPs of an element-wise op producing ``shape``: one per output element (``a + b`` on m×n: mn).

    Note: FlopCounterMode counts 0 for every element-wise op; :func:`trace_flops` lists them as
    tracer gaps with this estimate.

    >>> elementwise_flops((3, 4))
    12
    """
    return math.prod(_as_shape(shape, "shape")) * flops_per_element


# ───────────────────────────── exact per-matmul model formulas ─────────────────────────────


@dataclass(frozen=True)
class MatmulTerm:
    """One matmul of a training step: ``(m×k) @ (k×n)``, what it computes and whether autograd runs it."""

    phase: str  # "forward", "backward", or "skipped" (a gradient autograd does not compute)
    what: str  # e.g. "layers.0 output", "layers.0 weight gradient", "layers.1 input gradient"
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


@dataclass(frozen=True)
class PredictedFlops:
    """resacct's exact prediction for one forward and backward of a chain of linear layers.

    ``forward_flops`` / ``backward_flops`` / ``step_flops`` count matmuls, as FlopCounterMode
    does; the element-wise FLOPs of biases (add forward, sum backward) are kept apart.
    """

    tokens: int
    params: int
    bias_params: int
    matmuls: tuple[MatmulTerm, ...]
    forward_elementwise_flops: int = 0
    backward_elementwise_flops: int = 0

    def _phase_flops(self, phase: str) -> int:
        return sum(term.flops for term in self.matmuls if term.phase == phase)

    @property
    def forward_flops(self) -> int:
        return self._phase_flops("forward")

    @property
    def backward_flops(self) -> int:
        return self._phase_flops("backward")

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    @property
    def skipped_flops(self) -> int:
        """FLOPs of the input gradients autograd never computes (the input does not require grad)."""
        return self._phase_flops("skipped")

    def rule_shortfall(self) -> dict[str, int]:
        """Why the 6·tokens·params rule over-counts this step, term by term (they sum to the gap).

        >>> predict_two_layer_network_flops(tokens=8, dim=4, outputs=2).rule_shortfall()
        {'bias params in forward': 0, 'bias params in backward': 0, 'input gradients not computed': 256}
        """
        return {
            "bias params in forward": 2 * self.tokens * self.bias_params,
            "bias params in backward": 4 * self.tokens * self.bias_params,
            "input gradients not computed": self.skipped_flops,
        }


def predict_linear_chain_flops(
    tokens: int,
    widths: Sequence[int],
    *,
    biases: bool,
    input_requires_grad: bool = False,
    names: Sequence[str] | None = None,
) -> PredictedFlops:
    """Exact matmul FLOPs of ``x @ W₀ (+ b₀) @ W₁ (+ b₁) …`` with layer i mapping widths[i] → widths[i+1].

    Forward: ``2·tokens·in·out`` per layer. Backward: the weight gradient ``xᵀ·dy`` (2·in·tokens·out)
    for every layer, and the input gradient ``dy·Wᵀ`` (2·tokens·out·in) for every layer whose input
    requires grad: all but the first, unless ``input_requires_grad``.

    >>> predict_linear_chain_flops(tokens=16, widths=(32, 8), biases=False).backward_flops  # 2·B·D·K, not 4·B·D·K
    8192
    """
    _as_shape(tuple(widths), "widths")
    if len(widths) < 2:
        raise ResacctError(f"widths {tuple(widths)} must list at least an input and an output width")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ResacctError(f"tokens must be a non-negative integer (rows of x), got {tokens!r}")
    layer_names = list(names) if names is not None else [f"layers.{index}" for index in range(len(widths) - 1)]
    if len(layer_names) != len(widths) - 1:
        raise ResacctError(f"{len(layer_names)} names given for {len(widths) - 1} layers")
    terms = [MatmulTerm("forward", f"{name} output", tokens, width_in, width_out) for name, width_in, width_out in zip(layer_names, widths[:-1], widths[1:])]
    for index in reversed(range(len(layer_names))):
        name, width_in, width_out = layer_names[index], widths[index], widths[index + 1]
        terms.append(MatmulTerm("backward", f"{name} weight gradient", width_in, tokens, width_out))
        input_gradient_phase = "backward" if index > 0 or input_requires_grad else "skipped"
        terms.append(MatmulTerm(input_gradient_phase, f"{name} input gradient", tokens, width_out, width_in))
    weights = sum(width_in * width_out for width_in, width_out in zip(widths[:-1], widths[1:]))
    bias_params = sum(widths[1:]) if biases else 0
    return PredictedFlops(
        tokens=tokens,
        params=weights + bias_params,
        bias_params=bias_params,
        matmuls=tuple(terms),
        forward_elementwise_flops=tokens * bias_params,  # one add per output element
        backward_elementwise_flops=max(tokens - 1, 0) * bias_params,  # bias gradient: sum over tokens
    )


def predict_linear_flops(tokens: int, in_features: int, out_features: int, *, bias: bool = False, input_requires_grad: bool = False) -> PredictedFlops:
    """One :class:`resacct.training.models.Linear` layer: y = x @ W (+ b).

    >>> predict_linear_flops(16, 32, 8).forward_flops == 2 * 16 * (32 * 8)
    True
    """
    return predict_linear_chain_flops(tokens, (in_features, out_features), biases=bias, input_requires_grad=input_requires_grad, names=("linear",))


def predict_cruncher_flops(tokens: int, dim: int, num_layers: int, *, input_requires_grad: bool = False) -> PredictedFlops:
    """:class:`resacct.training.models.Cruncher`: ``num_layers`` D×D layers with biases, then a D×1 final layer.

    >>> p = predict_cruncher_flops(tokens=8, dim=64, num_layers=2)
    >>> p.forward_flops == 2 * 8 * (2 * 64 * 64 + 64), p.params == 2 * 64 * 64 + 2 * 64 + 64 + 1
    (True, True)
    """
    names = [f"layers.{index}" for index in range(num_layers)] + ["final"]
    return predict_linear_chain_flops(tokens, [dim] * (num_layers + 1) + [1], biases=True, input_requires_grad=input_requires_grad, names=names)


def predict_two_layer_network_flops(tokens: int, dim: int, outputs: int, *, input_requires_grad: bool = False) -> PredictedFlops:
    """:class:`resacct.training.models.TwoLayerNetwork`: x → w1 (D×D) → h1 → w2 (D×K) → h2, no biases.

    Backward is 2·B·D·D (w1) + 2·B·D·K (w2) + 2·B·K·D (h1), not 4·B·(D·D + D·K): the gradient
    with respect to x is not computed unless x requires grad.

    >>> p = predict_two_layer_network_flops(tokens=8, dim=4, outputs=2)
    >>> p.backward_flops, backward_flops_rule(8, p.params)
    (512, 768)
    """
    return predict_linear_chain_flops(tokens, (dim, dim, outputs), biases=False, input_requires_grad=input_requires_grad, names=("w1", "w2"))


# The 2/4/6 rule lives in resacct.formulas.flop_rules; its names stay importable from here.
from resacct.formulas.flop_rules import RuleDeviation, backward_flops_rule, forward_flops_rule, rule_deviation, step_flops_rule  # noqa: E402

# The tracer lives in resacct.measurement.flop_tracing; its names stay importable from here.
from resacct.measurement.flop_tracing import (  # noqa: E402
    DispatchedOps,
    FlopTrace,
    UncountedOp,
    build_on_meta,
    estimate_uncounted_flops,
    flop_counter_counts,
    trace_flops,
    uncounted_ops,
)
