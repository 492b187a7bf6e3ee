"""What CPU kernels allocate that the dispatcher never shows — the part of the allocator's peak a
census of op outputs misses, from the kernels' source (torch 2.13) and checked against the
allocator (``tests/test_peak.py``).

- **Python numbers** where an op takes a tensor (``x * 0.5``; the ``.Scalar`` overloads of
  add/sub/mul/div; ``mean``'s division by the count): each is wrapped in a 0-d CPU tensor (8 bytes
  for a float or int) and copied to the op's dtype when that differs (4 more for float32).
- **mean of a bf16/fp16 tensor** (``ReduceOps.cpp``, ``mean_out`` on the CPU): for accuracy the
  kernel sums in float32 — a float32 copy of the result (out·4 bytes), a float32 copy of the
  input while it sums (in·4), then the division by the count on the float32 result (its wrapped
  8 bytes and their float32 copy, 4) — and casts back.
- **mse_loss** forward: the element-wise loss, input-sized, which stays as the storage of the
  reduced loss (:func:`output_storage_bytes`), and one more input-sized tensor while reducing.
- **CPU flash attention** (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``): forward, per
  thread, q·kᵀ block, row max, row sum and output block in the accumulation dtype,
  T·(qS·kvS + 2·qS + qS·e)·4 bytes (16-bit inputs: + T·qS·kvS of their dtype); backward, per
  thread, the attention block and its gradient, T·2·qS·kvS·4 (16-bit: + the same in their dtype),
  the calling thread's row sums qS·4, and a contiguous copy of the output gradient when it is not
  contiguous. Blocks: qS = min(256 if s ≥ 768, 64 if s ≥ 192, else 32; s), kvS = min(512, s_kv);
  T = ``torch.get_num_threads()`` (the workspace grows with threads; worker threads' own row sums
  are not reported by the profiler, so they are not counted).

>>> import torch
>>> q = torch.empty(2, 4, 1024, 16)
>>> op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
>>> kernel_workspace_bytes(op, (q, q, q), {}) == torch.get_num_threads() * (256 * 512 + 2 * 256 + 256 * 16) * 4
True
"""

from __future__ import annotations

import math
from typing import Any, no_type_check

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["WRAPPED_NUMBER_BYTES", "WORKSPACE_OPS", "SIZED_OUTPUT_OPS", "op_name", "wrapped_number_bytes", "kernel_workspace_bytes", "output_storage_bytes", "flash_block_sizes"]

#: Bytes of the CPU tensor torch wraps a Python number in where an op takes a tensor.
WRAPPED_NUMBER_BYTES = {bool: 1, int: 8, float: 8, complex: 16}

#: Ops whose CPU kernel wraps their Scalar operand in a tensor and calls the Tensor overload.
_WRAPS_SCALAR_OPERAND = frozenset(f"aten.{op}.Scalar" for op in ("add", "sub", "mul", "div", "add_", "sub_", "mul_", "div_"))
#: Ops whose CPU kernel divides by the element count internally (``sum`` then ``div_(count)``).
_DIVIDES_BY_COUNT = frozenset({"aten.mean.default", "aten.mean.dim"})
_WRAPPED_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


_NUMBER_TYPES = (bool, int, float, complex)
_OP_NAMES: dict[int, tuple[Any, str]] = {}  # id(op) -> (op, its name): ops live as long as torch (kept here too)
_NUMBER_SLOTS: dict[int, tuple[Any, tuple[bool, ...]]] = {}  # id(op) -> (op, per positional argument: may a number there be wrapped)


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def op_name(func: Any) -> str:
    """``str(func)`` (``aten.mm.default``), computed once per op: the tracker asks for every call."""
    known = _OP_NAMES.get(id(func))
    if known is None or known[0] is not func:
        known = _OP_NAMES[id(func)] = (func, str(func))
    return known[1]


