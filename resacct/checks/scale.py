"""Checking resacct's scale formulas against figures that papers published.

A published figure cannot be re-measured here: the run is gone. So for these claims the
**measured** side is the paper's own number (``reported``, given in the claim with its table
and page), the **law** is the paper's formula written out in the YAML, and the **prediction**
is resacct's own function for the same quantity. The claim holds when the paper's formula gives
the paper's figure within the rounding the figure was printed with (each claim's tolerance says
which rounding); resacct is right when its prediction lands in the same window.

Where a paper's figure disagrees with its own formula, the claim is kept ``refuted`` and its
check measures the truth independently instead: 6·N·D with the FLOPs per token per parameter
counted by ``FlopCounterMode``, or Chinchilla's fitted loss minimised numerically over a grid.
"""

from __future__ import annotations

import math

from resacct.checks.hardware import raw_peak_flops_per_sec
from resacct.checks.napkin import measured_flops_per_token_per_parameter
from resacct.training.gpt import GPTConfig, gpt_parameter_count
from resacct.facts.hardware import peak_flops_per_sec
from resacct.harness.registry import Outcome, check
from resacct.formulas.napkin import training_days, training_flops
from resacct.formulas.parallelism import ParallelLayout, selective_recompute_memory_saving
from resacct.formulas.scaling import CHINCHILLA_APPROACH3, chinchilla_approach1_fit, chinchilla_approach2_fit, chinchilla_approach3_optimum
from resacct.formulas.utilization import (
    dense_model_flops_per_token,
    gpt_iteration_flops,
    mfu_from_achieved_flops_per_sec,
    mfu_from_step_time,
    mfu_from_tokens_per_sec,
    palm_model_flops_per_token,
    recompute_flops_overhead,
)

Number = float | int


@check("scale.gpt_parameters", evidence="published")
def gpt_parameters(layers: int, hidden: int, heads: int, vocab: int, seq: int, reported: Number) -> Outcome:
    """Parameters of a GPT of this shape, in billions: the paper's figure against resacct's count
    of its own GPT (learned positions, tied output layer, biases and LayerNorms)."""
    config = GPTConfig(vocab_size=vocab, context_length=seq, n_layers=layers, n_heads=heads, d_model=hidden)
    return Outcome(measured=float(reported), predicted=gpt_parameter_count(config) / 1e9)


@check("scale.percent_of_peak", evidence="published")
def percent_of_peak(achieved_tflops: Number, device: str, reported: Number, dtype: str = "bf16") -> Outcome:
    """A reported achieved TFLOP/s per device as a percentage of the device's datasheet peak
    (resacct's table and MFU function) against the percentage the paper printed."""
    predicted = 100 * mfu_from_achieved_flops_per_sec(achieved_tflops * 1e12, peak_flops_per_sec(device, dtype))
    return Outcome(measured=float(reported), predicted=predicted)


@check("scale.training_days", evidence="published")
def megatron_training_days(parameters: Number, tokens: Number, gpus: int, achieved_tflops: Number, reported: Number) -> Outcome:
    """Narayanan et al. 2021 eq. 4, end-to-end days ≈ 8·T·P/(n·X): resacct's napkin days with 8
    FLOPs per parameter per token (6 + 2 for the recomputed forward) at the achieved rate."""
    total = training_flops(parameters, tokens, flops_per_token_per_parameter=8)
    return Outcome(measured=float(reported), predicted=training_days(total, gpus, achieved_tflops * 1e12, 1.0))


@check("scale.iteration_utilization", evidence="published")
def iteration_utilization(batch: int, seq: int, layers: int, hidden: int, vocab: int, gpus: int, iteration_sec: Number,
                          device: str, recompute: str, reported: Number) -> Outcome:
    """MFU (recompute "none") or HFU (the recomputation the run did) in percent from an
    iteration time: resacct's GPT iteration FLOPs ÷ (seconds × GPUs × datasheet peak)."""
    flops = gpt_iteration_flops(batch, seq, layers, hidden, vocab, recompute)
    predicted = 100 * mfu_from_step_time(flops, iteration_sec, gpus * peak_flops_per_sec(device, "bf16"))
    return Outcome(measured=float(reported), predicted=predicted)


