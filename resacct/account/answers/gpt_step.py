"""Account one training step of a model: FLOPs, training-state memory, activations, peak and
time — each formula's prediction beside PyTorch's measurement, per module.

The measuring half (re-exported here) lives in :mod:`resacct.account.trace.step_measurements`:

- :func:`trace_step_flops` — FlopCounterMode over forward and backward, per module (its own
  module tracking), with the ops it has no formula for; fused attention kernels (the CPU one,
  which FlopCounterMode counts as 0, included) counted from the sdpa call's shapes as the
  model's matmuls (:mod:`resacct.formulas.attention_flops`).
- :func:`measure_training_state` — parameters, gradients, master weights and AdamW state held by
  a real ``torch.optim.AdamW`` after real steps under a precision recipe of
  :data:`resacct.measurement.memory.STATE_RECIPES`, deduplicated by storage (the tied LM head is the
  embedding's storage), step counters included.
- :func:`measure_optimizer_step_transient` — the allocator's peak inside ``optimizer.step()``.
- :func:`account_gpt` — all of it for a :mod:`resacct.training.gpt` model, with resacct's exact formulas
  (:mod:`resacct.formulas.gpt_formulas`), the 6N and PaLM conventions, activations (and Korthikanti et
  al.'s formula), checkpointing, gradient accumulation, time, MFU and a run projection; what it
  finds is a :class:`~resacct.account.render.step_account.StepAccount` (its rows and JSON there too).

>>> account = account_gpt("gpt-nano", batch=2, seq=16, measure=False)
>>> account.flops.forward_flops == account.predicted_flops.forward_flops
True
>>> round(account.state.at_step_bytes / account.parameters, 3)   # 16 B/param + AdamW step counters
16.001
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from resacct.measurement.activations import (
    gpt_loss,
    measure_checkpointing,
    measure_grad_accumulation,
    predict_gpt_step_peak_bytes,
    record_saved_activations,
    trace_allocations,
)
from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.training.gpt import GPTConfig, build_gpt, get_gpt_config, parameter_count
from resacct.formulas.gpt_formulas import predict_gpt_step_flops
from resacct.account.load.optimizers import memory_optimizer_name
from resacct.account.render.rows import UNIT_SUFFIX, ModuleRow, Row, json_key
from resacct.account.render.step_account import StepAccount, StepTiming
from resacct.account.trace import step_measurements
from resacct.measurement.memory import StateRecipe, get_state_recipe

__all__ = [
    *step_measurements.__all__,  # re-exported below: the measuring half of the account API
    "StepTiming",
    "StepAccount",
    "Row",
    "ModuleRow",
    "json_key",
    "UNIT_SUFFIX",
    "account_gpt",
]


from resacct.account.trace.step_measurements import (  # noqa: E402  (re-exported: part of the account API)
    AUTO_MEASURE_MAX_STEP_FLOPS,
    StepFlopTrace,
    TrainingStateMeasurement,
    measure_optimizer_step_transient,
    measure_training_state,
    predict_optimizer_step_transient_bytes,
    recipe_autocast,
    sdpa_gap_formulas,
    trace_step_flops,
)


# ───────────────────────────── the whole account ─────────────────────────────


def _check_sizes(config: GPTConfig, batch: object, seq: object, checkpoint_segments: object, grad_accum: object) -> None:
    for name, value, low in (("batch", batch, 1), ("seq", seq, 1), ("checkpoint segments", checkpoint_segments, 0), ("grad accumulation steps", grad_accum, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ResacctError(f"{name} {value!r}: expected a whole number ≥ {low}")
    if seq > config.context_length:  # type: ignore[operator]
        raise ResacctError(f"seq {seq} is longer than the model's context length {config.context_length}; expected seq ≤ {config.context_length}")
    if checkpoint_segments > config.n_layers:  # type: ignore[operator]
        raise ResacctError(f"checkpoint segments {checkpoint_segments} exceed the {config.n_layers} layers; expected 0 (off) to {config.n_layers}")
    if batch % grad_accum:  # type: ignore[operator]
        raise ResacctError(f"batch {batch} is not divisible by {grad_accum} gradient accumulation steps; expected a batch that splits into equal micro-batches")
    widest = max(config.vocab_size, int(config.mlp_ratio * config.d_model), config.n_heads * seq)  # logits, the MLP's hidden, attention scores per token
    if batch * seq * widest > 2**63 - 1:  # type: ignore[operator]
        raise ResacctError(f"batch {batch} × seq {seq} × {widest} (the step's widest tensor) is {batch * seq * widest:.3g} elements, "  # type: ignore[operator]
                           "more than a torch tensor can hold (2^63 − 1); expected a smaller --batch or --seq")


def account_gpt(
    model: str | GPTConfig = "gpt-tiny",
    *,
    batch: int = 4,
    seq: int | None = None,
    recipe: str | StateRecipe = "fp32",
    attention: str = "math",
    checkpoint_segments: int = 0,
    grad_accum: int = 1,
    measure: bool | None = None,
    device: str = "cpu",
    time_step: bool = True,
    peak_flops_per_sec: float | None = None,
    peak_source: str | None = None,
    train_tokens: float | None = None,
    devices: int = 1,
    seed: int = 0,
    optimizer: str = "adamw",
) -> StepAccount:
    """Account one training step of a :mod:`resacct.training.gpt` model on (batch, seq) random tokens.

    ``measure=False`` builds the model on the meta device: FLOPs are traced, the optimizer state
    and the saved tensors are real (meta) tensors with sizes but no memory — any size, in well
    under a second. ``measure=True`` runs on ``device`` (``cpu`` or ``cuda``) for real and adds
    the allocator's peaks, checkpointing, gradient accumulation and time. ``None``: measure when
    a step is at most :data:`AUTO_MEASURE_MAX_STEP_FLOPS`. ``optimizer`` (adamw, adam, sgd,
    sgd-momentum, adagrad, rmsprop) is the real ``torch.optim`` optimizer whose state is counted;
    the peaks and the timed step use AdamW.

    >>> account = account_gpt("gpt-nano", batch=1, seq=8, measure=False, optimizer="sgd-momentum")
    >>> account.state.at_step_bytes == account.state.predicted_at_step_bytes == 12 * account.parameters
    True
    >>> sorted(account.to_dict())[:3]
    ['activations', 'attention', 'batch']
    """
    config = get_gpt_config(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else "custom"
    seq = config.context_length if seq is None else seq
    _check_sizes(config, batch, seq, checkpoint_segments, grad_accum)
    chosen = get_state_recipe(recipe)
    memory_optimizer_name(optimizer)  # unknown optimizers: one line with close matches
    if measure is None:
        measure = predict_gpt_step_flops(config, batch, seq).step_flops <= AUTO_MEASURE_MAX_STEP_FLOPS
    where = device if measure else "meta"
    predicted = predict_gpt_step_flops(config, batch, seq)  # model FLOPs: fused attention is counted as the math path
    if where == "cuda" and not torch.cuda.is_available():
        raise ResacctError("device 'cuda' was asked for, but torch sees no CUDA GPU; expected --device cpu (or a GPU machine)")
    net = build_gpt(config, device=where, attention=attention, seed=seed)  # type: ignore[arg-type]
    tokens, targets = _token_batch(config.vocab_size, batch, seq, where, seed)
    notes: list[str] = []

    def loss_of(module: nn.Module) -> torch.Tensor:
        return gpt_loss(module, tokens, targets, checkpoint_segments=checkpoint_segments)

    flops = trace_step_flops(net, lambda: gpt_loss(net, tokens, targets), fill_tracer_gaps=True)
    if flops.gap_filled_flops:
        notes.append(
            f"FlopCounterMode counts {flops.step_flops - flops.gap_filled_flops:,} FLOPs: the fused CPU attention kernel "
            f"(_scaled_dot_product_flash_attention_for_cpu) has no formula and counts 0; resacct adds "
            f"{flops.gap_filled_flops:,} from the sdpa calls' shapes (resacct.formulas.attention_flops)"
        )
    activation_model = copy.deepcopy(net).to(parse_dtype(chosen.parameter_dtype))
    with record_saved_activations(activation_model) as saved, recipe_autocast(chosen, where):
        loss = gpt_loss(activation_model, tokens, targets)
    del loss, activation_model
    element = parse_dtype(chosen.parameter_dtype).itemsize
    predictable = chosen.compute_dtype is None and (attention == "math" or where == "cpu")
    predicted_saved, predicted_by_module = None, {}
    if predictable:
        from resacct.formulas.gpt_formulas import gpt_saved_terms

        terms = gpt_saved_terms(config, batch, seq, element_bytes=element, attention=attention, device_type=where)
        predicted_saved = sum(term.bytes for term in terms)
        for term in terms:
            predicted_by_module[term.module] = predicted_by_module.get(term.module, 0) + term.bytes
    else:
        notes.append("no activation formula for this case (autocast's mixed dtypes, or sdpa off CPU): measured only")
    state = measure_training_state(net, loss_of, chosen, optimizer)
    account = StepAccount(
        model=name, config=config, batch=batch, seq=seq, device=where, recipe=chosen, attention=attention, parameters=parameter_count(net),
        predicted_flops=predicted, flops=flops, state=state, saved=saved, predicted_saved_bytes=predicted_saved,
        predicted_saved_by_module=predicted_by_module, checkpoint_segments=checkpoint_segments, train_tokens=train_tokens,
        devices=devices, notes=notes,
    )
    account.step_peak = _step_peak(net, tokens, targets, chosen, optimizer, checkpoint_segments, grad_accum, measure=measure and where == "cpu")
    if recipe != "fp32" and measure:
        notes.append(f"the step peak runs the {chosen.name} recipe; the other peaks, checkpointing, accumulation and time run the float32 model (the recipe is applied to their state and activations)")
    if not measure:
        if checkpoint_segments or grad_accum > 1:
            notes.append("checkpointing and gradient accumulation are measured on a real device: add --measure")
        notes.append(f"built on the meta device (step of {predicted.step_flops:.3g} FLOPs): sizes measured, no arithmetic; --measure runs it for real")
    else:
        _measure_for_real(account, net, tokens, targets, loss_of, chosen, attention, grad_accum, time_step, peak_flops_per_sec, peak_source)
    return account


def _step_peak(net: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, recipe: StateRecipe, optimizer: str, checkpoint_segments: int,
               grad_accum: int, *, measure: bool) -> Any:
    """The whole step's peak (:func:`resacct.account.peak.step_peak.account_recipe_step_peak`) under ``recipe``
    (parameters in its dtype, autocast, master weights) over ``grad_accum`` micro-batches of
    ``batch ÷ grad_accum`` sequences: predicted on fake tensors, measured on a CPU run."""
    from resacct.account.peak.step_peak import account_recipe_step_peak

    micro = tokens.shape[0] // grad_accum
    return account_recipe_step_peak(net, (tokens[:micro], targets[:micro]),
                                    lambda m, i: gpt_loss(m, i[0], i[1], checkpoint_segments=checkpoint_segments),
                                    recipe=recipe, optimizer=optimizer, measure=measure, micro_batches=grad_accum)


def _token_batch(vocab_size: int, batch: int, seq: int, where: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets, made where the model is: on meta nothing is allocated."""
    from resacct.account.load.model_io import MAX_TENSOR_ELEMENTS

    if batch * seq > MAX_TENSOR_ELEMENTS:
        raise ResacctError(f"batch {batch} × seq {seq} = {batch * seq:.3g} tokens, more than a torch tensor can hold (2^63 − 1); expected a smaller --batch")
    if where == "meta":
        return torch.empty(batch, seq, dtype=torch.long, device="meta"), torch.empty(batch, seq, dtype=torch.long, device="meta")
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, seq), generator=generator).to(where)
    return tokens, torch.randint(0, vocab_size, (batch, seq), generator=generator).to(where)


