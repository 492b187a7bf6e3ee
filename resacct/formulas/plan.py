"""Does it fit? Training state + activations per GPU under a TP × PP × CP × DP × ZeRO layout,
and the largest micro-batch that fits.

Per GPU (the first pipeline stage, the busiest):

- training state: the model's parameters split evenly over TP × PP (N/(t·p); the embeddings
  on the first and last stage are not singled out), with parameters, gradients and optimizer
  state sharded over the data-parallel ranks by the ZeRO stage (:mod:`resacct.sharding`);
- activations: Korthikanti et al. 2022's per-layer bytes (:mod:`resacct.parallelism`) × L
  layers' worth for the first stage, with the sequence split over the context-parallel ranks
  (the attention-core term then uses the local sequence squared: an underestimate for ring
  attention, whose local queries score every key — selective recomputation has no such term).

Activations grow linearly with the micro-batch, so the largest micro-batch is a division.

>>> plan = plan_memory(parameters=70e9, layers=80, hidden=8192, heads=64, seq=4096, micro_batch=1,
...                    layout=ParallelLayout(tensor=8, pipeline=4, data=16, zero_stage=1, sequence_parallel=True),
...                    recipe="mixed-adam", recompute="selective", device_memory_bytes=80e9)
>>> round(plan.state.total_bytes / 1e9, 2), round(plan.activation_bytes / 1e9, 2), plan.fits, plan.largest_micro_batch
(10.39, 11.41, True, 6)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.parallelism import ParallelLayout, first_stage_activation_bytes
from resacct.sharding import PerRankBytes, ShardingRecipe, get_sharding_recipe, per_rank_bytes

__all__ = ["MemoryPlan", "plan_memory", "megatron_parameter_count"]


def megatron_parameter_count(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Parameters of a GPT, Narayanan et al. 2021 eq. 2: 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))."""
    # 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h)) multiplied out, in whole numbers
    return float(12 * layers * hidden**2 + 13 * layers * hidden + (vocab + seq) * hidden)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on the busiest GPU of a layout, and what fits."""

    layout: ParallelLayout
    recipe: ShardingRecipe
    recompute: str
    micro_batch: int
    parameters_per_gpu: float
    state: PerRankBytes
    activation_bytes: float
    activation_bytes_per_sample: float
    device_memory_bytes: float
    reserved_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.state.total_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.reserved_bytes <= self.device_memory_bytes

    @property
    def largest_micro_batch(self) -> int:
        """The most sequences per micro-batch whose activations fit beside the state (0: none)."""
        room = self.device_memory_bytes - self.reserved_bytes - self.state.total_bytes
        return max(0, math.floor(room / self.activation_bytes_per_sample)) if room > 0 else 0


def _check_divides(part: int, whole: int, what: str, by: str) -> None:
    if whole % part:
        raise ResacctError(f"{what} {whole} is not divisible by {by} {part}; choose a {by} that divides it")


def plan_memory(*, parameters: float, layers: int, hidden: int, heads: int, seq: int, micro_batch: int, layout: ParallelLayout,
                recipe: str | ShardingRecipe, recompute: str, device_memory_bytes: float, reserved_bytes: float = 0.0) -> MemoryPlan:
    """Training state and activations on the first pipeline stage's GPU (see the module doc)."""
    chosen = get_sharding_recipe(recipe)
    if isinstance(parameters, bool) or not isinstance(parameters, (int, float)) or not math.isfinite(parameters) or parameters <= 0:
        raise ResacctError(f"parameters is {parameters!r}; expected a number > 0 such as 70e9")
    if not math.isfinite(device_memory_bytes) or device_memory_bytes <= 0:
        raise ResacctError(f"device memory is {device_memory_bytes!r} bytes; expected a number > 0")
    if not math.isfinite(reserved_bytes) or reserved_bytes < 0:
        raise ResacctError(f"reserved memory is {reserved_bytes!r} bytes; expected 0 or more")
    _check_divides(layout.tensor, heads, "heads", "tensor-parallel size")
    _check_divides(layout.pipeline, layers, "layers", "pipeline-parallel size")
    _check_divides(layout.context, seq, "sequence length", "context-parallel size")
    parameters_per_gpu = parameters / (layout.tensor * layout.pipeline)
    state = per_rank_bytes(parameters_per_gpu, chosen, layout.zero_stage, layout.data)
    common = dict(tensor_parallel=layout.tensor, sequence_parallel=layout.sequence_parallel, recompute=recompute,
                  pipeline_parallel=layout.pipeline, interleaved_chunks=layout.interleaved_chunks)
    local_seq = seq // layout.context
    per_sample = first_stage_activation_bytes(layers, local_seq, 1, hidden, heads, **common)
    activations = first_stage_activation_bytes(layers, local_seq, micro_batch, hidden, heads, **common)
    return MemoryPlan(layout=layout, recipe=chosen, recompute=recompute, micro_batch=int(micro_batch), parameters_per_gpu=parameters_per_gpu,
                      state=state, activation_bytes=activations, activation_bytes_per_sample=per_sample,
                      device_memory_bytes=float(device_memory_bytes), reserved_bytes=float(reserved_bytes))
