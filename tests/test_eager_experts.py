"""Mixtral's eager experts forward emulated on meta tensors (resacct/account/gpu/tracing/eager_experts.py): with the routing's
answers made up — every expert hit, the rows spread evenly — it allocates what transformers' own eager loop allocates on
real CPU tensors when the routing does spread evenly, block for block (one_hot's internals aside), to the same peak."""

from __future__ import annotations

import pytest
import torch

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.tracing.eager_experts import even_eager_forward, even_rows

pytest.importorskip("transformers")


def _experts(device: str):  # type: ignore[no-untyped-def]
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "eager"  # transformers' own loop (its interface's default otherwise)
    with torch.device(device):
        experts = MixtralExperts(config)
    if device != "meta":
        torch.nn.init.normal_(experts.gate_up_proj)
        torch.nn.init.normal_(experts.down_proj)
    return experts


def _allocations(device: str, forward) -> tuple[list[int], int]:  # type: ignore[no-untyped-def]
    """The sizes each op allocated, in order, and the peak, for one forward and backward of ``forward`` on ``device``."""
    experts = _experts(device)
    tokens, k = 12, 2
    routing = torch.arange(tokens * k, device="cpu").reshape(tokens, k) % 4  # each expert gets 24 / 4 = 6 rows
    hidden = torch.randn(tokens, 32, device="cpu")
    if device == "meta":
        routing, hidden = routing.to("meta"), hidden.to("meta")
    hidden.requires_grad_(True)
    weights = torch.full((tokens, k), 0.5, device=device)
    recorder = AllocationRecorder(device=device, cuda_kernels=True)  # both as a GPU runs them (autograd's sums in place)
    with recorder:
        out = forward(experts, hidden, routing, weights)
        out.sum().backward()
    sizes = [entry["size"] for entry in recorder.snapshot()["device_traces"][0] if entry["action"] == "alloc"]
    return sizes, recorder.allocator.peak_allocated_bytes


def test_the_even_eager_loop_on_meta_allocates_what_transformers_eager_loop_does_on_cpu() -> None:
    real_sizes, real_peak = _allocations("cpu", lambda module, *args: module(*args))  # transformers' eager loop, routing evenly
    meta_sizes, meta_peak = _allocations("meta", even_eager_forward)
    # one_hot's own blocks differ (the CPU kernel checks the classes' min and max, 8 B each; meta runs a decomposition
    # through arange and eq); from its output on, every allocation of the loop and its backward is the same
    assert len(meta_sizes) == len(real_sizes) and meta_sizes[5:] == real_sizes[5:] and 960 in meta_sizes[:5] and 960 in real_sizes[:5]
    assert meta_peak == real_peak
    assert even_rows(24, 4) == [6, 6, 6, 6] and even_rows(25, 4) == [7, 6, 6, 6]
