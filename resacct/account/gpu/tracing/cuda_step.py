"""The CUDA step on any machine: one training step traced without a GPU, its allocations fed to
the caching allocator model — predicted ``max_memory_allocated`` and ``max_memory_reserved``.

:func:`predict_cuda_step_memory` runs the step on **meta tensors** (shapes and dtypes, no memory)
under :class:`~resacct.account.gpu.tracing.allocation_trace.AllocationRecorder`: every storage an op
makes is one allocation of the CUDA caching allocator model, its death one free — the order a
GPU would see them, from the model's parameters to the end of the step. Where a GPU's kernels
differ from what meta tensors would dispatch, it chooses the CUDA ones:

- attention: ``attention="flash"`` or ``"efficient"`` routes ``F.scaled_dot_product_attention``
  to ``aten._scaled_dot_product_flash_attention`` / ``_efficient_attention`` (their meta kernels
  give CUDA's outputs: the output, a float32 logsumexp, the RNG state), as ``sdpa_kernel`` would
  on a GPU; ``None`` leaves sdpa to pick (on meta tensors: the math path) — values of another head size than the
  queries' (DeepSeek's MLA) go to the efficient kernel, as sdpa sends them on a GPU (flash needs one);
- the optimizer: where it leaves ``foreach`` to torch, it gets the foreach implementation, CUDA's
  default (``_default_to_fused_or_foreach``; meta tensors would get the for-loop): the foreach
  kernels' temporaries. :func:`cuda_adamw`, the default, is ``torch.optim.AdamW(lr=1e-3, foreach=True)``.

Why meta and not ``FakeTensorMode`` with ``device="cuda"``: on this CPU-only torch (2.13.0+cpu)
fake cuda tensors are made, but C++ paths that take a CUDA device guard (``tensor[:, :-1]``,
``F.linear``) fail or abort the process ("PyTorch is not linked with support for cuda devices").

Not seen by the trace: cuBLAS/cuBLASLt workspaces (allocated by a thread's first matmul on a stream,
kept) — ``workspaces=`` adds them as :mod:`~resacct.account.gpu.allocator.library_workspaces` reads them from
PyTorch's source (confirmed on an H200 for sm90) — and CUDA's context and NCCL, which the record shows.

Measured against a real board (tests/test_cuda_step.py): the H100 record's
``gpu-step-peak-predicted`` (gpt-tiny, float32, batch 8 × 128, forward + backward) measured
56,240,128 bytes above the parameters; this prediction gives the same, to the byte.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, no_type_check

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
from resacct.account.gpu.allocator.cuda_allocator import AllocatorConfig
from resacct.account.gpu.tracing.cuda_composites import sdpa_math_region
from resacct.account.gpu.tracing.op_costs import OpCostCounter
from resacct.account.gpu.tracing.cuda_scratch import ReductionBoard
from resacct.errors import ResacctError
from resacct.measurement.memory_timeline import copy_inputs, make_optimizer_state, run_training_step

__all__ = ["CudaStepPrediction", "predict_cuda_step_memory", "cuda_adamw", "sdpa_routing", "ENGINE"]

ENGINE = "resacct's allocation recorder over meta tensors, fed to its model of the CUDA caching allocator"
LossFn = Callable[[nn.Module, Any], torch.Tensor]


def cuda_adamw(parameters: Any) -> torch.optim.Optimizer:
    """AdamW as it runs on CUDA by default: the foreach implementation."""
    return torch.optim.AdamW(parameters, lr=1e-3, foreach=True)


@dataclass(frozen=True)
class CudaStepPrediction:
    """Predicted allocator stats of one step: the peaks (``max_memory_*`` after
    ``reset_peak_memory_stats`` at the step's start), what was allocated and reserved at its
    start, the block sizes live at the allocated peak (largest first), the segments at the end."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_requested_bytes: int  # the most bytes the step's tensors asked for at once, before the allocator's rounding
    start_allocated_bytes: int
    start_reserved_bytes: int
    live_at_peak_bytes: list[int]
    segments: list[dict]
    attention: str
    engine: str = ENGINE

    @property
    def peak_above_start_bytes(self) -> int:
        return self.peak_allocated_bytes - self.start_allocated_bytes


#: the boards whose flash kernel has no backward for a head size in (192, 224], nor above 224 with dropout (sm86, sm89: A10, L4,
#: RTX 4090; sm120/121: consumer Blackwell) — PyTorch's sdp_utils.cpp, check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
_FLASH_TRAINING_LIMITED = ((8, 6), (8, 9), (12, 0), (12, 1))
FLASH_MAX_HEAD_DIM = 256  # sdp_utils.cpp, check_head_dim_size_flash


def _flash_as_sdpa_calls_it(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float, causal: bool,
                            scale: float | None) -> torch.Tensor:
    """CUDA's flash kernel as sdpa calls it on a GPU (attention.cpp, ``pad_last_dim<8>``): a head size that is not a multiple
    of 8 padded with zeros — a copy of each of query, key and value — the scale taken from the unpadded size, and the output
    sliced back (a view that keeps the padded output's block)."""
    sizes = (query.shape[-1], key.shape[-1], value.shape[-1])
    if all(size % 8 == 0 for size in sizes):
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout, causal, False, scale=scale)[0]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    query, key, value = (torch.nn.functional.pad(tensor, (0, -tensor.shape[-1] % 8)) for tensor in (query, key, value))
    out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout, causal, False, scale=scale)[0]
    return out[..., :sizes[2]]


