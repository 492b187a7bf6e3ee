"""Tensor memory and layout: bytes, strides, element offsets, and which operations copy.

>>> tensor_bytes((4, 8), "float32")
128
>>> contiguous_strides((3, 4))
(4, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Shaped

from resacct.facts.dtypes import dtype_bits
from resacct.errors import ResacctError

__all__ = [
    "GB",
    "GiB",
    "tensor_bytes",
    "numel",
    "contiguous_strides",
    "element_offset",
    "storage_bytes",
    "shares_storage",
    "OPERATION_MAKES_VIEW",
    "makes_view",
]

GB = 10**9
GiB = 2**30


def _validated_shape(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(shape)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ResacctError(f"shape {list(dims)} has the dimension {dim!r}; dimensions are whole numbers ≥ 0")
    return dims


def numel(shape: Sequence[int]) -> int:
    return math.prod(_validated_shape(shape))


def tensor_bytes(shape: Sequence[int], dtype: str | torch.dtype) -> int:
    """Bytes a contiguous tensor of ``shape`` and ``dtype`` occupies: numel × element size."""
    bits = numel(shape) * dtype_bits(dtype)
    return math.ceil(bits / 8)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides: the stride of a dimension is the product of the dimensions after it."""
    dims = _validated_shape(shape)
    strides, running = [], 1
    for dim in reversed(dims):
        strides.append(running)
        running *= max(dim, 1)
    return tuple(reversed(strides))


def element_offset(index: Sequence[int], strides: Sequence[int], storage_offset: int = 0) -> int:
    """Where element ``index`` lives in storage: storage_offset + Σ index[d] · stride[d]."""
    if len(index) != len(strides):
        raise ResacctError(f"index {list(index)} has {len(index)} positions but strides {list(strides)} have {len(strides)}")
    return storage_offset + sum(i * s for i, s in zip(index, strides))


def storage_bytes(tensor: Shaped[torch.Tensor, "..."]) -> int:
    """Bytes of the storage behind ``tensor`` (shared by all views of it)."""
    return tensor.untyped_storage().nbytes()


def shares_storage(a: Shaped[torch.Tensor, "..."], b: Shaped[torch.Tensor, "..."]) -> bool:
    """True when both tensors are views of the same storage."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


OPERATION_MAKES_VIEW: dict[str, bool] = {
    "row": True,                        # x[0]
    "column": True,                     # x[:, 1]
    "view": True,                       # x.view(...) on a contiguous tensor
    "transpose": True,                  # x.transpose(0, 1)
    "reshape_contiguous": True,         # x.reshape(...) when a view is possible
    "reshape_transposed": False,        # x.t().reshape(-1) must copy
    "contiguous_of_contiguous": True,   # x.contiguous() returns x itself
    "contiguous_of_transposed": False,  # x.t().contiguous() copies
    "add": False,                       # x + x
    "relu": False,                      # torch.relu(x)
    "pow": False,                       # x.pow(2)
    "flatten_contiguous": True,         # x.flatten()
}


def makes_view(operation: str) -> bool:
    """resacct's answer to "does this operation return a view (no new memory)?"."""
    try:
        return OPERATION_MAKES_VIEW[operation]
    except KeyError:
        from resacct.errors import UnknownNameError

        raise UnknownNameError("operation", operation, list(OPERATION_MAKES_VIEW)) from None


