"""ZeRO-Offload / ZeRO-3 model-state memory: the GiB DeepSpeed's own estimators print in its docs
(the figure, given as ``reported``) against resacct's reproduction of those estimators
(:mod:`resacct.formulas.offload`). DeepSpeed is not needed: the figures are its published output.
"""

from __future__ import annotations

from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check

Number = float | int


@check("offload.deepspeed_estimate", evidence="published")
def deepspeed_estimate(stage: int, parameters: Number, gpus_per_node: int, side: str, reported: Number, nodes: int = 1,
                       largest_layer_parameters: Number = 0, offload_optimizer: bool = True, offload_param: bool = False,
                       zero_init: bool = True) -> Outcome:
    """One figure of DeepSpeed's memory-estimator table, in GiB (``side`` cpu: per host; gpu: per
    GPU), against resacct's ZeRO-2 / ZeRO-3 estimate for the same setup."""
    from resacct.formulas.offload import deepspeed_zero2_bytes, deepspeed_zero3_bytes

    if side not in ("cpu", "gpu") or stage not in (2, 3):
        raise ResacctError(f"side {side!r} / stage {stage!r}: expected cpu or gpu / 2 or 3")
    if stage == 2:
        cpu, gpu = deepspeed_zero2_bytes(parameters, gpus_per_node=gpus_per_node, nodes=nodes, offload_optimizer=offload_optimizer)
    else:
        cpu, gpu = deepspeed_zero3_bytes(parameters, largest_layer_parameters, gpus_per_node=gpus_per_node, nodes=nodes,
                                         offload_optimizer=offload_optimizer, offload_param=offload_param, zero_init=zero_init)
    return Outcome(measured=float(reported), predicted=(cpu if side == "cpu" else gpu) / 2**30)
