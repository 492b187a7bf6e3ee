"""Will it fit: the peak memory of one training step, **predicted before it runs** — for any
``nn.Module`` resacct accounts — with what is live at the peak and when.

:func:`predict_step_peak` runs the step of :func:`resacct.measurement.memory_timeline.run_training_step`
(forward, backward, ``optimizer.step()``, ``zero_grad``; the optimizer state made beforehand, so a
steady step) on a copy of the model made of **fake CPU tensors** (``FakeTensorMode``: shapes,
dtypes and strides, no memory, no arithmetic) under resacct's
:class:`~resacct.account.peak.tracker.LiveStorageTracker`. Fake *CPU* tensors make torch choose the
kernels a CPU run chooses — ``F.scaled_dot_product_attention`` dispatches to the CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), not the math path a meta tensor decomposes
into — so attention memory follows the kernel that will run; the kernels seen are named.
Nothing of the model is allocated: a config on the meta device is converted as it is.

:func:`measure_step_peak` is the same step for real on the CPU, counted by the allocator
(:func:`resacct.measurement.memory_timeline.measure_step_memory`). The prediction never reads it.
Both take ``micro_batches`` (gradient accumulation: :mod:`resacct.account.peak.accumulation`);
:func:`account_recipe_step_peak` runs a precision recipe's step (autocast, master weights:
:mod:`resacct.account.peak.recipes`); :mod:`resacct.account.fit.search` searches the largest
micro-batch or sequence whose predicted peak fits a device.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
>>> adamw = lambda parameters: torch.optim.AdamW(parameters, lr=1e-3)
>>> loss = lambda m, x: m(x).mean()
>>> predicted = predict_step_peak(model, torch.randn(32, 64), loss, adamw)
>>> measured = measure_step_peak(model, torch.randn(32, 64), loss, adamw)
>>> predicted.peak_bytes == measured.peak_bytes, predicted.peak.phase, predicted.peak.op
(True, 'optimizer step', 'aten.div.Tensor')
>>> predicted.peak.bytes_by_kind["parameters"], predicted.peak.bytes_by_kind["optimizer state"]   # 4·33,088; 2·that + 4·4 counters
(132352, 264720)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from resacct.account.peak.accumulation import check_micro_batches, measure_accumulated_step_memory, run_accumulated_step
from resacct.account.peak.engine import ENGINE
from resacct.account.peak.recipes import master_parameters_of, optimizer_state_tensors
from resacct.account.peak.layer_segments import mark_layer_segments, segmenting_layers, segments_of
from resacct.account.peak.fake_state import active_fake_mode, fake_like, made_adam_state
from resacct.account.peak.optimizer_replay import replayed_optimizer_steps
from resacct.account.peak.tracker import LiveStorageTracker, PeakMoment
from resacct.account.render.rows import Row
from resacct.errors import ResacctError
from resacct.measurement.kernel_probe import MAX_PROBE_BYTES, MAX_PROBE_FLOPS, onednn_matmuls
from resacct.measurement.memory_timeline import (
    STEP_PHASES,
    LossFn,
    MakeOptimizer,
    MemoryTimeline,
    copy_inputs,
    gc_paused,
    make_optimizer_state,
    measure_step_memory,
    run_training_step,
)

__all__ = ["PredictedStepPeak", "StepPeakAccount", "predict_step_peak", "prediction_of_tracker", "measure_step_peak", "attention_kernel_of", "account_step_peak", "account_model_step_peak", "account_recipe_step_peak", "ENGINE"]


#: The fused attention kernels sdpa may dispatch to (on meta it always takes the math path: bmm, softmax).
FUSED_ATTENTION_KERNELS = _ATTENTION_KERNELS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "flash (CPU): keeps the output and a float32 logsumexp, no s² scores",
    "aten._scaled_dot_product_flash_attention.default": "flash (CUDA)",
    "aten._scaled_dot_product_efficient_attention.default": "memory-efficient (CUDA)",
    "aten._scaled_dot_product_cudnn_attention.default": "cuDNN (CUDA)",
    "aten._scaled_dot_product_fused_attention_overrideable.default": "a backend's fused kernel",
}


@dataclass(frozen=True)
class PredictedStepPeak:
    """resacct's prediction of one steady training step: the peak, what is live at it and when
    (:class:`~resacct.account.peak.tracker.PeakMoment`), the timeline, the aten ops seen."""

    peak: PeakMoment
    timeline: MemoryTimeline
    ops_seen: dict[str, int]
    unprobed_matmuls: int = 0  # 16-bit oneDNN matmuls too large to probe: their scratchpad is left out
    #: the step's segments, per layer (:mod:`resacct.account.peak.layer_segments`), when asked for; else None
    segments: Any = None

    @property
    def peak_bytes(self) -> int:
        return self.peak.bytes

    @property
    def attention_kernel(self) -> str:
        return attention_kernel_of(self.ops_seen)


def attention_kernel_of(ops_seen: dict[str, int]) -> str:
    """Which attention kernel ran, from the aten ops a step dispatched.

    >>> attention_kernel_of({"aten._scaled_dot_product_flash_attention_for_cpu.default": 2})
    'flash (CPU): keeps the output and a float32 logsumexp, no s² scores'
    >>> attention_kernel_of({"aten.bmm.default": 4, "aten._softmax.default": 2}), attention_kernel_of({"aten.mm.default": 3})
    ('math: scores and softmax as tensors (bmm, softmax)', 'none (no attention)')
    """
    for op, description in _ATTENTION_KERNELS.items():
        if ops_seen.get(op):
            return description
    if any(op.startswith(("aten._softmax", "aten._safe_softmax")) for op in ops_seen) and any(op.startswith(("aten.bmm", "aten.matmul")) for op in ops_seen):
        return "math: scores and softmax as tensors (bmm, softmax)"
    return "none (no attention)"


def _fake_copy(model: nn.Module) -> nn.Module:
    """``model`` (on the CPU or the meta device) with every parameter, buffer and tensor attribute
    replaced by a fake CPU tensor of the same shape, stride and dtype (under ``FakeTensorMode``); ties kept."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for tensor in (*module._parameters.values(), *module._buffers.values(), *(v for v in vars(module).values() if isinstance(v, torch.Tensor))):
            if tensor is not None and id(tensor) not in memo:
                memo[id(tensor)] = tensor
    tensors, mode = list(memo.values()), active_fake_mode()
    made = fake_like(mode, tensors) if mode is not None else [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu") for t in tensors]
    for tensor, fake in zip(tensors, made):
        if isinstance(tensor, nn.Parameter) and mode is None:
            fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
        elif isinstance(tensor, nn.Parameter):  # as nn.Parameter(fake) makes one of a tensor subclass, without its detach
            fake.requires_grad_(tensor.requires_grad)._is_param = True
        memo[id(tensor)] = fake
    return copy.deepcopy(model, memo)


def _tensors_of(inputs: Any) -> list[Any]:
    if isinstance(inputs, dict):
        return list(inputs.values())
    return list(inputs) if isinstance(inputs, tuple) else [inputs]


def predict_step_peak(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: MakeOptimizer, *,
                      micro_batches: int = 1, recorder: Any = None) -> PredictedStepPeak:
    """Predict the peak of one steady training step of ``model`` on ``inputs`` (a tensor, a tuple,
    or a mapping of tensors; on the CPU or the meta device — only their shapes are used) with the
    optimizer ``make_optimizer(parameters)`` builds, ``loss_fn(model, inputs)`` the scalar loss.
    ``micro_batches`` > 1: gradient accumulation over that many micro-steps on ``inputs``
    (:func:`resacct.account.peak.accumulation.run_accumulated_step`).

    ``recorder`` (a :class:`resacct.account.trace.fake_pass.FakeStepRecorder`, one micro-batch): the
    step's FLOPs, saved tensors and training state recorded on this same pass.

    Raises :class:`~resacct.errors.ResacctError` when the step cannot run on fake tensors (an
    op that needs the data, such as routing that loops over the experts a batch hits)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_micro_batches(micro_batches)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = LiveStorageTracker()
    original_rng_state = torch.get_rng_state

    def rng_state() -> torch.Tensor:  # a real CPU tensor made outside the dispatcher (checkpoint keeps one per segment)
        state = original_rng_state()
        tracker.classify((state,), "RNG states checkpoint keeps")
        return state

    with gc_paused(collect=False):  # no collection first: 0.1–0.2 s a prediction; the tracker counts only what the step makes
        torch.get_rng_state = rng_state
        try:
            with mode, tracker:  # the tracker above fake mode: it sees the tensors autograd sees (requires_grad, grad_fn)
                fake_model = _fake_copy(model)
                fake_inputs = copy_inputs(inputs, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu"))
                parameters = [p for p in fake_model.parameters() if p.requires_grad]
                optimizer = make_optimizer(parameters)
                with _untracked_if(tracker, _state_is_torch_optims(optimizer)):  # its state is named below; its ops are not the step's
                    if not made_adam_state(optimizer):  # Adam/AdamW: the state its first step makes, without the step's ops
                        make_optimizer_state(fake_model, optimizer)
                tracker.classify(fake_model.parameters(), "parameters")
                tracker.classify(fake_model.buffers(), "buffers")
                tracker.classify(_tensors_of(fake_inputs), "inputs")
                tracker.classify(master_parameters_of(optimizer), "master weights")
                if hasattr(optimizer, "on_master_gradient"):
                    optimizer.on_master_gradient = lambda grad: tracker.classify((grad,), "master gradients")
                tracker.classify(optimizer_state_tensors(optimizer), "optimizer state")
                hooks = [p.register_post_accumulate_grad_hook(lambda p: tracker.classify((p.grad,), "gradients")) for p in parameters]
                tracker.name_modules(fake_model)
                if (layers := segmenting_layers()) is not None:
                    hooks += mark_layer_segments(fake_model, tracker, layers)
                with replayed_optimizer_steps(optimizer, tracker):  # one parameter of each shape traced, the others replayed
                    if micro_batches == 1:
                        with contextlib.nullcontext() if recorder is None else recorder.start(fake_model, optimizer, tracker):
                            run_training_step(fake_model, fake_inputs, loss_fn, optimizer, tracker.mark if recorder is None else recorder.marking(tracker.mark))
                    else:
                        run_accumulated_step(fake_model, fake_inputs, loss_fn, optimizer, micro_batches, tracker.mark)
                for hook in hooks:
                    hook.remove()
                del fake_model, fake_inputs, parameters, optimizer, hooks  # freed by their counts now, not by the collector later
        except ResacctError:
            raise
        except Exception as error:  # an op fake tensors cannot run (data-dependent shapes, .item() …)
            first = (str(error).strip().splitlines() or [""])[0]
            raise ResacctError(f"the step of {type(model).__name__} cannot run on fake tensors ({type(error).__name__}: {first[:240]}); "
                               "expected a step whose shapes do not depend on the data") from None
        finally:
            torch.get_rng_state = original_rng_state
        if tracker.peak is None:
            raise ResacctError(f"the step of {type(model).__name__} dispatched no aten op; expected a forward that computes something")
        return prediction_of_tracker(tracker)  # before the collector runs again: the timeline's points are many small objects


def prediction_of_tracker(tracker: LiveStorageTracker) -> PredictedStepPeak:
    """The tracker's peak and timeline (from the first phase on; ``end`` counted as zero_grad's last point)."""
    start = next(held for phase, held in tracker.timeline if phase == "forward")
    kept = (*STEP_PHASES, "end")
    phases = tuple("zero_grad" if phase == "end" else phase for phase, _ in tracker.timeline if phase in kept)
    held = tuple(value for phase, value in tracker.timeline if phase in kept)
    segments = None if tracker.segments is None else segments_of(tracker)
    tracker.timeline = []
    timeline = MemoryTimeline(phases=phases, bytes_held=held, start_bytes=start, peak_bytes=tracker.peak.bytes, peak_phase=tracker.peak.phase,
                              source=ENGINE)
    return PredictedStepPeak(peak=tracker.peak, timeline=timeline, ops_seen=dict(tracker.ops_seen), unprobed_matmuls=tracker.unprobed_matmuls,
                             segments=segments)


def _state_is_torch_optims(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every tensor ``optimizer``'s first step leaves behind is its state: a ``torch.optim``
    optimizer, or :class:`~resacct.account.peak.recipes.MasterWeightsOptimizer` stepping one."""
    from resacct.account.peak.recipes import MasterWeightsOptimizer

    inner = optimizer.inner if type(optimizer) is MasterWeightsOptimizer else optimizer
    return type(inner).__module__.startswith("torch.optim.")


