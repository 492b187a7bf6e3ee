"""FlopCounterMode, traced honestly: forward and backward counted separately, every aten op
that ran recorded, and the ops FlopCounterMode has no formula for (element-wise, reductions,
losses, matmuls with a 1-D operand …) listed with resacct's estimate — never a silent zero.

The formulas these traces are compared with live in :mod:`resacct.formulas.flops`.

>>> from resacct.training.models import Cruncher
>>> trace = trace_flops(Cruncher(dim=8, num_layers=2), torch.randn(4, 8))
>>> trace.step_flops == trace.forward_flops + trace.backward_flops
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, no_type_check

import torch
from jaxtyping import Float
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from resacct.errors import ResacctError

__all__ = [
    "DispatchedOps",
    "dispatched_call",
    "uncounted_ops",
    "flop_counter_counts",
    "estimate_uncounted_flops",
    "UncountedOp",
    "is_matmul_class",
    "flop_warnings",
    "FlopTrace",
    "trace_flops",
    "build_on_meta",
]


# ───────────────────────────── tracing with FlopCounterMode ─────────────────────────────

# Ops that move, alias or fill memory: no arithmetic, so no FLOPs to miss.
_NO_ARITHMETIC = frozenset(
    "aten." + name
    for name in (
        "detach t view _unsafe_view reshape expand alias as_strided transpose permute unsqueeze squeeze slice select "
        "split split_with_sizes unbind clone copy_ _to_copy contiguous lift_fresh empty empty_like empty_strided "
        "zeros zeros_like ones ones_like full full_like fill_ zero_ new_empty new_empty_strided new_zeros new_ones "
        "new_full scalar_tensor arange randn randn_like rand rand_like normal_ uniform_ cat stack index_select "
        "_local_scalar_dense set_ resize_ _reshape_alias"
    ).split()
)


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _packet_name(op: Any) -> str:
    """'aten.add.Tensor' → 'aten.add' (an overload's packet); packets and plain names pass through."""
    name = str(op)
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else name


def flop_counter_counts(op: Any) -> bool:
    """Whether ``FlopCounterMode`` has a FLOP formula for ``op`` (an aten op or its name).

    >>> flop_counter_counts("aten.mm.default"), flop_counter_counts("aten.add.Tensor")
    (True, False)
    """
    from torch.utils.flop_counter import flop_registry

    return _packet_name(op) in {_packet_name(registered) for registered in flop_registry}


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _has_tag(op: Any, tag_name: str) -> bool:
    tag = getattr(torch.Tag, tag_name, None)
    return tag is not None and tag in getattr(op, "tags", ())


# resacct's estimates for ops with no FlopCounterMode formula: FLOPs per element of (input, output).
_ESTIMATE_PER_ELEMENT: dict[str, tuple[int, int]] = {
    "aten.mse_loss": (3, 0),  # subtract, square, accumulate each element
    "aten.mse_loss_backward": (0, 2),  # subtract, scale by 2·grad/n each element of the gradient
    "aten.dot": (2, 0),  # k multiply-accumulates
    "aten.mv": (2, 0),  # m·k multiply-accumulates
    "aten.addcmul": (0, 2),
    "aten.addcdiv": (0, 2),
    "aten.lerp": (0, 2),
}


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def estimate_uncounted_flops(op: Any, input_elements: int, output_elements: int) -> int | None:
    """resacct's estimate for one call of an op FlopCounterMode does not count (None: no estimate).

    Element-wise ops (torch's ``pointwise`` tag): one FLOP per output element. Reductions: one
    per input element folded in (``input − output``; ``mean`` adds one division per output).
    Losses, ``dot`` and ``mv`` by their arithmetic. Ops that only move memory: 0.

    >>> estimate_uncounted_flops("aten.add.Tensor", input_elements=12, output_elements=12)
    12
    >>> estimate_uncounted_flops("aten.sum.dim_IntList", input_elements=12, output_elements=4)
    8
    """
    packet = _packet_name(op)
    if packet in _NO_ARITHMETIC or getattr(op, "is_view", False):
        return 0
    if packet in _ESTIMATE_PER_ELEMENT:
        per_input, per_output = _ESTIMATE_PER_ELEMENT[packet]
        return per_input * input_elements + per_output * output_elements
    resolved = _resolve_op(op)
    if _has_tag(resolved, "pointwise"):
        return output_elements
    if _has_tag(resolved, "reduction") or packet in ("aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.max", "aten.min", "aten.prod", "aten.logsumexp"):
        return max(input_elements - output_elements, 0) + (output_elements if packet == "aten.mean" else 0)
    return None


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _resolve_op(op: Any) -> Any:
    """An OpOverload for ``op`` (given as one, or as a name such as 'aten.add.Tensor')."""
    if not isinstance(op, str):
        return op
    parts = op.split(".")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, parts[2] if len(parts) > 2 else "default")
    except (AttributeError, IndexError, RuntimeError):
        return None


