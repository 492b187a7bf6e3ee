"""Activation checkpointing over segments of layers, predicted and measured; gradient
accumulation measured.

- :func:`run_in_segments` / :func:`gpt_loss` — a forward with
  ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` over k segments of the layers.
- :func:`predict_gpt_held_after_forward_bytes`, :func:`predict_gpt_step_peak_bytes`,
  :func:`predict_gpt_recompute_flops` — resacct's formulas for what checkpointing keeps and
  recomputes; :func:`measure_checkpointing` / :func:`measure_grad_accumulation` — the allocator's
  figures for the same (:func:`resacct.measurement.activation_recording.trace_allocations`).

Re-exported by :mod:`resacct.measurement.activations`.

>>> segment_bounds(layers=16, segments=4)
[(0, 4), (4, 8), (8, 12), (12, 16)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int, Shaped
from torch import nn
from torch.utils.checkpoint import checkpoint

from resacct.measurement.activation_recording import trace_allocations
from resacct.errors import ResacctError
from resacct.training.gpt import GPTConfig, gpt_parameter_count
from resacct.formulas.gpt_formulas import gpt_layer_saved_bytes, gpt_outside_layers_saved_bytes

__all__ = [
    "segment_bounds",
    "run_in_segments",
    "gpt_forward",
    "gpt_loss",
    "best_segment_count",
    "WRAPPED_SCALAR_BYTES",
    "rng_state_bytes",
    "predict_gpt_held_after_forward_bytes",
    "predict_gpt_step_peak_bytes",
    "predict_gpt_recompute_flops",
    "CheckpointPoint",
    "measure_checkpointing",
    "GradAccumulation",
    "measure_grad_accumulation",
]

# ───────────────────────────── activation checkpointing ─────────────────────────────


def segment_bounds(layers: int, segments: int) -> list[tuple[int, int]]:
    """Split ``layers`` consecutive layers into ``segments`` contiguous runs as evenly as possible.

    >>> segment_bounds(5, 2)
    [(0, 2), (2, 5)]
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers <= 0:
        raise ResacctError(f"layers must be a whole number > 0, got {layers!r}")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= layers:
        raise ResacctError(f"checkpoint segments must be a whole number from 1 to the {layers} layers, got {segments!r}")
    edges = [round(index * layers / segments) for index in range(segments + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _run_layers(layers: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


def run_in_segments(layers: Sequence[nn.Module], x: Shaped[torch.Tensor, "..."], segments: int = 0) -> Shaped[torch.Tensor, "..."]:
    """``x`` through ``layers`` in order; with ``segments`` = k ≥ 1, each of k contiguous runs
    is wrapped in ``checkpoint(..., use_reentrant=False)``: only its input is kept, and its
    activations are recomputed in backward. ``segments=0``: no checkpointing.

    >>> layers = [torch.nn.Linear(4, 4) for _ in range(4)]
    >>> x = torch.randn(2, 4)
    >>> torch.allclose(run_in_segments(layers, x, 2), run_in_segments(layers, x, 0))
    True
    """
    if segments == 0:
        return _run_layers(layers, x)
    for start, end in segment_bounds(len(layers), segments):
        x = checkpoint(_run_layers, layers[start:end], x, use_reentrant=False)
    return x


def _segmented_gpt_forward(model: nn.Module, tokens: torch.Tensor, segments: int) -> torch.Tensor:
    """GPT.forward with its blocks run through :func:`run_in_segments`."""
    seq = tokens.shape[1]
    if seq > model.config.context_length:
        raise ResacctError(f"sequence of {seq} tokens is longer than the context length {model.config.context_length}")
    positions = torch.arange(seq, device=tokens.device)  # (s,)
    x = model.token_embedding(tokens) + model.position_embedding(positions)  # (b, s, d)
    x = run_in_segments(list(model.blocks), x, segments)  # (b, s, d)
    return model.lm_head(model.final_norm(x))  # (b, s, vocab)


def gpt_forward(model: nn.Module, tokens: Int[torch.Tensor, "batch seq"], *, checkpoint_segments: int = 0) -> Float[torch.Tensor, "batch seq vocab"]:
    """:class:`resacct.training.gpt.GPT`'s forward, its blocks optionally checkpointed in k segments.

    Always entered through ``model(tokens)`` (the checkpointed forward is swapped in for the
    call), so that hooks and module trackers see the root module and name its children
    ``blocks.0.attention`` … as usual."""
    if checkpoint_segments == 0:
        return model(tokens)
    model.forward = lambda toks: _segmented_gpt_forward(model, toks, checkpoint_segments)  # type: ignore[method-assign]
    try:
        return model(tokens)
    finally:
        del model.forward


def gpt_loss(
    model: nn.Module, tokens: Int[torch.Tensor, "batch seq"], targets: Int[torch.Tensor, "batch seq"], *, checkpoint_segments: int = 0
) -> Float[torch.Tensor, ""]:
    """Mean next-token cross-entropy of a GPT on ``tokens`` against ``targets``."""
    logits = gpt_forward(model, tokens, checkpoint_segments=checkpoint_segments)  # (b, s, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def best_segment_count(layers: int, layer_bytes: float, boundary_bytes: float) -> int:
    """The k in 1..L that minimises k·boundary + ⌈L/k⌉·layer — boundaries held plus one segment
    recomputed. The continuous optimum is k = √(L·layer/boundary): √L only when a layer saves
    as much as its boundary (Chen et al. 2016's chain), up to L when it saves much more.

    >>> best_segment_count(16, layer_bytes=1.0, boundary_bytes=1.0)
    4
    >>> best_segment_count(16, layer_bytes=18.0, boundary_bytes=1.0)
    16
    """
    if layer_bytes < 0 or boundary_bytes <= 0:
        raise ResacctError(f"layer_bytes {layer_bytes!r} must be ≥ 0 and boundary_bytes {boundary_bytes!r} > 0")
    candidates = range(1, segment_bounds(layers, 1)[0][1] + 1)
    return min(candidates, key=lambda k: (k * boundary_bytes + math.ceil(layers / k) * layer_bytes, k))


# ───────────────────────────── predicted and measured: checkpointing ─────────────────────────────

#: ``scores / math.sqrt(e)`` wraps the Python float in a 0-dim float64 tensor that the division's
#: backward node keeps without going through saved-tensor hooks: 8 bytes a layer, seen only by
#: the allocator.
WRAPPED_SCALAR_BYTES = 8


def rng_state_bytes() -> int:
    """Bytes of the CPU generator state ``checkpoint(preserve_rng_state=True)`` keeps per segment
    (read from torch: ``torch.get_rng_state()``, 5056 bytes for the Mersenne twister)."""
    return torch.get_rng_state().numel()


def _gpt_sizes(config: GPTConfig, batch: int, seq: int, element_bytes: int) -> dict[str, int]:
    tokens = batch * seq
    outside = gpt_outside_layers_saved_bytes(config, batch, seq, element_bytes=element_bytes)
    return {
        "x": tokens * config.d_model * element_bytes,  # one (b, s, d) activation: a boundary
        "layer": gpt_layer_saved_bytes(config, batch, seq, element_bytes=element_bytes),
        # saved outside the layers, minus token ids and targets (allocated before the step), plus the loss
        "outside": outside - 2 * tokens * 8 + element_bytes,
        "positions": seq * 8,
        "logits": tokens * config.vocab_size * element_bytes,
    }


def predict_gpt_held_after_forward_bytes(
    config: GPTConfig, batch: int, seq: int, checkpoint_segments: int = 0, *, element_bytes: int = 4, rng_bytes: int | None = None
) -> int:
    """Bytes the allocator holds after a GPT forward + loss (CPU, math attention), above what
    existed before: without checkpointing every layer's saved tensors; with k segments, only
    each segment's input and generator state — plus, always, what the embeddings, final norm,
    LM head and loss save and one wrapped scalar per layer.

    >>> from resacct.training.gpt import get_gpt_config
    >>> config = get_gpt_config("gpt-nano")
    >>> predict_gpt_held_after_forward_bytes(config, 2, 16, 1, rng_bytes=5056) < predict_gpt_held_after_forward_bytes(config, 2, 16, 0)
    True
    """
    sizes = _gpt_sizes(config, batch, seq, element_bytes)
    rng = rng_state_bytes() if rng_bytes is None else rng_bytes
    held = sizes["outside"] + WRAPPED_SCALAR_BYTES * config.n_layers
    if checkpoint_segments == 0:
        return held + config.n_layers * sizes["layer"]
    return held + len(segment_bounds(config.n_layers, checkpoint_segments)) * (sizes["x"] + rng)


def predict_gpt_step_peak_bytes(
    config: GPTConfig, batch: int, seq: int, checkpoint_segments: int = 0, *, element_bytes: int = 4, rng_bytes: int | None = None
) -> int:
    """The most a GPT forward + backward holds at once above its start (gradients start at None),
    by walking backward's phases: the loss and LM head (held + two b·s·V logit gradients), then
    each checkpoint segment from the last (inputs of earlier segments + the segment's recomputed
    activations + the incoming gradient + the gradients of later layers and of the layer being
    differentiated), then the
    embeddings (every gradient, and two (V, d) buffers for the tied embedding's gradient). A
    model of the schedule: it leaves out the few buffers alive inside one layer's backward, so
    it reads a few percent low with checkpointing.

    >>> from resacct.training.gpt import get_gpt_config
    >>> config = get_gpt_config("gpt-nano")
    >>> held = predict_gpt_held_after_forward_bytes(config, 8, 64)
    >>> predict_gpt_step_peak_bytes(config, 8, 64) == held + 2 * 8 * 64 * 256 * 4  # the loss's two logit gradients on top
    True
    """
    sizes = _gpt_sizes(config, batch, seq, element_bytes)
    rng = rng_state_bytes() if rng_bytes is None else rng_bytes
    d, layers = config.d_model, config.n_layers
    # parameter gradients, in the parameters' dtype (that of the activations here)
    head_gradients = (config.vocab_size * d + 2 * d) * element_bytes  # tied embedding / LM head, final norm
    layer_gradients = (gpt_parameter_count(config) - config.vocab_size * d - config.context_length * d - 2 * d) // layers * element_bytes
    all_gradients = gpt_parameter_count(config) * element_bytes
    scalars = WRAPPED_SCALAR_BYTES * layers
    held = predict_gpt_held_after_forward_bytes(config, batch, seq, checkpoint_segments, element_bytes=element_bytes, rng_bytes=rng)
    phases = [held + 2 * sizes["logits"]]
    if checkpoint_segments:
        for index, (start, end) in enumerate(segment_bounds(layers, checkpoint_segments)):
            earlier_inputs = index * (sizes["x"] + rng) + rng
            recomputed = (end - start) * sizes["layer"]
            gradients = head_gradients + (layers - end + 1) * layer_gradients  # later layers', and the one in backward
            phases.append(sizes["positions"] + scalars + earlier_inputs + recomputed + sizes["x"] + gradients)
    # the embeddings' backward, last: every gradient exists, the token embedding's backward makes
    # a (V, d) gradient and adding it to the tied LM head's makes another (accumulated out of place)
    phases.append(all_gradients + 2 * config.vocab_size * d * element_bytes)
    return max(phases)


def predict_gpt_recompute_flops(config: GPTConfig, batch: int, seq: int, checkpoint_segments: int) -> int:
    """Extra backward FLOPs of k checkpoint segments: one more forward of every layer, less the
    last MLP down projection of each segment — torch's non-reentrant checkpoint stops
    recomputing once the segment's last saved tensor (the down projection's input) is rebuilt.

    >>> from resacct.training.gpt import get_gpt_config
    >>> predict_gpt_recompute_flops(get_gpt_config("gpt-nano"), 2, 16, 0)
    0
    >>> predict_gpt_recompute_flops(get_gpt_config("gpt-nano"), 2, 16, 2)  # 2·3276800 − 2·1048576
    4456448
    """
    if checkpoint_segments == 0:
        return 0
    segments = len(segment_bounds(config.n_layers, checkpoint_segments))
    tokens, d, r = batch * seq, config.d_model, config.mlp_ratio
    layer_forward = 2 * tokens * (4 + 2 * r) * d * d + 4 * batch * seq * seq * d
    down_projection = 2 * tokens * r * d * d
    return config.n_layers * layer_forward - segments * down_projection


@dataclass(frozen=True)
class CheckpointPoint:
    """One forward + backward with k checkpoint segments (k = 0: none), measured and predicted."""

    segments: int
    held_after_forward_bytes: int
    peak_bytes: int
    backward_flops: int
    predicted_held_after_forward_bytes: int
    predicted_peak_bytes: int


def measure_checkpointing(
    model: nn.Module,
    tokens: Int[torch.Tensor, "batch seq"],
    targets: Int[torch.Tensor, "batch seq"],
    segments: Sequence[int],
) -> list[CheckpointPoint]:
    """For each k in ``segments``: the allocator's bytes held after forward and its peak over
    forward + backward (gradients start at None), and the backward FLOPs FlopCounterMode traces
    (recomputation included), beside resacct's predictions (CPU, float32, math attention)."""

    from torch.utils.flop_counter import FlopCounterMode

    config = model.config
    batch, seq = tokens.shape
    points = []
    for k in segments:
        model.zero_grad(set_to_none=True)
        with trace_allocations() as forward_trace:
            loss = gpt_loss(model, tokens, targets, checkpoint_segments=k)
        del loss
        with trace_allocations() as step_trace:
            loss = gpt_loss(model, tokens, targets, checkpoint_segments=k)
            loss.backward()
        del loss
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            loss = gpt_loss(model, tokens, targets, checkpoint_segments=k)
            forward_flops = counter.get_total_flops()
            loss.backward()
        del loss
        model.zero_grad(set_to_none=True)
        points.append(
            CheckpointPoint(
                segments=k,
                held_after_forward_bytes=forward_trace.end_bytes,
                peak_bytes=step_trace.peak_bytes,
                backward_flops=int(counter.get_total_flops() - forward_flops),
                predicted_held_after_forward_bytes=predict_gpt_held_after_forward_bytes(config, batch, seq, k),
                predicted_peak_bytes=predict_gpt_step_peak_bytes(config, batch, seq, k),
            )
        )
    return points


@dataclass(frozen=True)
class GradAccumulation:
    """Activation bytes held after each micro-batch's forward (the most of them), and after the
    forward of one batch as large as the effective batch, for comparison."""

    micro_batch: int
    steps: int
    micro_held_bytes: tuple[int, ...]
    effective_batch_held_bytes: int

    @property
    def max_micro_held_bytes(self) -> int:
        return max(self.micro_held_bytes)


def measure_grad_accumulation(
    model: nn.Module, tokens: Int[torch.Tensor, "batch seq"], targets: Int[torch.Tensor, "batch seq"], steps: int
) -> GradAccumulation:
    """Split (batch, seq) ``tokens`` into ``steps`` micro-batches, accumulate their gradients
    (loss / steps, backward after each), and trace what each micro forward holds; then trace a
    forward of the whole batch at once."""

    batch = tokens.shape[0]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or batch % steps:
        raise ResacctError(f"gradient accumulation steps {steps!r} must be a whole number ≥ 1 dividing the batch of {batch}")
    micro = batch // steps
    model.zero_grad(set_to_none=True)
    held = []
    for index in range(steps):
        rows = slice(index * micro, (index + 1) * micro)
        with trace_allocations() as trace:
            loss = gpt_loss(model, tokens[rows], targets[rows]) / steps
        held.append(trace.end_bytes)
        loss.backward()
        del loss
    with trace_allocations() as whole:
        loss = gpt_loss(model, tokens, targets)
    del loss
    model.zero_grad(set_to_none=True)
    return GradAccumulation(micro_batch=micro, steps=steps, micro_held_bytes=tuple(held), effective_batch_held_bytes=whole.end_bytes)
