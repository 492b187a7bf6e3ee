"""The library allocations the dispatcher never shows: **cuBLAS and cuBLASLt workspaces**, which
ATen takes from the CUDA caching allocator at a thread's first matmul on a stream and keeps — named
from PyTorch's source, **not yet confirmed on a board**.

Read at pytorch/pytorch commit 26a39059ec580351411f180816c47e2ef5134ae1,
``aten/src/ATen/cuda/CublasHandlePool.cpp`` (and ``CUDABlas.cpp`` at bd53dc4f6053a07b3a45e33157e66389c2239429):

- ``getCurrentCUDABlasHandle()`` — every cuBLAS call, and every cuBLASLt call through
  ``getCurrentCUDABlasLtHandle()``, which on CUDA is the same handle — calls ``setWorkspaceForHandle``:
  the first time a (handle, stream) pair is seen it allocates ``getChosenWorkspaceSize()`` bytes with
  ``CUDACachingAllocator::get()->allocate`` and keeps them in ``cublas_handle_stream_to_workspace()``
  until ``torch._C._cuda_clearCublasWorkspaces()`` (``empty_cache`` does not free them: they stay allocated).
- ``getChosenWorkspaceSize()`` parses ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs, summed);
  its default is ``:4096:8`` = 32 MiB on sm90 (Hopper) and ``:4096:2:16:8`` = 8,519,680 B elsewhere.
  The same 8,519,680 B is what issue pytorch/pytorch#95668 saw left allocated after one ``nn.Linear``
  forward on an A10G (torch 2.0 nightly) — someone else's board, not a record of ours.
- Handles come from a per-thread pool (``DeviceThreadHandlePool``, a thread-local ``PoolWindow``): a
  training step's backward runs on autograd's CUDA device thread, which reserves **its own handle**, so
  the (handle, stream) key differs and a second workspace is allocated at the backward's first matmul.
- The cuBLASLt path (``CublasLtWorkspace`` in CUDABlas.cpp: ``addmm`` with a bias vector, i.e. a
  ``Linear`` with a bias, goes through ``gemm_and_bias``) takes ``getCUDABlasLtWorkspace()``: a second map keyed
  the same way, ``getCUDABlasLtWorkspaceSize()`` = ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024 = 1 MiB;
  the variable is ``CUBLASLT_WORKSPACE_SIZE``, not ``TORCH_CUBLASLT_WORKSPACE_SIZE``), kept — unless
  ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``, when cuBLASLt uses the cuBLAS workspace and allocates nothing.

**Versions differ** (pull requests of pytorch/pytorch, by date; which torch release carries which is
not pinned here): torch 1.13 took none from the caching allocator (#95668: "1.13 does not have this
issue"), 2.0 does (#83461, 2022-08; its default sizes fixed by #91564, 2023-01); in older
CUDABlas.cpp ``gemm_and_bias`` allocated its 1 MiB per call and freed it at once (peak only); #168175
(2025-11) and #175879 (2026-03: "previously diverged between size parsing and actually using unified
workspaces", the divergence still in the commit read here) make the unified workspace the default,
so no separate cuBLASLt block; #175344 (2026-02) gives Blackwell (sm100/sm120) 32 MiB too; a later
``TORCH_CUBLAS_WORKSPACE_CACHE`` (default off on CUDA) leaves cuBLAS its own workspace, outside the
caching allocator, and keeps only the cuBLASLt block in it; #180283 (2026-04) makes the maps
thread-local. The model here is the commit read above; the H100 record of 2026-11-26 (torch 2.11)
cannot tell which applies — its peaks are measured above a start taken after warm-up steps, when the
workspaces already existed. ``tools/gpu_record.py``'s library probe records, in a fresh process,
``memory_allocated`` / ``memory_reserved`` and the allocator's trace around the first ``mm``, the first
``Linear`` with a bias and the first backward: the next GPU session settles it.

Where they go in the prediction: allocated once the parameters and the batch are on the board and
before the optimizer's state exists (the first step's first matmul comes before its first
``optimizer.step()``), never freed: they add to what is allocated at the step's start, hence to both
peaks, and their segments (a 32 MiB block is a segment of its own; 8,519,680 B sits in a 20 MiB one
whose rest later blocks may use) to the reserved memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a cached answer holding LibraryWorkspaces unpickles without torch
    from torch import nn

from resacct.errors import ResacctError

__all__ = ["LibraryWorkspaces", "cublas_workspace_bytes", "cublaslt_workspace_bytes", "step_workspaces", "capability_major",
           "SOURCE", "CONFIRMED_SM90", "SOURCE_FILE", "probe_library_allocations"]

SOURCE = "from PyTorch's source, unconfirmed on a board"
#: sm90's sizes and placement as a board showed them: the library probe of docs/gpu/2026-11-30-h200-record.json.gz
#: (32 MiB at the first mm, 1 MiB more at the first biased linear, 32 MiB at the first backward) and every trace of that record
CONFIRMED_SM90 = "from PyTorch's source, confirmed on an H200: sm90, torch 2.11, the 2026-11-30 record's library probe"
SOURCE_FILE = "CublasHandlePool.cpp at pytorch 26a39059"
MIB = 1 << 20
#: compute capability (major) of the datasheet table's NVIDIA families
_CAPABILITY_MAJOR = {"volta": 7, "turing": 7, "ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10}


def capability_major(board: Any) -> int | None:
    """The compute capability's major number of ``board`` (an Accelerator): its datasheet's ``compute_capability``, else
    its family's; None outside NVIDIA's families."""
    capability = getattr(board, "compute_capability", None)
    return capability[0] if capability else _CAPABILITY_MAJOR.get(getattr(board, "family", None) or "")


def cublas_workspace_bytes(major: int, env: Mapping[str, str] | None = None) -> int:
    """``getChosenWorkspaceSize()``: ``CUBLAS_WORKSPACE_CONFIG``'s ``:KiB:COUNT`` pairs summed, else
    32 MiB on sm90, 8,519,680 B (``:4096:2:16:8``) elsewhere.

    >>> cublas_workspace_bytes(9), cublas_workspace_bytes(8), cublas_workspace_bytes(9, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    (33554432, 8519680, 131072)
    """
    env = os.environ if env is None else env
    default = 4096 * 8 * 1024 if major == 9 else 4096 * 1024 * 2 + 16 * 1024 * 8
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config is None:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:  # torch warns and takes its default
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_workspace_bytes(major: int, env: Mapping[str, str] | None = None) -> int:
    """``getCUDABlasLtWorkspaceSize()``: ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024), at most the
    cuBLAS workspace (the size's unified default); 0 with ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`` (cuBLASLt
    then uses the cuBLAS workspace).

    >>> cublaslt_workspace_bytes(9), cublaslt_workspace_bytes(9, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"})
    (1048576, 0)
    """
    env = os.environ if env is None else env
    if env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in ("1", "true", "on", "yes", "y"):
        return 0
    try:
        kib = int(env.get("CUBLASLT_WORKSPACE_SIZE", "1024"))
    except ValueError:  # torch warns and keeps its default
        kib = 1024
    return min(kib * 1024, cublas_workspace_bytes(major, env))


@dataclass(frozen=True)
class LibraryWorkspaces:
    """The workspaces a step's matmuls take from the caching allocator: ``blocks`` as (what, bytes)."""

    blocks: tuple[tuple[str, int], ...]
    basis: str
    source: str = SOURCE  # where the sizes come from: PyTorch's source, or (sm90) a board's record too

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.blocks)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.blocks)

    def lines(self, suffix: str = "") -> list[str]:
        """The lines a command prints under its CUDA peaks: the workspaces in them (``suffix`` ends that line), then where
        their sizes come from."""
        if not self.blocks:
            return [f"  cuBLAS workspaces: none — {self.basis}{suffix}", f"    {self.source}"]
        parts = " + ".join(f"{size / MIB:g} MiB {what}" for what, size in self.blocks)
        return [f"  cuBLAS workspaces: {self.total_bytes / MIB:g} MiB in the peaks above = {parts}{suffix}",
                f"    {self.source}; {self.basis}; {SOURCE_FILE}"]


