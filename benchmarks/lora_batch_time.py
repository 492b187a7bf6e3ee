"""`resacct lora --memory-gb …`: CPU seconds of the command whose largest batch is searched as `fit`
searches (resacct.account.fit.lora_batch: traced at the answer and one more, issue 34) beside an
older tree's (``--before``, default 886c372: the estimate from one trace's growth per sequence),
the two taking turns in fresh processes, and the largest batch each printed.

    python benchmarks/lora_batch_time.py                    # 3 rounds, the questions below
    python benchmarks/lora_batch_time.py --rounds 5 --before 886c372

Questions: llama-2-7b r=16 on q,v, seq 2048, checkpointed, 24 GB (the README's bar), and the same
without ``--memory-gb`` (no search: what the rest of the command costs); the 2-layer Llama of
tests/test_lora_largest_batch.py over an fp32 base at 1.13 MB (where the estimate said 6 and 7 fits).
CPU seconds are ``getrusage(RUSAGE_CHILDREN)`` user + system of each command: on a busy machine they
move far less than wall time. The older tree is ``git archive``d into a temporary folder and put
first on ``PYTHONPATH``; nothing is written outside temporary folders.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}


def questions(tiny_config: str) -> dict[str, list[str]]:
    seven_b = ["lora", "--hf-config", "llama-2-7b", "--rank", "16", "--batch", "1", "--seq", "2048", "--gradient-checkpointing"]
    return {"7b-24gb": [*seven_b, "--memory-gb", "24"], "7b-no-memory": seven_b,
            "tiny-1.13mb": ["lora", "--hf-config", tiny_config, "--rank", "4", "--base", "fp32", "--seq", "16", "--memory-gb", "0.00113"]}


def run(tree: Path, argv: list[str]) -> tuple[float, str]:
    """CPU seconds of ``resacct argv`` with ``tree`` first on the path, and its largest-batch line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(tree), "RESACCT_NO_CACHE": "1"}
    out = subprocess.run([sys.executable, "-m", "resacct", *argv], cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True,
                         check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((line.strip() for line in out.splitlines() if "largest batch" in line), "")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, re.sub(r" \(.*", "", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="886c372", metavar="COMMIT", help="the older tree (default: 886c372, the one-trace estimate)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        old = Path(folder) / "before"
        archive = subprocess.run(["git", "archive", "--format=tar", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        tiny = Path(folder) / "config.json"
        tiny.write_text(json.dumps(TINY_LLAMA))
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        for name, question in questions(str(tiny)).items():
            seconds: dict[str, list[float]] = {"before": [], "after": []}
            lines = {}
            for _ in range(args.rounds):  # taking turns: load moves both alike
                for label, tree in (("before", old), ("after", ROOT)):
                    cpu, lines[label] = run(tree, question)
                    seconds[label].append(cpu)
            medians = {label: statistics.median(values) for label, values in seconds.items()}
            print(f"{name}: before {medians['before']:.2f} CPU s {sorted(round(s, 2) for s in seconds['before'])} '{lines['before']}'; "
                  f"after {medians['after']:.2f} CPU s {sorted(round(s, 2) for s in seconds['after'])} '{lines['after']}'; "
                  f"after/before {medians['after'] / medians['before']:.2f}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
