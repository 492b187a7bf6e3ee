"""Measuring a GPT training step with torch: FlopCounterMode for FLOPs (per phase and per
module), a real torch.optim.AdamW for the training state, ``saved_tensors_hooks`` and the CPU
allocator (``torch.profiler``) for activations, peaks, checkpointing and accumulation.

resacct's formulas (:mod:`resacct.formulas.gpt_formulas`, :mod:`resacct.measurement.activations`,
:mod:`resacct.account`) only supply the ``predicted`` side. Big models run on the meta device.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from resacct.account import (
    measure_training_state,
    predict_optimizer_step_transient_bytes,
    trace_step_flops,
)
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
from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.training.gpt import GPTConfig, build_gpt, get_gpt_config, gpt_parameter_count, parameter_count
from resacct.formulas.gpt_formulas import (
    gpt_layer_saved_bytes,
    gpt_matmul_parameter_count,
    layer_norm_stats_bytes,
    nanogpt_parameter_count,
    predict_gpt_saved_bytes,
    predict_gpt_step_flops,
)
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.training.models import Cruncher


def _tokens(config: GPTConfig, batch: int, seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    targets = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    return tokens.to(device), targets.to(device)


@check("account.gpt_parameters", quantities=("state_dict_elements",))
def gpt_parameters(model: str) -> Outcome:
    """Parameters of a resacct.training.gpt model built on the meta device, each storage once
    (``model.parameters()`` skips the tied LM head); the state_dict's elements (which list the
    tied matrix twice) as a quantity."""
    net = build_gpt(model, device="meta")
    state_dict_elements = sum(tensor.numel() for tensor in net.state_dict().values())
    return Outcome(measured=parameter_count(net), predicted=gpt_parameter_count(get_gpt_config(model)),
                   quantities={"state_dict_elements": state_dict_elements})


_FLOP_QUANTITIES = ("params", "tokens", "matmul_params", "nanogpt_params", "n_layers", "d_model", "forward_flops")


@functools.lru_cache(maxsize=16)
def _traced_step(model: str, batch: int, seq: int, attention: str, device: str, fill_tracer_gaps: bool) -> tuple[int, int, int, int]:
    """(forward, backward, parameters, recomputed attention) FlopCounterMode traces for one GPT step, once per input."""
    config = get_gpt_config(model)
    if seq > config.context_length:
        raise ResacctError(f"seq {seq} is longer than {model}'s context {config.context_length}")
    net = build_gpt(config, device=device, attention=attention)  # type: ignore[arg-type]
    tokens, targets = _tokens(config, batch, seq, device)
    trace = trace_step_flops(net, lambda: gpt_loss(net, tokens, targets), fill_tracer_gaps=fill_tracer_gaps)
    return trace.forward_flops, trace.backward_flops, parameter_count(net), trace.attention_recompute_flops


@check("account.gpt_step_flops", quantities=_FLOP_QUANTITIES)
def gpt_step_flops(model: str, batch: int, seq: int, phase: str = "step", attention: str = "math", device: str = "meta",
                   fill_tracer_gaps: bool = False) -> Outcome:
    """FLOPs FlopCounterMode traces in one forward (+ cross-entropy) and backward of a GPT on
    (batch, seq) tokens: the ``forward``, ``backward`` or whole ``step``; with
    ``fill_tracer_gaps``, the fused CPU attention kernel counted from its shapes (resacct.formulas.attention_flops).
    ``phase: recompute``: the scores the fused backward recomputes (apart from the model FLOPs)."""
    config = get_gpt_config(model)
    forward, backward, params, recompute = _traced_step(model, batch, seq, attention, device, fill_tracer_gaps)
    fused = attention == "sdpa" and device != "meta"
    predicted = predict_gpt_step_flops(config, batch, seq)  # model FLOPs: what the math path computes
    predicted_phase = {}
    for name in ("forward", "backward"):
        counted = [m for m in predicted.matmuls if m.term.phase == name]
        if fused and not fill_tracer_gaps:  # FlopCounterMode has no formula for the CPU kernel: resacct predicts the gap
            counted = [m for m in counted if not m.module.endswith(".attention")]
        predicted_phase[name] = sum(m.flops for m in counted)
    measured = {"forward": forward, "backward": backward, "step": forward + backward, "recompute": recompute}
    if phase not in measured:
        raise ResacctError(f"phase {phase!r}: expected forward, backward, step or recompute")
    predicted_phase["step"] = predicted_phase["forward"] + predicted_phase["backward"]
    predicted_phase["recompute"] = predict_gpt_step_flops(config, batch, seq, fused_attention=True).step_flops - predicted.step_flops if fused else 0
    return Outcome(
        measured=measured[phase],
        predicted=predicted_phase[phase],
        quantities={"params": params, "tokens": batch * seq, "matmul_params": gpt_matmul_parameter_count(config),
                    "nanogpt_params": nanogpt_parameter_count(params, config), "n_layers": config.n_layers,
                    "d_model": config.d_model, "forward_flops": forward},
    )


@check("account.gpt_training_state", quantities=("params", "parameter_tensors", "step_counter_bytes"))
def gpt_training_state(model: str, recipe: str, moment: str, include_step_counters: bool = True, device: str = "cpu") -> Outcome:
    """Bytes of distinct storages a real torch.optim.AdamW run of a GPT holds under ``recipe``
    (bf16 model copy + fp32 master + fp32 AdamW state for the master recipes), during its second
    step: right after backward, or when ``step()`` runs. The tied LM head is the embedding's
    storage: counted once."""
    config = get_gpt_config(model)
    net = build_gpt(config, device=device)
    tokens, targets = _tokens(config, 2, min(16, config.context_length), device)
    state = measure_training_state(net, lambda module: gpt_loss(module, tokens, targets), recipe)
    if moment not in ("after_backward", "at_step"):
        raise ResacctError(f"moment {moment!r}: expected after_backward or at_step")
    measured = state.after_backward_bytes if moment == "after_backward" else state.at_step_bytes
    predicted = state.predicted_after_backward_bytes if moment == "after_backward" else state.predicted_at_step_bytes
    counters = state.step_counter_bytes
    if not include_step_counters:
        measured, predicted = measured - counters, predicted - 4 * state.parameter_tensors
    return Outcome(measured=measured, predicted=predicted,
                   quantities={"params": state.parameters, "parameter_tensors": state.parameter_tensors, "step_counter_bytes": counters})


_ACTIVATION_QUANTITIES = ("hidden", "heads", "layers", "element_bytes", "stats_bytes", "vocab")


@check("account.gpt_saved_activations", quantities=_ACTIVATION_QUANTITIES)
def gpt_saved_activations(model: str, batch: int, seq: int, scope: str = "all", dtype: str = "float32", attention: str = "math",
                          device: str = "cpu") -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, distinct storages, parameters
    left out) in a GPT forward + cross-entropy in ``dtype`` on (batch, seq) tokens: ``all`` of
    them, or one ``layer`` (what the modules under blocks.0 save)."""
    config = get_gpt_config(model)
    if seq > config.context_length:
        raise ResacctError(f"seq {seq} is longer than {model}'s context {config.context_length}")
    net = build_gpt(config, device=device, attention=attention).to(parse_dtype(dtype))  # type: ignore[arg-type]
    tokens, targets = _tokens(config, batch, seq, device)
    with record_saved_activations(net) as saved:
        loss = gpt_loss(net, tokens, targets)
    del loss
    element = parse_dtype(dtype).itemsize
    options = {"element_bytes": element, "attention": attention, "device_type": device}
    if scope == "all":
        measured, predicted = saved.activation_bytes, predict_gpt_saved_bytes(config, batch, seq, **options)
    elif scope == "layer":
        measured = sum(v for module, v in saved.by_module().items() if module.startswith("blocks.0."))
        predicted = gpt_layer_saved_bytes(config, batch, seq, **options)  # type: ignore[arg-type]
    else:
        raise ResacctError(f"scope {scope!r}: expected all or layer")
    return Outcome(measured=measured, predicted=predicted, quantities={
        "hidden": config.d_model, "heads": config.n_heads, "layers": config.n_layers, "element_bytes": element,
        "stats_bytes": layer_norm_stats_bytes(element, device), "vocab": config.vocab_size})