def _matmul_modules(model: nn.Module) -> tuple[bool, bool]:
    """(the model runs a matmul, one of them is a Linear with a bias — cuBLASLt's ``gemm_and_bias``)."""
    from torch import nn  # imported here: the module loads without torch

    matmul = bias = False
    for module in model.modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":  # transformers' Conv1D is an addmm with a bias
            matmul = True
            bias = bias or getattr(module, "bias", None) is not None
    return matmul, bias


def step_workspaces(model: nn.Module, *, board: Any = None, backward: bool, env: Mapping[str, str] | None = None,
                    major: int | None = None) -> LibraryWorkspaces:
    """The workspaces ``model``'s step allocates on ``board`` (or a board of compute capability ``major``):
    a cuBLAS workspace on the thread that runs the forward, another on autograd's device thread when the
    step has a ``backward``, and a cuBLASLt workspace where a ``Linear`` has a bias. None for a model
    without a ``Linear`` (no matmul seen)."""
    major = capability_major(board) if major is None else major
    if major is None:
        raise ResacctError(f"board {getattr(board, 'name', board)!r} ({getattr(board, 'family', '?')}): expected an NVIDIA board "
                           f"({', '.join(_CAPABILITY_MAJOR)}) for cuBLAS workspaces")
    matmul, bias = _matmul_modules(model)
    if not matmul:
        return LibraryWorkspaces((), "the model has no Linear, so no cuBLAS call was assumed")
    cublas = cublas_workspace_bytes(major, env)
    blocks = [("cuBLAS (forward thread)", cublas)]
    if backward:
        blocks.append(("cuBLAS (autograd's backward thread)", cublas))
    lt = cublaslt_workspace_bytes(major, env) if bias else 0
    if lt:
        blocks.append(("cuBLASLt (a Linear with a bias)", lt))
    where = f"sm{major}0: {'32 MiB' if cublas == 32 * MIB else f'{cublas:,} B'} per (thread, stream), allocated at its first matmul and kept"
    return LibraryWorkspaces(tuple(blocks), where, CONFIRMED_SM90 if major == 9 else SOURCE)


