"""What a command answers for a GPU it does not have (``--device h100``): the CUDA caching
allocator's predicted **allocated** and **reserved** peaks of the step, and what calibrates them.

The step is the one the recipe runs (:func:`resacct.account.peak.recipes.recipe_step`: parameters
in its dtype, master weights), traced on meta tensors with CUDA's kernel choices by
:func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory`: sdpa takes flash attention for 16-bit
inputs without a mask (the efficient kernel otherwise, as ``sdpa_kernel`` would on a Hopper or Ampere
board), AdamW its foreach implementation. What it cannot predict it says in one line instead of a
number: loss scaling (GradScaler reads whether a gradient overflowed). An autocast recipe runs its
forward and loss under :class:`~resacct.account.gpu.tracing.cuda_autocast.CudaAutocast` (CUDA autocast's casts
applied to meta tensors), its attention through flash (16-bit inputs). A mixture of experts runs its
experts grouped by expert, as transformers does on a CUDA board (:mod:`~resacct.account.gpu.tracing.cuda_experts`).

The calibration line names the committed record of the board (``docs/gpu/``), else "datasheet only".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: an answer read back from the trace cache renders without torch
    import torch
    from torch import nn

from resacct.account.gpu.records.recorded import RECORDS_BY_FAMILY
from resacct.errors import ResacctError

__all__ = ["GpuStepAnswer", "gpu_step_answer", "calibration_text", "reductions_text", "hf_gpu_text", "RECORDS_BY_FAMILY", "sdpa_kernel_for", "attention_label", "under_cuda_autocast"]



@dataclass(frozen=True)
class GpuStepAnswer:
    """Predicted CUDA peaks of one step on ``board`` (None with ``gap``: why there is no number)."""

    board: str
    allocated_bytes: int | None
    reserved_bytes: int | None
    attention: str | None
    calibration: str
    gap: str | None = None
    step_sec: float | None = None  # the predicted step time (per-op roofline), where the command has a step
    step_time_basis: str | None = None  # how it was predicted (or why there is no step), in one line (--json, notes)
    step_time_detail: tuple[str, ...] = ()  # the lines printed under the time (board_rates.step_seconds); the basis joins them
    mfu: float | None = None  # the step's FLOPs ÷ its predicted time ÷ the board's datasheet peak in the step's format
    workspaces: Any = None  # the LibraryWorkspaces (cuBLAS/cuBLASLt) in the peaks, from PyTorch's source
    experts: str | None = None  # how a mixture of experts' experts ran (grouped, as on a CUDA board: cuda_experts.py); None: no experts switched
    timed: str = "step"  # what step_sec times: a training "step", or the "prefill" of infer
    decode_sec_per_token: float | None = None  # infer: one generated token's predicted time (decode_basis says how)
    decode_basis: str | None = None
    decode_detail: tuple[str, ...] = ()  # the lines printed under the decode time; decode_basis joins them
    decode_recorded: str | None = None  # infer: what the board's record measured of served models' tokens (recorded_serving)
    reductions: str | None = None  # what sizes the reduction kernels' staging in the peaks, or why it is not predicted (reductions_text)

    def lines(self, bytes_text: Callable[[float], str]) -> list[str]:
        """The lines a command prints beside its answer."""
        if self.gap is not None:
            return [f"on {self.board} (CUDA caching allocator): no prediction — {self.gap}"]
        assert self.allocated_bytes is not None and self.reserved_bytes is not None
        return [f"on {self.board} (CUDA caching allocator, predicted): allocated peak {bytes_text(self.allocated_bytes)}, "
                f"reserved peak {bytes_text(self.reserved_bytes)} (max_memory_allocated / max_memory_reserved; attention: {self.attention})",
                f"  calibrated by: {self.calibration}"] + (self.workspaces.lines() if self.workspaces is not None else []) + (
                    [f"  reduction kernels' staging: {self.reductions}"] if self.reductions is not None else []) + (
                    [f"  experts: {self.experts}"] if self.experts is not None else []) + self._time_lines()

    def _time_lines(self) -> list[str]:
        if self.step_sec is None:
            return [] if self.step_time_basis is None else [f"  {self.timed} time: none ({self.step_time_basis})"]
        mfu = "" if self.mfu is None else f", MFU {self.mfu:.2f}"
        decode = [] if self.decode_sec_per_token is None else [
            f"  decode there (predicted): {self.decode_sec_per_token * 1e3:.4g} ms a token"
            + (f" ({self.decode_basis})" if not self.decode_detail else ""), *(f"    {line}" for line in self.decode_detail)] + (
            [] if self.decode_recorded is None else [f"  decode {self.decode_recorded}"])
        if self.step_time_detail:
            return [f"  {self.timed} time there (predicted): {self.step_sec * 1e3:.4g} ms{mfu}", *(f"    {line}" for line in self.step_time_detail), *decode]
        return [f"  {self.timed} time there (predicted): {self.step_sec * 1e3:.4g} ms{mfu} ({self.step_time_basis})", *decode]

    def to_dict(self) -> dict[str, Any]:
        return {"board": self.board, "predicted_allocated_peak_bytes": self.allocated_bytes, "predicted_reserved_peak_bytes": self.reserved_bytes,
                "attention": self.attention, "calibration": self.calibration, "gap": self.gap,
                "timed": self.timed, "predicted_step_sec": self.step_sec, "step_time_basis": self.step_time_basis,
                "step_time_detail": list(self.step_time_detail), "predicted_mfu": self.mfu,
                "predicted_decode_sec_per_token": self.decode_sec_per_token, "decode_basis": self.decode_basis,
                "decode_detail": list(self.decode_detail), "decode_recorded": self.decode_recorded,
                "library_workspace_bytes": None if self.workspaces is None else self.workspaces.total_bytes,
                "library_workspaces": None if self.workspaces is None else [{"what": what, "bytes": size} for what, size in self.workspaces.blocks],
                "experts": self.experts, "reductions": self.reductions}


def reductions_text(board: Any) -> str:
    """What sizes the staging buffers ``board``'s reduction kernels take (a bias gradient's sum over many rows:
    :mod:`~resacct.account.gpu.tracing.cuda_scratch`), in the peaks; or, where the datasheet lacks what sizes them, that they are
    not predicted and why."""
    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard, reduction_gap

    reductions = ReductionBoard.of(board)
    if reductions is None:
        return f"not in the peaks above ({reduction_gap(board)}): a sum over many rows stages partial sums the allocator does not see here"
    return f"in the peaks above, sized by {reductions.text()} (where the count was read: resacct devices {board.name})"


def calibration_text(board: Any) -> str:
    """What calibrates the allocator model on ``board`` (an :class:`~resacct.facts.hardware.Accelerator`): its newest
    committed record (:func:`~resacct.account.gpu.records.board_record.board_ceilings`; its steps replayed and predicted by the
    recorded claims of ``resacct verify``), else round three's H100 record, else the datasheet."""
    from resacct.account.gpu.records.board_record import board_ceilings

    measured = board_ceilings(board)
    if measured is not None:
        return (f"allocator model of c10 CUDACachingAllocator; record {measured.record_file} ({measured.cuda_name}, {measured.when[:10]}, "
                f"{measured.steps_recorded} steps): `resacct verify --area gpu_recorded` replays and predicts each")
    record = RECORDS_BY_FAMILY.get(board.name)
    if record is None:
        return f"allocator model of c10 CUDACachingAllocator; no record for this board ({board.name}): datasheet only"
    return f"allocator model of c10 CUDACachingAllocator; verified against record {record[0]} ({record[1]})"