@contextlib.contextmanager
def _untracked_if(tracker: LiveStorageTracker, condition: bool) -> Iterator[None]:
    """``tracker`` (the innermost dispatch mode) off for the block when ``condition``."""
    from torch.utils._python_dispatch import _pop_mode_temporarily

    if not condition:
        yield
        return
    with _pop_mode_temporarily() as popped:
        if popped is not tracker:
            raise ResacctError(f"the innermost dispatch mode is {type(popped).__name__}, not the tracker; expected the tracker innermost")
        yield


def measure_step_peak(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: MakeOptimizer, *,
                      micro_batches: int = 1) -> MemoryTimeline:
    """The same step for real on the CPU, counted by the allocator
    (:func:`~resacct.measurement.memory_timeline.measure_step_memory`; with ``micro_batches`` > 1,
    :func:`~resacct.account.peak.accumulation.measure_accumulated_step_memory`)."""
    if check_micro_batches(micro_batches) > 1:
        return measure_accumulated_step_memory(model, inputs, loss_fn, make_optimizer, micro_batches=micro_batches)
    return measure_step_memory(model, inputs, loss_fn, make_optimizer)


@dataclass
class StepPeakAccount:
    """The predicted peak of a step beside the measured one (None: not measured), for the account's
    table (:meth:`rows`) and ``--json`` (:meth:`to_dict`). ``gap``: why there is no prediction."""

    predicted: PredictedStepPeak | None
    measured: MemoryTimeline | None = None
    gap: str | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[Row]:
        section = "step peak"
        if self.predicted is None:
            measured = None if self.measured is None else self.measured.peak_bytes
            return [Row(section, "training step (fwd, bwd, optimizer, zero_grad)", None, measured, "bytes", f"predicted: — ({self.gap})")]
        p, m = self.predicted, self.measured
        where = f" in {p.peak.where}" if p.peak.where else ""
        rows = [
            Row(section, "training step (fwd, bwd, optimizer, zero_grad)", p.peak_bytes, None if m is None else m.peak_bytes, "bytes",
                f"at {p.peak.phase}: {p.peak.op}{where}; measured: CPU allocator"),
            Row(section, "held before the step", p.timeline.start_bytes, None if m is None else m.start_bytes, "bytes",
                "parameters, inputs, optimizer state"),
        ]
        rows += [Row(section, f"  at the peak: {kind}", value, None, "bytes", "") for kind, value in p.peak.bytes_by_kind.items()]
        rows.append(Row(section, "attention kernel (CPU)", None, None, "", p.attention_kernel))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """``--json``'s ``step_peak``: bytes with units in the names, what is live at the peak, when."""
        if self.predicted is None:
            return {"predicted_peak_bytes": None, "why_not_predicted": self.gap,
                    "measured_peak_bytes": None if self.measured is None else self.measured.peak_bytes, "notes": self.notes}
        p, m = self.predicted, self.measured
        return {
            "predicted_peak_bytes": p.peak_bytes, "measured_peak_bytes": None if m is None else m.peak_bytes,
            "predicted_start_bytes": p.timeline.start_bytes, "measured_start_bytes": None if m is None else m.start_bytes,
            "peak_phase": p.peak.phase, "peak_op": p.peak.op, "peak_where": p.peak.where,
            "live_at_peak_bytes": dict(p.peak.bytes_by_kind),
            "predicted_phase_peak_bytes": {phase: p.timeline.peak_of_phase(phase) for phase in STEP_PHASES},
            "measured_phase_peak_bytes": None if m is None else {phase: m.peak_of_phase(phase) for phase in STEP_PHASES},
            "attention_kernel": p.attention_kernel, "predicted_by": ENGINE, "measured_by": None if m is None else m.source, "notes": self.notes,
        }


