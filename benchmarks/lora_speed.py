"""`resacct lora --hf-config llama-2-7b --seq 2048 --device h100` in fresh processes, cold (``--no-cache``): this
checkout beside another (``--baseline-root``, e.g. a ``git worktree`` of the commit before), taking turns, so a
machine whose speed moves (docs/verify_time.md, session 16) moves both alike. Prints each run's CPU and wall seconds,
the medians, their ratios, and whether every run printed the same ``--json`` answer (issue 34: the board's steps are
traced on the second core beside the CPU search, resacct/cli/_lora_board.py).

    python benchmarks/lora_speed.py --baseline-root /tmp/before --repeats 3
    python benchmarks/lora_speed.py --baseline-root /tmp/before --hf-config gemma-3-12b --seq 512 --no-device
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # core_throughput beside it


def command_of(config: str, seq: int, device: str | None) -> list[str]:
    """The ``resacct`` arguments timed: ``lora`` of ``config`` at ``seq`` tokens, on ``device`` (None: the CPU kernels' step alone)."""
    return ["lora", "--hf-config", config, "--seq", str(seq), *(["--device", device] if device else []), "--no-cache", "--json"]


def _run(root: Path, command: list[str]) -> tuple[float, float, str]:
    """(CPU s, wall s, the printed JSON) of the command from the checkout at ``root``, in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "resacct", *command], cwd=root, capture_output=True, text=True, check=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-root", type=Path, required=True, metavar="PATH", help="the other checkout (the tree before)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each running both trees (default 3)")
    parser.add_argument("--hf-config", default="llama-2-7b", metavar="NAME", help="the config (default llama-2-7b)")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    parser.add_argument("--no-device", action="store_true", help="no --device h100: the CPU kernels' step alone")
    parser.add_argument("--no-core-probe", action="store_true", help="skip measuring what the CPUs deliver before and after (~8 s each)")
    args = parser.parse_args()
    command = command_of(args.hf_config, args.seq, None if args.no_device else "h100")
    from core_throughput import print_probe

    print_probe("before", skip=args.no_core_probe)
    runs: dict[str, list[tuple[float, float]]] = {"this tree": [], "baseline": []}
    answers = set()
    trees = [("this tree", ROOT), ("baseline", args.baseline_root.resolve())]
    for index in range(args.repeats):
        for name, root in trees[index % 2:] + trees[:index % 2]:
            cpu, wall, printed = _run(root, command)
            runs[name].append((round(cpu, 2), round(wall, 2)))
            answers.add(printed)
    print(f"resacct {' '.join(command)}: fresh processes, {args.repeats} rounds taking turns (medians)")
    medians = {name: tuple(statistics.median(run[i] for run in found) for i in (0, 1)) for name, found in runs.items()}
    for name, (cpu, wall) in medians.items():
        print(f"  {name:<10} CPU {cpu:6.2f} s  wall {wall:6.2f} s   runs (CPU, wall) {runs[name]}")
    (cpu, wall), (base_cpu, base_wall) = medians["this tree"], medians["baseline"]
    print(f"  this tree ÷ baseline: CPU {cpu / base_cpu:.2f}, wall {wall / base_wall:.2f}; --json identical in every run: {len(answers) == 1}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print_probe("after", skip=args.no_core_probe)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
