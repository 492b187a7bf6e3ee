"""``lora`` and ``infer`` with ``--device BOARD`` (no GPU present): the CUDA caching allocator's
predicted allocated and reserved peaks on that board, the step time where the command has a step,
and what calibrates them (the board's committed record, else its datasheet).

- **lora**: the peft LoRA step of :mod:`resacct.account.trace.lora_step` (forward, backward, AdamW over
  the adapters, ``zero_grad``) traced on meta tensors by
  :func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory` with CUDA's kernel choices (flash
  attention for a 16-bit base, the efficient kernel for float32; foreach AdamW), and its per-op
  roofline time (:mod:`resacct.account.gpu.timing.step_time`).
- **infer**: the model's weights loaded in their format, then the prefill of ``batch`` × ``context``
  tokens as ``generate`` runs it (``use_cache=True``, the logits of the last position only, no
  gradients), the KV cache kept: its peaks, the prefill's per-op roofline time and one generated token's
  (:func:`~resacct.account.gpu.timing.step_time.predict_decode_seconds` over the next token's forward, traced on meta by
  :func:`~resacct.account.gpu.tracing.decode_trace.trace_decode_ops`). The GPU recorder serves its models through
  :func:`prefill_model` too (``tools/gpu_record_serve.py``), so a board's record checks this very prediction.

Both add the cuBLAS/cuBLASLt workspaces of :mod:`resacct.account.gpu.allocator.library_workspaces` (from PyTorch's
source, confirmed on an H200 for sm90; one line says which): LoRA's step two cuBLAS ones (forward and autograd's
backward thread), the prefill one. A mixture of experts runs its experts grouped by expert, as transformers
does on a CUDA board (:mod:`resacct.account.gpu.tracing.cuda_experts`); one line says so.

A board outside NVIDIA's CUDA families (TPU, Gaudi, AMD Instinct) gets no number: the CUDA caching
allocator is not what runs there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from resacct.account.gpu.timing.board_rates import board_rates, with_decode_time, with_step_time
from resacct.account.gpu.tracing.cuda_experts import group_experts, grouped_experts
from resacct.account.gpu.answers.device_answer import GpuStepAnswer, attention_label, calibration_text, reductions_text, sdpa_kernel_for
from resacct.account.gpu.allocator.library_workspaces import capability_major
from resacct.errors import ResacctError

__all__ = ["CUDA_FAMILIES", "SERVED_FORMATS", "cuda_board_gap", "board_rates", "lora_gpu_answer", "infer_gpu_answer", "prefill_model", "predict_prefill",
           "weight_bytes", "sdpa_kernel_for", "kv_prefill", "grouped_experts"]

#: The datasheet table's families whose boards run PyTorch's CUDA caching allocator.
CUDA_FAMILIES = ("volta", "ampere", "ada", "hopper", "blackwell")


def cuda_board_gap(board: Any) -> str | None:
    """Why ``board`` gets no CUDA allocator prediction (None: it runs the CUDA caching allocator)."""
    if board.family in CUDA_FAMILIES:
        return None
    return (f"{board.name} ({board.family}) does not run PyTorch's CUDA caching allocator; expected an NVIDIA board "
            f"({', '.join(CUDA_FAMILIES)}): its memory is the datasheet's only")


_LORA_TRACES: dict[tuple, tuple[Any, list | None, Any, str | None, tuple]] = {}  # the last LoRA steps traced: (CUDA prediction, ops (None: not yet), workspaces, experts, (model, inputs))
_LORA_TRACES_KEPT = 4
# AssertionError: torch's own checks (torch 2.6's FlopCounterMode asserts equal heads for sdpa: Falcon's broadcast key/value
# head failed `infer --device` with a traceback there)
_UNTRACEABLE = (ResacctError, RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError, AssertionError)


def _why(error: BaseException, what: str) -> str:
    """One line: why ``what`` has no GPU answer — a known limit of this torch named (its FLOP counter's bare assert on
    grouped-query attention in 2.8 and 2.9 said nothing: "AssertionError: "), else the error's first line."""
    from resacct.measurement.torch_limits import torch_limitation

    first = (str(error).strip().splitlines() or [""])[0][:200]
    if isinstance(error, ResacctError):
        return first
    if (limit := torch_limitation(error)) is not None:
        return f"{what} could not be traced on meta tensors: {limit}"
    return f"{what} could not be traced on meta tensors ({type(error).__name__}: {first})"


