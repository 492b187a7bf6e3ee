#!/usr/bin/env python3
"""Where a recorded step's time goes, host or GPU, from a board record's own profile (issue 31: docs/gpu.md "Where the
host binds"). Per training step: the board's median step time, the sum of its kernels' ``self_device_us`` (the GPU
busy), the top-level aten ops' CPU time under the profiler (the host; the profiler inflates it), their calls, and the ops
that wait for the device (``nonzero``, ``is_nonzero``, ``cumsum`` of a grouped matmul's offsets …; ``item`` of the
optimizer's host-side step counts waits for nothing), and — in a record made since session 30 — the host's unprofiled time
to the step's last launch (``host_enqueue_sec``). Nothing is predicted: the record alone.

    python benchmarks/board_host_bound.py                                  # the committed H200 record
    python benchmarks/board_host_bound.py --record docs/gpu/<date>-<board>-record.json.gz
    python benchmarks/board_host_bound.py --traced   # and the board's step time per aten op the prediction traces (~25 CPU s)

``--traced`` adds each step's aten ops as resacct traces them on meta (``predict_step_of_record``) and the board's step time
per traced op: on a step whose GPU was busy most of the step, the host took at most that per op — the bound a per-op host
term would have to meet on every step at once.

``--local`` steps each recorded model eagerly on this CPU — its own depth, experts and recipe, its widths shrunk to
:data:`~resacct.account.gpu.records.record_models.TINY`'s, one sequence of 16 tokens, one thread — and prints the median
CPU time of a step (15 after 3 warm-up) and the board's profiled host time over it: were that ratio one number across
the steps, this machine's run of the model code would price the board's host (docs/gpu.md, session 30: it is not).
``--only NAME`` (repeatable) keeps the named steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECORD = "docs/gpu/2026-11-30-h200-record.json.gz"
#: aten ops in a profile that may make the host wait for the device (their count per step)
DEVICE_WAITING = ("aten::nonzero", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::equal", "aten::unique",
                  "aten::repeat_interleave", "aten::cumsum")


def host_and_gpu(step: dict[str, Any]) -> dict[str, Any]:
    """One recorded step's times in milliseconds and its device-waiting ops, from its profile rows."""
    ops = step["ops"]
    waiting: dict[str, int] = {}
    for row in ops:
        if row["name"] in DEVICE_WAITING:
            waiting[row["name"].removeprefix("aten::")] = waiting.get(row["name"].removeprefix("aten::"), 0) + row["calls"]
    busy_ms = sum(row["self_device_us"] for row in ops) / 1e3
    host_ms = sum(row["cpu_us"] for row in ops if row["top_level"]) / 1e3
    enqueued = step.get("host_enqueue_sec")  # unprofiled (records since session 30)
    return {"name": step["name"], "step_ms": step["step_time_sec"]["median"] * 1e3, "gpu_busy_ms": busy_ms, "host_ms": host_ms,
            "enqueue_ms": None if enqueued is None else enqueued["median"] * 1e3,
            "top_level_calls": sum(row["calls"] for row in ops if row["top_level"]), "waiting": waiting,
            "binds": "host" if host_ms > busy_ms else "GPU"}


#: the widths ``--local`` shrinks a transformers config to (depth, experts and routing kept)
_LOCAL_WIDTHS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "head_dim", "num_key_value_heads", "n_embd",
                 "n_head", "n_positions")


def local_step_cpu_sec(step: dict[str, Any], *, steps: int = 15) -> float:
    """The median CPU seconds of one training step of ``step``'s model on this CPU, at its own depth with its widths
    shrunk (batch 1 × 16 tokens, one thread): the model code's host work without a GPU's kernels."""
    import statistics
    import time
    from dataclasses import asdict

    import torch

    from resacct.account.gpu.records.record_models import TINY, build_record_model
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.memory_timeline import run_training_step

    config = step["model_config"]
    if step["family"] == "resacct":
        from resacct.training.gpt import get_gpt_config

        fields = asdict(get_gpt_config(config)) if isinstance(config, str) else dict(config)
        config = dict(fields, vocab_size=256, context_length=64, n_heads=4, d_model=64)
    else:
        config = dict(config)
        config.update({key: TINY[key] for key in _LOCAL_WIDTHS if key in TINY and (key in config or key == "head_dim" and config["model_type"] != "gpt2")})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        net, loss_fn = build_record_model(step["family"], config, step["attention"], step.get("extra") or {}, tiny=False, device="cpu")
        tokens = torch.randint(0, net.config.vocab_size, (1, 17))
        prepared = recipe_step(parse_recipe(step["recipe"]), net, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()), loss_fn, "adamw")
        optimizer = prepared.make_optimizer([p for p in prepared.model.parameters() if p.requires_grad])
        seconds = []
        for index in range(3 + steps):
            begin = time.process_time()
            run_training_step(prepared.model, prepared.inputs, prepared.loss_fn, optimizer)
            if index >= 3:
                seconds.append(time.process_time() - begin)
        return statistics.median(seconds)
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", default=DEFAULT_RECORD, help=f"a board record (default {DEFAULT_RECORD})")
    parser.add_argument("--traced", action="store_true", help="also the ops resacct traces per step and the board's step time per traced op")
    parser.add_argument("--local", action="store_true", help="also each model's step on this CPU (widths shrunk) and the board's host ÷ it")
    parser.add_argument("--only", action="append", default=None, metavar="STEP", help="a recorded step's name (repeatable)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from resacct.account.gpu.records.board_record import read_board_record
    from resacct.errors import ResacctError

    try:
        data = read_board_record(args.record)
    except ResacctError as error:
        print(f"board_host_bound.py: {error}", file=sys.stderr)
        return 2
    print(f"{data['board']}, {data['when']}: {args.record}")
    print(f"{'step':48s} {'board step':>10s} {'GPU busy':>9s} {'host':>9s} {'calls':>6s}  binds  "
          + ("traced ops, step per op  " if args.traced else "") + ("local CPU, host ÷ it  " if args.local else "") + "device-waiting ops")
    steps = [step for step in data["steps"] if args.only is None or step["name"] in args.only]
    if not steps:
        print(f"board_host_bound.py: --only {', '.join(args.only or [])}: no such step; the record has {', '.join(s['name'] for s in data['steps'])}",
              file=sys.stderr)
        return 2
    for step in steps:
        if "ops" not in step:
            print(f"{step['name']:48s} (not recorded: {step.get('error', 'no profile')})")
            continue
        row = host_and_gpu(step)
        waiting = ", ".join(f"{count} {name}" for name, count in sorted(row["waiting"].items()))
        if row["enqueue_ms"] is not None:
            waiting += f"; host unprofiled {row['enqueue_ms']:.2f} ms"
        traced = ""
        if args.traced:
            from resacct.account.gpu.records.record_models import predict_step_of_record

            ops: list[Any] = []
            predict_step_of_record(data, step, ops=ops)
            traced = f"{len(ops):6,d} {row['step_ms'] * 1e3 / len(ops):6.1f} µs      "
        if args.local:
            local_ms = local_step_cpu_sec(step) * 1e3
            traced += f"{local_ms:7.2f} ms {row['host_ms'] / local_ms:5.2f}    "
        print(f"{row['name']:48s} {row['step_ms']:8.2f} ms {row['gpu_busy_ms']:6.2f} ms {row['host_ms']:6.2f} ms {row['top_level_calls']:6,d}"
              f"  {row['binds']:5s}  {traced}{waiting}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
