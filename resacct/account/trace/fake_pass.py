"""Trace once: the FLOPs, saved tensors and training state of a step recorded on the fake-tensor
pass that predicts its peak (:func:`resacct.account.peak.step_peak.predict_step_peak`), so the
meta pass of :func:`resacct.account.trace.step_measurements.measure_step_once` is not run.

:class:`FakeStepRecorder` rides on that pass's phase marks: from ``forward`` to ``backward`` the
forward runs under the step's FLOP tracer (FlopCounterMode per module, every op recorded) and
saved-tensor hooks; the backward under the tracer alone; at ``optimizer step`` the gradients are
there and the optimizer's state already made, so the storages the training state counts are
read. The tracer's modes go *below* the tracker, so the tracker sees each op as it does alone
(FlopCounterMode's decompositions stay under it); the saved tensors are recorded by storage
identity without keeping them alive (the meta recorder keeps them: here that would move the
peak), and the detaches autograd adds or drops for hooks are evened out (:func:`_record_saved_weakly`).

The answers are the meta pass's only where the fake CPU step runs the step the meta one does:
:func:`fake_pass_runs_the_meta_step` says when (float32 parameters and inputs on meta, no
autocast, no master weights, a ``torch.optim`` optimizer). Elsewhere they differ — on the CPU a
bf16 ``native_layer_norm`` keeps bf16 mean and rstd, the meta kernel float32 — and so they do
where the fake CPU step's sdpa takes a fused kernel (meta always takes the math path: Llama with
grouped-query attention saves other tensors): :func:`resacct.account.answers.generic.account_module`
then runs the meta pass as before and keeps only the peak. ``tests/test_account_fake_pass.py``
checks the two ways give the same account to the byte, peak timeline included.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, no_type_check

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from resacct.account.trace.step_measurements import StepFlopTrace, TrainingStateMeasurement, StepFlopTracer, state_measurement
from resacct.measurement.activation_recording import SavedActivation, SavedActivations, module_stack
from resacct.measurement.lean_flop_counter import lean_flop_counter
from resacct.errors import ResacctError
from resacct.measurement.memory import StateRecipe

__all__ = ["FAKE_PASS_FROM_TORCH", "FakeStepRecorder", "fake_pass_runs_the_meta_step", "torch_release"]

_CHECKPOINT_SOURCE = os.path.join("torch", "utils", "checkpoint.py")  # ``_make_saved_tensor(arg, is_output=False)``: its inputs

#: The torch from which the fake pass's records are the meta pass's, every case of
#: tests/test_account_fake_pass.py equal to the byte (2.13 and 2.14). Before it the meta pass runs:
#: on 2.11 a checkpointed model's saved tensors differ, on 2.8 six of the 15 cases (GPT, transformers
#: models, checkpointing, in-place ops), on 2.4.1 the step's timeline and ops seen.
FAKE_PASS_FROM_TORCH = (2, 13)


def fake_pass_runs_the_meta_step(parameters: list[nn.Parameter], inputs: Any, recipe: StateRecipe, where: str, optimizer: str) -> bool:
    """Whether the fake CPU step runs what the meta pass runs: the model on meta, every floating
    parameter and input float32, the recipe without autocast or master weights, a ``torch.optim``
    optimizer (the peak's and the state's builder is the same)."""
    from resacct.account.load.optimizers import OPTIMIZER_NAMES

    if torch_release() < FAKE_PASS_FROM_TORCH:
        return False
    if where != "meta" or recipe.compute_dtype is not None or recipe.master_dtype is not None or recipe.parameter_dtype != "float32":
        return False
    tensors = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs) if isinstance(inputs, tuple) else [inputs]
    floats = [t for t in [*parameters, *tensors] if t.is_floating_point()]
    return optimizer in OPTIMIZER_NAMES and all(t.dtype == torch.float32 for t in floats)


def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor): ``2.13.0+cpu`` → (2, 13)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


class FakeStepRecorder:
    """What :func:`~resacct.account.trace.step_measurements.measure_step_once` measures, recorded
    on the fake pass of a step peak: hand :meth:`start` the fake model and its optimizer, and
    wrap the tracker's ``mark`` with :meth:`marking`. ``done`` once the step reached the optimizer.

    ``recipe`` None: the FLOPs alone (no saved tensors, no training state), for a step whose other
    numbers are read elsewhere (:func:`resacct.account.trace.lora_step.trace_lora_step`)."""

    def __init__(self, model: nn.Module, recipe: StateRecipe | None, optimizer: str, *, fill_tracer_gaps: bool = True) -> None:
        self.model, self.recipe, self.optimizer_name, self.fill_tracer_gaps = model, recipe, optimizer, fill_tracer_gaps
        self.flops: StepFlopTrace | None = None
        self.saved: SavedActivations | None = None
        self.state: TrainingStateMeasurement | None = None
        self._fake_model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._tracer: StepFlopTracer | None = None
        self._recording: contextlib.ExitStack | None = None
        self._tracker: Any = None
        #: the loss ``auto`` resolved to on the fake forward (set by the peak's loss function)
        self.resolved_loss: str | None = None

    @property
    def done(self) -> bool:
        if self.recipe is None:
            return self.flops is not None
        return self.flops is not None and self.saved is not None and self.state is not None

    def start(self, fake_model: nn.Module, optimizer: torch.optim.Optimizer, tracker: Any) -> FakeStepRecorder:
        """The fake model and optimizer the step runs, under ``tracker`` (a
        :class:`~resacct.account.peak.tracker.LiveStorageTracker`, told to skip the detaches the unpack hook causes);
        the recorder, to run the step in (its modes below the tracker end when it ends, whatever the step raised)."""
        self._fake_model, self._optimizer, self._tracker = fake_model, optimizer, tracker
        return self

    def __enter__(self) -> FakeStepRecorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Whatever is still recording ends (the step raised inside a phase): the modes above the tracker popped first."""
        if self._recording is not None:
            self._recording.close()
            self._recording = None
        if self._tracer is not None:
            with _under_the_tracker(self._tracker):
                self._tracer.__exit__(*exc)
            self._tracker.op_record = None
            self._tracer = None

    def marking(self, mark: Callable[[str], None]) -> Callable[[str], None]:
        """``mark`` (the tracker's), with the recording begun and ended at the step's phases."""

        def marked(phase: str) -> None:
            if phase == "forward":
                mark(phase)
                self._begin()
            elif phase == "backward":
                self._end_forward()
                mark(phase)
            elif phase == "optimizer step":
                self._end_backward()
                mark(phase)
            else:
                mark(phase)

        return marked

    def _begin(self) -> None:
        if self._fake_model is None:
            return
        self._tracer = StepFlopTracer(self._fake_model, self.fill_tracer_gaps)
        self._tracer.ops = self._tracker.op_record = _RecordedByTheTracker()  # the calls DispatchedOps would record below it
        lean_flop_counter(self._tracer.counter)  # FlopCounterMode's dispatch without its per-op set and mode re-entry
        with _under_the_tracker(self._tracker):
            self._tracer.__enter__()
        if self.recipe is None:  # the FLOPs alone
            return
        self._recording = contextlib.ExitStack()
        self.saved = self._recording.enter_context(_record_saved_weakly(self._fake_model, self._tracker.skip_next_detach))

    def _end_forward(self) -> None:
        if self._recording is not None:
            self._recording.close()
            self._recording = None
        if self._tracer is not None:
            self._tracer.end_forward()

    def _end_backward(self) -> None:
        if self._tracer is None or self._fake_model is None or self._optimizer is None:
            return
        with _under_the_tracker(self._tracker):
            self._tracer.__exit__(None, None, None)
        self._tracker.op_record = None
        self.flops = self._tracer.trace()
        self._tracer = None
        if self.recipe is None:  # the FLOPs alone
            return
        parts = _state_parts(self._fake_model, self._optimizer, self.optimizer_name)
        total = sum(parts.values())
        self.state = state_measurement(self.model, self.recipe, self.optimizer_name, after_backward_bytes=total, at_step_parts=parts)


