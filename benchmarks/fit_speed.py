"""`resacct fit --hf-config llama-2-7b --recipe bf16 --device h100`: CPU seconds and traces of the
search — each phase's line through two traces, confirmed by two more (resacct.account.fit_lines, issue 34)
beside the search it replaced (doubling steered by the line, at most ×8 a step, then the line
between the sizes that fit and did not; copied below from commit 4c552ff) — measured side by side
in one process on one 7B model built on meta, then the whole command's CPU seconds in a fresh process.

    python benchmarks/fit_speed.py                 # seq 4096, 1024 and 256
    python benchmarks/fit_speed.py --seq 4096      # one sequence length

CPU seconds are ``time.process_time`` (this process) and ``getrusage(RUSAGE_CHILDREN)`` (the
command): on a busy machine they move far less than wall time. Each search traces afresh (no cache).
"""

from __future__ import annotations

import argparse
import copy
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 80e9  # an H100 SXM's 80 GB, no reserve


def _crossing(low, low_peak, high, high_peak, budget_bytes):
    if high_peak <= low_peak:
        return None
    return low + (budget_bytes - low_peak) * (high - low) / (high_peak - low_peak)


def previous_largest_fitting(peak_of, budget_bytes, *, limit):
    """The search before issue 34 (resacct/account/fit_search.py at 4c552ff), the probes' sizes returned."""
    probes: dict[int, int] = {}

    def fits(size):
        probes[size] = peak_of(size)
        return probes[size] <= budget_bytes

    if not fits(1):
        return None, list(probes)
    low, previous, high = 1, None, None
    while high is None and low < limit:
        guess = None if previous is None else _crossing(previous, probes[previous], low, probes[low], budget_bytes)
        size = 2 * low if guess is None else min(max(int(guess) + 1, 2 * low), 8 * low)
        size = min(size, limit)
        previous = low
        if fits(size):
            low = size
        else:
            high = size
    steer = True
    while high is not None and high - low > 1:
        gap = high - low
        guess = _crossing(low, probes[low], high, probes[high], budget_bytes) if steer else None
        size = (low + high) // 2 if guess is None else min(max(int(guess), low + 1), high - 1)
        if fits(size):
            low = size
        else:
            high = size
        steer = guess is None or high - low <= gap // 2 or high - low == 1
    return low, list(probes)


def _command_cpu_seconds(seq: int) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    completed = subprocess.run([sys.executable, "-m", "resacct", "fit", "--hf-config", "llama-2-7b", "--recipe", "bf16", "--seq", str(seq),
                                "--device", "h100"], cwd=ROOT, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    answer = next(line.strip() for line in completed.stdout.splitlines() if "largest micro-batch" in line)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, action="append", default=None, help="sequence length (repeatable; default 4096, 1024, 256)")
    parser.add_argument("--no-command", action="store_true", help="skip the whole command in a fresh process")
    args = parser.parse_args()
    import torch

    from resacct.account.fit_search import MAX_BATCH, hf_config_target, largest_fitting, phase_peaks_bytes, step_peak_function
    from resacct.facts.recipes import get_recipe

    recipe = get_recipe("bf16")
    target = hf_config_target("llama-2-7b")
    model = copy.deepcopy(target.model).to(torch.bfloat16)
    print(f"llama-2-7b, bf16 AdamW, budget {BUDGET_BYTES / 1e9:g} GB (h100-sxm), torch {torch.__version__}")
    print(f"{'seq':>6} {'search':<9} {'answer':>7} {'traces':>6} {'CPU s':>7} {'wall s':>7}  sizes traced")
    for seq in args.seq or [4096, 1024, 256]:
        results = {}
        for name in ("previous", "affine"):
            kept: dict = {}
            peak_of = step_peak_function(target, model, search="batch", fixed=seq, recipe=recipe, optimizer="adamw", keep=kept)
            cpu, wall = time.process_time(), time.perf_counter()
            if name == "previous":
                answer, probes = previous_largest_fitting(peak_of, BUDGET_BYTES, limit=MAX_BATCH)
            else:  # as fit_step runs it: each phase's line
                answer, probes = largest_fitting(peak_of, BUDGET_BYTES, limit=MAX_BATCH, phase_peaks_of=lambda size: phase_peaks_bytes(kept[size]))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            sizes = [p if isinstance(p, int) else p.size for p in probes]
            results[name] = (answer, cpu)
            print(f"{seq:>6} {name:<9} {answer!s:>7} {len(sizes):>6} {cpu:7.2f} {wall:7.2f}  {sizes}")
        assert results["previous"][0] == results["affine"][0], results
        print(f"{seq:>6} affine ÷ previous CPU: {results['affine'][1] / results['previous'][1]:.2f}")
    if not args.no_command:
        for seq in args.seq or [4096]:
            cpu, answer = _command_cpu_seconds(seq)
            print(f"resacct fit --hf-config llama-2-7b --recipe bf16 --seq {seq} --device h100: {cpu:.2f} CPU s in a fresh process ({answer})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