def _predict(model: Any, inputs: Any, loss_fn: Any, make_optimizer: Any, kernel: str | None, workspaces: tuple[int, ...] = (),
             ops: list | None = None, capability: tuple[int, int] | None = None, reductions: Any = None) -> Any:
    """:func:`predict_cuda_step_memory` with sdpa routed to ``kernel`` (None: its math path); a mask moves flash to the
    efficient kernel (flash takes none), a model that never calls sdpa runs as it is. ``workspaces``: the cuBLAS
    workspaces' bytes (:mod:`~resacct.account.gpu.allocator.library_workspaces`), kept from the step's start. ``ops``:
    a list that receives the step's aten ops with their FLOPs and bytes from this same pass — attention as
    the board runs it, the step time's input (only the attempt that succeeded fills it). ``reductions``: the board's
    :class:`~resacct.account.gpu.tracing.cuda_scratch.ReductionBoard` (None: reductions' staging not predicted)."""
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory

    def attempt(attention: str | None) -> Any:
        collected: list | None = None if ops is None else []
        prediction = predict_cuda_step_memory(model, inputs, loss_fn, make_optimizer, attention=attention, workspaces=workspaces, ops=collected,
                                              capability=capability, reductions=reductions)
        if ops is not None and collected is not None:
            ops[:] = collected
        return prediction

    try:
        return attempt(kernel)
    except ResacctError as error:
        if "never called F.scaled_dot_product_attention" in str(error):
            return attempt(None)
        if "mask" in str(error) and kernel == "flash":
            return attempt("efficient")
        raise


def _reduction_board(board: Any) -> Any:
    """:meth:`~resacct.account.gpu.tracing.cuda_scratch.ReductionBoard.of` ``board`` (imported here: this module loads without torch)."""
    from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard

    return ReductionBoard.of(board)


def _unavailable(board: Any, gap: str) -> GpuStepAnswer:
    return GpuStepAnswer(board.name, None, None, None, calibration_text(board), gap=gap)


def lora_gpu_answer(config: Any, *, rank: int, targets: tuple[str, ...], base: str, batch: int, seq: int, dropout: float,
                    gradient_checkpointing: bool, board: Any, timed: bool = True) -> GpuStepAnswer:
    """The LoRA step of ``config``'s model on ``board``: CUDA allocated and reserved peaks, and the step time
    (``timed``) from the ops of the same pass — attention as the board runs it (flash for a 16-bit base on
    Ampere and later), as its peaks have it; left out where only the peaks are asked (a batch search)."""
    from resacct.account.trace.lora_step import TRACED_BASES, adamw_over, build_lora_model, lora_loss, lora_step_inputs

    gap = cuda_board_gap(board)
    if gap is None and base not in TRACED_BASES:
        gap = f"a {base} base runs bitsandbytes' kernels, which meta tensors cannot run"
    if gap is None and gradient_checkpointing:
        gap = "gradient checkpointing's recomputation calls .item(), which meta tensors refuse"
    if gap is not None:
        return _unavailable(board, gap)
    from resacct.account.gpu.allocator.library_workspaces import step_workspaces

    from resacct.facts.dtypes import parse_dtype

    kernel = sdpa_kernel_for(board, parse_dtype(base))
    key = (config.to_json_string() if hasattr(config, "to_json_string") else repr(config), rank, targets, base, batch, seq, dropout, kernel,
           board.compute_capability or capability_major(board), _reduction_board(board))
    try:
        if key not in _LORA_TRACES:  # the trace does not depend on the board beyond its sdpa kernel: once per process
            model = build_lora_model(config, rank=rank, targets=targets, base=base, dropout=dropout)
            model.train()
            experts = group_experts(model)  # a model of its own: its experts as the board runs them, for the peaks and the step time
            inputs = lora_step_inputs(config, batch=batch, seq=seq)
            workspaces = step_workspaces(model, board=board, backward=True)
            while len(_LORA_TRACES) >= _LORA_TRACES_KEPT:  # the oldest goes: a batch search traces a few batches of one step
                del _LORA_TRACES[next(iter(_LORA_TRACES))]
            traced_ops: list | None = [] if timed else None
            _LORA_TRACES[key] = (_predict(model, inputs, lora_loss, adamw_over, kernel, workspaces.sizes, ops=traced_ops,
                                          capability=board.compute_capability, reductions=_reduction_board(board)),
                                 traced_ops, workspaces, experts, (model, inputs))
        predicted, ops, workspaces, experts, step = _LORA_TRACES[key]
        if timed and ops is None:  # traced for its peaks only before (a batch search): the same pass again, its ops kept
            ops = []
            _predict(*step, lora_loss, adamw_over, kernel, workspaces.sizes, ops=ops, capability=board.compute_capability,
                     reductions=_reduction_board(board))
            _LORA_TRACES[key] = (predicted, ops, workspaces, experts, step)
        answer = GpuStepAnswer(board.name, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes, attention_label(predicted.attention, kernel),
                               calibration_text(board), workspaces=workspaces, experts=experts, reductions=reductions_text(board))
        if not timed:
            return answer
    except _UNTRACEABLE as error:  # a model whose step meta tensors cannot run: one line, not a traceback
        return _unavailable(board, _why(error, "the LoRA step"))
    return with_step_time(answer, ops, board, base)


