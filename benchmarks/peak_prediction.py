"""Predicted step peak (resacct, fake CPU tensors) beside the CPU allocator's measured peak and beside
torch's own MemTracker (``torch.distributed._tools.mem_tracker``) under FakeTensorMode — the same
models, the same inputs, the same steady AdamW step, in one run. Rows past the fp32 ones run a
precision recipe's step (``resacct.account.peak.recipes``), gradient accumulation over k micro-steps
(``resacct.account.peak.accumulation``), selective checkpointing and ``mse_loss``.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/peak_prediction.py
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/peak_prediction.py --models mlp gpt-math   # a subset

Columns: bytes measured by the allocator (torch.profiler, profile_memory=True, the step run for
real); resacct's prediction and its ratio to measured; MemTracker's peak (same step on fake
tensors; its CPU figures are tensor bytes, no allocator rounding) and its ratio; each
predictor's wall time; the process's peak RSS growth is printed at the end; the phase resacct
predicts for the peak and the attention kernel it saw.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from resacct.account.peak.step_peak import measure_step_peak, predict_step_peak  # noqa: E402
from resacct.account.peak.accumulation import run_accumulated_step  # noqa: E402
from resacct.account.peak.models import PEAK_MODELS, peak_model  # noqa: E402
from resacct.account.peak.recipes import recipe_step  # noqa: E402
from resacct.facts.recipes import parse_recipe  # noqa: E402
from resacct.measurement.memory_timeline import copy_inputs, gc_paused, make_optimizer_state, run_training_step  # noqa: E402

# (model, batch, seq, recipe, micro-batches)
CASES = [("gpt2-eager", 2, 32, "fp32", 1), ("gpt2-sdpa", 2, 32, "fp32", 1), ("llama-sdpa", 2, 32, "fp32", 1), ("llama-eager", 2, 32, "fp32", 1),
         ("mixtral-batched-mm", 2, 16, "fp32", 1), ("mlp", 32, 1, "fp32", 1), ("sdpa-block", 4, 256, "fp32", 1), ("sdpa-block", 2, 1024, "fp32", 1),
         ("gpt-math", 4, 64, "fp32", 1), ("gpt-sdpa", 4, 64, "fp32", 1), ("gpt-checkpointed", 4, 64, "fp32", 1),
         ("gpt-checkpointed-selective", 4, 64, "fp32", 1), ("gpt-checkpointed-first-block", 4, 64, "fp32", 1), ("mlp-mse", 32, 1, "fp32", 1),
         ("llama-sdpa", 2, 32, "bf16-autocast", 1), ("llama-sdpa", 2, 32, "bf16-fp32-master", 1), ("llama-sdpa", 2, 32, "bf16", 1),
         ("mlp", 16, 1, "bf16-autocast", 1), ("gpt-math", 4, 64, "bf16-fp32-master", 1),
         ("gpt-math", 4, 64, "fp32", 2), ("llama-sdpa", 2, 32, "fp32", 4), ("mlp", 256, 1, "fp32", 2)]


def memtracker_peak(model, inputs, loss_fn, make_optimizer, micro_batches: int) -> int:
    """MemTracker's peak over the same steady step, on fake CPU tensors made under FakeTensorMode."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with gc_paused(), FakeTensorMode(allow_non_fake_inputs=True):
        memo = {}
        for tensor in [*model.parameters(), *model.buffers()]:
            fake = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype)
            memo[id(tensor)] = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else fake
        fake_model = copy.deepcopy(model, memo)
        fake_inputs = copy_inputs(inputs, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype))
        optimizer = make_optimizer(list(fake_model.parameters()))
        make_optimizer_state(fake_model, optimizer)
        tracker = MemTracker()
        tensors: list = []
        copy_inputs(fake_inputs, lambda t: tensors.append(t) or t)
        tracker.track_external(fake_model, getattr(optimizer, "inner", optimizer), *tensors, *getattr(optimizer, "master_parameters", ()))
        with tracker:
            if micro_batches == 1:
                run_training_step(fake_model, fake_inputs, loss_fn, optimizer)
            else:
                run_accumulated_step(fake_model, fake_inputs, loss_fn, optimizer, micro_batches)
    return sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=None, help=f"a subset of: {', '.join(PEAK_MODELS)}")
    args = parser.parse_args()
    cases = [case for case in CASES if args.models is None or case[0] in args.models]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); steady AdamW step (fwd, bwd, step, zero_grad), CPU; "
          "k: accumulated micro-steps; phases: the phases whose predicted peak differs from the allocator's")
    header = (f"{'model':28s} {'b×s':>8s} {'recipe':17s} {'k':>2s} {'measured B':>13s} {'resacct B':>13s} {'ratio':>7s} {'MemTracker B':>13s} "
              f"{'ratio':>7s} {'resacct s':>9s} {'MemTr. s':>8s}  peak phase / attention / phases off")
    print(header)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, batch, seq, recipe, micro_batches in cases:
        model, inputs, loss_fn = peak_model(name, batch=batch, seq=seq)
        step = recipe_step(parse_recipe(recipe), model, inputs, loss_fn, "adamw")
        model, inputs, loss_fn, make_optimizer = step.model, step.inputs, step.loss_fn, step.make_optimizer
        measured = measure_step_peak(model, inputs, loss_fn, make_optimizer, micro_batches=micro_batches)
        started = time.perf_counter()
        predicted = predict_step_peak(model, inputs, loss_fn, make_optimizer, micro_batches=micro_batches)
        resacct_sec = time.perf_counter() - started
        off = [phase for phase in ("forward", "backward", "optimizer step", "zero_grad")
               if predicted.timeline.peak_of_phase(phase) != measured.peak_of_phase(phase)]
        started = time.perf_counter()
        try:
            anchor = memtracker_peak(model, inputs, loss_fn, make_optimizer, micro_batches)
        except Exception as error:  # noqa: BLE001  (the anchor's own limits are part of the table)
            anchor = None
            print(f"  MemTracker failed on {name}: {type(error).__name__}: {str(error)[:120]}")
        anchor_sec = time.perf_counter() - started
        anchor_text = "—" if anchor is None else f"{anchor:,}"
        anchor_ratio = "—" if anchor is None else f"{anchor / measured.peak_bytes:.4f}"
        print(f"{name:28s} {f'{batch}×{seq}':>8s} {recipe:17s} {micro_batches:>2d} {measured.peak_bytes:>13,} {predicted.peak_bytes:>13,} "
              f"{predicted.peak_bytes / measured.peak_bytes:>7.4f} {anchor_text:>13s} {anchor_ratio:>7s} {resacct_sec:>9.2f} {anchor_sec:>8.2f}  "
              f"{predicted.peak.phase} / {predicted.attention_kernel.split(':')[0]} / {', '.join(off) or 'none'}")
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    print(f"peak RSS grew {grown:.0f} MiB over the run (the measured steps allocate for real; the predictions allocate no model)")


if __name__ == "__main__":
    main()
