"""Account one training step of a model: FLOPs, training-state memory, activations, peak and
time — each formula's prediction beside PyTorch's measurement, per module.

- :func:`trace_step_flops` — FlopCounterMode over forward and backward, per module (its own
  module tracking), with the ops it has no formula for; ``fill_tracer_gaps=True`` counts the
  fused CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``, which
  FlopCounterMode counts as 0) with torch's own SDPA formulas.
- :func:`measure_training_state` — parameters, gradients, master weights and AdamW state held by
  a real ``torch.optim.AdamW`` after real steps under a precision recipe of
  :data:`resacct.memory.STATE_RECIPES`, deduplicated by storage (the tied LM head is the
  embedding's storage), step counters included.
- :func:`measure_optimizer_step_transient` — the allocator's peak inside ``optimizer.step()``.
- :func:`account_gpt` — all of it for a :mod:`resacct.gpt` model, with resacct's exact formulas
  (:mod:`resacct.gpt_formulas`), the 6N and PaLM conventions, activations (and Korthikanti et
  al.'s formula), checkpointing, gradient accumulation, time, MFU and a run projection.

>>> account = account_gpt("gpt-nano", batch=2, seq=16, measure=False)
>>> account.flops.forward_flops == account.predicted_flops.forward_flops
True
>>> round(account.state.at_step_bytes / account.parameters, 3)   # 16 B/param + AdamW step counters
16.001
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from resacct.activations import (
    MODEL_SCOPE,
    AllocationTrace,
    CheckpointPoint,
    GradAccumulation,
    SavedActivations,
    gpt_loss,
    measure_checkpointing,
    measure_grad_accumulation,
    predict_gpt_held_after_forward_bytes,
    predict_gpt_step_peak_bytes,
    record_saved_activations,
    trace_allocations,
)
from resacct.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.flops import DispatchedOps, UncountedOp, uncounted_ops
from resacct.gpt import GPTConfig, build_gpt, get_gpt_config, parameter_count
from resacct.gpt_formulas import GptStepFlops, predict_gpt_step_flops
from resacct.account_optimizers import build_optimizer, memory_optimizer_name, optimizer_display_name
from resacct.memory import StateRecipe, distinct_storage_bytes, get_state_recipe, training_state_bytes

__all__ = [
    "StepFlopTrace",
    "sdpa_gap_formulas",
    "trace_step_flops",
    "TrainingStateMeasurement",
    "measure_training_state",
    "predict_optimizer_step_transient_bytes",
    "measure_optimizer_step_transient",
    "StepTiming",
    "StepAccount",
    "account_gpt",
]


# ───────────────────────────── FLOPs, traced per module ─────────────────────────────


@dataclass(frozen=True)
class StepFlopTrace:
    """FLOPs FlopCounterMode traced in one forward + backward, in total and per module.

    Per-module counts are *exclusive*: the matmuls a module runs itself, its children's apart
    (FlopCounterMode's own breakdown is inclusive). ``gap_filled_flops`` is what resacct added
    for ops the counter has no formula for (zero unless ``fill_tracer_gaps``)."""

    forward_flops: int
    backward_flops: int
    forward_by_module: Mapping[str, int]
    backward_by_module: Mapping[str, int]
    uncounted_ops: tuple[UncountedOp, ...] = ()
    gap_filled_flops: int = 0

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops


def sdpa_gap_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode ``custom_mapping`` entries for the fused CPU attention kernels, which it
    counts as 0: torch's own ``sdpa_flop`` / ``sdpa_backward_flop`` (the math path's matmuls,
    causal or not)."""
    aten = torch.ops.aten
    mapping: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_forward_flops
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _sdpa_backward_flops
    return mapping


def _sdpa_forward_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _sdpa_backward_flops(grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return int(sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape))


def _exclusive(inclusive: Mapping[str, int]) -> dict[str, int]:
    """Inclusive per-module counts → each module's own (minus its nearest traced descendants)."""
    exclusive = {}
    for name, total in inclusive.items():
        descendants = [other for other in inclusive if other != name and (name == MODEL_SCOPE or other.startswith(name + "."))]
        nearest = [other for other in descendants if not any(other.startswith(middle + ".") for middle in descendants)]
        own = total - sum(inclusive[other] for other in nearest)
        if own:
            exclusive[name] = own
    return exclusive


def _module_counts(counter: Any) -> dict[str, int]:
    """FlopCounterMode's per-module totals, the root's class-name prefix turned into paths."""
    counts: dict[str, int] = {}
    for name, per_op in counter.get_flop_counts().items():
        if name == "Global":
            continue
        path = name.split(".", 1)[1] if "." in name else MODEL_SCOPE
        counts[path] = int(sum(per_op.values()))
    return counts


def trace_step_flops(model: nn.Module, loss_fn: Callable[[], torch.Tensor], *, fill_tracer_gaps: bool = False) -> StepFlopTrace:
    """One forward (``loss_fn()``, returning a scalar loss) and its backward under FlopCounterMode.

    >>> model = build_gpt("gpt-nano", device="meta")
    >>> tokens = torch.zeros(2, 16, dtype=torch.long, device="meta")
    >>> trace = trace_step_flops(model, lambda: gpt_loss(model, tokens, tokens))
    >>> trace.forward_flops, trace.backward_flops, trace.forward_by_module["lm_head"]
    (7602176, 15204352, 1048576)
    """
    from torch.utils.flop_counter import FlopCounterMode

    mapping = sdpa_gap_formulas() if fill_tracer_gaps else {}
    filled = {str(op) for op in mapping}
    for parameter in model.parameters():
        parameter.grad = None
    with FlopCounterMode(display=False, custom_mapping=mapping) as step_counter:
        with FlopCounterMode(display=False, custom_mapping=mapping) as forward_counter, DispatchedOps() as forward_ops:
            loss = loss_fn()
        with DispatchedOps() as backward_ops:
            loss.backward()
    for parameter in model.parameters():
        parameter.grad = None
    step_modules, forward_modules = _module_counts(step_counter), _module_counts(forward_counter)
    backward_modules = {name: total - forward_modules.get(name, 0) for name, total in step_modules.items()}
    gap = _gap_flops(step_counter, mapping) if mapping else 0
    forward_total = int(forward_counter.get_total_flops())
    return StepFlopTrace(
        forward_flops=forward_total,
        backward_flops=int(step_counter.get_total_flops()) - forward_total,
        forward_by_module=_exclusive(forward_modules),
        backward_by_module=_exclusive(backward_modules),
        uncounted_ops=tuple(uncounted_ops("forward", forward_ops.calls, frozenset(filled)) + uncounted_ops("backward", backward_ops.calls, frozenset(filled))),
        gap_filled_flops=gap,
    )


def _gap_flops(counter: Any, mapping: Mapping[Any, Any]) -> int:
    """FLOPs the counter booked under the gap-filling ops."""
    per_op = counter.get_flop_counts().get("Global", {})
    return int(sum(flops for op, flops in per_op.items() if op in mapping))


# ───────────────────────────── training state, measured on a real optimizer ─────────────────────────────


@dataclass(frozen=True)
class TrainingStateMeasurement:
    """Bytes of distinct storages a real optimizer (``optimizer``: adamw, adam, sgd, sgd-momentum,
    adagrad, rmsprop) holds under ``recipe``, beside resacct's prediction
    (:func:`resacct.memory.training_state_bytes`, step counters included).

    ``after_backward_bytes``: what is kept between steps (parameters, their gradients, master
    weights, optimizer state). ``at_step_bytes``: when ``optimizer.step()`` runs (a master
    recipe has made fp32 gradients by then). ``parts_bytes`` splits ``at_step_bytes``."""

    recipe: str
    parameters: int
    parameter_tensors: int
    after_backward_bytes: int
    at_step_bytes: int
    parts_bytes: Mapping[str, int]
    predicted_after_backward_bytes: int
    predicted_at_step_bytes: int
    optimizer: str = "adamw"

    @property
    def step_counter_bytes(self) -> int:
        return self.parts_bytes.get("step counters", 0)


def _autocast(recipe: StateRecipe, device_type: str) -> Any:
    import contextlib

    if recipe.compute_dtype is None or device_type == "meta":
        return contextlib.nullcontext()  # meta: no arithmetic, and no state depends on autocast
    return torch.autocast(device_type, dtype=parse_dtype(recipe.compute_dtype))


def measure_training_state(
    model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], recipe: str | StateRecipe = "fp32", optimizer: str = "adamw",
) -> TrainingStateMeasurement:
    """Train a copy of ``model`` for real under ``recipe`` with the ``torch.optim`` optimizer
    ``optimizer`` (:data:`resacct.account_optimizers.OPTIMIZER_NAMES`: adamw, adam, sgd,
    sgd-momentum, adagrad, rmsprop) and count what it holds. Recipes with a master (``bf16-fp32-master``…) are built for real: a bf16 copy
    of the model runs forward and backward; fp32 master parameters carry the AdamW state; each
    step hands the bf16 gradients to the masters (as fp32 gradients), steps, and copies back.

    Step 1 creates the optimizer state; the counts are taken during step 2. Works on the meta
    device (storages have sizes but no memory). ``loss_fn(model)`` returns a scalar loss.
    """
    chosen = get_state_recipe(recipe)
    memory_name = memory_optimizer_name(optimizer)
    work = copy.deepcopy(model).to(parse_dtype(chosen.parameter_dtype))
    params = list(work.parameters())
    if not params:
        raise ResacctError(f"the model {type(model).__name__} has no parameters; expected a model with something to train")
    device_type = params[0].device.type
    master = [nn.Parameter(p.detach().to(parse_dtype(chosen.master_dtype))) for p in params] if chosen.master_dtype else []
    optimizer_name, optimizer = optimizer, build_optimizer(optimizer, master or params)
    state_part = "optimizer moments" if optimizer_name in ("adam", "adamw") else "optimizer state"

    def backward() -> None:
        with _autocast(chosen, device_type):
            loss = loss_fn(work)
        loss.float().backward()

    def hand_gradients_to_master() -> None:
        for master_param, param in zip(master, params):
            master_param.grad = param.grad.to(master_param.dtype)
            if chosen.frees_model_gradients:
                param.grad = None

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for master_param, param in zip(master, params):
                param.copy_(master_param)
        work.zero_grad(set_to_none=True)

    def parts() -> dict[str, int]:
        state = [value for per_param in optimizer.state.values() for value in per_param.values() if isinstance(value, torch.Tensor)]
        return {
            "parameters": distinct_storage_bytes(params),
            "gradients": distinct_storage_bytes([p.grad for p in params]),
            "master weights": distinct_storage_bytes(master),
            "master gradients": distinct_storage_bytes([m.grad for m in master]),
            state_part: distinct_storage_bytes([v for v in state if v.dim() > 0]),
            "step counters": distinct_storage_bytes([v for v in state if v.dim() == 0]),
        }

    backward()
    hand_gradients_to_master()
    step()
    backward()
    after_backward = sum(parts().values())
    hand_gradients_to_master()
    at_step = parts()
    numbers, tensors = parameter_count(work), len(params)
    return TrainingStateMeasurement(
        recipe=chosen.name,
        optimizer=optimizer_name,
        parameters=numbers,
        parameter_tensors=tensors,
        after_backward_bytes=after_backward,
        at_step_bytes=sum(at_step.values()),
        parts_bytes={name: value for name, value in at_step.items() if value},
        predicted_after_backward_bytes=training_state_bytes(numbers, tensors, chosen, memory_name, "after_backward"),
        predicted_at_step_bytes=training_state_bytes(numbers, tensors, chosen, memory_name, "at_step"),
    )


