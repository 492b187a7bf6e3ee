#!/usr/bin/env python3
"""The GPU recorder (issue 31): one device call records the truth every CPU run then replays.

On a GPU, for each step of :data:`MATRIX` (in its own fresh process, so the allocator's trace
starts from its first allocation; each bounded by ``--step-limit``), it records one steady training
step — what the CUDA caching allocator did (``torch.cuda.memory._record_memory_history(
context=None)`` + ``_snapshot()``, compacted by :func:`resacct.account.gpu.record.compact_snapshot`),
``max_memory_allocated`` / ``max_memory_reserved`` over that step, the step's time (median of 5,
CUDA-synchronised), and every aten op's time with its shapes and dtypes (``torch.profiler``) — then
the board's ceilings: the most matmul FLOP/s over a sweep of shapes for bf16, fp16, tf32, fp32 and
fp8 where the board has it (the MAMF method: the best of a sweep, not a datasheet), memory
bandwidth (a 1 GiB copy) and the launch overhead of a tiny kernel; first, in a fresh process, the
library probe (:func:`resacct.account.gpu.library_workspaces.probe_library_allocations`): what the
first ``mm``, the first ``Linear`` with a bias and the first backward allocate — the cuBLAS/cuBLASLt
workspaces the predictions take from PyTorch's source, unconfirmed until a record has it. Each step is replayed through
the allocator model at once, so the call's summary already says whether the model holds.

    python3 tools/gpu_record.py                  on the GPU machine: at most --budget seconds (540)
    python3 tools/gpu_record.py --dry-run        on any CPU: the same code on tiny shapes, CUDA calls
                                                 replaced (the trace comes from resacct's allocation
                                                 recorder and model: a layout check, not a record)
    python3 tools/gpu_record.py --replay FILE    on any CPU: replay a record's steps through the model,
                                                 one line each (exit 1 if one does not hold)
    python3 tools/gpu_record.py --compare FILE   on any CPU: predict each recorded step on meta tensors
                                                 (predict_cuda_step_memory) beside what the board did

Writes under ``--out`` (default ``$OUT``), three files (a device call returns at most 8):
``gpu-record.json.gz`` (the record: docs/gpu.md describes its format), ``gpu-record-summary.json``
(per step: status, seconds, peaks, step time, the replay's verdict) and ``gpu-record.log``.
Models are built from configs only (no weights, no network). Exit status 1 if any step failed.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MAX_TRACE_ENTRIES = 3_000_000
CUDA_DEVICE = "cuda"  # a test runs the CUDA branch on the CPU against a stubbed torch.cuda
TIMED_STEPS = 5
TIMED_STEPS_DRY = 2  # a dry run's CPU is slow and its times mean nothing: the code path, twice

#: meta-llama/Llama-3.2-1B's config.json (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json), built without weights
LLAMA_32_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
               "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
               "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
#: a small grouped-query Llama (4 query heads per key/value head)
GQA_LLAMA = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 4096, "tie_word_embeddings": False}
#: Mixtral's shape (8 experts, 2 per token, GQA) scaled down to fit a step in seconds
MIXTRAL_SMALL = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 4,
                 "num_attention_heads": 16, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "max_position_embeddings": 4096, "output_router_logits": False}
#: openai-community/gpt2's shape; dropout off (as resacct's GPT: no dropout masks, and the CPU flash kernel has no dropout)
HF_GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
           "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}

#: name → (family, model, recipe, attention, batch, seq, extra). attention: math | flash | efficient | eager (HF's own matmuls)
MATRIX: dict[str, tuple[str, Any, str, str, int, int, dict]] = {
    "gpt2-small/fp32/math": ("resacct", "gpt2-small", "fp32", "math", 4, 1024, {}),
    "gpt2-small/bf16-autocast/flash": ("resacct", "gpt2-small", "bf16-autocast", "flash", 4, 1024, {}),
    "gpt2-small/fp32/efficient/expandable": ("resacct", "gpt2-small", "fp32", "efficient", 4, 1024, {"expandable_segments": True}),
    "hf-gpt2/fp32/efficient": ("hf", HF_GPT2, "fp32", "efficient", 4, 1024, {}),
    "hf-gpt2/bf16-autocast/flash": ("hf", HF_GPT2, "bf16-autocast", "flash", 4, 1024, {}),
    "llama-3.2-1b/bf16-fp32-master/flash": ("hf", LLAMA_32_1B, "bf16-fp32-master", "flash", 2, 1024, {}),
    "llama-3.2-1b/bf16-autocast/efficient": ("hf", LLAMA_32_1B, "bf16-autocast", "efficient", 2, 1024, {}),
    "llama-3.2-1b-lora/bf16/flash": ("lora", LLAMA_32_1B, "bf16", "flash", 2, 1024, {}),
    "gqa-llama/fp32/math": ("hf", GQA_LLAMA, "fp32", "math", 4, 1024, {}),
    "gqa-llama/bf16/flash": ("hf", GQA_LLAMA, "bf16", "flash", 4, 1024, {}),
    "mixtral-small/bf16-autocast/eager-experts": ("hf", MIXTRAL_SMALL, "bf16-autocast", "efficient", 4, 512, {"experts": "eager"}),
    "mixtral-small/bf16-autocast/batched_mm-experts": ("hf", MIXTRAL_SMALL, "bf16-autocast", "efficient", 4, 512, {"experts": "batched_mm"}),
}

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16,
        "num_key_value_heads": 2, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "num_local_experts": 4}


# ── one step (in its own process) ──────────────────────────────────────────────────────────
def _build(family: str, model: Any, attention: str, extra: dict, dry: bool, device: str) -> tuple[Any, Any]:
    """The model on ``device`` and its loss ``(model, tokens) → loss``; tiny shapes in a dry run."""
    import torch

    if family == "resacct":
        from dataclasses import replace

        from resacct.training.gpt import build_gpt, get_gpt_config
        config = get_gpt_config(model)
        if dry:
            config = replace(config, vocab_size=256, context_length=64, n_layers=2, n_heads=4, d_model=64)
        net = build_gpt(config, device=device, attention="math" if attention == "math" else "sdpa")

        def loss(m: Any, batch: Any) -> Any:
            logits = m(batch[0])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[1].flatten())
        return net, loss
    from resacct.account.load.hf_models import HfConfigSpec, build_hf_model
    values = dict(model)
    if dry:
        values.update({key: value for key, value in TINY.items() if key in values or key == "head_dim" and values["model_type"] != "gpt2"})
    spec = HfConfigSpec(name=f"recorder-{values['model_type']}", source="tools/gpu_record.py", values=values)
    net = build_hf_model(spec, device=device, attention="eager" if attention == "eager" else "sdpa")
    if extra.get("experts"):
        net.config._experts_implementation = extra["experts"]
        for module in net.modules():
            if hasattr(module, "config") and hasattr(module.config, "_experts_implementation"):
                module.config._experts_implementation = extra["experts"]
    if family == "lora":
        import peft
        net = peft.get_peft_model(net, peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))

    def loss(m: Any, batch: Any) -> Any:
        return m(input_ids=batch[0], labels=batch[1]).loss
    return net, loss


def _attention_context(attention: str, dry: bool) -> Any:
    """The sdpa backend a step names (a dry run's CPU has no memory-efficient kernel: its flash kernel instead,
    and the math kernel where the CPU's flash kernel refuses the shapes: torch 2.8's refuses grouped-query attention)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if dry and attention == "efficient":
        attention = "flash"
    if dry and attention == "flash":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    return sdpa_kernel(backends[attention]) if attention in backends else contextlib.nullcontext()


