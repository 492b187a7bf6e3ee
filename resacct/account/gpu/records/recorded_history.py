"""A recorded step's whole process on meta tensors (issue 31): what ``tools/gpu_record_step.py`` did on the board, from
its first allocation, through the allocator model — the reserved peak of a steady step is the process's history.

The CUDA caching allocator never gives a segment back (no ``empty_cache``), so the reserved memory of the measured step
holds every segment the process reserved before it: the model built on the device (a tied head's first weight made and
dropped), a recipe's copy of it in another dtype (the float32 original freed: 5 GB of cached segments for a 1B model),
the batch, the cuBLAS workspaces at the first matmuls, and two warm-up steps — the first makes the optimizer's state
in the middle of its ``optimizer.step()``, after the backward, not before the step as
:func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory` (a steady step, any model) assumes. Measured against the
H200 record of 2026-11-30: the reserved peaks of resacct's GPT-2 (fp32 and bf16 autocast), HF GPT-2 (both), the LoRA
step and the GQA Llama's bf16 flash step to the byte; the steady-step prediction missed them by 2 % to 27 % (docs/gpu.md).

:func:`predict_recorded_process` runs the recorder's own sequence (:func:`~resacct.account.gpu.records.record_models.build_record_model`,
``recipe_step``, ``run_training_step``) on meta under :class:`WorkspaceRecorder` — the allocation recorder plus the
library's workspaces allocated where cuBLAS allocates them — with CUDA's choices made as the steady prediction makes them
(the sdpa kernel the step names, CUDA autocast, AdamW's foreach default).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, no_type_check

import torch

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.allocator.cuda_allocator_rules import AllocatorConfig
from resacct.account.gpu.records.steady_replay import SteadyStepLog
from resacct.account.gpu.tracing.op_costs import CUBLAS_OP_NAMES
from resacct.errors import ResacctError

__all__ = ["WARMUP_STEPS", "WorkspaceRecorder", "predict_recorded_process"]

#: the recorder's steps before the measured one (tools/gpu_record_step.py: the optimizer's state exists, the caches are warm)
WARMUP_STEPS = 2



class WorkspaceRecorder(AllocationRecorder):
    """The allocation recorder, with the library workspaces allocated where the H200's library probe saw them: a cuBLAS
    workspace of ``cublas_bytes`` just after the first cuBLAS op's output on the thread that runs the forward, another at
    the first one of the backward (autograd's device thread has its own handle), and ``cublaslt_bytes`` after the first
    ``addmm`` with a bias vector of the forward (cuBLASLt's ``gemm_and_bias``) — each kept to the end.
    The record's traces show them so (docs/gpu.md: ``alloc 37748736`` — the first layer's QKV — then ``alloc 33554432``
    then ``alloc 1048576`` on resacct's GPT-2)."""

    def __init__(self, config: AllocatorConfig | None = None, *, cublas_bytes: int = 0, cublaslt_bytes: int = 0) -> None:
        super().__init__(config, device="meta")
        self.cublas_bytes, self.cublaslt_bytes = cublas_bytes, cublaslt_bytes
        self._made: set[str] = set()
        #: when a list, each op's (allocator events before it, its name): which op made each event (tools/gpu_record.py --diff)
        self.op_starts: list[tuple[int, str]] | None = None
        #: when set, the step being logged to replay as the next (steady_replay): told each op's name
        self.steady_log: SteadyStepLog | None = None

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._overloadpacket.__name__
        if self.op_starts is not None:
            self.op_starts.append((len(self.allocator.events), name))
        if self.steady_log is not None:
            self.steady_log.op_names.append(name)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if name in CUBLAS_OP_NAMES and self.cublas_bytes:
            thread = "backward" if torch._C._current_autograd_node() is not None else "forward"
            self._workspace(f"cuBLAS ({thread} thread)", self.cublas_bytes)
            if name == "addmm" and args[0].dim() == 1 and thread == "forward" and self.cublaslt_bytes:
                self._workspace("cuBLASLt (a Linear with a bias)", self.cublaslt_bytes)
        return out

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def _workspace(self, name: str, size: int) -> None:
        if name not in self._made:
            self._made.add(name)
            self.allocator.malloc(("library workspace", name), size)


def predict_recorded_process(step: Mapping[str, Any], build: Callable[[], tuple[Any, Any]], *, config: AllocatorConfig | None,
                             cublas_bytes: int, cublaslt_bytes: int, kernel: str | None, capability: tuple[int, int] | None,
                             ops: list[Any] | None = None, multiprocessors: int | None = None, window: list[Any] | None = None,
                             replay: bool = True) -> Any:
    """The recorded ``step``'s process (its ``recipe``, ``batch``, ``seq``; ``build()`` makes its model on meta and the loss,
    :func:`~resacct.account.gpu.records.record_models.build_record_model`) replayed on meta as tools/gpu_record_step.py ran it on the board, through the allocator model (``config``), the
    workspaces of :class:`WorkspaceRecorder`, the sdpa ``kernel`` (``flash``/``efficient``; None: the step's own sdpa
    call, math on meta) on a board of ``capability``: a :class:`~resacct.account.gpu.tracing.cuda_step.CudaStepPrediction` of the
    measured step (the window after :data:`WARMUP_STEPS` steps). ``ops`` receives the measured step's aten ops.
    ``multiprocessors``: the board's, for its reduction kernels' staging buffers with ``capability``'s threads (None: not modelled). ``window`` receives the
    measured step's allocator events, each ``(action, size, op)`` — the last aten op begun before it (a free between two ops,
    a Python ``del`` or the engine dropping a node's inputs, is labelled with the op before it). ``replay`` (the default): the measured step is the last warm-up step's allocator calls
    replayed (:mod:`~resacct.account.gpu.records.steady_replay`) where that step was closed; False traces it (the check of the replay)."""
    from resacct.account.gpu.tracing.cuda_step import _as_on_cuda, attention_label, sdpa_routing, step_prediction
    from resacct.account.gpu.tracing.op_costs import OpCostCounter
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.memory_timeline import run_training_step

    recorder = WorkspaceRecorder(config, cublas_bytes=cublas_bytes, cublaslt_bytes=cublaslt_bytes)
    recorder.op_starts = None if window is None else []
    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard

    recorder.reduction_board = ReductionBoard.sized(multiprocessors, capability)
    routing = sdpa_routing(kernel, capability, forced=True)  # the recorder forces the kernel (sdpa_kernel)
    chosen = parse_recipe(step["recipe"])
    with recorder:
        net, loss_fn = build()  # built on the device: every parameter made (and a tied head's first weight dropped) as on the board
        tokens = torch.randint(0, net.config.vocab_size, (step["batch"], step["seq"] + 1), device="meta")
        inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        work = recipe_step(chosen, net, inputs, loss_fn, "adamw")
        del net  # a recipe in another dtype stepped a copy: the original is freed, its segments stay cached
        step_loss = work.loss_fn
        if chosen.uses_autocast:  # meta tensors have no torch.autocast: CUDA autocast's casts applied by resacct
            from resacct.account.gpu.answers.device_answer import under_cuda_autocast
            from resacct.facts.dtypes import parse_dtype

            step_loss = under_cuda_autocast(loss_fn, parse_dtype(chosen.computes_in))
        optimizer = work.make_optimizer([p for p in work.model.parameters() if p.requires_grad])
        _as_on_cuda(optimizer)
        with routing:
            for _ in range(WARMUP_STEPS - 1):
                run_training_step(work.model, work.inputs, step_loss, optimizer)
            # the last warm-up step is logged, and the measured step — the same ops on the same live blocks — is its calls
            # replayed (steady_replay); a step that is not closed (it freed an older block or kept one it made) is traced
            recorder.costs = None if ops is None else OpCostCounter()
            with _logged(recorder) as log:
                run_training_step(work.model, work.inputs, step_loss, optimizer)
            start_allocated, start_reserved = recorder.allocator.allocated_bytes, recorder.allocator.reserved_bytes
            recorder.start_window()
            if log.closed() and replay:
                log.replay(recorder.allocator, recorder._ids, recorder.op_starts)
            else:
                recorder.costs = None if ops is None else OpCostCounter()
                run_training_step(work.model, work.inputs, step_loss, optimizer)
        if ops is not None:
            ops.extend(recorder.costs.ops)
        recorder.costs = None
    if window is not None:
        window.extend(_labelled_events(recorder.allocator.events, recorder.window_start, recorder.op_starts))
    if kernel and routing.calls == 0:
        raise ResacctError(f"recorded step {step.get('name')!r}: attention {kernel!r}, but the step never called F.scaled_dot_product_attention")
    return step_prediction(recorder.allocator, start_allocated, start_reserved, attention_label(routing, work.model))


@contextlib.contextmanager
def _logged(recorder: WorkspaceRecorder) -> Iterator[SteadyStepLog]:
    """The allocator's ``malloc`` and ``free`` calls (and the ops they happen in) logged while the block runs; the calls
    still made."""
    allocator, log = recorder.allocator, SteadyStepLog()

    @no_type_check  # per allocator call of a traced step (docs/suite_time.md, session 24)
    def malloc(owner: Any, size: int, stream: int = 0) -> None:
        log.malloc(owner, size, stream)
        type(allocator).malloc(allocator, owner, size, stream)

    @no_type_check  # per allocator call of a traced step (docs/suite_time.md, session 24)
    def free(owner: Any) -> None:
        log.free(owner)
        type(allocator).free(allocator, owner)

    allocator.malloc, allocator.free, recorder.steady_log = malloc, free, log
    try:
        yield log
    finally:
        del allocator.malloc, allocator.free  # the class's own methods again
        recorder.steady_log = None


def _labelled_events(events: list[Any], start: int, op_starts: list[tuple[int, str]]) -> list[tuple[str, int, str]]:
    """``events[start:]`` as ``(action, size, op)``, ``op`` the last op that began at or before the event (``"-"``: none)."""
    import bisect

    starts = [count for count, _ in op_starts]
    labelled = []
    for index in range(start, len(events)):
        event = events[index]
        at = bisect.bisect_right(starts, index) - 1
        labelled.append((event.action, event.size, op_starts[at][1] if at >= 0 else "-"))
    return labelled