@dataclass(frozen=True)
class UncountedOp:
    """An aten op that ran but that FlopCounterMode has no formula for (it counts it as 0)."""

    phase: str
    op: str
    calls: int
    input_elements: int
    output_elements: int
    estimated_flops: int | None  # resacct's estimate over all calls; None when it has none


_MATMUL_PACKETS = frozenset(
    "aten." + name
    for name in "dot vdot mv addmv outer ger addr einsum tensordot matmul linear bilinear _grouped_mm _int_mm _scaled_mm baddbmm addbmm".split()
)


def is_matmul_class(op: str) -> bool:
    """Whether an op multiplies matrices (or vectors): a zero count for it is a real undercount,
    not a rounding error — attention kernels, convolutions, ``mv``, ``dot``, grouped or quantized mm.

    >>> is_matmul_class("aten.mv.default"), is_matmul_class("aten._scaled_dot_product_flash_attention_for_cpu.default"), is_matmul_class("aten.add.Tensor")
    (True, True, False)
    """
    packet = _packet_name(op)
    short = packet.split(".")[-1]
    return packet in _MATMUL_PACKETS or "attention" in short or "conv" in short or short.endswith("_mm") or short.endswith("gemm")


def flop_warnings(ops: tuple[UncountedOp, ...] | list[UncountedOp]) -> list[str]:
    """One warning line per uncounted matmul-class op (FlopCounterMode counted it as 0).

    >>> flop_warnings([UncountedOp("forward", "aten.mv.default", 2, 30, 6, 60)])
    ['FlopCounterMode counted 0 FLOPs for aten.mv.default ×2 (forward), a matmul-class op: the FLOPs above miss it (resacct estimates 60)']
    """
    lines = []
    for op in ops:
        if is_matmul_class(op.op):
            estimate = "no estimate" if op.estimated_flops is None else f"resacct estimates {op.estimated_flops:,}"
            lines.append(f"FlopCounterMode counted 0 FLOPs for {op.op} ×{op.calls} ({op.phase}), a matmul-class op: the FLOPs above miss it ({estimate})")
    return lines


@dataclass(frozen=True)
class FlopTrace:
    """FLOPs of one training step, measured by FlopCounterMode, forward and backward separately.

    ``forward_ops`` / ``backward_ops`` map each counted aten op (``aten.mm`` …) to its FLOPs;
    ``uncounted_ops`` lists the arithmetic ops the counter saw but has no formula for.
    """

    forward_flops: int
    backward_flops: int
    forward_ops: Mapping[str, int] = field(default_factory=dict)
    backward_ops: Mapping[str, int] = field(default_factory=dict)
    uncounted_ops: tuple[UncountedOp, ...] = ()

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    def uncounted_estimated_flops(self, phase: str | None = None) -> int:
        """Sum of resacct's estimates for the uncounted ops (of one phase, or of both)."""
        return sum(op.estimated_flops or 0 for op in self.uncounted_ops if phase in (None, op.phase))

    def uncounted_op_names(self, phase: str | None = None) -> list[str]:
        return [op.op for op in self.uncounted_ops if phase in (None, op.phase)]


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _tensor_elements(value: Any) -> int:
    if isinstance(value, torch.Tensor):  # the common case, without flattening
        return value.numel()
    return sum(leaf.numel() for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor))


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def _first_tensor_elements(args: tuple[Any, ...]) -> int:
    for argument in args:  # tensors are almost always direct arguments
        if isinstance(argument, torch.Tensor):
            return argument.numel()
    for leaf in tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            return leaf.numel()
    return 0


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def dispatched_call(func: Any, args: tuple[Any, ...], result: Any) -> tuple[Any, int, int]:
    """What :class:`DispatchedOps` records of one call (a mode that forwards ops itself records the same)."""
    return func, _first_tensor_elements(args), _tensor_elements(result)


