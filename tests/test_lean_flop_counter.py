"""The lean FlopCounterMode dispatch (:mod:`resacct.measurement.lean_flop_counter`) against torch's own:
the same FLOPs per module and per op, and the same ops reaching the modes below it, on a step whose ops
include ones FlopCounterMode decomposes (no formula, a ``CompositeImplicitAutograd`` kernel)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

from resacct.account.trace.module_flops import module_flop_counter
from resacct.measurement.flop_tracing import DispatchedOps
from resacct.measurement.lean_flop_counter import lean_flop_counter


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.qkv = nn.Linear(32, 96)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).view(x.shape[0], x.shape[1], 3, 4, 8).unbind(2)
        attended = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + attended.transpose(1, 2).reshape(x.shape)
        return x + self.down(nn.functional.silu(self.up(x))) @ torch.ones(32, device=x.device).diag()


def _count(model: nn.Module, x: torch.Tensor, lean: bool) -> tuple[dict[str, dict[str, int]], int, list[str]]:
    counter = module_flop_counter(model)
    used = lean_flop_counter(counter) if lean else False
    below = DispatchedOps()
    with contextlib.ExitStack() as stack:
        stack.enter_context(below)  # under the counter: the ops it hands down
        stack.enter_context(counter)
        model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)
    counts = {module: {str(op): int(flops) for op, flops in per_op.items()} for module, per_op in counter.get_flop_counts().items()}
    assert used == lean
    return counts, int(counter.get_total_flops()), [str(op) for op, _, _ in below.calls]


def _lean_here() -> bool:
    from resacct.measurement import lean_flop_counter as lean

    lean._LEAN.clear()
    return lean._lean_counter_class() is not None


needs_lean = pytest.mark.skipif(not _lean_here(), reason=f"torch {torch.__version__}'s FlopCounterMode dispatch is not the one the lean copy was made from")


@needs_lean
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_lean_counter_counts_what_torch_s_counts(device: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), _Block()).to(device)
    x = torch.randn(2, 16, 32, device=device)
    plain, plain_total, plain_ops = _count(model, x, lean=False)
    lean, lean_total, lean_ops = _count(model, x, lean=True)
    assert lean == plain  # per module, per op
    assert lean_total == plain_total > 0
    assert lean_ops == plain_ops  # the same ops, in order, below the counter: decompositions included
    assert any(op.startswith("aten.silu_backward") for op in plain_ops) or "aten.mul.Tensor" in plain_ops


@needs_lean
def test_lean_counter_decomposes_where_torch_s_does() -> None:
    """An op with no formula and a CompositeImplicitAutograd kernel is decomposed (its parts counted), as torch does."""
    seen: list[Any] = []
    counter = module_flop_counter(nn.Linear(4, 4))
    assert lean_flop_counter(counter)
    with DispatchedOps() as below, counter:
        a, b = torch.randn(3, 4), torch.randn(4, 5)
        torch.ops.aten.matmul.default(a, b)  # matmul: no formula of its own, decomposed into mm
        seen = [str(op) for op, _, _ in below.calls]
    assert "aten.mm.default" in seen and "aten.matmul.default" not in seen
    assert int(counter.get_total_flops()) == 2 * 3 * 4 * 5


def test_another_counter_is_left_alone() -> None:
    class Other:
        pass

    other = Other()
    assert not lean_flop_counter(other)
    assert type(other) is Other
