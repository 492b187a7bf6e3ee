"""transformers' ``eager`` experts forward (Mixtral's: a loop over the experts the routing hit) on meta tensors, for the
GPU record's ``mixtral-small/…/eager-experts`` step (:func:`~resacct.account.gpu.records.record_models.predict_record_step`).

The loop asks the data which experts were hit (``nonzero``) and which rows each got (``torch.where``): meta tensors
have no data, so the step cannot run there as it is. :func:`even_eager_forward` runs the same ops with the same
allocations under one assumption: **every expert is hit, and the T·k (token, expert) rows spread evenly** (T·k ÷ E
each, the first T·k mod E one more). What a training step saves for backward is the same however the rows spread (the
experts' inputs, intermediates and outputs add up to T·k rows); the transient blocks of one expert's turn follow its
share, so an uneven spread on a board moves the peak by a part of one expert's rows, and the caching allocator's
blocks with it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EVEN_EAGER_EXPERTS", "register_even_eager_experts", "even_eager_forward", "even_rows"]

#: the name :func:`even_eager_forward` is registered under in transformers' ExpertsInterface
EVEN_EAGER_EXPERTS = "resacct_even_eager"


def even_rows(rows: int, experts: int) -> list[int]:
    """``rows`` spread over ``experts`` as evenly as whole rows allow, the first ones one more.

    >>> even_rows(10, 4)
    [3, 3, 2, 2]
    """
    return [rows // experts + (1 if expert < rows % experts else 0) for expert in range(experts)]


def even_eager_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """Mixtral's eager experts forward (transformers' ``MixtralExperts.forward``), op for op, with the routing's answers
    made up: every expert hit, the rows spread by :func:`even_rows` (module doc)."""
    import torch
    from torch import nn

    final_hidden_states = torch.zeros_like(hidden_states)
    device = hidden_states.device
    with torch.no_grad():
        expert_mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        torch.greater(expert_mask.sum(dim=(-1, -2)), 0)
        expert_hit = torch.empty(self.num_experts, 1, dtype=torch.long, device=device)  # nonzero's answer: every expert hit
    for expert, (hit, rows) in enumerate(zip(expert_hit, even_rows(top_k_index.numel(), self.num_experts))):
        torch.eq(hit[0], self.num_experts)  # the loop's `expert_idx == self.num_experts` (a 0-dim bool on the board)
        top_k_pos, token_idx = torch.zeros(rows, 2, dtype=torch.long, device=device).unbind(1)  # torch.where's answer
        current_state = hidden_states[token_idx]
        # a 0-dim index tensor indexes as its value (.item() on the board): a view of one expert's weights, as here
        gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert]).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = nn.functional.linear(current_hidden_states, self.down_proj[expert])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


def register_even_eager_experts() -> str:
    """Register :data:`EVEN_EAGER_EXPERTS` with transformers (once) and return its name."""
    from transformers.integrations import moe

    if EVEN_EAGER_EXPERTS not in moe.ALL_EXPERTS_FUNCTIONS:
        moe.ExpertsInterface._global_mapping[EVEN_EAGER_EXPERTS] = even_eager_forward
    return EVEN_EAGER_EXPERTS