@check("account.bytes_per_parameter", quantities=("params", "state_bytes", "activation_bytes"))
def bytes_per_parameter(model: str, batch: int, seq: int, recipe: str) -> Outcome:
    """(training state at the optimizer step + activations saved for backward) ÷ parameters of a
    GPT on the meta device: the state from a real torch.optim.AdamW under ``recipe``, the
    activations from ``saved_tensors_hooks`` on the model in the recipe's parameter dtype."""
    from resacct.measurement.memory import get_state_recipe

    config = get_gpt_config(model)
    net = build_gpt(config, device="meta")
    tokens, targets = _tokens(config, batch, seq, "meta")
    chosen = get_state_recipe(recipe)
    state = measure_training_state(net, lambda module: gpt_loss(module, tokens, targets), chosen)
    typed = net.to(parse_dtype(chosen.parameter_dtype))
    with record_saved_activations(typed) as saved:
        loss = gpt_loss(typed, tokens, targets)
    del loss
    element = parse_dtype(chosen.parameter_dtype).itemsize
    predicted_activations = predict_gpt_saved_bytes(config, batch, seq, element_bytes=element, device_type="meta")
    params = state.parameters
    return Outcome(
        measured=(state.at_step_bytes + saved.activation_bytes) / params,
        predicted=(state.predicted_at_step_bytes + predicted_activations) / params,
        quantities={"params": params, "state_bytes": state.at_step_bytes, "activation_bytes": saved.activation_bytes},
    )