class DispatchedOps(TorchDispatchMode):
    """Records every aten op that runs: (op, elements of its first tensor input, elements of its outputs).

    >>> with DispatchedOps() as recorded:
    ...     _ = torch.ones(2, 3) + 1
    >>> [str(op) for op, _, _ in recorded.calls][-1]
    'aten.add.Tensor'
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, int, int]] = []

    @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        self.calls.append(dispatched_call(func, args, result))
        return result


def uncounted_ops(phase: str, calls: list[tuple[Any, int, int]], filled: frozenset[str] = frozenset()) -> list[UncountedOp]:
    """Group recorded calls by op; keep the ops with arithmetic that FlopCounterMode does not
    count (``filled``: op packets a custom mapping already counts, e.g. ``aten._scaled_dot_product_flash_attention_for_cpu``)."""
    grouped: dict[str, list[tuple[Any, int, int]]] = {}
    for call in calls:
        grouped.setdefault(str(call[0]), []).append(call)
    result = []
    for name, group in grouped.items():
        packet = str(getattr(group[0][0], "overloadpacket", name))
        if flop_counter_counts(group[0][0]) or packet in filled:
            continue
        estimates = [estimate_uncounted_flops(op, inputs, outputs) for op, inputs, outputs in group]
        if all(estimate == 0 for estimate in estimates):
            continue  # moves or aliases memory: nothing to count
        result.append(
            UncountedOp(
                phase=phase,
                op=name,
                calls=len(group),
                input_elements=sum(inputs for _, inputs, _ in group),
                output_elements=sum(outputs for _, _, outputs in group),
                estimated_flops=None if None in estimates else sum(estimate or 0 for estimate in estimates),
            )
        )
    return result


def _counted_ops(counter: Any) -> dict[str, int]:
    counts = Counter[str]()
    for per_op in counter.get_flop_counts().get("Global", {}).items():
        counts[_packet_name(per_op[0])] += int(per_op[1])
    return dict(counts)


def _loss(output: Float[torch.Tensor, "*batch outputs"], loss: str) -> Float[torch.Tensor, ""]:
    if loss == "mse":
        return nn.functional.mse_loss(output, torch.zeros_like(output))
    if loss == "sum":
        return output.sum()
    raise ResacctError(f"loss {loss!r}: expected 'mse', 'sum' or 'none'")


def trace_flops(model: nn.Module, inputs: Float[torch.Tensor, "*batch features"], *, loss: str = "mse") -> FlopTrace:
    """Run one forward and backward of ``model`` on ``inputs`` and count FLOPs with FlopCounterMode.

    ``loss``: ``"mse"`` (against zeros, as the lecture's training loop), ``"sum"``, or ``"none"``
    (backward from a gradient of ones on the output). The loss belongs to the forward phase.
    Works on the meta device (see :func:`build_on_meta`): no weights, no arithmetic, same counts.
    The model's ``.grad`` fields (and the input's) are restored afterwards, so tracing twice gives
    the same answer.

    >>> from resacct.training.models import Cruncher
    >>> model = build_on_meta(lambda: Cruncher(dim=4, num_layers=2))
    >>> trace = trace_flops(model, torch.empty(2, 4, device="meta"))
    >>> trace.forward_flops, trace.backward_flops, trace.forward_ops
    (144, 224, {'aten.mm': 144})
    >>> [(op.op, op.calls) for op in trace.uncounted_ops if op.phase == "forward"]
    [('aten.add.Tensor', 3), ('aten.mse_loss.default', 1)]
    """
    from torch.utils.flop_counter import FlopCounterMode

    if loss not in ("mse", "sum", "none"):
        raise ResacctError(f"loss {loss!r}: expected 'mse', 'sum' or 'none'")
    holders = [*model.parameters(), *([inputs] if inputs.is_leaf else [])]
    saved_grads = [holder.grad for holder in holders]
    for holder in holders:
        holder.grad = None
    try:
        with FlopCounterMode(display=False) as forward_counter, DispatchedOps() as forward_calls:
            output = model(inputs)
            objective = output if loss == "none" else _loss(output, loss)
        with FlopCounterMode(display=False) as backward_counter, DispatchedOps() as backward_calls:
            objective.backward(torch.ones_like(objective) if loss == "none" else None)
    finally:
        for holder, grad in zip(holders, saved_grads):
            holder.grad = grad
    return FlopTrace(
        forward_flops=int(forward_counter.get_total_flops()),
        backward_flops=int(backward_counter.get_total_flops()),
        forward_ops=_counted_ops(forward_counter),
        backward_ops=_counted_ops(backward_counter),
        uncounted_ops=tuple(uncounted_ops("forward", forward_calls.calls) + uncounted_ops("backward", backward_calls.calls)),
    )


def build_on_meta(factory: Any) -> nn.Module:
    """Build a model on the meta device: shapes without storage, so any size can be traced.

    >>> from resacct.training.models import Cruncher
    >>> build_on_meta(lambda: Cruncher(dim=32768, num_layers=1)).final.weight.device
    device(type='meta')
    """
    with torch.device("meta"):
        return factory()