def _op_times(prof: Any) -> list[dict]:
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


def record_step(name: str, dry: bool) -> dict[str, Any]:
    """Record one step of :data:`MATRIX` in this process: the allocator's trace from its first
    allocation, the peaks of the measured step, its time and its ops."""
    import torch

    from resacct.account.gpu.allocation_trace import AllocationRecorder
    from resacct.account.gpu.record import compact_snapshot, replay_step
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.memory_timeline import run_training_step

    family, model, recipe, attention, batch, seq, extra = MATRIX[name]
    cuda = not dry
    device = CUDA_DEVICE if cuda else "cpu"
    if dry or device != "cuda":
        batch, seq = 2, 32
    started = time.perf_counter()
    recorder = None
    if cuda:
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_TRACE_ENTRIES)
    else:  # the dry run: resacct's allocation recorder and allocator model stand in for the GPU's
        recorder = AllocationRecorder(device="cpu").__enter__()
    torch.manual_seed(0)
    net, loss_fn = _build(family, model, attention, extra, dry or device != "cuda", device)
    vocab = net.config.vocab_size  # resacct's GPTConfig and transformers' configs both have it
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    step = recipe_step(parse_recipe(recipe), net, inputs, loss_fn, "adamw")
    del net  # a recipe in another dtype stepped a copy: the original must not stay allocated beside it
    optimizer = step.make_optimizer([p for p in step.model.parameters() if p.requires_grad])

    def one_step() -> None:
        with _attention_context(attention, dry or device != "cuda"):
            run_training_step(step.model, step.inputs, step.loss_fn, optimizer)

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
    if cuda:
        peaks = {"max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
                 "memory_allocated_end": torch.cuda.memory_allocated(), "memory_reserved_end": torch.cuda.memory_reserved()}
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        settings = {key: value for key, value in (snapshot.get("allocator_settings") or {}).items() if isinstance(value, (bool, int, float, str))}
        settings.setdefault("expandable_segments", "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    else:
        model_allocator = recorder.allocator
        peaks = {"max_memory_allocated": model_allocator.peak_allocated_bytes, "max_memory_reserved": model_allocator.peak_reserved_bytes,
                 "memory_allocated_end": model_allocator.allocated_bytes, "memory_reserved_end": model_allocator.reserved_bytes}
        snapshot = recorder.snapshot()
        recorder.__exit__(None, None, None)
        settings = {"expandable_segments": False, "dry_run": True}
    entries = len(snapshot["device_traces"][0])
    compacted = compact_snapshot(snapshot, window_start=window_start)
    times = []
    for _ in range(TIMED_STEPS_DRY if dry else TIMED_STEPS):
        sync()
        begin = time.perf_counter()
        one_step()
        sync()
        times.append(time.perf_counter() - begin)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []), record_shapes=True) as prof:
        one_step()
        sync()
    replay = replay_step({**compacted, **peaks}, settings)
    return {"name": name, "family": family, "recipe": recipe, "attention": attention, "batch": batch, "seq": seq, "extra": extra,
            "model_config": model if isinstance(model, str) else {k: v for k, v in model.items()},
            "parameters": sum(p.numel() for p in step.model.parameters()), "allocator_settings": settings,
            "trace_complete": entries < MAX_TRACE_ENTRIES, **peaks, **compacted,
            "step_time_sec": {"median": statistics.median(times), "all": times}, "ops": _op_times(prof),
            "replay": {"peak_allocated_bytes": replay.peak_allocated_bytes, "peak_reserved_bytes": replay.peak_reserved_bytes,
                       "first_segment_mismatch": replay.first_segment_mismatch, "holds": replay.holds},
            "seconds": round(time.perf_counter() - started, 2)}