@check("account.optimizer_step_transient", quantities=("params", "largest_tensor"))
def optimizer_step_transient(model: str, foreach: bool) -> Outcome:
    """The CPU allocator's peak inside the second torch.optim.AdamW step of a float32 GPT, above
    what existed just before it (traced with torch.profiler, profile_memory=True)."""
    config = get_gpt_config(model)
    net = build_gpt(config)
    tokens, targets = _tokens(config, 2, min(16, config.context_length), "cpu")
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=foreach)
    for _ in range(2):
        gpt_loss(net, tokens, targets).backward()
        with trace_allocations() as trace:
            optimizer.step()
    sizes = [p.numel() for p in net.parameters()]
    return Outcome(measured=trace.peak_bytes, predicted=predict_optimizer_step_transient_bytes(sizes, foreach=foreach),
                   quantities={"params": sum(sizes), "largest_tensor": max(sizes)})


# ───────────────────────────── checkpointing and accumulation ─────────────────────────────


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


@functools.lru_cache(maxsize=4)
def _unsegmented_measurements(layers: int, batch: int, seq: int) -> tuple[int, int, int]:
    """(what blocks.0 saves, one boundary's bytes, held after an unsegmented forward) of the narrow
    GPT — the same for every segment count, so measured once per size."""
    config = _deep_config(layers)
    torch.manual_seed(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, batch, seq, "cpu")
    with record_saved_activations(net) as saved:
        loss = gpt_loss(net, tokens, targets)
    del loss
    layer_bytes = sum(v for module, v in saved.by_module().items() if module.startswith("blocks.0."))
    boundary = net.token_embedding(tokens) + net.position_embedding(torch.arange(seq))  # (b, s, d)
    return layer_bytes, boundary.untyped_storage().nbytes(), _held_after_forward(net, tokens, targets, 0)


