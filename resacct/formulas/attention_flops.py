"""FLOPs of ``F.scaled_dot_product_attention``'s fused kernels, from the call's shapes — for any
model (causal or not, grouped-query attention included), forward and backward.

FlopCounterMode has formulas for the CUDA kernels (flash, memory-efficient, cuDNN) but **none for
the CPU kernel** ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward): a real CPU
step of any model that calls sdpa counts its attention as 0 (a tiny Llama: 0.95 of the eager
twin's FLOPs, a longer sequence far less). :class:`FusedAttentionCount` gives FlopCounterMode a
``custom_mapping`` for every sdpa kernel:

- forward: the two matmuls of attention, q·kᵀ and weights·v (torch's ``sdpa_flop_count``): 4·b·h_q·s_q·s_k·d;
- backward: the **model's** four matmuls (gradients of the weights, v, q and k) — what the eager
  (math) path computes. A fused kernel also recomputes q·kᵀ in its backward (it keeps no s×s
  scores); torch's own backward formula counts that too. That recomputation is hardware work,
  not model FLOPs (MFU, not HFU): it is recorded apart, in :attr:`FusedAttentionCount.recompute_flops`.

So a step with sdpa counts exactly what the same model counts with eager attention
(``tests/test_hf_models.py``: ``LlamaForCausalLM``, sdpa vs eager, ratio 1.000). Causal masking
does not change the count: the kernels and the eager path both compute all s_q·s_k scores.
Grouped-query attention (k, v with fewer heads) costs as many FLOPs as if k, v were repeated to
the query's heads (the kernel broadcasts them; the eager path repeats them).

>>> q = torch.randn(1, 2, 4, 8)
>>> count = FusedAttentionCount()
>>> from torch.utils.flop_counter import FlopCounterMode
>>> with FlopCounterMode(display=False, custom_mapping=count.custom_mapping()) as counter:
...     _ = torch.nn.functional.scaled_dot_product_attention(q, q, q)
>>> counter.get_total_flops() == 2 * (2 * 2 * 4 * 8 * 4)     # q·kᵀ and weights·v, b·h = 2
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SDPA_FORWARD_KERNELS", "attention_forward_flops", "attention_backward_flops", "attention_recompute_flops", "FusedAttentionCount"]

#: aten kernels F.scaled_dot_product_attention dispatches to (each has a ``…_backward``)
SDPA_FORWARD_KERNELS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _bmm_flops(batch: int, rows: int, inner: int, columns: int) -> int:
    return 2 * batch * rows * inner * columns


def _kv_heads_as_query_heads(query_shape: Any, shape: Any) -> tuple[int, ...]:
    """A key or value shape with its heads broadcast to the query's, as grouped-query attention's
    kernel broadcasts them: the FLOPs are the query heads'. torch 2.13's ``sdpa_flop_count`` does this
    itself; before 2.13 (2.8, 2.11) it asserts equal heads, so resacct broadcasts before asking it."""
    batch, heads, length, size = shape
    query_heads = query_shape[1]
    if heads != query_heads and heads > 0 and query_heads % heads == 0:
        return (batch, query_heads, length, size)
    return tuple(shape)


def attention_forward_flops(query_shape: Any, key_shape: Any, value_shape: Any) -> int:
    """q·kᵀ and weights·v: 2·b·h_q·s_q·s_k·(d_qk + d_v) (torch's ``sdpa_flop_count``, which checks the shapes).

    >>> attention_forward_flops((2, 8, 16, 4), (2, 2, 16, 4), (2, 2, 16, 4))   # GQA: 2 kv heads for 8; 2 · 2·(2·8)·16·4·16
    65536
    """
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(tuple(query_shape), _kv_heads_as_query_heads(query_shape, key_shape),
                               _kv_heads_as_query_heads(query_shape, value_shape)))


def attention_recompute_flops(query_shape: Any, key_shape: Any) -> int:
    """The scores q·kᵀ a fused backward recomputes: 2·b·h_q·s_q·d·s_k."""
    batch, heads, rows, inner = query_shape
    return _bmm_flops(batch * heads, rows, inner, key_shape[2])


def attention_backward_flops(grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any) -> int:
    """The model's backward matmuls (gradients of weights, v, q, k): torch's
    ``sdpa_backward_flop_count`` without the scores it recomputes.

    >>> attention_backward_flops((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)) == 2 * attention_forward_flops((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    True
    """
    from torch.utils.flop_counter import sdpa_backward_flop_count

    with_recompute = int(sdpa_backward_flop_count(tuple(grad_shape), tuple(query_shape), _kv_heads_as_query_heads(query_shape, key_shape),
                                                  _kv_heads_as_query_heads(query_shape, value_shape)))
    return with_recompute - attention_recompute_flops(query_shape, key_shape)


class FusedAttentionCount:
    """A FlopCounterMode ``custom_mapping`` for every sdpa kernel torch has, counting model FLOPs;
    it adds up the recomputation the fused backward does beside them (``recompute_flops``) and
    the FLOPs it gave to kernels FlopCounterMode itself counts as 0 (``filled_flops``)."""

    def __init__(self) -> None:
        self.recompute_flops = 0
        self.filled_flops = 0

    def custom_mapping(self) -> dict[Any, Callable[..., int]]:
        from torch.utils.flop_counter import flop_registry

        aten = torch.ops.aten
        mapping: dict[Any, Callable[..., int]] = {}
        for name in SDPA_FORWARD_KERNELS:
            if not hasattr(aten, name) or not hasattr(aten, name + "_backward"):
                continue
            forward, backward = getattr(aten, name), getattr(aten, name + "_backward")
            mapping[forward] = self._forward(unknown_to_torch=forward not in flop_registry)
            mapping[backward] = self._backward(unknown_to_torch=backward not in flop_registry)
        return mapping

    # The counters are bound methods under functools.partial, not functions defined per call: the tests'
    # type-check hook decorates a function each time its ``def`` runs (0.6-0.7 ms), and every traced step asks
    # for a fresh mapping (688 decorations in 119 quick-tier items: docs/suite_time.md).
    def _forward(self, *, unknown_to_torch: bool) -> Callable[..., int]:
        return functools.partial(self._count_forward, unknown_to_torch)

    def _backward(self, *, unknown_to_torch: bool) -> Callable[..., int]:
        return functools.partial(self._count_backward, unknown_to_torch)

    def _count_forward(self, unknown_to_torch: bool, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                       out_shape: Any = None, **kwargs: Any) -> int:
        flops = attention_forward_flops(query_shape, key_shape, value_shape)
        self.filled_flops += flops if unknown_to_torch else 0
        return flops

    def _count_backward(self, unknown_to_torch: bool, grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any,
                        *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        flops = attention_backward_flops(grad_shape, query_shape, key_shape, value_shape)
        self.recompute_flops += attention_recompute_flops(query_shape, key_shape)
        self.filled_flops += flops if unknown_to_torch else 0
        return flops