def _measure_for_real(
    account: StepAccount, net: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, loss_of: Callable[[nn.Module], torch.Tensor],
    recipe: StateRecipe, attention: str, grad_accum: int, time_step: bool, peak_flops_per_sec: float | None, peak_source: str | None,
) -> None:
    config, batch, seq, k = account.config, account.batch, account.seq, account.checkpoint_segments
    math_attention = attention == "math"  # the allocator-level predictions follow the math path
    if account.device == "cpu":
        account.optimizer_transient = measure_optimizer_step_transient(net, loss_of, foreach=True)
        account.predicted_optimizer_transient_bytes = predict_optimizer_step_transient_bytes([p.numel() for p in net.parameters()], foreach=True)
        net.zero_grad(set_to_none=True)
        with trace_allocations() as trace:
            loss_of(net).backward()
        net.zero_grad(set_to_none=True)
        account.step_peak_bytes = trace.peak_bytes
        account.predicted_step_peak_bytes = predict_gpt_step_peak_bytes(config, batch, seq, k) if math_attention else None
        if math_attention:
            if k:
                account.checkpointing = measure_checkpointing(net, tokens, targets, [0, k])
            if grad_accum > 1:
                account.grad_accumulation = measure_grad_accumulation(net, tokens, targets, grad_accum)
        elif k or grad_accum > 1:
            account.notes.append("checkpointing and gradient accumulation are measured with attention='math' only")
    elif account.device == "cuda":
        account.gpu_peak_bytes = _cuda_step_peak_bytes(net, loss_of)
    if time_step:
        account.timing = _time_step(account, net, loss_of, peak_flops_per_sec, peak_source)


