"""Measuring one training step of any ``nn.Module``: FLOPs traced per module, and the training
state a real optimizer holds — the measurements :mod:`resacct.account` puts beside resacct's
predictions.

- :func:`trace_step_flops` — FlopCounterMode over forward and backward, per module (:mod:`resacct.account.trace.module_flops`),
  with the ops it has no formula for; fused attention kernels (the CPU one included) counted from the sdpa call's shapes as the
  model's matmuls (:mod:`resacct.formulas.attention_flops`); on meta, calls seen before answered by :func:`~resacct.measurement.meta_op_cache.meta_calls_cached`.
- :func:`measure_training_state` — parameters, gradients, master weights and optimizer state held
  by a real ``torch.optim`` optimizer after real steps under a precision recipe of
  :data:`resacct.measurement.memory.STATE_RECIPES`, deduplicated by storage, step counters included.
- :func:`measure_step_once` — both, and the tensors autograd saves, in one forward and backward.
- :func:`measure_optimizer_step_transient` — the allocator's peak inside ``optimizer.step()``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from resacct.account.trace.module_flops import in_tree_order, inclusive_by_module, module_flop_counter, module_flops
from resacct.account.load.moe_routing import grouped_mm_flop_mapping
from resacct.account.load.optimizers import build_optimizer, memory_optimizer_name
from resacct.account.load.trainable import predict_state_bytes, trainable_parameters
from resacct.measurement.activations import AllocationTrace, SavedActivations, record_saved_activations, trace_allocations
from resacct.facts.dtypes import parse_dtype
from resacct.errors import ResacctError
from resacct.formulas.attention_flops import FusedAttentionCount
from resacct.formulas.flops import DispatchedOps, UncountedOp, uncounted_ops
from resacct.measurement.flop_tracing import flop_warnings
from resacct.training.gpt import parameter_count
from resacct.measurement.memory import StateRecipe, distinct_storage_bytes, get_state_recipe
from resacct.measurement.meta_op_cache import meta_calls_cached

__all__ = [
    "AUTO_MEASURE_MAX_STEP_FLOPS",
    "StepFlopTrace",
    "sdpa_gap_formulas",
    "trace_step_flops",
    "TrainingStateMeasurement",
    "measure_training_state",
    "predict_optimizer_step_transient_bytes",
    "measure_optimizer_step_transient",
    "recipe_autocast",
]


#: Above this many FLOPs a step, ``measure=None`` stays on the meta device (no arithmetic):
#: the rule both accounts (:func:`resacct.account.account_gpt`,
#: :func:`resacct.account.answers.generic.account_named_model`) use to decide whether to measure.
AUTO_MEASURE_MAX_STEP_FLOPS = 2e10


# ───────────────────────────── FLOPs, traced per module ─────────────────────────────


@dataclass(frozen=True)
class StepFlopTrace:
    """FLOPs FlopCounterMode traced in one forward + backward, in total and per module.

    Per-module counts are *exclusive*, each op under one module (:mod:`resacct.account.trace.module_flops`):
    the forward's under the module running it, the backward's under the module whose forward made
    it; they sum to the totals (:meth:`inclusive_by_module`: with descendants'). ``gap_filled_flops`` is what resacct added
    for ops the counter has no formula for (the fused CPU attention kernel; zero unless
    ``fill_tracer_gaps``); ``attention_recompute_flops`` the scores fused attention kernels
    recompute in backward — hardware work, not in the model FLOPs above."""

    forward_flops: int
    backward_flops: int
    forward_by_module: Mapping[str, int]
    backward_by_module: Mapping[str, int]
    uncounted_ops: tuple[UncountedOp, ...] = ()
    gap_filled_flops: int = 0
    attention_recompute_flops: int = 0

    @property
    def warnings(self) -> list[str]:
        """One line per uncounted matmul-class op: FLOPs the counts above miss (never silent)."""
        return flop_warnings(self.uncounted_ops)

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    def inclusive_by_module(self, direction: str) -> dict[str, int]:
        """``"forward"`` or ``"backward"`` FLOPs per module, its descendants' included."""
        if direction not in ("forward", "backward"):
            raise ResacctError(f"direction {direction!r}: expected 'forward' or 'backward'")
        return inclusive_by_module(self.forward_by_module if direction == "forward" else self.backward_by_module)


def sdpa_gap_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode ``custom_mapping`` entries for every fused attention kernel
    (:class:`resacct.formulas.attention_flops.FusedAttentionCount`): model FLOPs from the sdpa call's shapes,
    forward and backward — also for the CPU kernel, which FlopCounterMode alone counts as 0."""
    return FusedAttentionCount().custom_mapping()


class StepFlopTracer:
    """One FlopCounterMode (and a record of every op) over a forward and its backward: the forward's counts copied
    when it ends (:meth:`end_forward`), the backward's the step's less them (a second counter's, at half the cost)."""

    def __init__(self, model: nn.Module, fill_tracer_gaps: bool) -> None:
        self.attention = FusedAttentionCount()
        mapping = {**self.attention.custom_mapping(), **grouped_mm_flop_mapping()} if fill_tracer_gaps else {}
        self.filled = frozenset({str(op) for op in mapping} | {str(getattr(op, "overloadpacket", op)) for op in mapping})
        self.counter = module_flop_counter(model, mapping)
        self.ops = DispatchedOps()
        self.forward_counts: dict[str, dict[Any, int]] = {}
        self.forward_total = 0
        self.forward_calls: list[tuple[Any, int, int]] = []
        self.meta_calls = meta_calls_cached(model)  # on meta, under the counters: calls seen before without Python meta kernels

    def __enter__(self) -> StepFlopTracer:
        self.meta_calls.__enter__()
        self.counter.__enter__()
        self.ops.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ops.__exit__(*exc)
        self.counter.__exit__(*exc)
        self.meta_calls.__exit__(*exc)

    def end_forward(self) -> None:
        self.forward_counts = self.counter.get_flop_counts()  # a copy, per module and op
        self.forward_total = int(self.counter.get_total_flops())
        self.forward_calls, self.ops.calls = self.ops.calls, []

    def trace(self) -> StepFlopTrace:
        step_modules, forward_modules = module_flops(self.counter.get_flop_counts()), module_flops(self.forward_counts)
        backward_modules = {name: total - forward_modules.get(name, 0) for name, total in step_modules.items()}
        return StepFlopTrace(
            forward_flops=self.forward_total,
            backward_flops=int(self.counter.get_total_flops()) - self.forward_total,
            forward_by_module=in_tree_order(forward_modules),
            backward_by_module=in_tree_order(backward_modules),
            uncounted_ops=tuple(uncounted_ops("forward", self.forward_calls, self.filled) + uncounted_ops("backward", self.ops.calls, self.filled)),
            gap_filled_flops=self.attention.filled_flops,
            attention_recompute_flops=self.attention.recompute_flops,
        )


def trace_step_flops(model: nn.Module, loss_fn: Callable[[], torch.Tensor], *, fill_tracer_gaps: bool = True) -> StepFlopTrace:
    """One forward (``loss_fn()``, returning a scalar loss) and its backward under FlopCounterMode.

    ``fill_tracer_gaps`` (default): every fused attention kernel counted from its shapes as the
    model's matmuls (:mod:`resacct.formulas.attention_flops`); False: FlopCounterMode alone.

    >>> from resacct.training.gpt import build_gpt
    >>> from resacct.measurement.activations import gpt_loss
    >>> model = build_gpt("gpt-nano", device="meta")
    >>> tokens = torch.zeros(2, 16, dtype=torch.long, device="meta")
    >>> trace = trace_step_flops(model, lambda: gpt_loss(model, tokens, tokens))
    >>> trace.forward_flops, trace.backward_flops, trace.forward_by_module["lm_head"]
    (7602176, 15204352, 1048576)
    """
    for parameter in model.parameters():
        parameter.grad = None
    with StepFlopTracer(model, fill_tracer_gaps) as tracer:
        loss = loss_fn()
        tracer.end_forward()
        loss.backward()
    for parameter in model.parameters():
        parameter.grad = None
    return tracer.trace()


# ───────────────────────────── training state, measured on a real optimizer ─────────────────────────────


@dataclass(frozen=True)
class TrainingStateMeasurement:
    """Bytes of distinct storages a real optimizer (``optimizer``: adamw, adam, sgd, sgd-momentum,
    adagrad, rmsprop) holds under ``recipe``, beside resacct's prediction
    (:func:`resacct.measurement.memory.training_state_bytes`, step counters included).

    ``after_backward_bytes``: what is kept between steps (parameters, their gradients, master
    weights, optimizer state). ``at_step_bytes``: when ``optimizer.step()`` runs (a master
    recipe has made fp32 gradients by then). ``parts_bytes`` splits ``at_step_bytes``."""

    recipe: StateRecipe
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


class _RecipeTraining:
    """A copy of a model in ``recipe``'s parameter dtype, trained by a real ``torch.optim``
    optimizer (on fp32 masters when the recipe has them), and the storages it holds (:meth:`parts`)."""

    def __init__(self, model: nn.Module, recipe: StateRecipe, optimizer: str) -> None:
        self.recipe, self.optimizer_name = recipe, optimizer
        self.work = copy.deepcopy(model).to(parse_dtype(recipe.parameter_dtype))
        self.params = list(self.work.parameters())
        if not self.params:
            raise ResacctError(f"the model {type(model).__name__} has no parameters; expected a model with something to train")
        self.device_type = self.params[0].device.type
        self.trainable = trainable_parameters(self.work)  # a frozen parameter (requires_grad=False) gets no gradient, master or state
        self.master = [nn.Parameter(p.detach().to(parse_dtype(recipe.master_dtype))) for p in self.trainable] if recipe.master_dtype else []
        self.optimizer = build_optimizer(optimizer, self.master or self.trainable)
        self.state_part = "optimizer moments" if optimizer in ("adam", "adamw") else "optimizer state"

    def loss(self, loss_fn: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
        with recipe_autocast(self.recipe, self.device_type):
            return loss_fn(self.work)

    def hand_gradients_to_master(self) -> None:
        for master_param, param in zip(self.master, self.trainable):
            master_param.grad = param.grad.to(master_param.dtype)
            if self.recipe.frees_model_gradients:
                param.grad = None

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for master_param, param in zip(self.master, self.trainable):
                param.copy_(master_param)
        self.work.zero_grad(set_to_none=True)

    def parts(self) -> dict[str, int]:
        state = [value for per_param in self.optimizer.state.values() for value in per_param.values() if isinstance(value, torch.Tensor)]
        return {
            "parameters": distinct_storage_bytes(self.params),
            "gradients": distinct_storage_bytes([p.grad for p in self.params]),
            "master weights": distinct_storage_bytes(self.master),
            "master gradients": distinct_storage_bytes([m.grad for m in self.master]),
            self.state_part: distinct_storage_bytes([v for v in state if v.dim() > 0]),
            "step counters": distinct_storage_bytes([v for v in state if v.dim() == 0]),
        }

    def measurement(self, after_backward: int, at_step: dict[str, int]) -> TrainingStateMeasurement:
        return state_measurement(self.work, self.recipe, self.optimizer_name, after_backward_bytes=after_backward, at_step_parts=at_step)


def state_measurement(model: nn.Module, recipe: StateRecipe, optimizer: str, *, after_backward_bytes: int,
                      at_step_parts: dict[str, int]) -> TrainingStateMeasurement:
    """The measurement of ``model``'s training state (``model``: the one trained, in the recipe's
    dtype — its parameters counted, the prediction made for it) from the storages counted."""
    memory_name = memory_optimizer_name(optimizer)
    return TrainingStateMeasurement(
        recipe=recipe,
        optimizer=optimizer,
        parameters=parameter_count(model),
        parameter_tensors=len(list(model.parameters())),
        after_backward_bytes=after_backward_bytes,
        at_step_bytes=sum(at_step_parts.values()),
        parts_bytes={name: value for name, value in at_step_parts.items() if value},
        predicted_after_backward_bytes=predict_state_bytes(model, recipe, memory_name, "after_backward"),
        predicted_at_step_bytes=predict_state_bytes(model, recipe, memory_name, "at_step"),
    )


def measure_training_state(
    model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], recipe: str | StateRecipe = "fp32", optimizer: str = "adamw",
) -> TrainingStateMeasurement:
    """Train a copy of ``model`` for real under ``recipe`` with the ``torch.optim`` optimizer
    ``optimizer`` (:data:`resacct.account.load.optimizers.OPTIMIZER_NAMES`: adamw, adam, sgd,
    sgd-momentum, adagrad, rmsprop) and count what it holds. Recipes with a master (``bf16-fp32-master``…) are built for real: a bf16 copy
    of the model runs forward and backward; fp32 master parameters carry the AdamW state; each
    step hands the bf16 gradients to the masters (as fp32 gradients), steps, and copies back.

    Step 1 creates the optimizer state; the counts are taken during step 2. Works on the meta
    device (storages have sizes but no memory). ``loss_fn(model)`` returns a scalar loss.
    """
    run = _RecipeTraining(model, get_state_recipe(recipe), optimizer)
    run.loss(loss_fn).float().backward()
    run.hand_gradients_to_master()
    run.step()
    run.loss(loss_fn).float().backward()
    after_backward = sum(run.parts().values())
    run.hand_gradients_to_master()
    return run.measurement(after_backward, run.parts())


# Not in __all__: resacct.account.answers.gpt_step re-exports every name listed there by name.
@dataclass(frozen=True)
class StepMeasurements:
    """What :func:`measure_step_once` measured in one forward and backward; ``model``: the copy in
    the recipe's parameter dtype that ran it (gradients cleared)."""

    flops: StepFlopTrace
    state: TrainingStateMeasurement
    saved: SavedActivations
    model: nn.Module


def measure_step_once(
    model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], recipe: str | StateRecipe = "fp32", optimizer: str = "adamw", *,
    fill_tracer_gaps: bool = True,
) -> StepMeasurements:
    """:func:`trace_step_flops`, :func:`measure_training_state` and
    :func:`~resacct.measurement.activations.record_saved_activations` (of the model in the
    recipe's parameter dtype) in **one** forward and backward of a copy of ``model`` in the
    recipe's dtype, then one optimizer step (on meta, an Adam/AdamW's state made by its own ``_init_group``, the
    update's arithmetic skipped) — the same figures, to the byte, for a third of the work.

    The copy's forward runs under FlopCounterMode and the saved-tensor hooks, its backward under
    FlopCounterMode; the gradients are counted as that backward leaves them (and, handed over,
    the master gradients), the optimizer state as the first step makes it. A second step holds
    the same storages (a backward makes gradients of the parameters' shapes whenever it runs;
    the state exists from the first step on), so "after backward" and "at the step" are what
    :func:`measure_training_state` counts during its second step — ``tests/test_account_speed.py``
    checks both ways agree for every optimizer and recipe. FLOP counts do not depend on the
    parameters' dtype (FlopCounterMode counts from shapes); the gaps it reports are the copy's ops.
    """
    run = _RecipeTraining(model, get_state_recipe(recipe), optimizer)
    with StepFlopTracer(run.work, fill_tracer_gaps) as tracer:
        with record_saved_activations(run.work) as saved:
            loss = run.loss(loss_fn)
        tracer.end_forward()
        loss.float().backward()
    del loss
    held = run.parts()  # after backward: gradients, no master gradients, no state yet
    run.hand_gradients_to_master()
    handed = run.parts()
    if not _state_made_on_meta(run):
        run.step()  # makes the optimizer's state
    made = run.parts()
    state = {run.state_part: made[run.state_part], "step counters": made["step counters"]}
    after_backward = sum({**held, **state}.values())
    return StepMeasurements(flops=tracer.trace(), state=run.measurement(after_backward, {**handed, **state}), saved=saved,
                            model=run.work)


def _state_made_on_meta(run: _RecipeTraining) -> bool:
    """On the meta device, an Adam/AdamW's first step made by its own ``_init_group`` — the code
    ``step()`` runs first, which makes every state tensor — without the update that follows (its
    arithmetic on meta tensors has no values and leaves no storage: on Llama-2-70B, 0.4 s of Python
    meta kernels), then the gradients cleared as :meth:`_RecipeTraining.step` clears them. False
    (nothing done): another optimizer, a fused, capturable or differentiable one, or a device with values."""
    import inspect

    optimizer = run.optimizer
    if run.device_type != "meta" or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    if any(group["fused"] or group["capturable"] or group["differentiable"] for group in optimizer.param_groups):
        return False
    slots = [name for name in inspect.signature(optimizer._init_group).parameters if name != "group"]
    for group in optimizer.param_groups:  # torch 2.4's AdamW takes amsgrad among its lists
        optimizer._init_group(group, *(group["amsgrad"] if name == "amsgrad" else [] for name in slots))
    optimizer.zero_grad(set_to_none=True)
    run.work.zero_grad(set_to_none=True)
    return True


def recipe_autocast(recipe: StateRecipe, device_type: str) -> Any:
    import contextlib

    if recipe.compute_dtype is None or device_type == "meta":
        return contextlib.nullcontext()  # meta: no arithmetic, and no state depends on autocast
    return torch.autocast(device_type, dtype=parse_dtype(recipe.compute_dtype))


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
