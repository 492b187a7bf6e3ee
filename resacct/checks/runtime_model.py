"""Measuring the runtime model's claims: a real training step on this CPU (one thread), its ops
recorded and costed by :mod:`resacct.measurement.runtime_model`, beside the clock (this thread's CPU time)."""

from __future__ import annotations

import functools

import torch

from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.measurement.perf import threads
from resacct.measurement.runtime_model import MachineCosts, StepPrediction, measure_machine_costs, predict_step
from resacct.training.seeding import seed_torch

MODELS = ("gpt-tiny", "mlp", "cruncher")


@functools.cache
def machine_costs() -> MachineCosts:
    """This machine's rates with one thread, measured once per process; the out-of-cache triad is the
    perf claims' roofline's where this process measured it already (one thread: the same kernel, arrays
    and clock — 1.2 of the rates' 1.5 s on the 2-core Xeon, in the timed claims' phase of its own)."""
    with threads(1):
        return measure_machine_costs(dram_bytes_per_sec=_dram_measured_already())


def _dram_measured_already() -> float | None:
    from resacct.measurement.measured_roofline import this_machine_roofline

    if this_machine_roofline.cache_info().currsize == 0:  # not measured here: the rates measure their own
        return None
    roofline = this_machine_roofline()
    return roofline.memory.bandwidth_bytes_per_sec if roofline.threads == 1 else None


@functools.cache
def predicted_step(model: str, batch: int) -> StepPrediction:
    """One AdamW training step of ``model`` (gpt-tiny: ``batch`` × 64 tokens; mlp 256 → 1024 → 1024
    → 256 and cruncher 4 × Linear(256, 256): ``batch`` rows), one thread, predicted and clocked."""
    from resacct.training.seeding import preserved_global_rng

    with threads(1), preserved_global_rng():
        seed_torch(0)
        if model == "gpt-tiny":
            from resacct.training.gpt import build_gpt, get_gpt_config

            config = get_gpt_config("gpt-tiny")
            net = build_gpt(config)
            tokens = torch.randint(0, config.vocab_size, (batch, 64))
            targets = torch.randint(0, config.vocab_size, (batch, 64))
            return predict_step(net, tokens, machine_costs(), repeats=5,
                                loss=lambda logits: torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()))
        if model == "mlp":
            from resacct.account.answers.generic import mlp

            return predict_step(mlp(dim=256, hidden=1024, depth=2), torch.randn(batch, 256), machine_costs(), repeats=5)
        if model == "cruncher":
            from resacct.training.models import Cruncher

            return predict_step(Cruncher(dim=256, num_layers=4), torch.randn(batch, 256), machine_costs(), repeats=5)
    raise ResacctError(f"model {model!r}: expected one of {', '.join(MODELS)}")


_FORGET = (predicted_step.cache_clear, machine_costs.cache_clear)  # a new round re-measures the rates and the step


@check("runtime_model.step_time_ratio", evidence="measured", quantities=("predicted_sec", "measured_sec"), timing=True, forget=_FORGET)
def step_time_ratio(model: str, batch: int) -> Outcome:
    """Predicted ÷ measured seconds of one training step (forward, backward, AdamW) on this CPU."""
    step = predicted_step(model, batch)
    return Outcome(measured=step.ratio, quantities={"predicted_sec": step.predicted_step_sec, "measured_sec": step.measured_step_sec})


@check("runtime_model.phase_time_ratio", evidence="measured", quantities=("predicted_sec", "measured_sec", "optimizer_op_overhead_sec"), timing=True,
       forget=_FORGET)
def phase_time_ratio(model: str, batch: int, phase: str) -> Outcome:
    """Predicted ÷ measured seconds of one phase (forward, backward, optimizer) of a training step
    on this CPU: the phase's ops costed, against the median of its clean timed runs."""
    step = predicted_step(model, batch)
    if phase not in step.measured_phase_sec:
        raise ResacctError(f"phase {phase!r}: expected one of {', '.join(step.measured_phase_sec)}")
    predicted, measured = step.phases()[phase], step.measured_phase_sec[phase]
    return Outcome(measured=predicted / measured, quantities={"predicted_sec": predicted, "measured_sec": measured,
                                                                "optimizer_op_overhead_sec": step.optimizer_op_overhead_sec})


@check("runtime_model.op_roofline_bound", evidence="measured", quantities=("intensity_flops_per_byte", "ridge_flops_per_byte"), timing=True, forget=_FORGET)
def op_roofline_bound(model: str, batch: int, op: str) -> Outcome:
    """"memory" or "compute": the op's arithmetic intensity over one training step of ``model``
    (its FLOPs ÷ the bytes it read and wrote, write-allocate included as the roof counts them)
    against this machine's measured ridge point (matmul roof ÷ triad bandwidth)."""
    step = predicted_step(model, batch)
    calls = [cost for cost in step.ops if cost.op == op]
    if not calls:
        raise ResacctError(f"op {op!r} did not run in a {model} step; ran: {', '.join(sorted({cost.op for cost in step.ops}))}")
    intensity = sum(cost.flops for cost in calls) / sum(cost.bytes_moved for cost in calls)
    costs = step.costs
    ridge = costs.matmul_flops_per_sec["float32"] / costs.dram_bytes_per_sec
    return Outcome(measured="memory" if intensity < ridge else "compute",
                   quantities={"intensity_flops_per_byte": intensity, "ridge_flops_per_byte": ridge})
