"""Wall time of ``resacct account``'s analyses against the bare torch measurements they wrap.

    OMP_NUM_THREADS=1 python benchmarks/account_step.py                       # gpt-tiny, batch 4 × 128
    OMP_NUM_THREADS=1 python benchmarks/account_step.py --model gpt-nano --batch 2 --seq 32 --repeats 9
    OMP_NUM_THREADS=1 python benchmarks/account_step.py --cli-bar        # the bar: gpt2-small 1 × 1024 on meta < 20 s
    OMP_NUM_THREADS=1 python benchmarks/account_step.py --account-model  # issue 34: account_model on HF GPT-2 ÷ bare FlopCounterMode ≤ 2

Each row times one analysis on the same model and batch, beside the bare measurement it wraps:

- FLOPs — *bare*: one FlopCounterMode around forward + loss + backward; *resacct*:
  :func:`resacct.account.trace_step_flops` (nested counters for the forward/backward split, the
  per-module breakdown made exclusive, a dispatch mode listing the ops the counter misses);
- activations — *bare*: ``saved_tensors_hooks`` keeping every saved tensor; *resacct*:
  :func:`resacct.measurement.activations.record_saved_activations` (a module stack from forward hooks,
  storage deduplication, parameters flagged);
- allocator — *bare*: forward + backward with no profiler; *resacct*: the same under
  :func:`resacct.measurement.activations.trace_allocations` (torch.profiler, ``profile_memory=True``);
- training state — *bare*: two AdamW steps; *resacct*:
  :func:`resacct.account.measure_training_state` (a copy of the model, the recipe, the counts);
- the whole account — *bare*: one training step (forward, backward, AdamW); *resacct*:
  :func:`resacct.account.account_gpt` without its own timing (``time_step=False``).

Each cell is the median of ``--repeats`` runs after one warm-up, the two sides interleaved run by
run; the FLOP and saved-byte counts of both sides must agree, or the script exits with status 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resacct.account import account_gpt, measure_training_state, trace_step_flops  # noqa: E402
from resacct.measurement.activations import gpt_loss, record_saved_activations, trace_allocations  # noqa: E402
from resacct.training.gpt import build_gpt, get_gpt_config  # noqa: E402


def _median_sec(function: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cli-bar", action="store_true",
                        help="time `resacct account --model gpt2-small --batch 1 --seq 1024 --json` end to end (a fresh process, imports included)")
    parser.add_argument("--account-model", action="store_true",
                        help="issue 34's bar: resacct.api.account_model on HF GPT-2 (meta, 1 × 1024) ÷ bare FlopCounterMode fwd+bwd, one process")
    args = parser.parse_args(argv)
    if args.cli_bar:
        return _cli_bar(args.repeats)
    if args.account_model:
        return _account_model_bar(args.repeats)

    torch.manual_seed(0)
    config = get_gpt_config(args.model)
    model = build_gpt(config)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    targets = torch.randint(0, config.vocab_size, (args.batch, args.seq))

    def loss() -> torch.Tensor:
        return gpt_loss(model, tokens, targets)

    found: dict[str, int] = {}

    def bare_flops() -> None:
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            loss().backward()
        found["bare flops"] = int(counter.get_total_flops())

    def resacct_flops() -> None:
        found["resacct flops"] = trace_step_flops(model, loss).step_flops

    def bare_saved() -> None:
        kept: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (kept.append(t), t)[1], lambda t: t):
            loss()
        parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
        found["bare saved"] = sum(size for pointer, size in storages.items() if pointer not in parameters)

    def resacct_saved() -> None:
        with record_saved_activations(model) as saved:
            loss()
        found["resacct saved"] = saved.activation_bytes

    def bare_step_no_profiler() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    def resacct_allocator() -> None:
        model.zero_grad(set_to_none=True)
        with trace_allocations():
            loss().backward()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def bare_two_steps() -> None:
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            loss().backward()
            optimizer.step()

    def resacct_state() -> None:
        measure_training_state(model, lambda module: gpt_loss(module, tokens, targets), "fp32")

    def bare_one_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()

    def resacct_account() -> None:
        account_gpt(args.model, batch=args.batch, seq=args.seq, time_step=False)

    rows = [
        ("FLOPs: FlopCounterMode | trace_step_flops", bare_flops, resacct_flops),
        ("activations: saved_tensors_hooks | record_saved_activations", bare_saved, resacct_saved),
        ("allocator: fwd+bwd | under trace_allocations", bare_step_no_profiler, resacct_allocator),
        ("state: 2 AdamW steps | measure_training_state", bare_two_steps, resacct_state),
        ("all: 1 training step | account_gpt (no timing)", bare_one_step, resacct_account),
    ]
    print(f"{args.model}, batch {args.batch} × seq {args.seq}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"median of {args.repeats}")
    print(f"{'analysis: bare | resacct':<62}{'bare s':>10}{'resacct s':>12}{'ratio':>9}")
    for name, bare, wrapped in rows:
        bare(), wrapped()  # warm-up
        bare_samples, wrapped_samples = [], []
        for _ in range(args.repeats):  # interleaved, so both sides see the same machine
            bare_samples += _median_sec(bare, 1)
            wrapped_samples += _median_sec(wrapped, 1)
        bare_sec, wrapped_sec = statistics.median(bare_samples), statistics.median(wrapped_samples)
        print(f"{name:<62}{bare_sec:>10.4f}{wrapped_sec:>12.4f}{wrapped_sec / bare_sec:>9.1f}")
    if found["bare flops"] != found["resacct flops"] or found["bare saved"] != found["resacct saved"]:
        print(f"counts disagree: {found}", file=sys.stderr)
        return 1
    print(f"counts agree: {found['bare flops']:,} FLOPs, {found['bare saved']:,} saved bytes")
    return 0


def _cli_bar(repeats: int, limit_sec: float = 20.0) -> int:
    """Wall time of the whole command in a fresh process (median of ``repeats``); fails above the bar."""
    import json
    import subprocess

    command = [sys.executable, "-m", "resacct", "account", "--model", "gpt2-small", "--batch", "1", "--seq", "1024", "--json"]
    samples, device = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
        samples.append(time.perf_counter() - started)
        device = json.loads(done.stdout)["device"]
    median = statistics.median(samples)
    print(f"resacct account --model gpt2-small --batch 1 --seq 1024 (on {device}): median {median:.2f} s of {repeats} "
          f"(min {min(samples):.2f}, max {max(samples):.2f}); bar {limit_sec:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    return 0 if median < limit_sec else 1


def _account_model_bar(repeats: int, limit: float = 2.0) -> int:
    """CPU seconds of :func:`resacct.api.account_model` on transformers' GPT-2 (config ``gpt2``, built on
    meta, batch 1 × 1024) beside one bare FlopCounterMode over the same model's forward (its own loss)
    and backward, interleaved in one process after a warm-up of each; the ratio of the medians.
    account_model does more than count: FLOPs, saved tensors, training state and the step's peak, all
    from one pass on fake CPU tensors (forward, backward, optimizer step; docs/account.md "Trace once") — fails above ``limit``."""
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.api import account_model

    model = build_hf_model(load_hf_config("gpt2"), device="meta")
    model.train()
    ids = torch.empty(1, 1024, dtype=torch.long, device="meta")
    found: dict[str, int] = {}

    def bare() -> None:
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        found["bare"] = int(counter.get_total_flops())

    def resacct_side() -> None:
        report = account_model(model, batch=1, seq=1024)
        found["resacct"] = int(report.flops.measured)

    cpu: dict[str, list[float]] = {"bare": [], "resacct": []}
    for index in range(repeats + 1):
        for name, function in (("bare", bare), ("resacct", resacct_side)):
            started = time.process_time()
            function()
            if index:  # the first round warms both up
                cpu[name].append(time.process_time() - started)
    ratio = statistics.median(cpu["resacct"]) / statistics.median(cpu["bare"])
    print(f"account_model(HF GPT-2 on meta, 1 × 1024) ÷ bare FlopCounterMode fwd+bwd, CPU s, {repeats} interleaved runs each: "
          f"{statistics.median(cpu['resacct']):.2f} / {statistics.median(cpu['bare']):.2f} = {ratio:.2f} (bar ≤ {limit:g}); "
          f"step FLOPs resacct {found['resacct']:,}, bare {found['bare']:,}")
    return 0 if ratio <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
