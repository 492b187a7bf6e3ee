"""Wall time of resacct's traced FLOP counting against bare FlopCounterMode, on the same models.

    OMP_NUM_THREADS=1 python benchmarks/flop_counting.py                 # meta and cpu, 21 repeats
    OMP_NUM_THREADS=1 python benchmarks/flop_counting.py --repeats 51 --devices cpu

Both count one training step (forward, MSE loss, backward) of the same model on the same input:

- *bare*: one ``FlopCounterMode`` around the whole step, ``get_total_flops()``;
- *resacct*: :func:`resacct.formulas.flops.trace_flops` — forward and backward in separate counters, a
  dispatch mode beside them that records every aten op (for the per-op breakdown and the list of
  ops FlopCounterMode does not count), and the model's ``.grad`` saved and restored.

On ``meta`` no arithmetic runs, so the times are pure tracing overhead; on ``cpu`` the real
matmuls run too. Each cell is the median of ``--repeats`` runs after one warm-up, the two methods
interleaved run by run; the FLOP counts of both must agree, or the script exits with status 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resacct.formulas.flops import trace_flops  # noqa: E402
from resacct.training.models import Cruncher, TwoLayerNetwork  # noqa: E402

MODELS: dict[str, tuple[Callable[[], nn.Module], int, int]] = {
    # name: (factory, batch, input dim)
    "Cruncher(D=1024, 8 layers), B=64": (lambda: Cruncher(dim=1024, num_layers=8), 64, 1024),
    "TwoLayerNetwork(D=1024, K=1024), B=64": (lambda: TwoLayerNetwork(dim=1024, outputs=1024), 64, 1024),
}


def bare_step_flops(model: nn.Module, inputs: torch.Tensor) -> int:
    """One FlopCounterMode around forward, MSE loss and backward."""
    with FlopCounterMode(display=False) as counter:
        output = model(inputs)
        nn.functional.mse_loss(output, torch.zeros_like(output)).backward()
    return int(counter.get_total_flops())


def resacct_step_flops(model: nn.Module, inputs: torch.Tensor) -> int:
    return trace_flops(model, inputs).step_flops


def timed(count: Callable[[nn.Module, torch.Tensor], int], model: nn.Module, inputs: torch.Tensor) -> tuple[float, int]:
    model.zero_grad(set_to_none=True)  # the same starting state for both methods, outside the timer
    started = time.perf_counter()
    flops = count(model, inputs)
    return time.perf_counter() - started, flops


def paired_medians(model: nn.Module, inputs: torch.Tensor, repeats: int) -> tuple[float, float, int, int]:
    """Median seconds of bare and of resacct counting, interleaved run by run (alternating which
    goes first) so that load from other processes falls on both alike; one warm-up each first."""
    timed(bare_step_flops, model, inputs), timed(resacct_step_flops, model, inputs)
    bare_times, resacct_times = [], []
    bare_flops = resacct_flops = 0
    for run in range(repeats):
        order = [(bare_step_flops, bare_times), (resacct_step_flops, resacct_times)]
        for count, times in order if run % 2 == 0 else reversed(order):
            seconds, flops = timed(count, model, inputs)
            times.append(seconds)
            if count is bare_step_flops:
                bare_flops = flops
            else:
                resacct_flops = flops
    return statistics.median(bare_times), statistics.median(resacct_times), bare_flops, resacct_flops


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--devices", nargs="+", default=["meta", "cpu"])
    options = parser.parse_args(arguments)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), median of {options.repeats} interleaved runs after 1 warm-up\n")
    header = f"{'model':40} {'device':6} {'bare FlopCounterMode':>21} {'resacct trace_flops':>20} {'ratio':>6}  {'step FLOPs':>14}"
    print(header)
    print("-" * len(header))
    agree = True
    for name, (factory, batch, dim) in MODELS.items():
        for device in options.devices:
            with torch.device(device):
                model = factory()
                inputs = torch.randn(batch, dim)
            bare_seconds, resacct_seconds, bare_flops, resacct_flops = paired_medians(model, inputs, options.repeats)
            agree &= bare_flops == resacct_flops
            mark = "" if bare_flops == resacct_flops else f"  MISMATCH: resacct {resacct_flops}"
            print(
                f"{name:40} {device:6} {bare_seconds * 1e3:18.2f} ms {resacct_seconds * 1e3:17.2f} ms "
                f"{resacct_seconds / bare_seconds:6.2f}  {bare_flops:14,d}{mark}"
            )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