@check("account.checkpoint_freed_bytes", quantities=("layer_bytes", "boundary_bytes", "rng_bytes"))
def checkpoint_freed_bytes(layers: int, segments: int, batch: int = 2, seq: int = 32) -> Outcome:
    """Bytes the CPU allocator no longer holds after a forward when the layers of a narrow GPT
    are checkpointed in ``segments`` segments (torch.utils.checkpoint, use_reentrant=False):
    held without checkpointing − held with. Quantities: what one layer saves (saved_tensors_hooks,
    blocks.0), one boundary activation (the embedding output's storage) and torch's RNG state."""
    config = _deep_config(layers)
    layer_bytes, boundary_bytes, unsegmented = _unsegmented_measurements(layers, batch, seq)
    torch.manual_seed(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, batch, seq, "cpu")
    freed = unsegmented - _held_after_forward(net, tokens, targets, segments)
    predicted = predict_gpt_held_after_forward_bytes(config, batch, seq, 0) - predict_gpt_held_after_forward_bytes(config, batch, seq, segments)
    return Outcome(measured=freed, predicted=predicted,
                   quantities={"layer_bytes": layer_bytes, "boundary_bytes": boundary_bytes, "rng_bytes": rng_state_bytes()})


@functools.lru_cache(maxsize=8)
def _backward_flops_and_modules(layers: int, batch: int, seq: int, segments: int) -> tuple[int, dict[str, int]]:
    """Backward FLOPs (FlopCounterMode) of the narrow GPT on meta with k segments, and the
    forward FLOPs per module (inclusive), measured once per size."""
    config = _deep_config(layers)
    net = build_gpt(config, device="meta")
    tokens, targets = _tokens(config, batch, seq, "meta")
    with FlopCounterMode(display=False) as forward_counter:
        loss = gpt_loss(net, tokens, targets, checkpoint_segments=segments)
    with FlopCounterMode(display=False) as backward_counter:
        loss.backward()
    root = type(net).__name__
    modules = {name.removeprefix(root + "."): int(sum(per_op.values())) for name, per_op in forward_counter.get_flop_counts().items()}
    return int(backward_counter.get_total_flops()), modules


@check("account.checkpoint_recompute_flops", quantities=("layer_forward_flops", "down_projection_flops"))
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


@check("account.checkpoint_best_segments", quantities=("layers", "peaks_bytes"))
def checkpoint_best_segments(model: str, layers: int = 16) -> Outcome:
    """The number of checkpoint segments k ∈ {1, 2, 4, 8, 16} (divisors of L = 16) whose
    forward + backward has the lowest CPU-allocator peak: for a narrow GPT (``gpt``: a layer
    saves ~18 boundary-sized tensors) or a Cruncher chain (``cruncher``: a layer saves only its
    input, Chen et al.'s setting). The peaks are a quantity."""
    if layers != 16:
        raise ResacctError(f"layers {layers!r}: this check compares the divisors of 16; expected 16")
    torch.manual_seed(0)
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


@functools.lru_cache(maxsize=4)
def _accumulation(micro_batch: int, steps: int, model: str, seq: int) -> tuple[int, int, int]:
    from resacct.measurement.activations import measure_grad_accumulation

    config = get_gpt_config(model)
    torch.manual_seed(0)
    net = build_gpt(config)
    tokens, targets = _tokens(config, micro_batch * steps, seq, "cpu")
    accumulated = measure_grad_accumulation(net, tokens, targets, steps)
    single = _held_after_forward(net, tokens[:micro_batch], targets[:micro_batch], 0)
    return accumulated.max_micro_held_bytes, single, accumulated.effective_batch_held_bytes


@check("account.grad_accumulation_held", quantities=("single_micro_batch_bytes", "effective_batch_bytes", "steps"))
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