class _RecordedByTheTracker:
    """Stands in for the step tracer's :class:`~resacct.measurement.flop_tracing.DispatchedOps`: the
    tracker appends each op it hands down (:attr:`~resacct.account.peak.tracker.LiveStorageTracker.op_record`),
    the very calls that mode would see right below it — one dispatch mode fewer on every op."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, int, int]] = []

    def __enter__(self) -> _RecordedByTheTracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _checkpoint_saving(frame: Any) -> bool:
    """Whether the save being packed is ``torch.utils.checkpoint``'s own ``_make_saved_tensor(arg,
    is_output=False)`` of a segment's inputs (no node made: its input looks like the newest node's output);
    ``frame``: the pack hook's caller (read by the hook itself: a wrapper around this function moves its own frames)."""
    for _ in range(3):  # a wrapper or two between them at most
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(_CHECKPOINT_SOURCE):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _under_the_tracker(tracker: Any) -> Iterator[None]:
    """Modes entered or exited in the block go below ``tracker`` (the innermost dispatch mode): the
    tracker sees each op as it does alone — FlopCounterMode's decompositions of an op it has no
    formula for (``silu_backward``) stay under it, as do the ops' device queries it answers itself."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    top = _pop_mode()
    try:
        if top is not tracker:
            raise ResacctError(f"the innermost dispatch mode is {type(top).__name__}, not the tracker; expected the tracker innermost")
        yield
    finally:
        _push_mode(top)


def _distinct_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None skipped), told apart by the storage
    object (alive while asked) — never by ``.device``, which a fake tensor answers by dispatching."""
    storages: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None:
            storage = tensor.untyped_storage()
            storages[id(storage)] = storage.nbytes()
    return sum(storages.values())


