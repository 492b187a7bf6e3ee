"""ZeRO-Offload / ZeRO-Infinity memory: the model states per GPU and per host (CPU memory of one
node) when DeepSpeed keeps the optimizer state, and optionally the parameters, on the CPU.

These are DeepSpeed's own estimators, reproduced term by term
(``deepspeed/runtime/zero/stage_1_and_2.py: estimate_zero2_model_states_mem_needs`` and
``deepspeed/runtime/zero/stage3.py: estimate_zero3_model_states_mem_needs``; explained in
DeepSpeed's docs, "Memory Requirements", docs/code-docs/source/memory.rst), with P the parameters,
n GPUs per node, N nodes, G = n·N, ℓ the largest layer's parameters and a buffer factor f = 1.5:

| stage, offload | per GPU | per host (CPU) |
|---|---|---|
| ZeRO-2, optimizer on CPU | 2P (fp16 parameters) | P·max(4n·N, 16)·f |
| ZeRO-2, none | 2P + 18P/G (DeepSpeed ≥ 0.14.3; its docs' table: 4P + 16P/G) | 4P·n·f (model init only) |
| ZeRO-3, parameters and optimizer on CPU | 4ℓ (gathered fp16 layer + its grads) | 18P/N·f (zero.Init; else P·max(4n, 18/N)·f) |
| ZeRO-3, optimizer on CPU | 4ℓ + 2P/G | 16P/N·f (zero.Init; else P·max(4n, 16/N)·f) |
| ZeRO-3, none | 4ℓ + 18P/G | 4ℓ·n·f (zero.Init; else 4P·n·f) |

16 bytes = fp32 parameters, gradients, momentum and variance; 18 = those + the fp16 parameters;
4 = a model created in fp32 on the CPU. Activations, buffers and NVMe (ZeRO-Infinity's
``offload_*: nvme`` moves the CPU figure to disk) are not in these estimates. DeepSpeed prints
them in GiB (labelled "GB").

ZeRO-2 without offload changed in DeepSpeed 0.14.3 (PR #5099, June 2024: "was considering 4 bytes
per model param, and 4 bytes per gradient"): each GPU now holds 2P (16-bit parameters) + 18P/G
(its shard of the 16-bit and fp32 gradients, fp32 parameters, momentum and variance). DeepSpeed's
memory docs still print the table of the estimator before it (15.93 GB, not 11.28, for the
example below): ``estimator="docs"`` reproduces that one, ``"current"`` (the default) the code.

>>> cpu, gpu = deepspeed_zero2_bytes(2851e6, gpus_per_node=8, offload_optimizer=True)
>>> round(cpu / 2**30, 2), round(gpu / 2**30, 2)      # DeepSpeed's docs: 127.45GB | 5.31GB
(127.45, 5.31)
>>> cpu, gpu = deepspeed_zero3_bytes(2851e6, 32e6, gpus_per_node=8, offload_optimizer=True, offload_param=True)
>>> round(cpu / 2**30, 2), round(gpu / 2**30, 2)      # 71.69GB | 0.12GB
(71.69, 0.12)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import HfArchitecture

__all__ = ["DEEPSPEED_BUFFER_FACTOR", "DEEPSPEED_ESTIMATORS", "deepspeed_zero2_bytes", "deepspeed_zero3_bytes", "largest_module_parameters",
           "OffloadOption", "deepspeed_options"]

#: DeepSpeed's ``additional_buffer_factor`` default: the CPU figures × 1.5 "to be conservative".
DEEPSPEED_BUFFER_FACTOR = 1.5

#: which ZeRO-2 estimator: DeepSpeed's code since 0.14.3 (PR #5099), or the one its memory docs' table shows
DEEPSPEED_ESTIMATORS = ("current", "docs")


def _check(parameters: float, gpus_per_node: int, nodes: int, buffer_factor: float, largest_layer: float = 1.0) -> None:
    for name, value in (("parameters", parameters), ("largest layer parameters", largest_layer), ("buffer factor", buffer_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ResacctError(f"{name} {value!r}: expected a number > 0")
    for name, whole in (("GPUs per node", gpus_per_node), ("nodes", nodes)):
        if isinstance(whole, bool) or not isinstance(whole, int) or whole < 1:
            raise ResacctError(f"{name} {whole!r}: expected a whole number ≥ 1")
    if largest_layer > parameters:
        raise ResacctError(f"largest layer {largest_layer:g} parameters is more than the model's {parameters:g}")


def deepspeed_zero2_bytes(parameters: float, *, gpus_per_node: int = 1, nodes: int = 1, offload_optimizer: bool = True,
                          buffer_factor: float = DEEPSPEED_BUFFER_FACTOR, estimator: str = "current") -> tuple[float, float]:
    """(bytes per host, bytes per GPU) of ZeRO-2's model states, as DeepSpeed estimates them
    (``estimator``: ``"current"``, DeepSpeed ≥ 0.14.3, or ``"docs"``, the table its docs print)."""
    _check(parameters, gpus_per_node, nodes, buffer_factor)
    if estimator not in DEEPSPEED_ESTIMATORS:
        raise ResacctError(f"estimator {estimator!r}: expected current (DeepSpeed ≥ 0.14.3) or docs (the table DeepSpeed's memory docs print)")
    gpus = gpus_per_node * nodes
    if offload_optimizer:
        return parameters * max(4 * gpus, 16) * buffer_factor, 2 * parameters
    gpu = 2 * parameters + int(18 * parameters / gpus) if estimator == "current" else 4 * parameters + int(16 * parameters / gpus)
    return parameters * 4 * gpus_per_node * buffer_factor, gpu


def deepspeed_zero3_bytes(parameters: float, largest_layer_parameters: float, *, gpus_per_node: int = 1, nodes: int = 1,
                          offload_optimizer: bool = True, offload_param: bool = True, zero_init: bool = True,
                          buffer_factor: float = DEEPSPEED_BUFFER_FACTOR) -> tuple[float, float]:
    """(bytes per host, bytes per GPU) of ZeRO-3's model states, as DeepSpeed estimates them."""
    _check(parameters, gpus_per_node, nodes, buffer_factor, largest_layer_parameters)
    if offload_param and not offload_optimizer:
        raise ResacctError("offloading the parameters without the optimizer state is not a ZeRO-3 configuration DeepSpeed estimates")
    gpus, per_node = gpus_per_node * nodes, 1 / nodes
    largest = 4 * largest_layer_parameters
    if offload_optimizer:
        kept = 18 if offload_param else 16
        gpu = largest if offload_param else largest + int(2 * parameters / gpus)
        cpu = parameters * (kept * per_node if zero_init else max(4 * gpus_per_node, kept * per_node)) * buffer_factor
        return cpu, gpu
    cpu = (largest_layer_parameters if zero_init else parameters) * 4 * gpus_per_node * buffer_factor
    return cpu, largest + int(18 * parameters / gpus)


