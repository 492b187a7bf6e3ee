"""One recorded step of tools/gpu_record.py (issue 31), run in its own process so the allocator's
trace starts from its first allocation: the CUDA caching allocator's trace (compacted), the peaks of
one steady step, its time (median of :data:`TIMED_STEPS`) and every aten op's time with its shapes
and dtypes. In a dry run resacct's allocation recorder and allocator model stand in for the GPU's.

Beside each timed step's time (between ``synchronize()`` calls) the host's: the seconds until the step's last launch
returned, before the synchronize (``host_enqueue_sec``), and when each phase (forward, backward, optimizer step,
zero_grad) began (``host_phase_sec``: each phase's median) — unprofiled, the host time a host model is judged by (the
profile's CPU times are the profiler's, inflated). Where the GPU holds the host back — a full launch queue, an op that
waits for the device (``nonzero``) — the figure is an upper bound of the host's own work.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from gpu_record_matrix import MATRIX, attention_context

from resacct.account.gpu.records.record_models import build_record_model, built_config

MAX_TRACE_ENTRIES = 3_000_000
CUDA_DEVICE = "cuda"  # a test runs the CUDA branch on the CPU against a stubbed torch.cuda
TIMED_STEPS = 5
TIMED_STEPS_DRY = 2  # a dry run's CPU is slow and its times mean nothing: the code path, twice


def op_times(prof: Any) -> list[dict]:
    """Every aten op of the profiled step, grouped by (name, shapes, dtypes, top-level or not):
    calls, device time (its kernels, µs) and CPU time, self and total."""
    groups: dict[tuple, dict] = {}
    kineto_dtypes: dict[int, list] = {}  # torch < 2.13's FunctionEvent has no input_dtypes: its kineto event (same id) has them
    try:
        kineto_dtypes = {e.correlation_id(): list(e.dtypes()) for e in prof.profiler.kineto_results.events() if e.name().startswith("aten::")}
    except (AttributeError, RuntimeError):
        pass
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        dtypes = getattr(event, "input_dtypes", None) or kineto_dtypes.get(event.id, [])
        key = (event.name, json.dumps(event.input_shapes), json.dumps(dtypes), parent is None)
        row = groups.setdefault(key, {"name": event.name, "shapes": event.input_shapes, "dtypes": dtypes, "top_level": parent is None,
                                      "calls": 0, "device_us": 0.0, "self_device_us": 0.0, "cpu_us": 0.0})
        row["calls"] += 1
        row["device_us"] += event.device_time_total
        row["self_device_us"] += event.self_device_time_total
        row["cpu_us"] += event.cpu_time_total
    return [{**row, **{k: round(row[k], 3) for k in ("device_us", "self_device_us", "cpu_us")}} for row in groups.values()]


def start_history(cuda: bool) -> Any:
    """The allocator's history on from here: CUDA's (``_record_memory_history``, no stack frames; returns None), or in
    a dry run resacct's allocation recorder over CPU tensors feeding its allocator model (returned, entered)."""
    import torch

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder

    if cuda:
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_TRACE_ENTRIES)
        return None
    return AllocationRecorder(device="cpu").__enter__()


def stop_history(recorder: Any) -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
    """The peaks since the last reset, the history as a snapshot and the allocator's settings; the history off
    (``recorder``: :func:`start_history`'s, None on a board)."""
    import torch

    if recorder is None:
        peaks = {"max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
                 "memory_allocated_end": torch.cuda.memory_allocated(), "memory_reserved_end": torch.cuda.memory_reserved()}
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        settings = {key: value for key, value in (snapshot.get("allocator_settings") or {}).items() if isinstance(value, (bool, int, float, str))}
        settings.setdefault("expandable_segments", "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
        return peaks, snapshot, settings
    allocator = recorder.allocator
    peaks = {"max_memory_allocated": allocator.peak_allocated_bytes, "max_memory_reserved": allocator.peak_reserved_bytes,
             "memory_allocated_end": allocator.allocated_bytes, "memory_reserved_end": allocator.reserved_bytes}
    snapshot = recorder.snapshot()
    recorder.__exit__(None, None, None)
    return peaks, snapshot, {"expandable_segments": False, "dry_run": True}


def record_step(name: str, dry: bool) -> dict[str, Any]:
    """Record one step of :data:`MATRIX` in this process: the allocator's trace from its first
    allocation, the peaks of the measured step, its time and its ops."""
    import torch

    from resacct.account.gpu.records.record import compact_snapshot, replay_step
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.memory_timeline import run_training_step

    family, model, recipe, attention, batch, seq, extra = MATRIX[name]
    cuda = not dry
    device = CUDA_DEVICE if cuda else "cpu"
    if dry or device != "cuda":
        batch, seq = 2, 32
    started = time.perf_counter()
    recorder = start_history(cuda)
    torch.manual_seed(0)
    net, loss_fn = build_record_model(family, model, attention, extra, tiny=dry or device != "cuda", device=device)
    vocab = net.config.vocab_size  # resacct's GPTConfig and transformers' configs both have it
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    step = recipe_step(parse_recipe(recipe), net, inputs, loss_fn, "adamw")
    del net  # a recipe in another dtype stepped a copy: the original must not stay allocated beside it
    optimizer = step.make_optimizer([p for p in step.model.parameters() if p.requires_grad])

    def one_step(mark: Any = None) -> None:
        with attention_context(attention, dry or device != "cuda"):
            run_training_step(step.model, step.inputs, step.loss_fn, optimizer, *(() if mark is None else (mark,)))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):
        one_step()  # the optimizer's state exists; the caches are warm: the next step is a steady one
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        window_start = len(torch.cuda.memory._snapshot()["device_traces"][0])
    else:
        recorder.start_window()
        window_start = recorder.window_start
    one_step()
    sync()
    peaks, snapshot, settings = stop_history(recorder)
    entries = len(snapshot["device_traces"][0])
    compacted = compact_snapshot(snapshot, window_start=window_start)
    times, enqueued, phases = [], [], []
    for _ in range(TIMED_STEPS_DRY if dry else TIMED_STEPS):
        marks: list[tuple[str, float]] = []
        sync()
        begin = time.perf_counter()
        one_step(lambda phase: marks.append((phase, time.perf_counter())))
        enqueued.append(time.perf_counter() - begin)
        sync()
        times.append(time.perf_counter() - begin)
        phases.append({phase: at_next - at for (phase, at), (_, at_next) in zip(marks, marks[1:])})
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []), record_shapes=True) as prof:
        one_step()
        sync()
    replay = replay_step({**compacted, **peaks}, settings)
    return {"name": name, "family": family, "recipe": recipe, "attention": attention, "batch": batch, "seq": seq, "extra": extra,
            "model_config": built_config(family, model, tiny=dry or device != "cuda"),  # the config built: a replay rebuilds this model
            "parameters": sum(p.numel() for p in step.model.parameters()), "allocator_settings": settings,
            "trace_complete": entries < MAX_TRACE_ENTRIES, **peaks, **compacted,
            "step_time_sec": {"median": statistics.median(times), "all": times}, "ops": op_times(prof),
            "host_enqueue_sec": {"median": statistics.median(enqueued), "all": enqueued},
            "host_phase_sec": {phase: statistics.median(each[phase] for each in phases) for phase in phases[0]},
            "replay": {"peak_allocated_bytes": replay.peak_allocated_bytes, "peak_reserved_bytes": replay.peak_reserved_bytes,
                       "first_segment_mismatch": replay.first_segment_mismatch, "holds": replay.holds},
            "seconds": round(time.perf_counter() - started, 2)}