@check("scale.selective_recompute_saving", evidence="published")
def selective_saving(seq: int, hidden: int, heads: int, reported: Number) -> Outcome:
    """Percent of a layer's activation memory that selective recomputation frees (resacct's
    Korthikanti per-layer bytes) against the paper's percentage."""
    return Outcome(measured=float(reported), predicted=100 * selective_recompute_memory_saving(seq, hidden, heads))


@check("scale.recompute_flops_overhead", evidence="published")
def recompute_overhead(seq: int, layers: int, hidden: int, vocab: int, recompute: str, reported: Number) -> Outcome:
    """Extra FLOPs of recomputation over the model FLOPs, in percent (resacct's iteration FLOPs)."""
    return Outcome(measured=float(reported), predicted=100 * recompute_flops_overhead(seq, layers, hidden, vocab, recompute))


@check("scale.throughput_mfu", evidence="published")
def throughput_mfu(parameters: Number, tokens_per_sec: Number, devices: int, device: str, reported: Number,
                   layers: int = 0, heads: int = 0, head_dim: int = 0, seq: int = 0) -> Outcome:
    """MFU in percent from tokens/s: 6N per token, plus PaLM's 12·L·H·Q·T when the shape is
    given (all four > 0), over devices × the datasheet bf16 peak."""
    shape = (layers, heads, head_dim, seq)
    per_token = palm_model_flops_per_token(parameters, *shape) if all(shape) else dense_model_flops_per_token(parameters)
    predicted = 100 * mfu_from_tokens_per_sec(tokens_per_sec, per_token, devices * peak_flops_per_sec(device, "bf16"))
    return Outcome(measured=float(reported), predicted=predicted)


@check("scale.throughput_utilization", evidence="published")
def throughput_utilization(flops_per_token: Number, tokens_per_sec: Number, devices: int, device: str, reported: Number) -> Outcome:
    """Utilization in percent from tokens/s and a paper's own FLOPs per token (model FLOPs give
    MFU; FLOPs with rematerialization give HFU), over devices × the datasheet bf16 peak."""
    predicted = 100 * mfu_from_tokens_per_sec(tokens_per_sec, flops_per_token, devices * peak_flops_per_sec(device, "bf16"))
    return Outcome(measured=float(reported), predicted=predicted)


@check("scale.layout_world_size", evidence="published")
def layout_world_size(tensor: int, context: int, pipeline: int, data: int, reported: int) -> Outcome:
    """GPUs of a TP × CP × PP × DP layout (resacct's ParallelLayout) against the paper's count."""
    return Outcome(measured=int(reported), predicted=ParallelLayout(tensor=tensor, context=context, pipeline=pipeline, data=data).world_size)


@check("scale.reported_training_flops", evidence="published")
def reported_training_flops(parameters: Number, tokens: Number, reported: Number) -> Outcome:
    """A paper's training-compute figure against resacct's 6·N·D."""
    return Outcome(measured=float(reported), predicted=training_flops(parameters, tokens))


@check("scale.counted_training_flops", evidence="measured")
def counted_training_flops(parameters: Number, tokens: Number) -> Outcome:
    """The truth for a refuted compute figure: FLOPs per token per parameter counted by
    FlopCounterMode over a real forward + backward, × N × D; resacct's 6·N·D predicts it."""
    return Outcome(measured=measured_flops_per_token_per_parameter() * parameters * tokens, predicted=training_flops(parameters, tokens))