def flash_refusal(head_dim: int, value_head_dim: int, *, training: bool, dropout: float, capability: tuple[int, int] | None) -> str | None:
    """Why sdpa would not run CUDA's flash kernel for this call (None: it would): the head sizes of the query and the value
    differ, the head size is over 256, or — training, on sm86/89/120/121 — it lies in (192, 224], or over 224 with dropout.
    sdpa then takes the memory-efficient kernel.

    >>> flash_refusal(128, 128, training=True, dropout=0.0, capability=(8, 6)) is None
    True
    >>> flash_refusal(256, 256, training=True, dropout=0.1, capability=(8, 9))
    'head_dim 256 > 224 with dropout, training on sm89'
    >>> flash_refusal(256, 256, training=True, dropout=0.1, capability=(9, 0)) is None
    True
    """
    if value_head_dim != head_dim:
        return f"query head_dim {head_dim} != value head_dim {value_head_dim}"
    if head_dim > FLASH_MAX_HEAD_DIM:
        return f"head_dim {head_dim} > {FLASH_MAX_HEAD_DIM}"
    if training and capability in _FLASH_TRAINING_LIMITED:
        where = f"training on sm{capability[0]}{capability[1]}"
        if 192 < head_dim <= 224:
            return f"head_dim {head_dim} in (192, 224], {where}"
        if head_dim > 224 and dropout > 0:
            return f"head_dim {head_dim} > 224 with dropout, {where}"
    return None


#: what ran where every sdpa call was grouped-query attention the memory-efficient kernel refused
GQA_MATH_LABEL = "math (grouped-query attention: the memory-efficient kernel refuses it, sdpa falls to its math path)"


