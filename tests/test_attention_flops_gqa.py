"""Grouped-query attention's FLOPs on every torch we admit: torch before 2.13 (2.8, 2.11) asserts equal
heads in ``sdpa_flop_count``, so resacct broadcasts the key/value heads first (the kernel does the same).
Measured: FlopCounterMode over the same attention with its key/value heads repeated (plain matmuls)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from resacct.formulas.attention_flops import attention_backward_flops, attention_forward_flops


def _measured_forward_flops(batch: int, query_heads: int, kv_heads: int, length: int, size: int) -> int:
    query = torch.empty(batch, query_heads, length, size, device="meta")
    key = torch.empty(batch, kv_heads, length, size, device="meta").repeat_interleave(query_heads // kv_heads, dim=1)
    with FlopCounterMode(display=False) as counter:
        weights = query @ key.transpose(-2, -1)
        weights @ key  # value has the key's shape here
    return int(counter.get_total_flops())


@pytest.mark.parametrize(("query_heads", "kv_heads"), [(8, 2), (4, 1), (4, 4)])
def test_grouped_query_forward_flops_are_the_repeated_heads_matmuls(query_heads, kv_heads):
    batch, length, size = 2, 16, 8
    query_shape = (batch, query_heads, length, size)
    kv_shape = (batch, kv_heads, length, size)
    assert attention_forward_flops(query_shape, kv_shape, kv_shape) == _measured_forward_flops(batch, query_heads, kv_heads, length, size)


def test_grouped_query_backward_is_twice_the_forward_without_recompute():
    query_shape, kv_shape = (1, 8, 32, 16), (1, 2, 32, 16)
    assert attention_backward_flops(query_shape, query_shape, kv_shape, kv_shape) == 2 * attention_forward_flops(query_shape, kv_shape, kv_shape)
