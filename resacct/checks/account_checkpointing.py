"""How the account claims about activation checkpointing and gradient accumulation are measured:
what a checkpointed step frees and recomputes, the best number of segments, and what accumulation
holds (a real CPU step of a GPT each; split from :mod:`resacct.checks.account`, whose check names
they keep).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from resacct.checks.account import _tokens
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.measurement.memo import shared_measurement
from resacct.measurement.meta_op_cache import meta_calls_cached
from resacct.measurement.activations import (
    best_segment_count,
    gpt_loss,
    predict_gpt_held_after_forward_bytes,
    predict_gpt_step_peak_bytes,
    record_saved_activations,
    rng_state_bytes,
    run_in_segments,
    trace_allocations,
)
from resacct.training.gpt import GPTConfig, build_gpt, get_gpt_config
from resacct.training.models import Cruncher
from resacct.training.seeding import seed_torch



def _deep_config(layers: int) -> GPTConfig:
    """A narrow, deep GPT that measures in a fraction of a second: V 64, d 32, 2 heads."""
    return GPTConfig(vocab_size=64, context_length=32, n_layers=layers, n_heads=2, d_model=32)


def _held_after_forward(net: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, segments: int) -> int:
    net.zero_grad(set_to_none=True)
    with trace_allocations() as trace:
        loss = gpt_loss(net, tokens, targets, checkpoint_segments=segments)
    del loss
    return trace.end_bytes


def _step_peak(net: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, segments: int) -> int:
    net.zero_grad(set_to_none=True)
    with trace_allocations() as trace:
        gpt_loss(net, tokens, targets, checkpoint_segments=segments).backward()
    net.zero_grad(set_to_none=True)
    return trace.peak_bytes


@shared_measurement
def _unsegmented_measurements(layers: int, batch: int, seq: int) -> tuple[int, int, int]:
    """(what blocks.0 saves, one boundary's bytes, held after an unsegmented forward) of the narrow
    GPT — the same for every segment count, so measured once per size."""
    config = _deep_config(layers)
    seed_torch(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, batch, seq, "cpu")
    with record_saved_activations(net) as saved:
        loss = gpt_loss(net, tokens, targets)
    del loss
    layer_bytes = sum(v for module, v in saved.by_module().items() if module.startswith("blocks.0."))
    boundary = net.token_embedding(tokens) + net.position_embedding(torch.arange(seq))  # (b, s, d)
    return layer_bytes, boundary.untyped_storage().nbytes(), _held_after_forward(net, tokens, targets, 0)


@check("account.checkpoint_freed_bytes", evidence="measured", quantities=("layer_bytes", "boundary_bytes", "rng_bytes"))
def checkpoint_freed_bytes(layers: int, segments: int, batch: int = 2, seq: int = 32) -> Outcome:
    """Bytes the CPU allocator no longer holds after a forward when the layers of a narrow GPT
    are checkpointed in ``segments`` segments (torch.utils.checkpoint, use_reentrant=False):
    held without checkpointing − held with. Quantities: what one layer saves (saved_tensors_hooks,
    blocks.0), one boundary activation (the embedding output's storage) and torch's RNG state."""
    config = _deep_config(layers)
    layer_bytes, boundary_bytes, unsegmented = _unsegmented_measurements(layers, batch, seq)
    seed_torch(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, batch, seq, "cpu")
    freed = unsegmented - _held_after_forward(net, tokens, targets, segments)
    predicted = predict_gpt_held_after_forward_bytes(config, batch, seq, 0) - predict_gpt_held_after_forward_bytes(config, batch, seq, segments)
    return Outcome(measured=freed, predicted=predicted,
                   quantities={"layer_bytes": layer_bytes, "boundary_bytes": boundary_bytes, "rng_bytes": rng_state_bytes()})


@shared_measurement
def _backward_flops_and_modules(layers: int, batch: int, seq: int, segments: int) -> tuple[int, dict[str, int]]:
    """Backward FLOPs (FlopCounterMode) of the narrow GPT on meta with k segments, and the
    forward FLOPs per module (inclusive), measured once per size."""
    config = _deep_config(layers)
    net = build_gpt(config, device="meta")
    tokens, targets = _tokens(config, batch, seq, "meta")
    with meta_calls_cached(net), FlopCounterMode(display=False) as forward_counter:
        loss = gpt_loss(net, tokens, targets, checkpoint_segments=segments)
    with meta_calls_cached(net), FlopCounterMode(display=False) as backward_counter:
        loss.backward()
    root = type(net).__name__
    modules = {name.removeprefix(root + "."): int(sum(per_op.values())) for name, per_op in forward_counter.get_flop_counts().items()}
    return int(backward_counter.get_total_flops()), modules


@check("account.checkpoint_recompute_flops", evidence="measured", quantities=("layer_forward_flops", "down_projection_flops"))
def checkpoint_recompute_flops(layers: int, segments: int, batch: int = 2, seq: int = 32) -> Outcome:
    """Backward FLOPs with ``segments`` checkpoint segments − without (FlopCounterMode), for a
    narrow GPT on the meta device; the forward FLOPs of one layer and of its MLP down
    projection (FlopCounterMode's per-module counts) as quantities."""
    from resacct.measurement.activations import predict_gpt_recompute_flops

    plain, modules = _backward_flops_and_modules(layers, batch, seq, 0)
    checkpointed, _ = _backward_flops_and_modules(layers, batch, seq, segments)
    return Outcome(measured=checkpointed - plain, predicted=predict_gpt_recompute_flops(_deep_config(layers), batch, seq, segments),
                   quantities={"layer_forward_flops": modules["blocks.0"], "down_projection_flops": modules["blocks.0.mlp.down"]})


_SEGMENT_CHOICES = (1, 2, 4, 8, 16)


@check("account.checkpoint_best_segments", evidence="measured", quantities=("layers", "peaks_bytes"))
def checkpoint_best_segments(model: str, layers: int = 16) -> Outcome:
    """The number of checkpoint segments k ∈ {1, 2, 4, 8, 16} (divisors of L = 16) whose
    forward + backward has the lowest CPU-allocator peak: for a narrow GPT (``gpt``: a layer
    saves ~18 boundary-sized tensors) or a Cruncher chain (``cruncher``: a layer saves only its
    input, Chen et al.'s setting). The peaks are a quantity."""
    if layers != 16:
        raise ResacctError(f"layers {layers!r}: this check compares the divisors of 16; expected 16")
    seed_torch(0)
    if model == "gpt":
        config = _deep_config(layers)
        net = build_gpt(config)
        tokens, targets = _tokens(config, 2, 32, "cpu")
        peaks = [_step_peak(net, tokens, targets, k) for k in _SEGMENT_CHOICES]
        predicted_peaks = [predict_gpt_step_peak_bytes(config, 2, 32, k) for k in _SEGMENT_CHOICES]
        predicted = _SEGMENT_CHOICES[predicted_peaks.index(min(predicted_peaks))]
    elif model == "cruncher":
        chain = Cruncher(dim=16, num_layers=layers)
        x = torch.randn(1024, 16)  # (batch, dim): activations ≫ parameters
        peaks = []
        for k in _SEGMENT_CHOICES:
            chain.zero_grad(set_to_none=True)
            with trace_allocations() as trace:
                chain.final(run_in_segments(list(chain.layers), x, k)).pow(2).mean().backward()
            peaks.append(trace.peak_bytes)
        boundary = x.numel() * x.element_size()
        predicted = best_segment_count(layers, layer_bytes=boundary, boundary_bytes=boundary + rng_state_bytes())
    else:
        raise ResacctError(f"model {model!r}: expected gpt or cruncher")
    best = _SEGMENT_CHOICES[peaks.index(min(peaks))]
    return Outcome(measured=best, predicted=predicted, quantities={"layers": layers, "peaks_bytes": peaks})


@shared_measurement
def _accumulation(micro_batch: int, steps: int, model: str, seq: int) -> tuple[int, int, int]:
    from resacct.measurement.activations import measure_grad_accumulation

    config = get_gpt_config(model)
    seed_torch(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, micro_batch * steps, seq, "cpu")
    accumulated = measure_grad_accumulation(net, tokens, targets, steps)
    single = _held_after_forward(net, tokens[:micro_batch], targets[:micro_batch], 0)
    return accumulated.max_micro_held_bytes, single, accumulated.effective_batch_held_bytes


@check("account.grad_accumulation_held", evidence="measured", quantities=("single_micro_batch_bytes", "effective_batch_bytes", "steps"))
def grad_accumulation_held(micro_batch: int, steps: int, model: str = "gpt-nano", seq: int = 32) -> Outcome:
    """The most the CPU allocator holds after any micro-batch's forward while ``steps``
    micro-batches of ``micro_batch`` sequences accumulate gradients (loss / steps, backward after
    each); held by one micro-batch alone and by the whole effective batch at once as quantities."""
    most, single, effective = _accumulation(micro_batch, steps, model, seq)
    return Outcome(
        measured=most,
        predicted=predict_gpt_held_after_forward_bytes(get_gpt_config(model), micro_batch, seq),
        quantities={"single_micro_batch_bytes": single, "effective_batch_bytes": effective, "steps": steps},
    )
