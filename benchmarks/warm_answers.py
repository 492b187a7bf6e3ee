"""A command's answer read back from the trace cache (issue 34, "fast answers"): each command once cold (traced, then
stored in a temporary cache folder) and ``--repeats`` times warm, in fresh processes, side by side in one run — wall
seconds, whether the warm run imported torch, and whether it printed the same as the cold one.

    python benchmarks/warm_answers.py                          # fit, infer, lora on llama-2-7b
    python benchmarks/warm_answers.py --command shard --repeats 5
    python benchmarks/warm_answers.py --root /tmp/before     # another tree (a `git archive` unpacked) on PYTHONPATH

Wall seconds are the machine's load as much as resacct's: read the ratios and the load average printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "fit": ["fit", "--hf-config", "llama-2-7b", "--recipe", "bf16", "--seq", "4096", "--device", "h100", "--no-progress"],
    "infer": ["infer", "--hf-config", "llama-2-7b", "--device", "h200"],
    "lora": ["lora", "--hf-config", "llama-2-7b", "--device", "a100", "--batch", "4", "--seq", "1024"],
    "shard": ["shard", "--hf-config", "llama-2-7b", "--devices", "8", "--seq", "2048", "--device", "h100"],
    "account": ["account", "--hf-config", "llama-2-7b", "--batch", "1", "--seq", "4096"],
}

_PROBE = """
import json, sys
from resacct.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


def _run(argv: list[str], cache: str, root: Path = ROOT) -> tuple[float, dict, str]:
    env = {**os.environ, "RESACCT_CACHE_DIR": cache, "PYTHONPATH": str(root)}
    env.pop("RESACCT_NO_CACHE", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env, cwd=root)
    seconds = time.perf_counter() - started
    return seconds, json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", action="append", choices=sorted(COMMANDS), default=[], help="commands to run (default: fit, infer, lora)")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per command (default 3)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the resacct tree to run (default: this checkout)")
    args = parser.parse_args(argv)
    print(f"tree: {args.root}")
    print(f"load average before: {' '.join(f'{value:.1f}' for value in os.getloadavg())}  ({os.cpu_count()} CPUs)")
    for name in args.command or ["fit", "infer", "lora"]:
        with tempfile.TemporaryDirectory() as cache:
            cold, cold_probe, cold_out = _run(COMMANDS[name], cache, args.root)
            warm = [_run(COMMANDS[name], cache, args.root) for _ in range(args.repeats)]
        median = statistics.median(seconds for seconds, _, _ in warm)
        same = all(out == cold_out for _, _, out in warm)
        torch_warm = any(probe["torch"] for _, probe, _ in warm)
        print(f"{' '.join(COMMANDS[name])}\n  cold {cold:.2f} s (exit {cold_probe['code']}), warm {', '.join(f'{s:.2f}' for s, _, _ in warm)} s: "
              f"median {median:.2f} s, warm ÷ cold {median / cold:.3f}; torch imported warm: {torch_warm}; same output: {same}", flush=True)
    print(f"load average after:  {' '.join(f'{value:.1f}' for value in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
