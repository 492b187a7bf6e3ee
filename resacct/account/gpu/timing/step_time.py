"""The GPU step time predicted on any machine (issue 31, part 3): a roofline per aten op of a step
traced on meta tensors, bounded below by the host's dispatch time.

Per op of the traced step (forward, backward, CUDA's foreach AdamW, zero_grad): its FLOPs (torch's
own ``flop_registry``: matmuls, attention) ÷ the board's achievable matmul rate, or the bytes it reads
and writes (every tensor argument and output) ÷ the memory bandwidth, whichever is longer — the GPU's
time. The host issues one op after another: ``ops × overhead`` (eager PyTorch's dispatch and launch
per op) is the step's other bound, and the step takes the longer of the two (the host runs ahead of
the GPU, so they overlap).

- the matmul rate: a record's measured fp32 / bf16 matmul FLOP/s where the board has one, else the
  datasheet peak × :data:`DATASHEET_MATMUL_EFFICIENCY`;
- the bandwidth: the datasheet × :data:`BANDWIDTH_EFFICIENCY` (an assumption: the H100 record
  measured no bandwidth);
- the per-op overhead: calibrated on one recorded step whose GPU time is far below its measured
  time (host-bound), :func:`calibrate_overhead`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from resacct.account.gpu.tracing.op_costs import OpCost
from resacct.errors import ResacctError

__all__ = ["OpCost", "BoardRates", "StepTimePrediction", "DecodePrediction", "trace_step_ops", "predict_step_seconds", "predict_decode_seconds",
           "calibrate_overhead",
           "BANDWIDTH_EFFICIENCY", "DATASHEET_MATMUL_EFFICIENCY"]

BANDWIDTH_EFFICIENCY = 0.8  # assumed share of the datasheet's HBM bandwidth an elementwise kernel reaches (no record measured it)
DATASHEET_MATMUL_EFFICIENCY = 0.7  # assumed share of the datasheet's dense peak a matmul reaches, where no record measured one


@dataclass(frozen=True)
class BoardRates:
    matmul_flops_per_sec: float
    bandwidth_bytes_per_sec: float
    overhead_sec_per_op: float
    source: str


@dataclass(frozen=True)
class StepTimePrediction:
    gpu_sec: float  # Σ per op max(FLOPs ÷ matmul rate, bytes ÷ bandwidth)
    host_sec: float  # ops × overhead
    ops: int
    flops: int

    @property
    def step_sec(self) -> float:
        return max(self.gpu_sec, self.host_sec)

    @property
    def bound(self) -> str:
        return "GPU (roofline per op)" if self.gpu_sec >= self.host_sec else "host (dispatch per op)"


def trace_step_ops(model: nn.Module, inputs: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor],
                   make_optimizer: Callable[[Any], torch.optim.Optimizer] | None = None) -> list[OpCost]:
    """Every aten op of one steady training step of ``model`` on meta tensors, with its FLOPs and
    bytes: forward, backward, the optimizer's step (CUDA's foreach AdamW by default), zero_grad — the
    ops of :func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory`'s pass (its meta calls' cache
    answers the repeated layers; ``tests/test_gpu_step_time.py`` checks them against a pass of their own)."""
    from resacct.account.gpu.tracing.cuda_step import cuda_adamw, predict_cuda_step_memory

    ops: list[OpCost] = []
    predict_cuda_step_memory(model, inputs, loss_fn, make_optimizer or cuda_adamw, ops=ops)
    return ops


def predict_step_seconds(ops: Sequence[OpCost], rates: BoardRates) -> StepTimePrediction:
    gpu = sum(max(op.flops / rates.matmul_flops_per_sec, op.bytes / rates.bandwidth_bytes_per_sec) for op in ops)
    return StepTimePrediction(gpu_sec=gpu, host_sec=len(ops) * rates.overhead_sec_per_op, ops=len(ops), flops=sum(op.flops for op in ops))


def calibrate_overhead(ops: Sequence[OpCost], measured_sec: float, matmul_flops_per_sec: float, bandwidth_bytes_per_sec: float) -> float:
    """Seconds per op from a recorded host-bound step: its measured time ÷ its ops. Refused where the
    step's own GPU time is over a tenth of the measured one (not host-bound: it would not calibrate the host)."""
    gpu = predict_step_seconds(ops, BoardRates(matmul_flops_per_sec, bandwidth_bytes_per_sec, 0.0, "")).gpu_sec
    if gpu > measured_sec / 10:
        raise ResacctError(f"calibration step: {gpu:.3g} s of GPU time in {measured_sec:.3g} s measured is not host-bound; expected a step whose GPU time is under a tenth")
    return measured_sec / len(ops)


@dataclass(frozen=True)
class DecodePrediction:
    """One generated token's predicted seconds (``infer --device``): the longest of its three bounds."""

    memory_sec: float  # the weights and the KV cache read once ÷ the bandwidth
    compute_sec: float  # the decode forward's FLOPs ÷ the matmul rate
    host_sec: float  # the decode forward's ops × the per-op overhead
    ops: int
    read_bytes: int

    @property
    def token_sec(self) -> float:
        return max(self.memory_sec, self.compute_sec, self.host_sec)

    @property
    def bound(self) -> str:
        return ("host (dispatch per op)" if self.token_sec == self.host_sec else "memory (the reads)" if self.token_sec == self.memory_sec
                else "compute")


def predict_decode_seconds(decode_ops: Sequence[OpCost], rates: BoardRates, *, read_bytes: int) -> DecodePrediction:
    """A decode step — one forward of one token a sequence, its ops traced on meta
    (:func:`~resacct.account.gpu.tracing.decode_trace.trace_decode_ops`) — bounded three ways: it reads the weights and the
    whole KV cache (``read_bytes``) ÷ the bandwidth, its FLOPs (attention of one query to the whole context included)
    ÷ the matmul rate, and its ops × the per-op overhead on the host; it takes the longest.

    >>> rates = BoardRates(1e15, 4e12, 1e-5, "")
    >>> decode = predict_decode_seconds([OpCost("aten::mm", 2 * 10**9, 10**6)] * 100, rates, read_bytes=8 * 10**9)
    >>> round(decode.token_sec * 1e3, 3), decode.bound
    (2.0, 'memory (the reads)')
    """
    if not decode_ops:
        raise ResacctError("a decode step of no ops: expected the ops of one traced decode forward (trace_decode_ops)")
    return DecodePrediction(memory_sec=read_bytes / rates.bandwidth_bytes_per_sec,
                            compute_sec=sum(op.flops for op in decode_ops) / rates.matmul_flops_per_sec,
                            host_sec=len(decode_ops) * rates.overhead_sec_per_op, ops=len(decode_ops), read_bytes=read_bytes)
