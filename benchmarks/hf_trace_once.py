"""``account_hf_config`` traced once (the step peak's fake pass also records FLOPs, state and saved
tensors) against the same account with the meta pass run too, side by side in one process (issue 34).

    python benchmarks/hf_trace_once.py [--layers 9] [--rounds 3]

A GPT-2 built from a small config (64 wide, ``--layers`` deep, batch 2 × 24 tokens, fp32: its CPU
sdpa takes the math path, so the fake pass runs the meta step), accounted with every layer traced
and sampled at depths 3, 4 and 5; the two ways alternate round by round. Printed: the median CPU
seconds of each way and their ratio, and whether the two accounts are equal (``to_dict``, the
peak and its timeline) — they must be.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=9, help="the GPT-2's depth (default 9)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two ways in turn (default 3)")
    args = parser.parse_args(argv)
    from resacct.account.answers.hf import account_hf_config
    from resacct.account.peak import one_pass
    from resacct.checks.hf import _small_spec

    spec = _small_spec("gpt2", 64, args.layers, 4, 4, 96, 160, 128, 0, 0)
    account_hf_config(spec, batch=2, seq=24, layers="all")  # warm-up: imports, kernels
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; GPT-2 {args.layers} layers, batch 2 x 24, fp32")
    for layers in ("all", "sampled"):
        seconds: dict[str, list[float]] = {"once": [], "meta pass too": []}
        equal = True
        for _ in range(args.rounds):
            accounts = {}
            for way in seconds:
                patch = mock.patch.object(one_pass, "trace_once", lambda *a, **k: None) if way != "once" else mock.patch.object(one_pass, "trace_once", one_pass.trace_once)
                with patch:
                    began = time.process_time()
                    accounts[way] = account_hf_config(spec, batch=2, seq=24, layers=layers)
                    seconds[way].append(time.process_time() - began)
            once, meta = accounts["once"], accounts["meta pass too"]
            equal &= once.to_dict() == meta.to_dict() and once.step_peak.predicted == meta.step_peak.predicted
        medians = {way: statistics.median(values) for way, values in seconds.items()}
        print(f"layers={layers:8s} traced once {medians['once']:.2f} CPU s, with the meta pass {medians['meta pass too']:.2f} CPU s "
              f"(ratio {medians['once'] / medians['meta pass too']:.2f}); accounts equal: {equal}")
        if not equal:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