def _state_parts(model: nn.Module, optimizer: torch.optim.Optimizer, name: str) -> dict[str, int]:
    """The training state as :class:`~resacct.account.trace.step_measurements._RecipeTraining` parts it
    (no master weights: the recipes :func:`fake_pass_runs_the_meta_step` admits have none)."""
    parameters = list(model.parameters())
    state = [value for per_param in optimizer.state.values() for value in per_param.values() if isinstance(value, torch.Tensor)]
    state_part = "optimizer moments" if name in ("adam", "adamw") else "optimizer state"
    return {
        "parameters": _distinct_bytes(parameters),
        "gradients": _distinct_bytes(p.grad for p in parameters),
        "master weights": 0,
        "master gradients": 0,
        state_part: _distinct_bytes(v for v in state if v.dim() > 0),
        "step counters": _distinct_bytes(v for v in state if v.dim() == 0),
    }


@contextlib.contextmanager
def _record_saved_weakly(model: nn.Module, unpacked: Callable[[torch.Tensor], None]) -> Iterator[SavedActivations]:
    """:func:`~resacct.measurement.activations.record_saved_activations` without keeping the saved
    tensors: each storage is entered when first saved (its module, shape, dtype, bytes), a storage
    told apart by its object, held weakly (a freed one's successor is a new storage, as on meta).

    The dispatcher sees the step it sees without hooks: without them autograd detaches each output
    it saves (``tensor_data``; the unpack detaches it again), with them it hands the pack hook the
    output itself and detaches whatever the unpack hook returns. So the pack hook detaches a saved
    output as autograd would have, and ``unpacked(tensor)`` is told of every other unpacked tensor
    (the tracker skips the detach that follows). Nor does autograd check, with hooks, that a saved
    tensor was not modified in place before backward: the unpack hook does, and raises as it would."""
    result = SavedActivations()
    parameter_storages = WeakIdKeyDictionary()
    for parameter in model.parameters():
        parameter_storages[parameter.untyped_storage()] = True
    seen = WeakIdKeyDictionary()
    with module_stack(model) as stack:

        @no_type_check  # per-save hot path, and its caller's frame is read (_checkpoint_saving)
        def pack(tensor: torch.Tensor) -> tuple[torch.Tensor, bool, int]:
            result.saves += 1
            storage = tensor.untyped_storage()
            if storage not in seen:
                seen[storage] = True
                result.entries.append(SavedActivation(module=stack[-1], shape=tuple(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."),
                                                      bytes=storage.nbytes(), is_parameter=storage in parameter_storages))
            # An output of the op saving it: its node is the newest one — but not the copy of ``self`` an in-place op
            # saves before it runs (``self.clone()``: clone's node saves nothing), nor checkpoint's own save of its inputs.
            node = tensor.grad_fn
            is_output = (node is not None and node._sequence_nr() == torch.autograd._get_sequence_nr() - 1
                         and type(node).__name__ != "CloneBackward0" and not _checkpoint_saving(sys._getframe(1)))
            if is_output:
                tensor.detach()
            return tensor, is_output, tensor._version

        @no_type_check
        def unpack(packed: tuple[torch.Tensor, bool, int]) -> torch.Tensor:
            tensor, is_output, version = packed
            if tensor._version != version:  # autograd checks this itself only without hooks: the step would raise here
                raise RuntimeError(f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                                   f"at version {tensor._version}; expected version {version} instead")
            if not is_output:
                unpacked(tensor)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield result
