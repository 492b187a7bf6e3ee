"""Each aten op of a traced step with its FLOPs and the bytes it reads and writes: the step time's
input (:mod:`resacct.account.gpu.step_time`), recorded on its own pass (:class:`OpCosts`, a dispatch
mode) or on the CUDA step-peak pass (:func:`resacct.account.gpu.cuda_step.predict_cuda_step_memory`'s
``ops``), where the allocation recorder that already sees every op counts them (:class:`OpCostCounter`:
no second mode between the step and the recorder, ~0.3 CPU s fewer on a 7B step's 7,900 ops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, no_type_check

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCost", "OpCostCounter", "OpCosts"]


@dataclass(frozen=True)
class OpCost:
    op: str
    flops: int
    bytes: int


def _tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in one argument or output: a tensor, or the tensors in a list or tuple (and in
    theirs: a fused optimizer returns a tuple of lists), anything else none."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


class OpCostCounter:
    """Appends to ``ops`` each op it is told of: its name, FLOPs (torch's ``flop_registry`` and the grouped-matmul
    ops of a mixture of experts) and bytes (every tensor argument and output)."""

    def __init__(self) -> None:
        from torch.utils.flop_counter import flop_registry, shape_wrapper

        from resacct.account.load.moe_routing import grouped_mm_flop_mapping

        # transformers' grouped-matmul ops (a mixture of experts run grouped, as on a CUDA board) counted from their shapes
        self.registry = {**flop_registry, **{op: shape_wrapper(count) for op, count in grouped_mm_flop_mapping().items()}}
        self.ops: list[OpCost] = []
        self._names: dict[Any, str] = {}
        self._by_key: dict[Any, OpCost] = {}

    @no_type_check  # per op of a traced step: the hints are all Any
    def record(self, func: Any, args: tuple, kwargs: dict, out: Any, key: Any = None) -> None:
        """Count ``func``'s call; ``key``: the call's key in a :class:`~resacct.measurement.meta_op_cache.MetaOpCache`
        (the op and every argument's dtype, shape, strides and value), which decides its FLOPs and bytes: counted once per key."""
        if key is not None:
            known = self._by_key.get(key)
            if known is not None:
                self.ops.append(known)
                return
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = str(func)
        packet = func._overloadpacket
        flops = int(self.registry[packet](*args, **kwargs, out_val=out)) if packet in self.registry else 0
        moved = _tensor_bytes(out) + sum(_tensor_bytes(value) for value in args) + sum(_tensor_bytes(value) for value in kwargs.values())
        cost = OpCost(name, flops, moved)
        if key is not None:
            self._by_key[key] = cost
        self.ops.append(cost)


class OpCosts(TorchDispatchMode):
    """Records every aten op that runs under it (an :class:`OpCostCounter` as a dispatch mode; ``ops`` its list)."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = OpCostCounter()
        self.ops = self.counter.ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.counter.record(func, args, kwargs, out)
        return out