def account_step_peak(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: MakeOptimizer, *, measure: bool,
                      gap: str | None = None, micro_batches: int = 1, recorder: Any = None) -> StepPeakAccount:
    """Predict (unless ``gap`` says why not) and, when ``measure`` and the model is on the CPU, measure;
    ``micro_batches`` > 1: a step accumulating gradients over that many micro-steps on ``inputs``."""
    predicted, notes = None, []
    if gap is None:
        try:
            predicted = predict_step_peak(model, inputs, loss_fn, make_optimizer, micro_batches=micro_batches, recorder=recorder)
        except ResacctError as error:
            gap = str(error)
    measured = measure_step_peak(model, inputs, loss_fn, make_optimizer, micro_batches=micro_batches) if measure else None
    if micro_batches > 1:
        notes.append(f"gradient accumulation: {micro_batches} micro-steps on the same micro-batch, gradients kept between them")
    return StepPeakAccount(predicted=predicted, measured=measured, gap=gap, notes=notes)


def account_model_step_peak(model: nn.Module, inputs: Any, *, loss: str, recipe: Any, optimizer: str, measure: bool,
                            micro_batches: int = 1, recorder: Any = None) -> StepPeakAccount:
    """The step peak of an account's model: ``loss`` as :func:`resacct.account.load.model_io.loss_of_output`
    reads it (see :func:`account_recipe_step_peak`); ``recorder`` (:func:`predict_step_peak`) is told what ``auto`` resolved to."""
    from resacct.account.load.model_io import call_model, loss_of_output, resolve_loss

    def loss_fn(module: nn.Module, step_inputs: Any) -> torch.Tensor:
        output = call_model(module, step_inputs)
        if recorder is not None and recorder.resolved_loss is None:
            recorder.resolved_loss = resolve_loss(output, loss)
        return loss_of_output(output, loss)

    return account_recipe_step_peak(model, inputs, loss_fn, recipe=recipe, optimizer=optimizer, measure=measure, micro_batches=micro_batches,
                                    recorder=recorder)


