"""Measuring a GPT training step with torch: FlopCounterMode for FLOPs (per phase and per
module), a real torch.optim.AdamW for the training state, ``saved_tensors_hooks`` and the CPU
allocator (``torch.profiler``) for activations, peaks, checkpointing and accumulation.

resacct's formulas (:mod:`resacct.formulas.gpt_formulas`, :mod:`resacct.measurement.activations`,
:mod:`resacct.account`) only supply the ``predicted`` side. Big models run on the meta device.
"""

from __future__ import annotations


import torch
from torch.utils.flop_counter import FlopCounterMode

from resacct.account import (
    predict_optimizer_step_transient_bytes,
    trace_step_flops,
)
from resacct.account.trace.step_measurements import TrainingStateMeasurement, measure_step_once, measure_training_state
from resacct.measurement.activations import (
    gpt_loss,
    predict_gpt_step_peak_bytes,
    record_saved_activations,
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
from resacct.measurement.memo import shared_measurement


def _tokens(config: GPTConfig, batch: int, seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    targets = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    return tokens.to(device), targets.to(device)


@check("account.gpt_parameters", evidence="measured", quantities=("state_dict_elements",))
def gpt_parameters(model: str) -> Outcome:
    """Parameters of a resacct.training.gpt model built on the meta device, each storage once
    (``model.parameters()`` skips the tied LM head); the state_dict's elements (which list the
    tied matrix twice) as a quantity."""
    net = build_gpt(model, device="meta")
    state_dict_elements = sum(tensor.numel() for tensor in net.state_dict().values())
    return Outcome(measured=parameter_count(net), predicted=gpt_parameter_count(get_gpt_config(model)),
                   quantities={"state_dict_elements": state_dict_elements})


_FLOP_QUANTITIES = ("params", "tokens", "matmul_params", "nanogpt_params", "n_layers", "d_model", "forward_flops")


@shared_measurement
def _traced_step(model: str, batch: int, seq: int, attention: str, device: str, fill_tracer_gaps: bool) -> tuple[int, int, int, int]:
    """(forward, backward, parameters, recomputed attention) FlopCounterMode traces for one GPT step, once per input."""
    config = get_gpt_config(model)
    if seq > config.context_length:
        raise ResacctError(f"seq {seq} is longer than {model}'s context {config.context_length}")
    net = build_gpt(config, device=device, attention=attention)  # type: ignore[arg-type]
    tokens, targets = _tokens(config, batch, seq, device)
    trace = trace_step_flops(net, lambda: gpt_loss(net, tokens, targets), fill_tracer_gaps=fill_tracer_gaps)
    return trace.forward_flops, trace.backward_flops, parameter_count(net), trace.attention_recompute_flops


@check("account.gpt_step_flops", evidence="measured", quantities=_FLOP_QUANTITIES)
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


@shared_measurement
def _training_state(model: str, recipe: str, device: str) -> TrainingStateMeasurement:
    """The training state of a real AdamW run of ``model`` under ``recipe``, once per input (both
    moments, with and without the step counters, come from the one run)."""
    config = get_gpt_config(model)
    net = build_gpt(config, device=device)
    tokens, targets = _tokens(config, 2, min(16, config.context_length), device)
    loss_fn = lambda module: gpt_loss(module, tokens, targets)  # noqa: E731
    # the same bytes either way; on meta one traced pass is cheaper than two steps (gpt2-small: ~0.5 against ~0.8 CPU s),
    # on a tiny CPU model FlopCounterMode costs more than the second step
    return measure_step_once(net, loss_fn, recipe, fill_tracer_gaps=False).state if device == "meta" else measure_training_state(net, loss_fn, recipe)


@check("account.gpt_training_state", evidence="measured", quantities=("params", "parameter_tensors", "step_counter_bytes"))
def gpt_training_state(model: str, recipe: str, moment: str, include_step_counters: bool = True, device: str = "cpu") -> Outcome:
    """Bytes of distinct storages a real torch.optim.AdamW run of a GPT holds under ``recipe``
    (bf16 model copy + fp32 master + fp32 AdamW state for the master recipes), during its second
    step: right after backward, or when ``step()`` runs. The tied LM head is the embedding's
    storage: counted once."""
    if moment not in ("after_backward", "at_step"):
        raise ResacctError(f"moment {moment!r}: expected after_backward or at_step")
    state = _training_state(model, recipe, device)
    measured = state.after_backward_bytes if moment == "after_backward" else state.at_step_bytes
    predicted = state.predicted_after_backward_bytes if moment == "after_backward" else state.predicted_at_step_bytes
    counters = state.step_counter_bytes
    if not include_step_counters:
        measured, predicted = measured - counters, predicted - 4 * state.parameter_tensors
    return Outcome(measured=measured, predicted=predicted,
                   quantities={"params": state.parameters, "parameter_tensors": state.parameter_tensors, "step_counter_bytes": counters})


_ACTIVATION_QUANTITIES = ("hidden", "heads", "layers", "element_bytes", "stats_bytes", "vocab")


@check("account.gpt_saved_activations", evidence="measured", quantities=_ACTIVATION_QUANTITIES)
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


@check("account.bytes_per_parameter", evidence="measured", quantities=("params", "state_bytes", "activation_bytes"))
def bytes_per_parameter(model: str, batch: int, seq: int, recipe: str) -> Outcome:
    """(training state at the optimizer step + activations saved for backward) ÷ parameters of a
    GPT on the meta device: the state from a real torch.optim.AdamW under ``recipe``, the
    activations from ``saved_tensors_hooks`` on the model in the recipe's parameter dtype."""
    from resacct.measurement.memory import get_state_recipe

    config = get_gpt_config(model)
    net = build_gpt(config, device="meta")
    tokens, targets = _tokens(config, batch, seq, "meta")
    chosen = get_state_recipe(recipe)
    once = measure_step_once(net, lambda module: gpt_loss(module, tokens, targets), chosen, fill_tracer_gaps=False)  # one forward and backward
    state, saved = once.state, once.saved  # the saved activations of the model in the recipe's parameter dtype
    element = parse_dtype(chosen.parameter_dtype).itemsize
    predicted_activations = predict_gpt_saved_bytes(config, batch, seq, element_bytes=element, device_type="meta")
    params = state.parameters
    return Outcome(
        measured=(state.at_step_bytes + saved.activation_bytes) / params,
        predicted=(state.predicted_at_step_bytes + predicted_activations) / params,
        quantities={"params": params, "state_bytes": state.at_step_bytes, "activation_bytes": saved.activation_bytes},
    )


@check("account.optimizer_step_transient", evidence="measured", quantities=("params", "largest_tensor"))
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


@check("account.gpu_step_peak", evidence="measured", quantities=("params", "saved_bytes", "logit_gradient_bytes"))
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


@check("account.gpu_step_time_over_flops_floor", evidence="measured", quantities=("step_sec", "step_flops", "peak_flops_per_sec", "mfu"), timing=True)
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


@check("account.stack_saved_activations", evidence="measured", quantities=("params",))
def stack_saved_activations(model: str, batch: int, dim: int, layers: int, hidden: int = 0, activation: str = "gelu") -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, distinct storages, parameters
    left out) in one float32 forward + mean loss of a Cruncher (``layers`` D×D layers) or an MLP
    (``layers`` hidden layers of ``hidden``, ``activation``) on a (batch, dim) batch; predicted
    by :func:`resacct.formulas.account_formulas.predict_stack_step`."""
    from resacct.formulas.account_formulas import predict_stack_step
    from resacct.account.answers.generic import cruncher, mlp

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