def probe_library_allocations(device: str = "cuda", *, cuda: bool | None = None) -> dict[str, Any]:
    """In a fresh process, what the first matmuls allocate: ``memory_allocated`` and ``memory_reserved``
    before and after the first ``mm`` (cuBLAS), the first ``F.linear`` with a bias (cuBLASLt) and the
    first backward (autograd's device thread), with the allocator's trace (action, size) from the first
    allocation. On a CPU (``device="cpu"``, the recorder's dry run) the same code with the stats left
    None; ``cuda`` (default: ``device == "cuda"``) asks ``torch.cuda`` for them (a test stubs it)."""
    import torch
    import torch.nn.functional as F

    cuda = device == "cuda" if cuda is None else cuda
    if cuda:
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")

    def stats() -> dict[str, int | None]:
        if not cuda:
            return {"allocated": None, "reserved": None, "trace_entries": None}
        return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "trace_entries": len(torch.cuda.memory._snapshot()["device_traces"][0])}

    a = torch.ones(64, 64, device=device)
    weight = torch.ones(64, 64, device=device, requires_grad=True)
    bias = torch.ones(64, device=device, requires_grad=True)
    stages: list[dict[str, Any]] = [{"stage": "inputs", **stats()}]
    for stage, run in (("first mm (cuBLAS)", lambda: a @ a), ("first linear with a bias (cuBLASLt)", lambda: F.linear(a, weight, bias)),
                       ("first backward (autograd's device thread)", lambda: F.linear(a, weight, bias).sum().backward())):
        out = run()
        if cuda:
            torch.cuda.synchronize()
        stages.append({"stage": stage, **stats()})
        del out
    trace: list[list[Any]] = []
    if cuda:
        trace = [[e["action"], e["size"]] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
        torch.cuda.memory._record_memory_history(enabled=None)
    env = {key: os.environ.get(key) for key in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
                                                "TORCH_CUBLAS_WORKSPACE_CACHE", "DISABLE_ADDMM_CUDA_LT")}
    blas = getattr(torch.backends.cuda, "preferred_blas_library", None)
    return {"device": device, "torch": torch.__version__, "stages": stages, "trace": trace, "env": env,
            "preferred_blas_library": str(blas()) if cuda and blas is not None else None}
