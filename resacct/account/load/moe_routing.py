"""A mixture of experts as training holds it: **dropless routing**, the routing assumption every
resacct trace of a transformers MoE (other than Mixtral's, whose closed forms model transformers'
``batched_mm``) follows.

The assumption, printed with every MoE account: each token runs its k routed experts (no
capacity factor, no token dropped, no padding); the T·k (token, expert) rows are sorted by expert
and each expert multiplies its own rows by its own weights (a grouped matmul, as MegaBlocks,
Megatron's grouped GEMM and transformers' ``grouped_mm`` do). What a step saves and computes then
depends on T·k alone — **not** on how the tokens spread over the experts: an even spread and a
skewed one hold the same bytes and cost the same FLOPs (only one expert's share of the work, which
matters for expert parallelism, would change).

transformers' ``batched_mm`` path, the one that runs on the meta device by default, instead gathers
a copy of the expert weights for every (token, expert) pair — ``weights[expert_ids]``, T·k·3·d·f
numbers saved for backward — which is not what a training framework holds (DeepSeek-V3 at 1 × 128
tokens: 10.47 TB of "activations"). :data:`EXPERTS_IMPLEMENTATION` is transformers' own
``grouped_mm`` forward with its grouped matmul taken by transformers' fallback custom op
(``transformers::grouped_mm_fallback``: a shape function for meta and fake tensors, a CPU kernel,
an autograd rule saving the rows and the weights) on every device, so the meta trace and a real
CPU step run the same ops. FlopCounterMode does not count that op: :func:`grouped_mm_flop_mapping`
counts it from its shapes, 2·S·K·N forward (input S×K, weights E×K×N) and twice that backward.

>>> routing_basis(experts=256, per_token=8, tokens=128)
'dropless routing: each of 128 tokens runs its 8 of 256 experts (1024 token–expert rows, grouped by expert, no capacity limit); bytes and FLOPs depend on the 1024 rows, not on how they spread over the experts'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EXPERTS_IMPLEMENTATION", "register_dropless_experts", "grouped_mm_flop_mapping", "routing_basis"]

#: the name resacct's experts forward is registered under in transformers' ExpertsInterface
EXPERTS_IMPLEMENTATION = "resacct_dropless"


def routing_basis(*, experts: int, per_token: int, tokens: int) -> str:
    """The routing assumption, in one line, for ``tokens`` tokens of a model with ``experts`` routed experts, k = ``per_token``."""
    rows = tokens * per_token
    return (f"dropless routing: each of {tokens} tokens runs its {per_token} of {experts} experts ({rows} token–expert rows, grouped by expert, "
            f"no capacity limit); bytes and FLOPs depend on the {rows} rows, not on how they spread over the experts")


def register_dropless_experts() -> str:
    """Register :data:`EXPERTS_IMPLEMENTATION` with transformers (once) and return its name."""
    from transformers.integrations import moe

    if EXPERTS_IMPLEMENTATION not in moe.ALL_EXPERTS_FUNCTIONS:
        moe.ExpertsInterface._global_mapping[EXPERTS_IMPLEMENTATION] = _dropless_forward
    return EXPERTS_IMPLEMENTATION


def _dropless_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """transformers' grouped_mm experts forward, its grouped matmul always the fallback custom op."""
    from transformers.integrations import moe

    original = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        return moe.grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    finally:
        moe._can_use_grouped_mm = original


def _grouped_forward_flops(input_shape: Any, weight_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    rows, inner = input_shape
    return 2 * rows * inner * weight_shape[-1]


def _grouped_backward_flops(input_shape: Any, weight_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * _grouped_forward_flops(input_shape, weight_shape)  # the input's gradient and the weights'


def grouped_mm_flop_mapping() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode ``custom_mapping`` entries for transformers' grouped-matmul custom ops (empty without them)."""
    import torch

    namespace = getattr(torch.ops, "transformers", None)
    forward = getattr(namespace, "grouped_mm_fallback", None) if namespace is not None else None
    backward = getattr(namespace, "grouped_mm_fallback_backward", None) if namespace is not None else None
    mapping: dict[Any, Callable[..., int]] = {}
    if forward is not None:
        mapping[forward] = _grouped_forward_flops
    if backward is not None:
        mapping[backward] = _grouped_backward_flops
    return mapping
