"""A training step's time predicted op by op (resacct.measurement.runtime_model) beside the clock, for three
models on this CPU: per phase, the top modules and the top ops, with each one's bound.

    OMP_NUM_THREADS=1 python benchmarks/runtime_prediction.py            # gpt-tiny, mlp, cruncher
    OMP_NUM_THREADS=1 python benchmarks/runtime_prediction.py --models mlp --top 10

One torch thread; "measured" is this thread's CPU time (time.thread_time), the median of 5 clean
steps — on an idle machine it equals the wall time; on a shared one it leaves out the waiting.
The models are those of resacct/specs/runtime_model.claims.yaml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resacct.checks.runtime_model import MODELS, machine_costs, predicted_step  # noqa: E402

BATCH = {"gpt-tiny": 2, "mlp": 256, "cruncher": 256}
SHAPE = {"gpt-tiny": "gpt-tiny (4 layers, d 128), batch 2 × 64 tokens", "mlp": "MLP 256 → 1024 → 1024 → 256 (GELU), batch 256",
         "cruncher": "Cruncher 4 × Linear(256, 256) + Linear(256, 1), batch 256"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--top", type=int, default=5, help="modules and ops shown per model (by measured time)")
    args = parser.parse_args(argv)
    costs = machine_costs()
    print(f"torch {torch.__version__}, 1 thread; measured rates: matmul {costs.matmul_flops_per_sec['float32'] / 1e9:.1f} GFLOP/s (384³), "
          f"element-wise {costs.elements_per_sec / 1e9:.2f} G/s (add in L2), tanh {costs.transcendental_elements_per_sec / 1e9:.2f} G/s, "
          f"sqrt {costs.root_elements_per_sec / 1e9:.2f} G/s, triad {costs.dram_bytes_per_sec / 1e9:.1f} GB/s DRAM / {costs.cache_bytes_per_sec / 1e9:.1f} GB/s LLC, "
          f"overhead {costs.kernel_overhead_sec * 1e6:.2f} µs an op ({costs.view_overhead_sec * 1e6:.2f} µs a view)\n")
    print(f"{'model':<10}{'phase':<11}{'predicted ms':>13}{'measured ms':>12}{'pred/meas':>10}  bound (share of predicted time)")
    for model in args.models:
        step = predicted_step(model, BATCH[model])
        by_phase = step.by(lambda op: op.phase)
        for phase, predicted in step.phases().items():
            row = by_phase.get(phase, {"sec_by_bound": {}})
            mix = ", ".join(f"{bound} {seconds / predicted:.0%}" for bound, seconds in sorted(row["sec_by_bound"].items(), key=lambda kv: -kv[1]))
            print(f"{model:<10}{phase:<11}{_ms(predicted):>13}{_ms(step.measured_phase_sec[phase]):>12}{predicted / step.measured_phase_sec[phase]:>10.2f}  {mix}")
        print(f"{model:<10}{'step':<11}{_ms(step.predicted_step_sec):>13}{_ms(step.measured_step_sec):>12}{step.ratio:>10.2f}  {SHAPE[model]}")
        calls = sum(1 for op in step.ops if op.phase == "optimizer")
        print(f"{'':<10}optimizer: {calls} ops at {step.optimizer_op_overhead_sec * 1e6:.1f} µs each of the optimizer's own cost "
              f"(a one-element stand-in's step ÷ its ops)\n")
    for model in args.models:
        step = predicted_step(model, BATCH[model])
        for title, table in (("module", step.by_module()), ("op", step.by_op())):
            print(f"{model}: top {args.top} {title}s by measured time (clocked inside the recording)")
            print(f"  {title:<36}{'calls':>6}{'predicted ms':>13}{'measured ms':>12}  bound")
            for name, row in sorted(table.items(), key=lambda kv: -kv[1]["measured_sec"])[: args.top]:
                print(f"  {name:<36}{row['calls']:>6}{_ms(row['predicted_sec']):>13}{_ms(row['measured_sec']):>12}  {row['bound']}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
