"""Each aten op of a traced step with its FLOPs and the bytes it reads and writes: the step time's
input (:mod:`resacct.account.gpu.timing.step_time`), recorded on its own pass (:class:`OpCosts`, a dispatch
mode) or on the CUDA step-peak pass (:func:`resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory`'s
``ops``), where the allocation recorder that already sees every op counts them (:class:`OpCostCounter`:
no second mode between the step and the recorder, ~0.3 CPU s fewer on a 7B step's 7,900 ops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, no_type_check

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCost", "OpCostCounter", "OpCosts", "CUBLAS_OP_NAMES", "FUSED_ATTENTION_OP_NAMES"]


@no_type_check  # made per block, event or op of a traced step (docs/suite_time.md, session 24)
@dataclass(frozen=True)
class OpCost:
    op: str
    flops: int
    bytes: int
    kernel: bool = True  # False: the op launches no kernel (a view: ``t``, ``view``, ``expand`` …; an empty allocation)
    #: a cuBLAS call's (rows, columns, inner dimension, dtype, aligned): batches folded into the rows; aligned when every
    #: operand's and the output's leading dimension (its larger stride of the last two) is a multiple of 8 elements
    matmul: tuple[int, int, int, str, bool] | None = None
    #: a fused attention op's dtype (its first tensor's: the query, or the gradient of its output): the precision that
    #: prices it (step_time_calibrated's rates per kernel family and precision); None for any other op
    dtype: str | None = None

    def __deepcopy__(self, memo: dict) -> OpCost:
        """Itself: frozen, and every field a number, a string or a tuple of them (a memoised step's thousands of ops are
        handed to each claim that asks: copying them cost ~15 ms a claim, session 25)."""
        return self


#: ops that return new storage yet launch no kernel (their schema is not an alias, so ``is_view`` misses them)
_NO_KERNEL = frozenset({"_unsafe_view", "empty", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "_local_scalar_dense"})
#: cuBLAS's ops, and where their two operands sit in the arguments
_MATMUL_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}
#: the aten ops (by name) that call cuBLAS: a ``Linear`` is ``addmm`` or ``mm`` by then
CUBLAS_OP_NAMES = frozenset(_MATMUL_OPERANDS)
#: the fused attention ops a step's trace shows (their kernels' rates depend on the dtype: OpCost.dtype)
FUSED_ATTENTION_OP_NAMES = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                                      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"})


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _leading(tensor: Any) -> int:
    """The leading dimension cuBLAS is given for a matrix (or a batch of them): the larger of its last two strides."""
    return int(max(tensor.stride()[-2:]))


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _matmul_shape(name: str, args: tuple) -> tuple[int, int, int, str, bool] | None:
    """(rows, columns, inner, dtype, aligned) of a cuBLAS op's call (``bmm``'s batch folded into the rows); None for any other op.
    A transposed operand's leading dimension is its rows (GPT-2's 50,257 × 4,096 weight gradient: unaligned)."""
    where = _MATMUL_OPERANDS.get(name)
    if where is None:
        return None
    left, right = args[where[0]], args[where[1]]
    rows = left.shape[0] * left.shape[1] if left.dim() == 3 else left.shape[0]
    aligned = _leading(left) % 8 == 0 and _leading(right) % 8 == 0 and int(right.shape[-1]) % 8 == 0
    return int(rows), int(right.shape[-1]), int(left.shape[-1]), str(left.dtype).removeprefix("torch."), aligned


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
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
        kernel = not (func.is_view or packet.__name__ in _NO_KERNEL)
        dtype = str(args[0].dtype).removeprefix("torch.") if packet.__name__ in FUSED_ATTENTION_OP_NAMES and args and isinstance(args[0], torch.Tensor) else None
        cost = OpCost(name, flops, moved, kernel, _matmul_shape(packet.__name__, args), dtype)
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
