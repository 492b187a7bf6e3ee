"""One served model of tools/gpu_record.py (issue 31), in its own process so the allocator's trace starts from its
first allocation: what ``resacct infer --device`` predicts, measured — the weights loaded (in the module's order, as
the prediction loads them), the first prefill of batch × context tokens with its KV cache kept (the CUDA caching
allocator's trace and peaks over all of it), the prefill's time (median of :data:`TIMED_PREFILLS` more), then
tokens generated one at a time from a prefill's cache (each CUDA-synchronised: the median seconds a token), the aten
ops of one more token's forward and the prefill's. In a dry run resacct's allocation recorder and allocator model stand
in for the GPU's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpu_record_matrix import SERVING, attention_context
from gpu_record_step import CUDA_DEVICE, MAX_TRACE_ENTRIES, op_times, start_history, stop_history

from resacct.account.gpu.records.record_models import built_config, materialize_in_order, served_model

TIMED_PREFILLS = 5
DRY_SIZES = (2, 32, 4)  # a dry run's batch, context and generated tokens: the code path on a CPU


def record_serving(name: str, dry: bool) -> dict[str, Any]:
    """Record one entry of :data:`SERVING` in this process (see the module doc)."""
    import torch

    from resacct.account.gpu.tracing.decode_trace import cache_of, serving_forward  # torch's import here, not at the script's start (a usage error is instant)
    from resacct.account.gpu.records.record import compact_snapshot, replay_step
    from resacct.account.load.meta_facts import kv_cache_tensors

    model_config, weights, attention, batch, context, new_tokens = SERVING[name]
    cuda = not dry
    device = CUDA_DEVICE if cuda else "cpu"
    tiny = dry or device != "cuda"
    if tiny:
        batch, context, new_tokens = DRY_SIZES
    values = built_config("hf", model_config, tiny=tiny)
    started = time.perf_counter()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    model = served_model(values, weights)  # on meta, as the prediction builds it
    recorder = start_history(cuda)
    torch.manual_seed(0)
    materialize_in_order(model, device)
    tokens = torch.randint(0, int(values["vocab_size"]), (batch, context), device=device)
    with torch.no_grad(), attention_context(attention, tiny):
        kept = serving_forward(model, tokens)  # the first prefill: what infer --device predicts (weights, the prefill, its cache kept)
    sync()
    peaks, snapshot, settings = stop_history(recorder)
    entries = len(snapshot["device_traces"][0])
    compacted = compact_snapshot(snapshot, window_start=0)
    kv_cache_bytes = sum(tensor.numel() * tensor.element_size() for tensor in kv_cache_tensors(cache_of(kept)))  # what the prefill keeps
    del kept
    prefill_times: list[float] = []
    with torch.no_grad():
        for _ in range(TIMED_PREFILLS):
            sync()
            begin = time.perf_counter()
            with attention_context(attention, tiny):
                output = serving_forward(model, tokens)
            sync()
            prefill_times.append(time.perf_counter() - begin)
        cache, token = cache_of(output), output.logits[:, -1:].argmax(-1)
        del output
        token_times, token, output = timed_tokens(model, token, cache, new_tokens, sync)  # sdpa's own kernel choice, as generate gets it
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as decode_prof:  # one more token: its ops, as infer --device traces them
            serving_forward(model, token, cache)
            sync()
        forced = forced_decode_times(model, token, cache, attention, tiny, new_tokens, sync)  # after the profiled token: its cache as the loop's
        del cache, output
        with profile(activities=activities, record_shapes=True) as prof:
            with attention_context(attention, tiny):
                serving_forward(model, tokens)
            sync()
    replay = replay_step({**compacted, **peaks}, settings)
    return {"name": name, "family": "hf", "weights": weights, "attention": attention, "batch": batch, "context": context,
            "new_tokens": new_tokens, "model_config": values, "parameters": sum(p.numel() for p in model.parameters()),
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()), "kv_cache_bytes": kv_cache_bytes,
            "allocator_settings": settings, "trace_complete": entries < MAX_TRACE_ENTRIES, **peaks, **compacted,
            "prefill_sec": {"median": statistics.median(prefill_times), "all": prefill_times},
            "decode_sec_per_token": {"median": statistics.median(token_times), "all": token_times}, "decode_forced_sec_per_token": forced,
            "ops": op_times(prof), "decode_ops": op_times(decode_prof),
            "replay": {"peak_allocated_bytes": replay.peak_allocated_bytes, "peak_reserved_bytes": replay.peak_reserved_bytes,
                       "first_segment_mismatch": replay.first_segment_mismatch, "holds": replay.holds},
            "seconds": round(time.perf_counter() - started, 2)}


def forced_decode_times(model: Any, token: Any, cache: Any, attention: str, dry: bool, tokens: int, sync: Any) -> dict[str, Any]:
    """``tokens`` more tokens generated with the entry's own sdpa kernel forced (as its prefill runs), each synchronised: beside
    sdpa's own choice (``decode_sec_per_token``) it tells a kernel's time from its choice's. On the H200 record of 2026-11-30
    sdpa's own choice for one-query bf16 attention was cuDNN's, 2.2-4.3 ms of host time a call (its graph built for each new
    cache length): 38-41 ms a token against 1.9 ms of kernels (docs/gpu.md). A kernel that refuses the call is recorded as
    the error it raised, the entry kept."""
    import torch

    try:
        with torch.no_grad(), attention_context(attention, dry):
            times = timed_tokens(model, token, cache, tokens, sync)[0]
    except RuntimeError as error:
        return {"kernel": attention, "error": f"{type(error).__name__}: {error}"[:300]}
    return {"kernel": attention, "median": statistics.median(times), "all": times}


def timed_tokens(model: Any, token: Any, cache: Any, tokens: int, sync: Any) -> tuple[list[float], Any, Any]:
    """``tokens`` tokens generated one at a time from ``cache`` (greedy), each between ``sync()`` calls: their seconds, the
    last token and the last forward's output."""
    from resacct.account.gpu.tracing.decode_trace import serving_forward

    times, output = [], None
    for _ in range(tokens):
        sync()
        begin = time.perf_counter()
        output = serving_forward(model, token, cache)
        token = output.logits[:, -1:].argmax(-1)
        sync()
        times.append(time.perf_counter() - begin)
    return times, token, output