def predict_optimizer_step_transient_bytes(parameter_sizes: Sequence[int], *, foreach: bool, state_element_bytes: int = 4) -> int:
    """Scratch memory of ``torch.optim.AdamW.step()`` above its state: the denominator
    √v̂ + ε. The foreach implementation builds it for every tensor at once (one more copy of
    the parameters). The for-loop one builds it a tensor at a time — ``sqrt`` and the division
    both alive — while the previous tensor's denominator is still held by its loop variable:
    the most of 2·size(i) + size(i−1) over the parameters in order.

    >>> predict_optimizer_step_transient_bytes([100, 10], foreach=True), predict_optimizer_step_transient_bytes([10, 100], foreach=False)
    (440, 840)
    """
    if not parameter_sizes:
        return 0
    if foreach:
        return sum(parameter_sizes) * state_element_bytes
    previous = [0, *parameter_sizes[:-1]]
    return max(2 * size + before for size, before in zip(parameter_sizes, previous)) * state_element_bytes


def measure_optimizer_step_transient(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], *, foreach: bool = True) -> AllocationTrace:
    """The CPU allocator's peak inside the second ``AdamW.step()`` of a float32 copy of
    ``model`` (the first creates the state), relative to just before it."""
    work = copy.deepcopy(model)
    if next(work.parameters()).device.type != "cpu":
        raise ResacctError(f"the optimizer-step transient is traced on CPU; the model is on {next(work.parameters()).device}")
    optimizer = torch.optim.AdamW(work.parameters(), lr=1e-3, foreach=foreach)
    for _ in range(2):
        loss_fn(work).backward()
        with trace_allocations() as trace:
            optimizer.step()
    return trace