def infer_gpu_answer(config: Any, *, batch: int, context: int, weights: str, kv_format: str, board: Any,
                     kv_cache_bytes: int | None = None) -> GpuStepAnswer:
    """The serving peak of ``config`` (a shipped name, a config.json path or an
    :class:`~resacct.account.load.hf_models.HfConfigSpec`) on ``board``: weights in ``weights`` (bf16, fp16 or fp32),
    then the prefill of ``batch`` × ``context`` tokens with the KV cache kept (in the weights' dtype); the prefill's
    time from the ops of that pass, and — given the cache's bytes at the context — one generated token's
    (:func:`~resacct.account.gpu.timing.board_rates.with_decode_time`)."""
    from resacct.account.gpu.allocator.library_workspaces import step_workspaces
    from resacct.account.load.hf_models import load_hf_config

    gap = cuda_board_gap(board)
    if gap is None and weights not in SERVED_FORMATS:
        gap = f"{weights} weights run quantised kernels that meta tensors cannot run; expected bf16, fp16 or fp32 weights for a CUDA prediction"
    if gap is None and kv_format != weights:
        gap = f"a {kv_format} KV cache beside {weights} weights: transformers' cache keeps the model's dtype; expected --kv-format {weights}"
    if gap is not None:
        return _unavailable(board, gap)
    model, experts = prefill_model(load_hf_config(config), weights)
    workspaces = step_workspaces(model, board=board, backward=False)  # no backward: the forward thread's only
    ops: list[Any] = []
    try:
        kernel = sdpa_kernel_for(board, next(model.parameters()).dtype)
        predicted = predict_prefill(model, batch=batch, context=context, kernel=kernel, workspaces=workspaces.sizes, ops=ops,
                                    capability=board.compute_capability, reductions=_reduction_board(board))
    except _UNTRACEABLE as error:
        return _unavailable(board, _why(error, "the prefill"))
    answer = GpuStepAnswer(board.name, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes, attention_label(predicted.attention, kernel),
                           calibration_text(board), workspaces=workspaces, experts=experts, timed="prefill", reductions=reductions_text(board))
    answer = with_step_time(answer, ops, board, weights)
    if kv_cache_bytes is None or answer.step_sec is None:
        return answer
    from resacct.account.gpu.tracing.decode_trace import trace_decode_ops

    try:
        decode_ops = trace_decode_ops(model, batch=batch, context=context, kernel=kernel, capability=board.compute_capability)
    except _UNTRACEABLE as error:  # the prefill ran, the next token's forward did not: the prefill's answer, and why no decode
        return replace(answer, decode_basis=f"not predicted: {_why(error, 'the decode forward')}")
    return with_decode_time(answer, decode_ops, board, weights, read_bytes=weight_bytes(model) + kv_cache_bytes)


#: the weight formats a prefill is traced in (meta tensors run no quantised kernel)
SERVED_FORMATS = ("fp32", "bf16", "fp16")


def prefill_model(spec: Any, weights: str) -> tuple[Any, str | None]:
    """The model ``infer --device`` serves, built on meta from ``spec`` (an HfConfigSpec): its experts grouped as
    transformers runs them on a CUDA board, its weights in ``weights`` (one of :data:`SERVED_FORMATS`), in eval mode;
    and the line saying how its experts run (None: no experts). The GPU recorder builds its served models here too."""
    import torch

    from resacct.account.load.hf_models import build_hf_model

    if weights not in SERVED_FORMATS:
        raise ResacctError(f"weights {weights!r}: expected one of {', '.join(SERVED_FORMATS)}")
    model = build_hf_model(spec, device="meta")
    experts = group_experts(model)  # as transformers runs them on a CUDA board
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[weights])
    model.eval()
    return model, experts


def predict_prefill(model: Any, *, batch: int, context: int, kernel: str | None, workspaces: tuple[int, ...] = (), ops: list | None = None,
                    capability: tuple[int, int] | None = None, reductions: Any = None) -> Any:
    """The CUDA allocator's peaks of ``model``'s weights loaded, then the prefill of ``batch`` × ``context`` tokens as
    ``generate`` runs it (:func:`kv_prefill`), sdpa routed to ``kernel``; ``ops`` receives the prefill's aten ops."""
    import torch

    return _predict(model, torch.zeros(batch, context, dtype=torch.long), kv_prefill, None, kernel, workspaces, ops=ops, capability=capability,
                    reductions=reductions)


def weight_bytes(model: Any) -> int:
    """The bytes of ``model``'s parameters (each storage once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_prefill(module: Any, tokens: Any) -> Any:
    """``generate``'s first forward: ``use_cache=True``, the last position's logits only, no
    gradients; the output (its KV cache) kept alive to the end of the trace."""
    import torch

    with torch.no_grad():
        try:
            output = module(input_ids=tokens, use_cache=True, logits_to_keep=1)
        except TypeError:  # a model without logits_to_keep: every position's logits
            output = module(input_ids=tokens, use_cache=True)
    return _Kept(output)


class _Kept:
    """What the prefill returns: its output (the KV cache in it) stays alive to the end of the trace;
    ``backward()`` does nothing (there is no step)."""

    def __init__(self, output: Any) -> None:
        self.output = output

    def backward(self) -> None:
        return None