@check("scale.chinchilla_parameter_exponent", evidence="arithmetic")
def chinchilla_parameter_exponent(alpha: Number, beta: Number) -> Outcome:
    """a in N_opt ∝ C^a from the printed α and β, computed here as β/(α+β); resacct's fit
    object predicts it from its own constants."""
    return Outcome(measured=beta / (alpha + beta), predicted=CHINCHILLA_APPROACH3.parameter_exponent)


@check("scale.chinchilla_optimal_parameters", evidence="arithmetic")
def chinchilla_optimal_parameters(compute_flops: Number, E: Number, A: Number, B: Number, alpha: Number, beta: Number) -> Outcome:
    """The N that minimises E + A/N^α + B/D^β on the iso-FLOP line D = C/(6N), found by a dense
    grid search on log N (no closed form used), in parameters; resacct's closed form (eq. 4)
    predicts it."""
    def loss(log_n: float) -> float:
        n = math.exp(log_n)
        return E + A / n**alpha + B / (compute_flops / (6 * n)) ** beta

    low, high = math.log(1e6), math.log(compute_flops / 6 / 1e6)
    for _ in range(4):  # zoom: 2001 points, then around the best point
        step = (high - low) / 2000
        best = min((low + i * step for i in range(2001)), key=loss)
        low, high = best - 2 * step, best + 2 * step
    return Outcome(measured=math.exp(best), predicted=chinchilla_approach3_optimum(compute_flops)[0])


@check("scale.datasheet_peak_tflops", evidence="published")
def datasheet_peak_tflops(device: str, dtype: str = "bf16") -> Outcome:
    """A board's peak in TFLOP/s as the data file prints it; resacct's lookup predicts it."""
    return Outcome(measured=raw_peak_flops_per_sec(device, dtype) / 1e12, predicted=peak_flops_per_sec(device, dtype) / 1e12)


@check("scale.table_parameter_exponent", evidence="arithmetic")
def table_parameter_exponent(rows: list[list[float]], approach: int = 1, tokens: bool = False) -> Outcome:
    """a in N ∝ C^a through a table's (parameters, FLOPs[, tokens]) rows — with ``tokens``, b in
    D ∝ C^b through its (…, FLOPs, tokens) rows — fitted here with numpy's polyfit on the
    logarithms; resacct's own least-squares fit of Table 3 (approach 1) or of Table A3's
    approach-2 rows (approach 2) predicts it."""
    import numpy

    flops = [row[1] for row in rows]
    sizes = [row[2] if tokens else row[0] for row in rows]
    slope = float(numpy.polyfit(numpy.log(flops), numpy.log(sizes), 1)[0])
    predicted = chinchilla_approach2_fit(tokens=tokens)[0] if approach == 2 else chinchilla_approach1_fit()[0]
    return Outcome(measured=slope, predicted=predicted)


@check("scale.table_row_on_power_law", evidence="arithmetic")
def table_row_on_power_law(rows: list[list[float]], row: int) -> Outcome:
    """The parameters a single power law N = k·C^a through all of a table's (parameters, FLOPs)
    rows gives at one row's FLOPs — numpy's polyfit on the logarithms, evaluated there; resacct's
    approach-2 optimum (its own fit of Table A3) predicts it. Against the row's printed size,
    this says whether the row lies on the line the other rows draw."""
    import numpy

    flops = numpy.log([r[1] for r in rows])
    slope, intercept = numpy.polyfit(flops, numpy.log([r[0] for r in rows]), 1)
    from resacct.formulas.scaling import chinchilla_approach2_optimum

    return Outcome(measured=float(numpy.exp(intercept + slope * flops[row])), predicted=chinchilla_approach2_optimum(rows[row][1])[0])


@check("scale.flops_per_token_times_tokens", evidence="arithmetic")
def flops_per_token_times_tokens(flops_per_token: Number, tokens: Number) -> Outcome:
    """Training FLOPs as a paper's own FLOPs per token × its tokens — plain arithmetic on two
    printed figures, to hold a third printed figure against (resacct has nothing to add here)."""
    return Outcome(measured=float(flops_per_token) * float(tokens))