# ───────────────────────────── the whole account ─────────────────────────────


@dataclass(frozen=True)
class StepTiming:
    """Seconds of one real training step (forward, backward, AdamW step), and what follows."""

    device: str
    median_sec: float
    samples_sec: tuple[float, ...]
    step_flops: int
    tokens: int
    peak_flops_per_sec: float | None = None
    peak_source: str | None = None

    @property
    def achieved_flops_per_sec(self) -> float:
        return self.step_flops / self.median_sec

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.median_sec

    @property
    def mfu(self) -> float | None:
        return None if self.peak_flops_per_sec is None else self.achieved_flops_per_sec / self.peak_flops_per_sec


@dataclass
class StepAccount:
    """Everything :func:`account_gpt` found (the typed result of the GPT path); :meth:`rows`
    lays it out predicted | measured, :meth:`to_dict` as plain JSON-ready values.

    >>> account = account_gpt("gpt-nano", batch=1, seq=8, measure=False)
    >>> account.flops.step_flops == account.predicted_flops.step_flops, account.saved.activation_bytes == account.predicted_saved_bytes
    (True, True)
    >>> [row.quantity for row in account.rows()][:2]
    ['forward (exact per-matmul formula)', 'backward (exact per-matmul formula)']
    """

    model: str
    config: GPTConfig
    batch: int
    seq: int
    device: str
    recipe: str
    attention: str
    parameters: int
    predicted_flops: GptStepFlops
    flops: StepFlopTrace
    state: TrainingStateMeasurement
    saved: SavedActivations
    predicted_saved_bytes: int | None
    predicted_saved_by_module: Mapping[str, int] = field(default_factory=dict)
    optimizer_transient: AllocationTrace | None = None
    predicted_optimizer_transient_bytes: int | None = None
    step_peak_bytes: int | None = None
    predicted_step_peak_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    checkpoint_segments: int = 0
    checkpointing: list[CheckpointPoint] = field(default_factory=list)
    grad_accumulation: GradAccumulation | None = None
    timing: StepTiming | None = None
    train_tokens: float | None = None
    devices: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def rows(self) -> list[Row]:
        """The account as (section, quantity, predicted, measured, unit, note) rows."""
        return _rows(self)

    def per_module_rows(self) -> list[ModuleRow]:
        """FLOPs and saved bytes per module, predicted beside measured (modules with either)."""
        return _module_rows(self)

    def to_json(self) -> dict[str, Any]:
        """Named fields with units in the names, for ``--json``."""
        return _to_json(self)

    def to_dict(self) -> dict[str, Any]:
        """The same as :meth:`to_json`: plain values (``json.dumps``-able), units in the names."""
        return _to_json(self)