class _CudaAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` → the CUDA kernel sdpa would choose: ``kernel``, or the memory-efficient
    one where flash refuses the call on a board of compute ``capability`` (:func:`flash_refusal`; ``refused`` says why).
    Grouped-query attention (``enable_gqa``, fewer key/value heads): flash takes the key/value heads as they are; the
    memory-efficient kernel refuses it (an H200 with torch 2.11: "No available kernel"), so sdpa's own choice falls to its
    math path (the heads repeated), and a ``forced`` kernel (``sdpa_kernel(...)``, as the recorder forces it) is an error."""

    def __init__(self, kernel: str, capability: tuple[int, int] | None = None, *, forced: bool = False) -> None:
        super().__init__()
        self.kernel = kernel
        self.capability = capability
        self.forced = forced
        self.calls = 0
        self.math_calls = 0  # grouped-query calls the memory-efficient kernel refuses: sdpa's math path
        self.refused: list[str] = []

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        given = dict(zip(names, args)) | kwargs
        query, key, value = given["query"], given["key"], given["value"]
        mask, dropout, causal, scale = given.get("attn_mask"), given.get("dropout_p", 0.0), given.get("is_causal", False), given.get("scale")
        grouped = bool(given.get("enable_gqa")) and key.shape[-3] != query.shape[-3]
        self.calls += 1
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        refusal = None if self.kernel != "flash" else flash_refusal(query.shape[-1], value.shape[-1], training=grad, dropout=dropout,
                                                                    capability=self.capability)
        if self.forced and refusal is not None:
            raise ResacctError(f"attention forced to CUDA's flash kernel, which refuses this call ({refusal}): sdpa_kernel would find "
                               "no available kernel; expected attention='efficient' or sdpa's own choice")
        if grouped and (self.kernel != "flash" or refusal is not None):
            why = (f"grouped-query attention ({query.shape[-3]} query heads, {key.shape[-3]} key/value heads, enable_gqa=True) on CUDA's "
                   "memory-efficient kernel, which refuses it ('No available kernel' on an H200 with torch 2.11, docs/gpu.md)")
            if self.forced:
                raise ResacctError(f"{why}; expected attention='flash' (it takes the key/value heads as they are) or 'math'")
            self.math_calls += 1
            with sdpa_math_region(query):
                return func(*args, **kwargs)  # sdpa's next choice: its math path, the key/value heads repeated
        if refusal is not None:
            self.refused.append(refusal)
        if self.kernel == "flash" and refusal is None:
            if mask is not None:
                raise ResacctError("attention='flash' with an attention mask: CUDA's flash kernel takes none; expected attention='efficient' or None")
            try:
                return _flash_as_sdpa_calls_it(query, key, value, dropout, causal, scale)
            except NotImplementedError as error:  # torch 2.4 registers no meta kernel for it
                if query.device.type != "meta":
                    raise
                raise ResacctError(f"torch {torch.__version__} cannot trace CUDA's flash attention kernel on meta tensors "
                                   f"({str(error).splitlines()[0][:120]}); expected a torch with its meta kernel (2.8 has it)") from None
        return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, mask, grad, dropout, causal, scale=scale)[0]

    def label(self) -> str:
        """The kernel the step ran, and where flash refused calls, how many and why; the calls that fell to sdpa's math path."""
        if self.calls and self.math_calls == self.calls:
            return GQA_MATH_LABEL
        label = self.kernel
        if self.refused:
            label += f"; efficient for {len(self.refused)} of {self.calls} calls (flash refuses {'; '.join(sorted(set(self.refused)))})"
        if self.math_calls:
            label += (f"; math for {self.math_calls} of {self.calls} calls (grouped-query attention: the memory-efficient kernel "
                      "refuses it, sdpa falls to its math path)")
        return label


def _as_on_cuda(optimizer: torch.optim.Optimizer) -> None:
    """Where an optimizer leaves ``foreach`` to torch (None), CUDA tensors get the foreach
    implementation (``_default_to_fused_or_foreach``) and meta tensors the for-loop: choose CUDA's.
    A master-weights optimizer's inner one (``.inner``) too."""
    for each in (optimizer, getattr(optimizer, "inner", None)):
        if isinstance(each, torch.optim.Optimizer):
            for group in each.param_groups:
                if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                    group["foreach"] = True


def _meta_copy(model: nn.Module) -> nn.Module:
    """``model`` with every parameter, buffer and tensor attribute on the meta device (ties kept, nothing copied)."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        tensors = [*module._parameters.values(), *module._buffers.values(),
                   *(value for value in vars(module).values() if isinstance(value, torch.Tensor))]
        for tensor in tensors:
            if tensor is not None and id(tensor) not in memo:
                made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
                memo[id(tensor)] = nn.Parameter(made, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else made
    return copy.deepcopy(model, memo)


def predict_cuda_step_memory(model: nn.Module, inputs: Any, loss_fn: LossFn, make_optimizer: Callable[[Any], torch.optim.Optimizer] | None = cuda_adamw,
                             *, attention: str | None = None, config: AllocatorConfig | None = None,
                             workspaces: tuple[int, ...] = (), ops: list[Any] | None = None,
                             capability: tuple[int, int] | None = None, reductions: ReductionBoard | None = None) -> CudaStepPrediction:
    """Predict the CUDA caching allocator's peaks over one steady training step of ``model``
    (on the CPU or the meta device) on ``inputs`` (a tensor, tuple or mapping), ``loss_fn(model,
    inputs)`` the loss: forward, backward, ``optimizer.step()``, ``zero_grad`` — the optimizer's
    state made first, as a second step finds it. ``make_optimizer=None``: forward and backward
    only, gradients starting at None. ``attention``: ``"flash"``, ``"efficient"`` or None
    (module docstring); ``config``: the allocator's settings (``expandable_segments`` …);
    ``workspaces``: library blocks (bytes) allocated once the parameters and inputs are on the board,
    before the optimizer's state, and kept — the cuBLAS workspaces of
    :func:`~resacct.account.gpu.allocator.library_workspaces.step_workspaces` (none by default: the record's peaks
    above the start did not see them). ``ops``: a list that receives every aten op of the step with
    its FLOPs and bytes, as :func:`~resacct.account.gpu.timing.step_time.trace_step_ops` traces them (the
    step time's input from this same pass: one trace of the step, not two; issue 34). ``capability``: the board's compute
    capability (major, minor), where flash refuses some calls (:func:`flash_refusal`: they run the efficient kernel).
    ``reductions``: the board's multiprocessors and threads (:meth:`ReductionBoard.of`), which size the staging buffer a
    reduction over many rows takes inside its kernel (None: not predicted; :mod:`~resacct.account.gpu.tracing.cuda_scratch`).

    >>> model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    >>> prediction = predict_cuda_step_memory(model, torch.randn(64, 512), lambda m, x: m(x).square().mean())
    >>> prediction.start_allocated_bytes, prediction.peak_allocated_bytes, prediction.peak_reserved_bytes
    (25327616, 42125312, 44040192)
    """
    if attention not in (None, "flash", "efficient"):
        raise ResacctError(f"attention {attention!r}: expected 'flash', 'efficient' or None (sdpa's own choice)")
    meta_model = _meta_copy(model)
    meta_inputs = copy_inputs(inputs, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"))
    recorder = AllocationRecorder(config, device="meta")
    recorder.reduction_board = reductions
    routing: _CudaAttention | _SdpaCalls = _CudaAttention(attention, capability) if attention else _SdpaCalls()
    with recorder:
        for tensor in [*meta_model.parameters(), *meta_model.buffers()]:
            recorder.track(tensor)  # loaded onto the GPU first, in the module's order
        for tensor in (meta_inputs.values() if isinstance(meta_inputs, dict) else meta_inputs if isinstance(meta_inputs, (tuple, list)) else [meta_inputs]):
            if isinstance(tensor, torch.Tensor):
                recorder.track(tensor)
        for index, size in enumerate(workspaces):  # the first step's first matmuls, before its optimizer.step()
            recorder.allocator.malloc(("library workspace", index), size)
        optimizer = None
        if make_optimizer is not None:
            optimizer = make_optimizer([p for p in meta_model.parameters() if p.requires_grad])
            _as_on_cuda(optimizer)
            make_optimizer_state(meta_model, optimizer)
        start_allocated, start_reserved = recorder.allocator.allocated_bytes, recorder.allocator.reserved_bytes
        recorder.start_window()
        routing.__enter__()
        recorder.costs = None if ops is None else OpCostCounter()  # the step's ops counted by the recorder that sees each one
        try:
            if optimizer is None:
                loss = loss_fn(meta_model, meta_inputs)
                loss.backward()
                del loss
            else:
                run_training_step(meta_model, meta_inputs, loss_fn, optimizer)
        finally:
            routing.__exit__(None, None, None)
        if ops is not None:
            ops.extend(recorder.costs.ops)
        recorder.costs = None
    if attention and routing.calls == 0:
        raise ResacctError(f"attention={attention!r}, but the step never called F.scaled_dot_product_attention; expected attention=None for this model")
    return step_prediction(recorder.allocator, start_allocated, start_reserved, attention_label(routing, meta_model))


def step_prediction(allocator: Any, start_allocated: int, start_reserved: int, attention: str) -> CudaStepPrediction:
    """The prediction an allocator model's run of a step gives (its peaks since the window began, what is live at the
    peak, its segments), the window starting at ``start_allocated``/``start_reserved``."""
    return CudaStepPrediction(peak_allocated_bytes=allocator.peak_allocated_bytes, peak_reserved_bytes=allocator.peak_reserved_bytes,
                              peak_requested_bytes=allocator.peak_requested_bytes, start_allocated_bytes=start_allocated, start_reserved_bytes=start_reserved,
                              live_at_peak_bytes=sorted(allocator.live_at_peak().values(), reverse=True), segments=allocator.segments(), attention=attention)


def attention_label(routing: TorchFunctionMode, model: nn.Module) -> str:
    """What ran as attention under ``routing`` (:func:`sdpa_routing`'s mode) in ``model``'s step."""
    return routing.label() if isinstance(routing, _CudaAttention) else _attention_label(model, routing.calls)


class _SdpaCalls(TorchFunctionMode):
    """Counts ``F.scaled_dot_product_attention`` calls (sdpa left to its own choice)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls += 1
            query = args[0] if args else (kwargs or {}).get("query")
            with sdpa_math_region(query):  # its math path (meta tensors' own choice, forced on fake CPU ones)
                return func(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def sdpa_routing(kernel: str | None, capability: tuple[int, int] | None = None, *, forced: bool = False) -> TorchFunctionMode:
    """A mode routing ``F.scaled_dot_product_attention`` to ``kernel`` (``"flash"`` or ``"efficient"``) as a board of compute
    ``capability`` runs it (``forced``: as ``sdpa_kernel(kernel)`` forces it, no fallback); None: left to sdpa's own choice
    (on meta tensors its math path), its calls counted."""
    return _SdpaCalls() if kernel is None else _CudaAttention(kernel, capability, forced=forced)


def _attention_label(model: nn.Module, sdpa_calls: int) -> str:
    """What ran as attention when no CUDA kernel was chosen: sdpa's own choice (on meta tensors its
    math path), or — where the step never called sdpa — the model's eager attention (Gemma-2, BLOOM:
    transformers' own matmuls and softmax), or none."""
    if sdpa_calls:
        return "sdpa's choice on meta tensors (math)"
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation == "eager":
        return "eager (transformers' own matmuls and softmax; no sdpa)"
    return "no sdpa call (the model's own attention, if any)"