@no_type_check  # per op (23,912 checks in the CI quick tier): func is Any, name op_name's checked str (docs/suite_time.md, session 7)
def _number_slots(func: Any, name: str) -> tuple[bool, ...]:
    """Per positional argument of ``func``: whether a Python number passed there is wrapped in a
    tensor (a Tensor slot; the ``other`` operand of a ``.Scalar`` add/sub/mul/div)."""
    known = _NUMBER_SLOTS.get(id(func))
    if known is None or known[0] is not func:
        slots = tuple(isinstance(argument.type, torch.TensorType) or (name in _WRAPS_SCALAR_OPERAND and argument.name == "other")
                      for argument in func._schema.arguments)
        known = _NUMBER_SLOTS[id(func)] = (func, slots)
    return known[1]


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def wrapped_number_bytes(func: Any, args: Any, out: Any) -> int:
    """Bytes of the CPU tensors torch makes for this call's Python numbers while it runs: each
    number in a Tensor slot (or the operand of a ``.Scalar`` add/sub/mul/div) is wrapped in a
    0-d tensor (8 bytes for a float or an int), and copied to the op's dtype when that differs
    (4 more for float32). ``mean`` does the same for its element count inside the kernel."""
    name = op_name(func)
    if name not in _DIVIDES_BY_COUNT and not any(isinstance(value, _NUMBER_TYPES) for value in args):
        return 0  # most ops: no Python number at all
    if name in _DIVIDES_BY_COUNT and _is_sixteen_bit(args[0]):
        return 0  # its count divides a float32 copy: part of the kernel's workspace (kernel_workspace_bytes)
    numbers = [value for wrapped, value in zip(_number_slots(func, name), args) if wrapped and isinstance(value, _NUMBER_TYPES)]
    if name in _DIVIDES_BY_COUNT:
        numbers.append(1)
    result = out if isinstance(out, torch.Tensor) else next((value for value in tree_flatten(out)[0] if isinstance(value, torch.Tensor)), None)
    total = 0
    for number in numbers:
        total += WRAPPED_NUMBER_BYTES[type(number)]
        if result is not None and result.dtype != _WRAPPED_DTYPE[type(number)]:
            total += result.element_size()
    return total


def flash_block_sizes(q_seq: int, kv_seq: int) -> tuple[int, int]:
    """(qS, kvS): the CPU flash kernels' query and key/value block sizes.

    >>> flash_block_sizes(4096, 4096), flash_block_sizes(256, 256), flash_block_sizes(16, 16)
    ((256, 512), (64, 256), (16, 16))
    """
    q_split = 256 if q_seq >= 768 else 64 if q_seq >= 192 else 32
    return min(q_split, q_seq), min(512, kv_seq)


_FLASH_FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
_FLASH_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


_MSE = ("aten.mse_loss.default", "aten.mse_loss_backward.default")
#: The ops :func:`kernel_workspace_bytes` may add bytes for, and those :func:`output_storage_bytes` may size (0 / None for every other op).
WORKSPACE_OPS = frozenset({*_MSE, *_DIVIDES_BY_COUNT, _FLASH_FORWARD, _FLASH_BACKWARD})
SIZED_OUTPUT_OPS = frozenset({"aten.mse_loss.default"})
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _mse_arguments(args: Any, kwargs: Any) -> tuple[torch.Tensor, str]:
    """(the input, the reduction's name) of an ``aten.mse_loss`` call."""
    values = [*args, *kwargs.values()]
    source = next(value for value in values if isinstance(value, torch.Tensor))
    reduction = next((value for value in values[2:] if isinstance(value, int) and not isinstance(value, bool)), 1)
    return source, _REDUCTIONS.get(reduction, "mean")


