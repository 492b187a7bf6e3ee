"""The CUDA allocator pass (``predict_cuda_step_memory`` over meta tensors) and the FLOP trace of a step on
meta (``trace_step_flops``, GPT-2 small, 4 × 64 tokens) with and without
:class:`resacct.measurement.meta_op_cache.MetaOpCache`, interleaved in one process, the answers compared.

    python benchmarks/meta_op_cache.py                       # llama-2-7b bf16 seq 4096, llama-2-70b fp32 batch 4 × 4096
    python benchmarks/meta_op_cache.py --rounds 3 --config llama-2-7b

Each round traces every layer once with the cache (a fresh one per pass, as the commands make it) and
once without (every op through torch's meta kernels), the order alternating; prints the CPU seconds
(``time.process_time``) of each, their ratio and the cache's hits, and exits 1 if any predicted number
(allocated and reserved peaks, what is live at the peak, the segments; the FLOPs per module) differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from resacct.account.gpu.tracing import allocation_trace
from resacct.account.gpu.tracing.cuda_step import cuda_adamw, predict_cuda_step_memory
from resacct.account.load.hf_models import build_hf_model, load_hf_config
from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
from resacct.measurement.meta_op_cache import MetaOpCache, MetaOpCacheMode, meta_calls_cached, shared_meta_cache as shared

CASES = {"llama-2-7b": (torch.bfloat16, 1, 4096, "flash"), "llama-2-70b": (torch.float32, 4, 4096, "efficient")}


class _NoCache(MetaOpCache):
    def call(self, func, args, kwargs):  # type: ignore[no-untyped-def]
        self.passed += 1
        return func(*args, **kwargs)


def _pass(model, inputs, attention: str, cached: bool) -> tuple[float, object, MetaOpCache]:  # type: ignore[no-untyped-def]
    made: list[MetaOpCache] = []

    def cache() -> MetaOpCache:
        made.append(MetaOpCache() if cached else _NoCache())
        return made[-1]

    allocation_trace.shared_meta_cache = cache  # type: ignore[assignment]  # the recorder asks for its cache here
    try:
        began = time.process_time()
        prediction = predict_cuda_step_memory(model, inputs, lambda module, batch: loss_of_output(call_model(module, batch), "model"),
                                              cuda_adamw, attention=attention)
        return time.process_time() - began, prediction, made[0]
    finally:
        allocation_trace.shared_meta_cache = shared  # type: ignore[assignment]


def _flop_trace(rounds: int) -> bool:
    import contextlib

    from resacct.account.trace import step_measurements
    from resacct.measurement.activations import gpt_loss
    from resacct.training.gpt import build_gpt, get_gpt_config

    net = build_gpt(get_gpt_config("gpt2-small"), device="meta")
    tokens = torch.zeros(4, 64, dtype=torch.long, device="meta")
    seconds: dict[bool, list[float]] = {True: [], False: []}
    traces = {}
    try:
        for round_index in range(2 * rounds):
            for cached in ((True, False) if round_index % 2 == 0 else (False, True)):
                step_measurements.meta_calls_cached = (lambda *things: MetaOpCacheMode()) if cached else (lambda *things: contextlib.nullcontext())  # type: ignore[assignment]
                began = time.process_time()
                traces[cached] = step_measurements.trace_step_flops(net, lambda: gpt_loss(net, tokens, tokens))
                seconds[cached].append(time.process_time() - began)
    finally:
        step_measurements.meta_calls_cached = meta_calls_cached  # type: ignore[assignment]
    with_cache, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"  trace_step_flops, gpt2-small on meta, 4 × 64 tokens ({2 * rounds} runs each): cache {with_cache:.3f} s, no cache {without:.3f} s; "
          f"ratio {with_cache / without:.2f}; traces equal: {traces[True] == traces[False]}")
    return traces[True] == traces[False]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each pass once with and once without the cache (default 2)")
    parser.add_argument("--config", choices=sorted(CASES), action="append", help="a shipped config (default: both)")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    differing = 0
    print(f"torch {torch.__version__}; CPU seconds of one CUDA allocator pass over every layer, {arguments.rounds} interleaved rounds")
    for name in arguments.config or sorted(CASES):
        dtype, batch, seq, attention = CASES[name]
        model = build_hf_model(load_hf_config(name), device="meta").to(dtype).train()
        inputs = default_inputs(model, batch=batch, seq=seq, device="meta")
        seconds: dict[bool, list[float]] = {True: [], False: []}
        answers = {}
        for round_index in range(arguments.rounds):
            for cached in ((True, False) if round_index % 2 == 0 else (False, True)):
                spent, prediction, cache = _pass(model, inputs, attention, cached)
                seconds[cached].append(spent)
                answers.setdefault(cached, prediction)
                if cached:
                    hits, misses, passed = cache.hits, cache.misses, cache.passed
        same = answers[True] == answers[False]
        differing += not same
        with_cache, without = statistics.median(seconds[True]), statistics.median(seconds[False])
        print(f"  {name} {str(dtype).removeprefix('torch.')} batch {batch} × seq {seq}, attention {attention}: "
              f"cache {with_cache:.2f} s (runs {', '.join(f'{s:.2f}' for s in seconds[True])}), "
              f"no cache {without:.2f} s (runs {', '.join(f'{s:.2f}' for s in seconds[False])}); ratio {with_cache / without:.2f}; "
              f"{hits:,} calls answered from the cache, {misses:,} traced, {passed:,} passed through; predictions equal: {same}")
    differing += not _flop_trace(arguments.rounds)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