def _cuda_step_peak_bytes(net: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor]) -> int:
    """``torch.cuda.max_memory_allocated`` over a real step (forward, backward, AdamW), above
    what was allocated before it (the second step: the optimizer state exists)."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss_of(net).backward()
        optimizer.step()
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _time_step(account: StepAccount, net: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor], peak: float | None, source: str | None) -> StepTiming:
    from resacct.measurement.perf import time_callable

    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(net).backward()
        optimizer.step()

    if peak is None and account.device == "cuda":
        from resacct.facts.hardware import current_accelerator, peak_flops_per_sec, peak_format, peak_source_text

        board = current_accelerator()
        if board is not None:
            dtype = peak_format(account.recipe.computes_in)  # the matmuls' format (fp16 for fp16-autocast-scaled)
            peak, source = peak_flops_per_sec(board, dtype), peak_source_text(board, dtype)
    timing = time_callable(step, device=account.device, warmup=1, repeats=3, min_sample_sec=0.0)
    from resacct.measurement.runtime_model import predict_training_step

    prediction = predict_training_step(net, lambda: loss_of(net), repeats=3) if account.device == "cpu" else None
    return StepTiming(
        device=account.device, median_sec=timing.median_sec, samples_sec=timing.samples_sec,
        step_flops=account.flops.step_flops,  # model FLOPs: recomputation is not counted (MFU, not HFU)
        tokens=account.tokens, peak_flops_per_sec=peak, peak_source=source, prediction=prediction,
    )