@dataclass(frozen=True)
class Row:
    """One line of the account: ``measured / predicted`` is the ratio (1.000 when exact)."""

    section: str
    quantity: str
    predicted: float | None
    measured: float | None
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.predicted in (None, 0) or self.measured is None:
            return None
        return self.measured / self.predicted


@dataclass(frozen=True)
class ModuleRow:
    """FLOPs and saved bytes of one module (its own, children apart); predicted None: no formula."""

    module: str
    predicted_forward_flops: int | None
    traced_forward_flops: int
    predicted_backward_flops: int | None
    traced_backward_flops: int
    predicted_saved_bytes: int | None
    measured_saved_bytes: int


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


#: Above this many FLOPs a step, ``measure=None`` stays on the meta device (no arithmetic).
AUTO_MEASURE_MAX_STEP_FLOPS = 2e10


def account_gpt(
    model: str | GPTConfig = "gpt-tiny",
    *,
    batch: int = 4,
    seq: int | None = None,
    recipe: str = "fp32",
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
    """Account one training step of a :mod:`resacct.gpt` model on (batch, seq) random tokens.

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
    predicted = predict_gpt_step_flops(config, batch, seq, fused_attention=attention == "sdpa" and where != "meta")
    if where == "cuda" and not torch.cuda.is_available():
        raise ResacctError("device 'cuda' was asked for, but torch sees no CUDA GPU; expected --device cpu (or a GPU machine)")
    net = build_gpt(config, device=where, attention=attention, seed=seed)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(where)
    targets = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(where)
    notes: list[str] = []

    def loss_of(module: nn.Module) -> torch.Tensor:
        return gpt_loss(module, tokens, targets, checkpoint_segments=checkpoint_segments)

    flops = trace_step_flops(net, lambda: gpt_loss(net, tokens, targets), fill_tracer_gaps=True)
    if flops.gap_filled_flops:
        notes.append(
            f"FlopCounterMode counts {flops.step_flops - flops.gap_filled_flops:,} FLOPs: the fused CPU attention kernel "
            f"(_scaled_dot_product_flash_attention_for_cpu) has no formula and counts 0; resacct adds "
            f"{flops.gap_filled_flops:,} with torch's own sdpa formulas"
        )
    activation_model = copy.deepcopy(net).to(parse_dtype(chosen.parameter_dtype))
    with record_saved_activations(activation_model) as saved, _autocast(chosen, where):
        loss = gpt_loss(activation_model, tokens, targets)
    del loss, activation_model
    element = parse_dtype(chosen.parameter_dtype).itemsize
    predictable = chosen.compute_dtype is None and (attention == "math" or where == "cpu")
    predicted_saved, predicted_by_module = None, {}
    if predictable:
        from resacct.gpt_formulas import gpt_saved_terms

        terms = gpt_saved_terms(config, batch, seq, element_bytes=element, attention=attention, device_type=where)
        predicted_saved = sum(term.bytes for term in terms)
        for term in terms:
            predicted_by_module[term.module] = predicted_by_module.get(term.module, 0) + term.bytes
    else:
        notes.append("no activation formula for this case (autocast's mixed dtypes, or sdpa off CPU): measured only")
    state = measure_training_state(net, loss_of, chosen, optimizer)
    account = StepAccount(
        model=name, config=config, batch=batch, seq=seq, device=where, recipe=chosen.name, attention=attention, parameters=parameter_count(net),
        predicted_flops=predicted, flops=flops, state=state, saved=saved, predicted_saved_bytes=predicted_saved,
        predicted_saved_by_module=predicted_by_module, checkpoint_segments=checkpoint_segments, train_tokens=train_tokens,
        devices=devices, notes=notes,
    )
    if recipe != "fp32" and measure:
        notes.append(f"peaks, checkpointing, accumulation and time run the float32 model; the {chosen.name} recipe is applied to the state and activations")
    if not measure:
        if checkpoint_segments or grad_accum > 1:
            notes.append("checkpointing and gradient accumulation are measured on a real device: add --measure")
        notes.append(f"built on the meta device (step of {predicted.step_flops:.3g} FLOPs): sizes measured, no arithmetic; --measure runs it for real")
    else:
        _measure_for_real(account, net, tokens, targets, loss_of, chosen, attention, grad_accum, time_step, peak_flops_per_sec, peak_source)
    return account


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
    from resacct.perf import time_callable

    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(net).backward()
        optimizer.step()

    if peak is None and account.device == "cuda":
        from resacct.hardware import current_accelerator, peak_flops_per_sec

        board = current_accelerator()
        if board is not None:
            dtype = "bf16" if account.recipe != "fp32" else "fp32"
            peak, source = peak_flops_per_sec(board, dtype), f"{board.name} {dtype} dense peak"
    timing = time_callable(step, device=account.device, warmup=1, repeats=3, min_sample_sec=0.0)
    return StepTiming(
        device=account.device, median_sec=timing.median_sec, samples_sec=timing.samples_sec,
        step_flops=account.flops.step_flops,  # model FLOPs: recomputation is not counted (MFU, not HFU)
        tokens=account.tokens, peak_flops_per_sec=peak, peak_source=source,
    )


# ───────────────────────────── layout: rows and JSON ─────────────────────────────


def _per_layer_measured(saved: SavedActivations) -> int:
    return sum(value for module, value in saved.by_module().items() if module.startswith("blocks.0."))


def _rows(a: StepAccount) -> list[Row]:
    from resacct.activations import predict_gpt_recompute_flops
    from resacct.gpt_formulas import gpt_layer_saved_bytes, korthikanti_layer_activation_bytes, palm_step_flops, six_n_step_flops

    p, f, n, t = a.predicted_flops, a.flops, a.parameters, a.tokens
    traced = "FlopCounterMode" + (" + resacct's fill for fused attention" if f.gap_filled_flops else "")
    rows = [
        Row("FLOPs", "forward (exact per-matmul formula)", p.forward_flops, f.forward_flops, "FLOPs", traced),
        Row("FLOPs", "backward (exact per-matmul formula)", p.backward_flops, f.backward_flops, "FLOPs", traced),
        Row("FLOPs", "step (exact per-matmul formula)", p.step_flops, f.step_flops, "FLOPs", traced),
        Row("FLOPs", "step, 6N rule (lecture)", six_n_step_flops(n, t), f.step_flops, "FLOPs", "6 · params · tokens"),
        Row("FLOPs", "step, 6N + 12·L·d·s (PaLM, nanoGPT)", palm_step_flops(n, a.config, a.batch, a.seq), f.step_flops, "FLOPs",
            "N without position embedding"),
    ]
    if f.gap_filled_flops:
        rows.append(Row("FLOPs", "FlopCounterMode alone (fused attention = 0)", p.step_flops, f.step_flops - f.gap_filled_flops, "FLOPs", "tracer gap"))
    s = a.state
    rows += [
        Row("training state", f"after backward ({s.recipe}, {optimizer_display_name(s.optimizer)})", s.predicted_after_backward_bytes, s.after_backward_bytes, "bytes", "kept between steps"),
        Row("training state", f"at optimizer step ({s.recipe}, {optimizer_display_name(s.optimizer)})", s.predicted_at_step_bytes, s.at_step_bytes, "bytes", "step counters included"),
        Row("training state", "bytes per parameter at step", s.predicted_at_step_bytes / n, s.at_step_bytes / n, "B/param", f"{n:,} parameters"),
    ]
    rows += [Row("training state", f"  {part}", None, value, "bytes", f"{value / n:.3g} B/param") for part, value in s.parts_bytes.items()]
    element = parse_dtype(get_state_recipe(a.recipe).parameter_dtype).itemsize
    measured_layer = _per_layer_measured(a.saved)
    rows += [
        Row("activations", "saved for backward (resacct formula)", a.predicted_saved_bytes, a.saved.activation_bytes, "bytes", "saved_tensors_hooks, by storage"),
        Row("activations", "one layer (blocks.0)", gpt_layer_saved_bytes(a.config, a.batch, a.seq, element_bytes=element, attention=a.attention, device_type=a.device)
            if a.predicted_saved_bytes is not None else None, measured_layer, "bytes", ""),
        Row("activations", "one layer, Korthikanti s·b·h·(34 + 5as/h)", korthikanti_layer_activation_bytes(a.seq, a.batch, a.config.d_model, a.config.n_heads),
            measured_layer, "bytes", "16-bit, with dropout"),
        Row("activations", "saved weights (parameters, not activations)", None, a.saved.parameter_bytes, "bytes", "no extra memory"),
        Row("activations", "state + activations per parameter", None if a.predicted_saved_bytes is None else (s.predicted_at_step_bytes + a.predicted_saved_bytes) / n,
            (s.at_step_bytes + a.saved.activation_bytes) / n, "B/param", f"batch {a.batch} × seq {a.seq}"),
    ]
    if a.optimizer_transient is not None:
        rows.append(Row("peak", "AdamW step transient (foreach)", a.predicted_optimizer_transient_bytes, a.optimizer_transient.peak_bytes, "bytes", "allocator, above the state"))
    if a.step_peak_bytes is not None:
        rows.append(Row("peak", "forward + backward peak", a.predicted_step_peak_bytes, a.step_peak_bytes, "bytes", "allocator, above params + state"))
    if a.gpu_peak_bytes is not None:
        rows.append(Row("peak", "GPU step peak (max_memory_allocated)", None, a.gpu_peak_bytes, "bytes", "above what existed before"))
    for point in a.checkpointing:
        label = f"k={point.segments}" if point.segments else "no checkpointing"
        rows += [
            Row("checkpointing", f"held after forward, {label}", point.predicted_held_after_forward_bytes, point.held_after_forward_bytes, "bytes", "allocator"),
            Row("checkpointing", f"peak, {label}", point.predicted_peak_bytes, point.peak_bytes, "bytes", "allocator"),
        ]
    if len(a.checkpointing) == 2:
        extra = a.checkpointing[1].backward_flops - a.checkpointing[0].backward_flops
        predicted_extra = predict_gpt_recompute_flops(a.config, a.batch, a.seq, a.checkpointing[1].segments)
        rows.append(Row("checkpointing", f"recompute FLOPs, k={a.checkpointing[1].segments}", predicted_extra, extra, "FLOPs", "FlopCounterMode, backward"))
    if a.grad_accumulation is not None:
        g = a.grad_accumulation
        micro = predict_gpt_held_after_forward_bytes(a.config, g.micro_batch, a.seq)
        rows += [
            Row("grad accumulation", f"held per micro-batch of {g.micro_batch} (× {g.steps})", micro, g.max_micro_held_bytes, "bytes", "loss / steps adds a scalar"),
            Row("grad accumulation", f"held by one batch of {g.micro_batch * g.steps}", predict_gpt_held_after_forward_bytes(a.config, a.batch, a.seq),
                g.effective_batch_held_bytes, "bytes", ""),
        ]
    if a.timing is not None:
        rows += _time_rows(a, a.timing)
    return rows


def _time_rows(a: StepAccount, timing: StepTiming) -> list[Row]:
    from resacct.napkin import training_days

    rows = [
        Row("time", f"step on {timing.device} (median of {len(timing.samples_sec)})", None, timing.median_sec, "s", ""),
        Row("time", "achieved", None, timing.achieved_flops_per_sec, "FLOP/s", f"{timing.tokens_per_sec:,.0f} tokens/s"),
    ]
    if timing.mfu is not None:
        rows.append(Row("time", "MFU", None, timing.mfu, "", timing.peak_source or "given peak"))
    if a.train_tokens:
        total_flops = a.flops.step_flops / a.tokens * a.train_tokens
        if timing.mfu is not None and timing.mfu <= 1:  # napkin: FLOPs ÷ (devices · peak · MFU), MFU as measured
            days = training_days(total_flops, a.devices, timing.peak_flops_per_sec, timing.mfu)
        else:  # no peak: the measured rate is the whole answer (MFU 1 of it)
            days = training_days(total_flops, a.devices, timing.achieved_flops_per_sec, 1.0)
        rows.append(Row("time", f"{a.train_tokens:.3g} tokens on {a.devices} such device(s)", None, days, "days", "at the measured rate"))
    return rows


def _module_rows(a: StepAccount) -> list[ModuleRow]:
    predicted_forward, predicted_backward = a.predicted_flops.by_module("forward"), a.predicted_flops.by_module("backward")
    measured_saved = a.saved.by_module()
    names = list(dict.fromkeys([*a.predicted_saved_by_module, *measured_saved, *predicted_forward, *a.flops.forward_by_module]))
    return [
        ModuleRow(
            module=name,
            predicted_forward_flops=predicted_forward.get(name, 0),
            traced_forward_flops=a.flops.forward_by_module.get(name, 0),
            predicted_backward_flops=predicted_backward.get(name, 0),
            traced_backward_flops=a.flops.backward_by_module.get(name, 0),
            predicted_saved_bytes=a.predicted_saved_by_module.get(name, 0) if a.predicted_saved_bytes is not None else None,
            measured_saved_bytes=measured_saved.get(name, 0),
        )
        for name in names
    ]


def _key(text: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in text.lower())
    return "_".join(part for part in cleaned.split("_") if part)


_UNIT_SUFFIX = {"FLOPs": "flops", "bytes": "bytes", "B/param": "bytes_per_parameter", "s": "sec", "FLOP/s": "flops_per_sec", "days": "days", "": "fraction"}


def _to_json(a: StepAccount) -> dict[str, Any]:
    sections: dict[str, list[dict[str, Any]]] = {}
    for row in a.rows():
        unit = _UNIT_SUFFIX.get(row.unit, _key(row.unit))
        sections.setdefault(_key(row.section), []).append(
            {"quantity": row.quantity, f"predicted_{unit}": row.predicted, f"measured_{unit}": row.measured,
             "ratio": row.ratio, "note": row.note}
        )
    return {
        "model": a.model,
        "config": {"vocab_size": a.config.vocab_size, "context_length": a.config.context_length, "n_layers": a.config.n_layers,
                   "n_heads": a.config.n_heads, "d_model": a.config.d_model, "mlp_ratio": a.config.mlp_ratio},
        "attention": a.attention,
        "batch": a.batch, "seq": a.seq, "tokens": a.tokens, "device": a.device, "recipe": a.recipe, "optimizer": a.state.optimizer,
        "parameters": a.parameters,
        "checkpoint_segments": a.checkpoint_segments,
        **sections,
        "per_module": [vars(row) for row in a.per_module_rows()],
        "tracer_gaps": [
            {"phase": op.phase, "op": op.op, "calls": op.calls, "estimated_flops": op.estimated_flops} for op in a.flops.uncounted_ops
        ],
        "notes": a.notes,
    }


_GENERIC = ("ModelAccount", "account_model", "account_module")


def __getattr__(name: str) -> Any:
    """The generic path (:mod:`resacct.account_generic`) is importable from here too, lazily
    (it builds on this module): ``from resacct.account import account_model``."""
    if name in _GENERIC:
        import resacct.account_generic as generic

        return getattr(generic, name)
    raise AttributeError(f"module 'resacct.account' has no attribute {name!r}")
