"""Each aten op of a traced step with its FLOPs and the bytes it reads and writes: the step time's
input (:mod:`resacct.account.gpu.step_time`), recorded on its own pass or on the CUDA step-peak pass
(:func:`resacct.account.gpu.cuda_step.predict_cuda_step_memory`'s ``ops``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["OpCost", "OpCosts"]


@dataclass(frozen=True)
class OpCost:
    op: str
    flops: int
    bytes: int


class OpCosts(TorchDispatchMode):
    """Records every aten op that runs under it: its name, FLOPs (torch's ``flop_registry`` and the
    grouped-matmul ops of a mixture of experts) and bytes (every tensor argument and output)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry, shape_wrapper

        from resacct.account.load.moe_routing import grouped_mm_flop_mapping

        # transformers' grouped-matmul ops (a mixture of experts run grouped, as on a CUDA board) counted from their shapes
        self.registry = {**flop_registry, **{op: shape_wrapper(count) for op, count in grouped_mm_flop_mapping().items()}}
        self.ops: list[OpCost] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        flops = int(self.registry[packet](*args, **kwargs, out_val=out)) if packet in self.registry else 0
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self.ops.append(OpCost(str(func), flops, sum(t.numel() * t.element_size() for t in tensors)))
        return out
