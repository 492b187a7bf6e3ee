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
| ZeRO-2, none | 4P + 16P/G | 4P·n·f (model init only) |
| ZeRO-3, parameters and optimizer on CPU | 4ℓ (gathered fp16 layer + its grads) | 18P/N·f (zero.Init; else P·max(4n, 18/N)·f) |
| ZeRO-3, optimizer on CPU | 4ℓ + 2P/G | 16P/N·f (zero.Init; else P·max(4n, 16/N)·f) |
| ZeRO-3, none | 4ℓ + 18P/G | 4ℓ·n·f (zero.Init; else 4P·n·f) |

16 bytes = fp32 parameters, gradients, momentum and variance; 18 = those + the fp16 parameters;
4 = a model created in fp32 on the CPU. Activations, buffers and NVMe (ZeRO-Infinity's
``offload_*: nvme`` moves the CPU figure to disk) are not in these estimates. DeepSpeed prints
them in GiB (labelled "GB").

>>> cpu, gpu = deepspeed_zero2_bytes(2851e6, gpus_per_node=8, offload_optimizer=True)
>>> round(cpu / 2**30, 2), round(gpu / 2**30, 2)      # DeepSpeed's docs: 127.45GB | 5.31GB
(127.45, 5.31)
>>> cpu, gpu = deepspeed_zero3_bytes(2851e6, 32e6, gpus_per_node=8, offload_optimizer=True, offload_param=True)
>>> round(cpu / 2**30, 2), round(gpu / 2**30, 2)      # 71.69GB | 0.12GB
(71.69, 0.12)
"""

from __future__ import annotations

import math

from resacct.errors import ResacctError

__all__ = ["DEEPSPEED_BUFFER_FACTOR", "deepspeed_zero2_bytes", "deepspeed_zero3_bytes"]

#: DeepSpeed's ``additional_buffer_factor`` default: the CPU figures × 1.5 "to be conservative".
DEEPSPEED_BUFFER_FACTOR = 1.5


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
                          buffer_factor: float = DEEPSPEED_BUFFER_FACTOR) -> tuple[float, float]:
    """(bytes per host, bytes per GPU) of ZeRO-2's model states, as DeepSpeed estimates them."""
    _check(parameters, gpus_per_node, nodes, buffer_factor)
    gpus = gpus_per_node * nodes
    if offload_optimizer:
        return parameters * max(4 * gpus, 16) * buffer_factor, 2 * parameters
    return parameters * 4 * gpus_per_node * buffer_factor, 4 * parameters + int(16 * parameters / gpus)


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