def _mse_workspace_bytes(name: str, args: Any, kwargs: Any) -> int:
    """``mse_loss`` forward on the CPU, as the allocator records it (torch 2.13; float32, float64,
    bfloat16 checked in ``tests/test_peak.py``): the element-wise loss is made (it stays: the reduced loss is written
    into its storage, :func:`output_storage_bytes`), then a second tensor of the input's size while
    reducing; ``mean`` adds its count wrapped (8 bytes) and a 0-d sum in the input's dtype — for
    16-bit inputs a 4-byte float32 sum and the float32 copy of the element-wise loss instead.
    ``reduction='none'`` returns the element-wise loss itself: nothing more. Backward: its output only."""
    if not name.endswith("mse_loss.default"):
        return 0
    source, reduction = _mse_arguments(args, kwargs)
    size = source.numel() * source.element_size()
    if reduction == "none":
        return 0
    if reduction == "sum":
        return size
    if source.dtype in (torch.bfloat16, torch.float16):
        return size + 4 + source.numel() * 4
    return size + 8 + source.element_size()


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def output_storage_bytes(func: Any, args: Any, kwargs: Any) -> int | None:
    """Bytes of the storage a CPU kernel really returns its output in, where that differs from
    the output's own size (None elsewhere): ``mse_loss`` with ``mean`` or ``sum`` returns its 0-d
    loss inside the storage of the element-wise loss — input-sized, alive as long as the loss is.

    >>> op = torch.ops.aten.mse_loss.default
    >>> output_storage_bytes(op, (torch.empty(16, 64), torch.empty(16, 64), 1), {}), output_storage_bytes(op, (torch.empty(3), torch.empty(3), 0), {})
    (4096, None)
    """
    if op_name(func) != "aten.mse_loss.default":
        return None
    source, reduction = _mse_arguments(args, kwargs)
    return None if reduction == "none" else source.numel() * source.element_size()


def _is_sixteen_bit(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16)


def _sixteen_bit_mean_workspace_bytes(name: str, args: Any, kwargs: Any) -> int:
    """``mean`` of a bf16/fp16 tensor on the CPU: float32 copies of the result and (while summing)
    of the input, then the count's wrapped 8 bytes and their float32 copy (module docstring)."""
    source = args[0]
    dims = (args[1] if len(args) > 1 else kwargs.get("dim")) if name == "aten.mean.dim" else None
    reduced = [d % max(source.dim(), 1) for d in dims] if dims else list(range(source.dim()))
    out_numel = source.numel() // max(1, math.prod(source.shape[d] for d in reduced)) if source.dim() else 1
    return out_numel * 4 + max(source.numel() * 4, WRAPPED_NUMBER_BYTES[int] + 4)


@no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
def kernel_workspace_bytes(func: Any, args: Any, kwargs: Any) -> int:
    """Bytes a CPU kernel allocates for itself while it runs (0 for the ops resacct knows nothing
    to add for): the flash attention kernels' buffers, mse_loss's, a 16-bit mean's float32 copies.

    >>> kernel_workspace_bytes(torch.ops.aten.mean.default, (torch.empty(16, 64, dtype=torch.bfloat16),), {})   # 4 + 16·64·4
    4100
    """
    name = op_name(func)
    if name in _MSE:
        return _mse_workspace_bytes(name, args, kwargs)
    if name in _DIVIDES_BY_COUNT and args and _is_sixteen_bit(args[0]):
        return _sixteen_bit_mean_workspace_bytes(name, args, kwargs)
    if name not in (_FLASH_FORWARD, _FLASH_BACKWARD):
        return 0
    threads = torch.get_num_threads()
    if name == _FLASH_FORWARD:
        query, key = args[0], args[1]  # (b, h, s, e)
        q_block, kv_block = flash_block_sizes(query.shape[-2], key.shape[-2])
        reduced = query.element_size() if query.dtype in (torch.bfloat16, torch.float16) else 0
        return threads * ((q_block * kv_block + 2 * q_block + q_block * query.shape[-1]) * 4 + q_block * kv_block * reduced)
    grad_out, query, key = args[0], args[1], args[2]  # (b, h, s, e)
    q_block, kv_block = flash_block_sizes(query.shape[-2], key.shape[-2])
    reduced = query.element_size() if query.dtype in (torch.bfloat16, torch.float16) else 0
    copy = 0 if grad_out.transpose(1, 2).is_contiguous() else grad_out.numel() * grad_out.element_size()
    return copy + threads * 2 * q_block * kv_block * (4 + reduced) + q_block * 4