def account_recipe_step_peak(model: nn.Module, inputs: Any, loss_fn: LossFn, *, recipe: Any, optimizer: str, measure: bool,
                             micro_batches: int = 1, recorder: Any = None) -> StepPeakAccount:
    """The step peak of the step ``recipe`` (a :class:`~resacct.facts.recipes.Recipe`) runs
    (:func:`resacct.account.peak.recipes.recipe_step`: parameters in its dtype, autocast, master
    weights) with the ``torch.optim`` ``optimizer`` (torch's default implementation), ``loss_fn``
    as the float32 model computes it. A recipe fake tensors cannot run (loss scaling) leaves ``gap``
    saying why."""
    from resacct.account.peak.recipes import recipe_step

    try:
        step = recipe_step(recipe, model, inputs, loss_fn, optimizer)
    except ResacctError as error:
        return StepPeakAccount(predicted=None, gap=str(error))
    account = account_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer, measure=measure, micro_batches=micro_batches,
                                recorder=recorder)
    account.notes.append(f"recipe {recipe.name}: {step.description}")
    if recipe.computes_in in ("bfloat16", "float16") and onednn_matmuls(recipe.computes_in):
        account.notes.append(onednn_note(recipe.computes_in, 0 if account.predicted is None else account.predicted.unprobed_matmuls))
    return account


def onednn_note(dtype: str, unprobed: int) -> str:
    """What the prediction says about oneDNN's matmul scratchpad on this CPU (see
    :mod:`resacct.measurement.kernel_probe`), ``unprobed`` the matmul calls too large to probe."""
    note = (f"{dtype} matmuls on this CPU run through oneDNN, whose scratchpad (its blocking heuristics' choice for this CPU) "
            "is measured by running each distinct matmul once")
    if unprobed:
        note += (f"; {unprobed} matmul call(s) too large to probe (over {MAX_PROBE_BYTES // 2**20} MiB or {MAX_PROBE_FLOPS:.0e} FLOPs) are left out: "
                 "forward and backward may hold up to hundreds of kB more each (an fp32 copy of the output where oneDNN emulates bf16)")
    return note
