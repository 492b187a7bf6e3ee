"""Model and hardware FLOPs utilization (MFU, HFU) as the papers define them.

**Model FLOPs** are what one forward + backward pass of the model needs, whatever the
implementation; **hardware FLOPs** add what the implementation recomputes (activation
checkpointing). MFU divides model FLOP/s by the peak, HFU hardware FLOP/s (PaLM, Chowdhery et
al. 2022, §4.1 and Appendix B; Korthikanti et al. 2022, §6.3 and Appendix A).

For a GPT-style decoder with ``layers`` L, hidden size h, sequence s, vocabulary V, batch B, the
matmul FLOPs per iteration are (Korthikanti et al. 2022, Appendix A; Narayanan et al. 2021, eq. 3)

- model FLOPs (no recomputation):           72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))
- hardware FLOPs, selective recomputation:  72·B·s·L·h²·(1 + s/(3h) + V/(12·L·h))
- hardware FLOPs, full recomputation:       96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))

and per token, PaLM's 6N + 12·L·H·Q·T (N parameters, H heads of width Q, T the sequence) is
the same count written with the parameter total.

>>> round(palm_model_flops_per_token(540.35e9, layers=118, heads=48, head_dim=256, seq=2048) / 1e12, 3)
3.278
>>> mfu = mfu_from_tokens_per_sec(238.3e3, palm_model_flops_per_token(540.35e9, 118, 48, 256, 2048), 6144 * 275e12)
>>> round(mfu, 4)   # PaLM: "46.2% with [self-attention]"
0.4623
"""

from __future__ import annotations

from typing import Literal

from resacct.errors import ResacctError
from resacct.formulas.validation import positive_number as _positive
from resacct.formulas.validation import whole_number as _whole

__all__ = [
    "Recompute",
    "RECOMPUTE_MODES",
    "palm_model_flops_per_token",
    "dense_model_flops_per_token",
    "gpt_iteration_flops",
    "recompute_flops_overhead",
    "achieved_flops_per_sec",
    "mfu_from_tokens_per_sec",
    "mfu_from_step_time",
    "mfu_from_achieved_flops_per_sec",
    "hfu_over_mfu",
]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")


def _recompute(value: object) -> str:
    if value not in RECOMPUTE_MODES:
        raise ResacctError(f"recompute is {value!r}; expected one of {', '.join(RECOMPUTE_MODES)}")
    return str(value)


def palm_model_flops_per_token(parameters: float, layers: int, heads: int, head_dim: int, seq: int) -> float:
    """Training model FLOPs per token, PaLM Appendix B: 6N + 12·L·H·Q·T.

    6N: forward 2N and backward 4N for every parameter; 12·L·H·Q·T: the two attention matmuls
    (QKᵀ and attention·V) in forward and backward, which no parameter counts.
    """
    return 6 * _positive("parameters", parameters) + 12 * _whole("layers", layers) * _whole("heads", heads) * _whole("head_dim", head_dim) * _whole("seq", seq)


def dense_model_flops_per_token(parameters: float) -> float:
    """6N: training model FLOPs per token without the attention term (PaLM's "without self-attention")."""
    return 6 * _positive("parameters", parameters)


def gpt_iteration_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: str = "none") -> float:
    """Matmul FLOPs of one training iteration of a GPT (B sequences of s tokens), counting what
    the hardware executes under ``recompute``: "none" gives the model FLOPs, "selective"
    (recompute the attention core) and "full" (recompute every layer's forward) hardware FLOPs.

    >>> gpt_iteration_flops(1, 2048, 96, 12288, 51200, "full") / gpt_iteration_flops(1, 2048, 96, 12288, 51200) > 1.3
    True
    """
    b, s, n_layers, h, v = (_whole(name, value) for name, value in
                            (("batch", batch), ("seq", seq), ("layers", layers), ("hidden", hidden), ("vocab", vocab)))
    mode = _recompute(recompute)
    base = b * s * n_layers * h * h
    if mode == "full":
        return 96 * base * (1 + s / (6 * h) + v / (16 * n_layers * h))
    attention = s / (3 * h) if mode == "selective" else s / (6 * h)
    return 72 * base * (1 + attention + v / (12 * n_layers * h))


def recompute_flops_overhead(seq: int, layers: int, hidden: int, vocab: int, recompute: str) -> float:
    """Extra hardware FLOPs over model FLOPs, as a fraction (0.027 = 2.7%): what the
    recomputation costs (Korthikanti et al. 2022 §5 quotes 2.7% for GPT-3 and 1.6% for MT-NLG
    under selective recomputation)."""
    model = gpt_iteration_flops(1, seq, layers, hidden, vocab, "none")
    return gpt_iteration_flops(1, seq, layers, hidden, vocab, recompute) / model - 1


def hfu_over_mfu(seq: int, layers: int, hidden: int, vocab: int, recompute: str) -> float:
    """HFU ÷ MFU for the same run: hardware FLOPs ÷ model FLOPs (1 without recomputation)."""
    return 1 + recompute_flops_overhead(seq, layers, hidden, vocab, recompute)


def achieved_flops_per_sec(tokens_per_sec: float, flops_per_token: float) -> float:
    """FLOP/s a run achieves: tokens per second × FLOPs per token."""
    return _positive("tokens_per_sec", tokens_per_sec) * _positive("flops_per_token", flops_per_token)


def mfu_from_tokens_per_sec(tokens_per_sec: float, flops_per_token: float, peak_flops_per_sec: float) -> float:
    """MFU = tokens/s × model FLOPs per token ÷ the peak of every device together.
    Above 1 means an input is wrong; it is returned so the caller can say so."""
    return achieved_flops_per_sec(tokens_per_sec, flops_per_token) / _positive("peak_flops_per_sec", peak_flops_per_sec)


def mfu_from_step_time(flops_per_step: float, step_sec: float, peak_flops_per_sec: float) -> float:
    """MFU (or HFU, given hardware FLOPs) = FLOPs of one step ÷ its seconds ÷ the total peak."""
    return _positive("flops_per_step", flops_per_step) / _positive("step_sec", step_sec) / _positive("peak_flops_per_sec", peak_flops_per_sec)


def mfu_from_achieved_flops_per_sec(achieved_per_device: float, peak_flops_per_sec: float) -> float:
    """MFU from an achieved FLOP/s per device (a paper's "TFLOP/s per GPU") and a per-device peak."""
    return _positive("achieved_per_device", achieved_per_device) / _positive("peak_flops_per_sec", peak_flops_per_sec)