def sdpa_kernel_for(board: Any, dtype: torch.dtype) -> str | None:
    """The fused kernel sdpa picks on ``board`` for ``dtype`` inputs (PyTorch's ``sdp_utils.cpp``): flash for float16
    and bfloat16 on Ampere and later (flash needs sm80), else the memory-efficient one — which before sm80 (a V100
    is sm70) takes float16 and float32 only: bfloat16 there runs sdpa's math path (None: no fused kernel)."""
    import torch

    from resacct.account.gpu.allocator.library_workspaces import capability_major

    ampere_or_later = (capability_major(board) or 0) >= 8
    if dtype in (torch.float16, torch.bfloat16) and ampere_or_later:
        return "flash"
    if dtype == torch.bfloat16 and not ampere_or_later:
        return None
    return "efficient"


def attention_label(traced: str, kernel: str | None) -> str:
    """What ran as attention on the board: ``traced`` (the CUDA step's label), named for what it is where no fused
    kernel was chosen (``kernel`` None) and sdpa ran its math path on meta tensors — the board's path too."""
    if kernel is None and traced.startswith("sdpa's choice"):
        return "math (sdpa: no fused kernel for this dtype on this board)"
    return traced


def _attention_for(model: nn.Module, dtype: torch.dtype, board: Any) -> str | None:
    """The kernel sdpa picks on ``board`` (:func:`sdpa_kernel_for`); None for a model whose attention does not
    go through sdpa (eager), or where sdpa runs its math path."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation not in (None, "sdpa"):
        return None
    return sdpa_kernel_for(board, dtype)


def gpu_step_answer(model: nn.Module, inputs: Any, loss_fn: Callable[[nn.Module, Any], Any], *, recipe: Any, optimizer: str,
                    board: Any, timed: bool = False) -> GpuStepAnswer:
    """The CUDA allocated and reserved peaks of ``recipe``'s step of ``model`` on ``board`` (the
    model on the meta device or the CPU; nothing allocated), or the one-line reason there is none;
    ``timed``: and the step time, from the aten ops of the same pass
    (:func:`~resacct.account.gpu.timing.board_rates.with_step_time`: the matmuls in the recipe's compute format)."""
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
    from resacct.account.gpu.allocator.library_workspaces import capability_major, step_workspaces
    from resacct.account.peak.recipes import recipe_step

    calibration = calibration_text(board)
    try:
        step = recipe_step(recipe, model, inputs, loss_fn, optimizer)
    except ResacctError as error:
        return GpuStepAnswer(board.name, None, None, None, calibration, gap=str(error))
    autocast_dtype = None
    if recipe.uses_autocast:  # CUDA autocast's casts applied on meta tensors (cuda_autocast.CudaAutocast), not torch.autocast("meta")
        from resacct.facts.dtypes import parse_dtype

        autocast_dtype = parse_dtype(recipe.computes_in)
        step = replace(step, loss_fn=under_cuda_autocast(loss_fn, autocast_dtype))
    import torch

    dtype = autocast_dtype if autocast_dtype is not None else next((p.dtype for p in step.model.parameters()), torch.float32)
    attention = _attention_for(step.model, dtype, board)
    workspaces = step_workspaces(step.model, board=board, backward=True) if capability_major(board) is not None else None
    library = workspaces.sizes if workspaces is not None else ()
    from resacct.account.gpu.tracing.cuda_experts import experts_as_on_cuda
    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard

    reductions = ReductionBoard.of(board)
    ops: list[Any] | None = [] if timed else None
    with experts_as_on_cuda(step.model) as experts:  # grouped_mm, as transformers runs them on the board; batched_mm again after
        try:
            predicted = predict_cuda_step_memory(step.model, step.inputs, step.loss_fn, step.make_optimizer, attention=attention, workspaces=library,
                                                 ops=ops, capability=board.compute_capability, reductions=reductions)
        except ResacctError as error:
            if attention != "flash" or "mask" not in str(error):
                if "never called F.scaled_dot_product_attention" not in str(error):
                    raise
                attention = None
            else:
                attention = "efficient"  # a mask: sdpa's efficient kernel takes it, flash does not
            ops = [] if timed else None  # the first pass's ops go with it
            predicted = predict_cuda_step_memory(step.model, step.inputs, step.loss_fn, step.make_optimizer, attention=attention, workspaces=library,
                                                 ops=ops, capability=board.compute_capability, reductions=reductions)
    answer = GpuStepAnswer(board.name, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes, attention_label(predicted.attention, attention),
                           calibration, workspaces=workspaces, experts=experts, reductions=reductions_text(board))
    if ops is None:
        return answer
    from resacct.account.gpu.timing.board_rates import with_step_time
    from resacct.facts.hardware import peak_format

    return with_step_time(answer, ops, board, peak_format(recipe.computes_in))


def under_cuda_autocast(loss_fn: Callable[[nn.Module, Any], Any], dtype: Any) -> Callable[[nn.Module, Any], Any]:
    """``loss_fn`` (forward and loss) under CUDA autocast's casts, as ``torch.autocast("cuda", dtype)`` would run it."""
    from resacct.account.gpu.tracing.cuda_autocast import CudaAutocast

    def loss(module: nn.Module, batch: Any) -> Any:
        with CudaAutocast(dtype):
            return loss_fn(module, batch)

    return loss


def hf_gpu_text(account: Any, config: str, device: str, bytes_text: Callable[[float], str]) -> str:
    """``resacct account --hf-config X --device BOARD``: the lines printed under the account (the
    model rebuilt on meta, its step traced as CUDA runs it), the answer added to its notes and kept as its ``gpu`` (``--json``)."""
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
    from resacct.facts.hardware import get_accelerator

    board = get_accelerator(device)
    model = build_hf_model(load_hf_config(config), device="meta")
    model.train()
    inputs = default_inputs(model, batch=account.batch, seq=account.seq, device="meta")
    answer = gpu_step_answer(model, inputs, lambda module, batch: loss_of_output(call_model(module, batch), "model"),
                             recipe=account.recipe, optimizer=account.optimizer, board=board, timed=True)
    account.gpu = answer.to_dict()  # --json: the answer whole (the text prints its lines, not a note repeating them)
    return "\n" + "\n".join(answer.lines(bytes_text))


def board_step_function(target: Any, *, searched: str, board: Any, recipe: Any, optimizer: str) -> Callable[[int, Any], GpuStepAnswer]:
    """``step_at(size, fixed)``: the :class:`GpuStepAnswer` (peaks and step time) of ``target``'s step on ``board`` with
    ``searched`` (``batch`` or ``seq``) = size, the other size ``fixed`` — the model copied once into the recipe's dtype."""
    from resacct.account.peak.recipes import model_in_dtype
    from resacct.facts.dtypes import parse_dtype
    from resacct.facts.recipes import get_recipe

    chosen = get_recipe(recipe)
    model = model_in_dtype(target.model, parse_dtype(chosen.parameter_dtype))  # a copy in the recipe's dtype: the caller's target keeps its own
    loss_fn = target.loss_fn()

    def step_at(size: int, fixed: Any) -> GpuStepAnswer:
        inputs = target.make_inputs(size, fixed) if searched == "batch" else target.make_inputs(fixed, size)
        return gpu_step_answer(model, inputs, loss_fn, recipe=chosen, optimizer=optimizer, board=board, timed=True)

    return step_at


def fit_gpu_answer(answer: Any, target: Any, *, board: Any, recipe: Any, optimizer: str, max_traces: int = 6,
                   step_at: Callable[[int, Any], GpuStepAnswer] | None = None, traced: dict[tuple[int, Any], GpuStepAnswer] | None = None) -> dict[str, Any]:
    """``resacct fit --device BOARD``: the CUDA peaks at the fit's answer (``answer``, a
    :class:`~resacct.account.fit.search.FitAnswer` of ``target``), judged by the **reserved** peak
    against the budget — what a GPU runs out of. The batch (or sequence length) is searched again on the
    board's step (:func:`~resacct.account.gpu.answers.reserved_search.largest_by_reserved`, from the CPU kernels'
    answer, up or down: a board's flash attention may hold far less than the CPU's math path), at most
    ``max_traces`` steps traced. Returns ``gpu`` (the :class:`GpuStepAnswer` at the size kept: the largest
    that fits, else the smallest traced, with its step time), ``largest`` (the size whose reserved peak fits; None: none found
    or no prediction), ``traces``, ``size`` and ``search`` (the :class:`~resacct.account.gpu.answers.reserved_search.ReservedSearch`;
    None where the first step has no prediction). ``step_at``: :func:`board_step_function`'s (made here when not given);
    ``traced``: answers already traced by ``(size, fixed)`` (beside the CPU search: :mod:`resacct.account.gpu.answers.traced_beside`)."""
    board_step = step_at or board_step_function(target, searched=answer.searched, board=board, recipe=recipe, optimizer=optimizer)
    ready = traced or {}

    def at(size: int) -> GpuStepAnswer:
        known = ready.get((size, answer.fixed))
        return known if known is not None else board_step(size, answer.fixed)

    return _largest_on_the_board(answer, at, max_traces)


def _largest_on_the_board(answer: Any, step_at: Callable[[int], GpuStepAnswer], max_traces: int) -> dict[str, Any]:
    """:func:`fit_gpu_answer`'s search: the board's largest batch (or sequence length) by its reserved peak, at most
    ``answer.limit`` (``--max-batch``, or the context length)."""
    from resacct.account.gpu.answers.reserved_search import largest_by_reserved

    steps: dict[int, GpuStepAnswer] = {}

    def reserved_at(size: int) -> int | None:
        steps[size] = step_at(size)
        return steps[size].reserved_bytes

    search = largest_by_reserved(reserved_at, answer.largest or 0, answer.budget_bytes, max_traces=max_traces, limit=answer.limit,
                                 what=answer.searched)
    if search is None:  # no prediction at the first size: its gap is the answer
        first = next(iter(steps))
        return {"gpu": steps[first], "largest": None, "traces": len(steps), "size": first, "search": None}
    size = search.largest if search.largest else min(steps)
    return {"gpu": steps[size], "largest": search.largest or None, "traces": len(steps), "size": size, "search": search}


def fit_gpu_lines(found: dict[str, Any], answer: Any, bytes_text: Callable[[float], str]) -> list[str]:
    """The lines ``resacct fit --device BOARD`` prints under its answer."""
    gpu = found["gpu"]
    if gpu is None:
        return []
    lines = gpu.lines(bytes_text)
    lines[0] = f"  {answer.searched} {found['size']:,} " + lines[0]
    if gpu.reserved_bytes is None:
        return lines
    return lines if found["search"] is None else [*lines, "  " + found["search"].line(bytes_text)]


def fit_gpu_headline(found: dict[str, Any], board_name: str, bytes_text: Callable[[float], str]) -> str | None:
    """The line ``resacct fit --device BOARD`` puts first: the board's answer (:meth:`ReservedSearch.headline`), ahead of the CPU
    kernels' search that the lines below give first. None where the board's search has no answer (its step could not be predicted)."""
    search = found.get("search") if found.get("gpu") is not None else None
    if search is None:
        return None
    return search.headline(board_name, bytes_text, noun="micro-batch" if search.what == "batch" else "sequence length")


def fit_gpu_fields(found: dict[str, Any]) -> dict[str, Any] | None:
    """``--json``'s ``gpu``: the CUDA answer and the reserved-peak fit."""
    gpu = found["gpu"]
    search = found.get("search")
    return None if gpu is None else {**gpu.to_dict(), "size": found["size"], "largest_by_reserved_peak": found["largest"], "traces": found["traces"],
                                     **({} if search is None else {f"largest_{search.what}_by_reserved": search.to_dict()})}