# ── the board's ceilings ──────────────────────────────────────────────────────────────────
def _time_it(fn: Any, cuda: bool, repeats: int) -> float:
    import torch

    fn()
    if cuda:
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - begin)
    return best


def record_ceilings(dry: bool, budget_sec: float) -> dict[str, Any]:
    """The most matmul FLOP/s over a shape sweep per dtype (MAMF), the bandwidth of a large copy, a launch's overhead."""
    import torch

    cuda = not dry
    device = "cuda" if cuda else "cpu"
    started = time.perf_counter()
    sizes = [1024, 2048, 4096, 6144, 8192, 12288, 16384] if cuda else [32, 64]
    shapes = [(n, n, n) for n in sizes] + ([(8192, 8192, 2048), (8192, 2048, 8192), (16384, 4096, 4096), (4096, 14336, 4096)] if cuda else [(64, 32, 64)])
    dtypes: dict[str, Any] = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
    fp8 = cuda and torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "float8_e4m3fn")
    if fp8 or dry:
        dtypes["fp8"] = getattr(torch, "float8_e4m3fn", None)
    matmul: dict[str, Any] = {}
    for label, dtype in dtypes.items():
        results = []
        torch.backends.cuda.matmul.allow_tf32 = label == "tf32"
        for m, n, k in shapes:
            if time.perf_counter() - started > budget_sec * 0.8 or (label in ("fp32", "tf32") and m * n * k > 8192**3):
                continue
            try:
                if label == "fp8":
                    a = torch.randn(m, k, device=device).to(dtype)
                    b = torch.randn(n, k, device=device).to(dtype).t()
                    one = torch.tensor(1.0, device=device)
                    fn = lambda a=a, b=b, one=one: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
                else:
                    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
                    fn = lambda a=a, b=b: a @ b  # noqa: E731
                seconds = _time_it(fn, cuda, 5 if cuda else 2)
                results.append({"m": m, "n": n, "k": k, "flops_per_sec": 2 * m * n * k / seconds})
            except (RuntimeError, TypeError) as error:  # fp8 on a CPU build, a shape the board refuses
                results.append({"m": m, "n": n, "k": k, "error": str(error).splitlines()[0][:200]})
            finally:
                a = b = None
        best = max((r for r in results if "flops_per_sec" in r), key=lambda r: r["flops_per_sec"], default=None)
        matmul[label] = {"max_flops_per_sec": best and best["flops_per_sec"], "best_shape": best and [best["m"], best["n"], best["k"]], "sweep": results}
    torch.backends.cuda.matmul.allow_tf32 = False
    nbytes = (1 << 30) if cuda else (1 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_sec = _time_it(lambda: dst.copy_(src), cuda, 10 if cuda else 2)
    tiny = torch.zeros(1, device=device)
    launches = 1000 if cuda else 50

    def launch_many() -> None:
        for _ in range(launches):
            tiny.add_(1)
    launch_sec = _time_it(launch_many, cuda, 3)
    return {"matmul": matmul, "copy": {"bytes": nbytes, "seconds": copy_sec, "bandwidth_bytes_per_sec": 2 * nbytes / copy_sec,
                                       "note": "read + write: 2 × bytes ÷ time"},
            "launch": {"kernels": launches, "seconds": launch_sec, "per_launch_sec": launch_sec / launches, "kernel": "tiny.add_(1), back to back"},
            "seconds": round(time.perf_counter() - started, 2)}


def _read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` (.json or .json.gz), or None after one line on stderr."""
    from resacct.account.gpu.record import check_record_layout
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        print(f"gpu_record.py: cannot read the record {str(path)!r} ({error}); expected a .json or .json.gz record", file=sys.stderr)
        return None
    problems = check_record_layout(record)
    if problems:
        print(f"gpu_record.py: {path} is not a whole record: {problems[0]}", file=sys.stderr)
        return None
    return record


def predict_recorded_step(step: dict[str, Any], dry: bool, capability: str | None = None, env: dict[str, str] | None = None) -> Any:
    """:func:`~resacct.account.gpu.cuda_step.predict_cuda_step_memory` of the step a record names:
    the same model (on meta), recipe, batch, attention kernel and allocator settings; on a board's
    record (``capability`` "9.0" …) with the cuBLAS workspaces PyTorch's source gives it (the
    recorded peaks are absolute: the warm-up steps allocated them), ``env`` the probe's variables."""
    import torch

    from resacct.account.gpu.cuda_step import predict_cuda_step_memory
    from resacct.account.gpu.record import allocator_config_of
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe

    family, model, recipe, attention, *_ = MATRIX[step["name"]]
    net, loss_fn = _build(family, model, attention, step.get("extra", {}), dry, "meta")
    tokens = torch.zeros(step["batch"], step["seq"], dtype=torch.long)
    chosen = parse_recipe(recipe)
    work = recipe_step(chosen, net, (tokens, tokens), loss_fn, "adamw")
    step_loss = work.loss_fn
    if chosen.uses_autocast:  # meta tensors have no torch.autocast: CUDA autocast's casts applied by resacct (cuda_autocast.py)
        from resacct.account.gpu.device_answer import under_cuda_autocast
        from resacct.facts.dtypes import parse_dtype
        step_loss = under_cuda_autocast(loss_fn, parse_dtype(chosen.computes_in))
    kernel = attention if attention in ("flash", "efficient") and not dry else None
    workspaces: tuple[int, ...] = ()
    if capability and not dry:
        from resacct.account.gpu.library_workspaces import step_workspaces
        workspaces = step_workspaces(work.model, major=int(capability.split(".")[0]), backward=True, env=env or {}).sizes
    return predict_cuda_step_memory(work.model, work.inputs, step_loss, work.make_optimizer, attention=kernel,
                                    config=allocator_config_of(step.get("allocator_settings")), workspaces=workspaces)


def compare_record(path: Path) -> int:
    """Each recorded step predicted on a CPU beside the board's peaks: allocated, reserved, ratios."""
    from resacct.errors import ResacctError
    record = _read_record(path)
    if record is None:
        return 2
    print(f"{record['board']} · torch {record['torch']} · {record['when']}{' · DRY RUN' if record.get('dry_run') else ''}")
    print(f"{'step':48} {'allocated: predicted':>21} {'recorded':>15} {'ratio':>6}  {'reserved: predicted':>20} {'recorded':>15} {'ratio':>6}")
    for step in record["steps"]:
        if "error" in step or step["name"] not in MATRIX:
            continue
        try:
            probe_env = {key: value for key, value in (record.get("library_probe") or {}).get("env", {}).items() if value is not None}
            predicted = predict_recorded_step(step, bool(record.get("dry_run")), record.get("capability"), probe_env)
        except (ResacctError, RuntimeError, ImportError) as error:
            print(f"{step['name']:48} cannot predict: {str(error).splitlines()[0][:120]}")
            continue
        allocated, reserved = step["max_memory_allocated"], step["max_memory_reserved"]
        print(f"{step['name']:48} {predicted.peak_allocated_bytes:>21,} {allocated:>15,} {predicted.peak_allocated_bytes / allocated:>6.3f}  "
              f"{predicted.peak_reserved_bytes:>20,} {reserved:>15,} {predicted.peak_reserved_bytes / reserved:>6.3f}")
    return 0


def replay_record(path: Path) -> int:
    """Replay every step of the record at ``path`` through the allocator model; one line per step."""
    from resacct.account.gpu.record import replay_step
    from resacct.errors import ResacctError
    record = _read_record(path)
    if record is None:
        return 2
    print(f"{record['board']} · torch {record['torch']} · {record['when']}{' · DRY RUN' if record.get('dry_run') else ''}")
    held = 0
    steps = [step for step in record["steps"] if "error" not in step]
    for step in steps:
        try:
            result = replay_step(step)
        except ResacctError as error:
            print(f"{step['name']:48} cannot replay: {error}")
            continue
        held += result.holds
        print(f"{step['name']:48} allocated {result.peak_allocated_bytes:>14,} (recorded {result.recorded_max_allocated_bytes:>14,})  "
              f"reserved {result.peak_reserved_bytes:>14,} (recorded {result.recorded_max_reserved_bytes:>14,})  "
              f"{'holds' if result.holds else 'DIFFERS: ' + (result.first_segment_mismatch or result.first_misplaced_block or 'the peaks')}")
    print(f"{held} of {len(steps)} recorded steps replay exactly ({len(record['steps']) - len(steps)} not recorded)")
    return 0 if held == len(steps) else 1


# ── the driver: each step in a fresh process, bounded; the bundle ────────────────────────────
def _board(dry: bool) -> dict[str, Any]:
    import platform

    import torch
    board: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "python": platform.python_version()}
    if not dry and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        board.update(board=props.name, capability=f"{props.major}.{props.minor}", total_memory_bytes=props.total_memory,
                     multi_processor_count=props.multi_processor_count)
    else:
        board["board"] = "dry run on a CPU (no board)"
    return board


def _child(args: list[str], limit_sec: float, env: dict[str, str], log: Any) -> tuple[dict[str, Any] | None, str]:
    """Run this script with ``args`` in a fresh process, at most ``limit_sec``; its JSON (last stdout line) and status."""
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_sec, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as expired:
        log.write(f"  timeout after {limit_sec:.0f} s\n{(expired.stderr or b'')[-2000:]!r}\n")
        return None, "timeout"
    log.write(done.stderr[-4000:])
    if done.returncode != 0:
        return None, f"failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else ''}"
    return json.loads(done.stdout.strip().splitlines()[-1]), "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: tiny shapes, CUDA calls replaced (a layout check)")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--only", default="", help="comma-separated step names (default: every step of MATRIX)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540)")
    parser.add_argument("--step-limit", type=float, default=75.0, help="seconds for one step's process (default 75)")
    parser.add_argument("--replay", type=Path, help="a record (.json or .json.gz) to replay through the allocator model")
    parser.add_argument("--compare", type=Path, help="a record whose steps to predict on meta tensors, beside the recorded peaks")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--ceilings", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(record_step(args.one, args.dry_run), separators=(",", ":")))
        return 0
    if args.replay:
        return replay_record(args.replay)
    if args.compare:
        return compare_record(args.compare)
    if args.ceilings:
        print(json.dumps(record_ceilings(args.dry_run, args.budget)))
        return 0
    if args.library:  # a fresh process: what the first matmuls allocate (cuBLAS/cuBLASLt workspaces)
        from resacct.account.gpu.library_workspaces import probe_library_allocations
        print(json.dumps(probe_library_allocations("cpu" if args.dry_run else CUDA_DEVICE, cuda=not args.dry_run)))
        return 0
    names = [name for name in args.only.split(",") if name] or list(MATRIX)
    unknown = [name for name in names if name not in MATRIX]
    if unknown:
        print(f"gpu_record.py: unknown step {unknown[0]!r}; expected one of: {', '.join(MATRIX)}", file=sys.stderr)
        return 2
    if args.out is None:
        print("gpu_record.py: no --out and no $OUT; expected a folder to write into", file=sys.stderr)
        return 2
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            print("gpu_record.py: torch.cuda.is_available() is False; on a CPU, run with --dry-run", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    steps, summary = [], []
    with open(args.out / "gpu-record.log", "w") as log:
        log.write("== library probe\n")
        library, library_status = _child(["--library"] + (["--dry-run"] if args.dry_run else []), 60, env, log)
        print(json.dumps({"library_probe": library_status, "stages": library and library["stages"]}), flush=True)
        for name in names:
            left = args.budget - 130 - (time.perf_counter() - started)  # 130 s kept for the ceilings and the bundle
            if left < 15:
                steps.append({"name": name, "error": "skipped: the budget was spent"})
                summary.append({"name": name, "status": "skipped"})
                continue
            step_env = dict(env)
            if MATRIX[name][6].get("expandable_segments"):
                step_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            log.write(f"== {name}\n")
            log.flush()
            begin = time.perf_counter()
            result, status = _child(["--one", name] + (["--dry-run"] if args.dry_run else []), min(args.step_limit, left), step_env, log)
            seconds = round(time.perf_counter() - begin, 1)
            steps.append(result if result is not None else {"name": name, "error": status})
            row = {"name": name, "status": status, "seconds": seconds}
            if result is not None:
                row.update({key: result[key] for key in ("max_memory_allocated", "max_memory_reserved", "trace_complete")},
                           step_time_sec=result["step_time_sec"]["median"], trace_entries=len(result["trace"]), replay=result["replay"])
            summary.append(row)
            print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
        left = args.budget - 10 - (time.perf_counter() - started)
        ceilings, status = _child(["--ceilings", "--budget", str(max(left - 20, 10))] + (["--dry-run"] if args.dry_run else []), max(left, 10), env, log)
        print(json.dumps({"ceilings": status}), flush=True)
    from resacct.account.gpu.record import RECORD_FORMAT
    record = {"format": RECORD_FORMAT, "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "dry_run": args.dry_run,
              **_board(args.dry_run), "allocator_settings": next((s["allocator_settings"] for s in steps if "allocator_settings" in s), {}),
              "steps": steps, "ceilings": ceilings if ceilings is not None else {"error": status},
              "library_probe": library if library is not None else {"error": library_status}}
    with gzip.open(args.out / "gpu-record.json.gz", "wt") as handle:
        json.dump(record, handle, separators=(",", ":"))
    failed = ([row["name"] for row in summary if row["status"] != "ok"] + ([] if ceilings is not None else ["ceilings"])
              + ([] if library is not None else ["library probe"]))
    (args.out / "gpu-record-summary.json").write_text(json.dumps(
        {"board": record["board"], "torch": record["torch"], "dry_run": args.dry_run, "seconds": round(time.perf_counter() - started, 1),
         "steps": summary, "ceilings_status": status, "library_probe_status": library_status, "failed": failed,
         "record_bytes": (args.out / "gpu-record.json.gz").stat().st_size}, indent=1) + "\n")
    print(f"== gpu_record: {len(summary) - len(failed)} of {len(summary)} steps ok, {time.perf_counter() - started:.0f} s, files in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