@check("account.gpu_step_peak", quantities=("params", "saved_bytes", "logit_gradient_bytes"))
def gpu_step_peak(model: str, batch: int, seq: int) -> Outcome:
    """``torch.cuda.max_memory_allocated`` over a float32 GPT forward + backward on GPU 0, above
    what was allocated before it (parameters; gradients start at None; second run); what
    autograd saves (saved_tensors_hooks, on the GPU) and two (b, s, V) float32 logit gradients
    as quantities."""
    if not torch.cuda.is_available():
        raise NotMeasurable("no CUDA GPU: torch.cuda.is_available() is False")
    config = get_gpt_config(model)
    net = build_gpt(config, device="cuda")
    tokens, targets = _tokens(config, batch, seq, "cuda")
    for _ in range(2):
        net.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        gpt_loss(net, tokens, targets).backward()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    with record_saved_activations(net) as saved:
        loss = gpt_loss(net, tokens, targets)
    del loss
    return Outcome(measured=peak, predicted=predict_gpt_step_peak_bytes(config, batch, seq, 0, rng_bytes=0),
                   quantities={"params": parameter_count(net), "saved_bytes": saved.activation_bytes,
                               "logit_gradient_bytes": 2 * batch * seq * config.vocab_size * 4})


@check("account.gpu_step_time_over_flops_floor", quantities=("step_sec", "step_flops", "peak_flops_per_sec", "mfu"), timing=True)
def gpu_step_time_over_flops_floor(model: str, batch: int, seq: int) -> Outcome:
    """Median seconds of a float32 GPT training step (forward, backward, AdamW; TF32 off) on
    GPU 0, timed with CUDA events (:func:`resacct.measurement.perf.time_callable`), ÷ the
    lecture's napkin time at MFU 1: the step's model FLOPs (FlopCounterMode over forward and
    backward) ÷ the board's dense fp32 datasheet peak. The MFU is its inverse, a quantity."""
    from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec
    from resacct.measurement.perf import time_callable

    if not torch.cuda.is_available():
        raise NotMeasurable("no CUDA GPU: torch.cuda.is_available() is False")
    name = torch.cuda.get_device_name(0)
    board = accelerator_for_cuda_name(name)
    if board is None:
        raise NotMeasurable(f"GPU {name!r} is not in resacct/facts/datasheets/accelerators.yaml; its fp32 peak is unknown")
    config = get_gpt_config(model)
    net = build_gpt(config, device="cuda")
    tokens, targets = _tokens(config, batch, seq, "cuda")
    with FlopCounterMode(display=False) as counter:
        gpt_loss(net, tokens, targets).backward()
    step_flops = int(counter.get_total_flops())
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        gpt_loss(net, tokens, targets).backward()
        optimizer.step()

    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means the fp32 path, as the fp32 peak does
    try:
        seconds = time_callable(step, device="cuda", warmup=2, repeats=5, min_sample_sec=0.0).median_sec
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    peak = peak_flops_per_sec(board, "fp32")
    floor = step_flops / peak
    return Outcome(measured=seconds / floor, quantities={"step_sec": seconds, "step_flops": step_flops, "peak_flops_per_sec": peak, "mfu": floor / seconds})


# ── Linear / activation stacks (Cruncher, MLP): resacct's formula against saved_tensors_hooks ──


@check("account.stack_saved_activations", quantities=("params",))
def stack_saved_activations(model: str, batch: int, dim: int, layers: int, hidden: int = 0, activation: str = "gelu") -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, distinct storages, parameters
    left out) in one float32 forward + mean loss of a Cruncher (``layers`` D×D layers) or an MLP
    (``layers`` hidden layers of ``hidden``, ``activation``) on a (batch, dim) batch; predicted
    by :func:`resacct.formulas.account_formulas.predict_stack_step`."""
    from resacct.formulas.account_formulas import predict_stack_step
    from resacct.account.generic import cruncher, mlp

    if model == "cruncher":
        net = cruncher(dim=dim, layers=layers)
    elif model == "mlp":
        net = mlp(dim=dim, hidden=hidden, depth=layers, activation=activation)
    else:
        raise ResacctError(f"model {model!r}: expected cruncher or mlp")
    x = torch.randn(batch, dim)
    with record_saved_activations(net) as saved:
        loss = net(x).mean()
    del loss
    predicted = predict_stack_step(net, (batch, dim), element_bytes=4)
    return Outcome(measured=saved.activation_bytes, predicted=None if predicted is None else predicted.saved_bytes,
                   quantities={"params": sum(p.numel() for p in net.parameters())})
