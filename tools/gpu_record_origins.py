"""Where a process's first allocations come from, as tools/gpu_record.py records it (issue 31): every transformers step's
process on the H200 began with a 4-byte allocation kept to its end — a 512-byte block opening a 2 MiB segment before
the model's first parameter — which resacct's prediction lacks and whose origin the record (traced without stack frames)
cannot say (docs/gpu.md). Here, in a fresh process, a transformers step's model is built and stepped once the way the
recorder builds it, with the allocator's history recording each allocation's Python frames; the first allocations are
kept with their frames.

On a board: ``torch.cuda.memory._record_memory_history(context="alloc", stacks="python")``. In a dry run (a CPU):
resacct's allocation recorder stands in, each allocation's frames taken by ``traceback`` — the same layout, the CPU's
allocations (a layout check, not the board's answer).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from gpu_record_matrix import MATRIX

ORIGIN_STEP = "hf-gpt2/fp32/efficient"  # a transformers step: the 4-byte block was seen in every one
KEPT_ALLOCATIONS = 6  # the first allocations kept: the block came first, the model's parameters after it
KEPT_FRAMES = 24  # innermost first


def _frame(filename: str, line: int, name: str) -> str:
    """``package/module.py:line name`` (the path from its package on: site-packages and the checkout's folders dropped)."""
    for marker in ("site-packages/", "dist-packages/", "/resacct/", "/tools/"):
        if marker in filename:
            filename = ("resacct/" if marker == "/resacct/" else "tools/" if marker == "/tools/" else "") + filename.split(marker, 1)[1]
            break
    return f"{filename}:{line} {name}"


def _board_allocations(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The first allocations of the board's trace with their frames (innermost first)."""
    entries = [entry for entry in snapshot["device_traces"][0] if entry.get("action") == "alloc"][:KEPT_ALLOCATIONS]
    return [{"size": entry["size"], "frames": [_frame(frame["filename"], frame["line"], frame["name"]) for frame in entry.get("frames", [])][:KEPT_FRAMES]}
            for entry in entries]


class _FramesOfFirstAllocations:
    """A dry run's stand-in: resacct's allocation recorder, each of its first allocations' Python frames kept."""

    def __init__(self) -> None:
        from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder

        self.allocations: list[dict[str, Any]] = []
        recorder = AllocationRecorder(device="cpu")
        track = recorder.track

        def tracked(tensor: Any) -> None:
            storage = tensor.untyped_storage()
            new = storage not in recorder._seen and storage.nbytes() > 0
            track(tensor)
            if new and len(self.allocations) < KEPT_ALLOCATIONS:
                stack = traceback.extract_stack()[:-1]
                self.allocations.append({"size": storage.nbytes(), "frames": [_frame(f.filename, f.lineno or 0, f.name) for f in reversed(stack)][:KEPT_FRAMES]})
        recorder.track = tracked  # type: ignore[method-assign]
        self.recorder = recorder


def record_allocation_origins(dry: bool) -> dict[str, Any]:
    """The first allocations of a process that builds :data:`ORIGIN_STEP`'s model (tiny) and runs one training step of it, each
    with its Python frames; the parameters' sizes beside them, to tell the model's own allocations from what came before."""
    import torch

    from resacct.account.gpu.records.record_models import build_record_model

    started = time.perf_counter()
    family, model, _, attention, _, _, extra = MATRIX[ORIGIN_STEP]
    device = "cpu" if dry else "cuda"
    stand_in = None
    if dry:
        stand_in = _FramesOfFirstAllocations()
        stand_in.recorder.__enter__()
    else:
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=10_000)
    try:
        torch.manual_seed(0)
        net, loss_fn = build_record_model(family, model, attention, extra, tiny=True, device=device)
        tokens = torch.randint(0, net.config.vocab_size, (2, 17), device=device)
        loss_fn(net, (tokens[:, :-1], tokens[:, 1:])).backward()
        first_parameter_bytes = next(net.parameters()).untyped_storage().nbytes()
        if dry:
            allocations = stand_in.allocations
        else:
            torch.cuda.synchronize()
            allocations = _board_allocations(torch.cuda.memory._snapshot())
    finally:
        if stand_in is not None:
            stand_in.recorder.__exit__(None, None, None)
        elif not dry:
            torch.cuda.memory._record_memory_history(enabled=None)
    return {"step": ORIGIN_STEP, "tiny": True, "first_parameter_bytes": first_parameter_bytes, "allocations": allocations,
            "how": "the CPU's allocations by resacct's recorder (a dry run)" if dry else "_record_memory_history(context='alloc', stacks='python')",
            "seconds": round(time.perf_counter() - started, 2)}