def largest_module_parameters(a: HfArchitecture) -> int:
    """The ``largest_layer_params`` DeepSpeed's ``model_to_params`` finds in a transformers model:
    the most parameters one module holds directly (not its children) — the token embedding or
    LM head (V·d), a linear layer (with its bias), or a Mixtral layer's expert banks (transformers
    keeps all E experts' gate-up and down weights in one module: E·3·d·f).

    >>> from resacct.formulas.hf_formulas import HfArchitecture
    >>> largest_module_parameters(HfArchitecture(family="llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, mlp=11008, positions=4096))
    131072000
    """
    d, f = a.hidden, a.mlp
    candidates = [a.vocab * d]
    if a.family == "gpt2":
        candidates += [a.positions * d, 3 * d * d + 3 * d, d * f + f, f * d + d]
    else:
        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        bias = 1 if a.attention_bias else 0
        candidates += [d * q + bias * q, d * kv + bias * kv, q * d + bias * d, d * a.experts]
        candidates += [a.experts * 3 * d * f] if a.family == "mixtral" else [d * f + (f if a.mlp_bias else 0), f * d + (d if a.mlp_bias else 0)]
    return max(candidates)


@dataclass(frozen=True)
class OffloadOption:
    """One row of DeepSpeed's estimate: a ZeRO stage and what is offloaded, with its bytes."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    zero_init: bool | None  # ZeRO-3 only: the model built under deepspeed.zero.Init
    host_bytes: float
    gpu_bytes: float


def deepspeed_options(parameters: float, largest_layer_parameters: float, *, gpus_per_node: int = 1, nodes: int = 1,
                      buffer_factor: float = DEEPSPEED_BUFFER_FACTOR, estimator: str = "current") -> list[OffloadOption]:
    """Every row DeepSpeed's ``estimate_zero2/3_model_states_mem_needs_all_cold`` print, in their
    order: ZeRO-2 with the optimizer on the CPU or not; ZeRO-3 with parameters and optimizer, the
    optimizer alone, or nothing offloaded, each with and without zero.Init."""
    common = dict(gpus_per_node=gpus_per_node, nodes=nodes, buffer_factor=buffer_factor)
    rows = [OffloadOption(2, offload, False, None, *deepspeed_zero2_bytes(parameters, offload_optimizer=offload, estimator=estimator, **common))
            for offload in (True, False)]
    for optimizer, param in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            rows.append(OffloadOption(3, optimizer, param, zero_init, *deepspeed_zero3_bytes(
                parameters, largest_layer_parameters, offload_optimizer=optimizer, offload_param=param, zero_init=zero_init, **common)))
    return rows
