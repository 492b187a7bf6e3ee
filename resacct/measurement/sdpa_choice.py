"""Which kernel *this* torch runs for ``scaled_dot_product_attention`` on the CPU, seen by running it
once on tiny tensors of the same heads, head size and dtype and recording the aten op it dispatches.

torch's CPU dispatcher (``sdp_utils_cpp``) sends sdpa to its flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``: it keeps the output and a float32
logsumexp, no s² scores) when the inputs pass its checks, else to the math decomposition (bmm,
softmax: the scores are kept). The checks change between releases: torch 2.8 refuses grouped-query
attention (``enable_gqa`` with fewer key/value heads than query heads: "both fused kernels require
query, key and value to have the same num_heads") and runs the math kernel; torch 2.11 and 2.13 run
the flash kernel (seen 2026-11-28 on these three). What a model saves for backward follows that choice,
so the activation formulas ask here rather than assume a version's choice.

>>> cpu_sdpa_kernel(heads=4, kv_heads=4, head_dim=8, dtype="float32")
'flash'
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from resacct.errors import ResacctError

__all__ = ["CPU_FLASH_OP", "cpu_sdpa_kernel"]

#: the aten op torch's CPU flash attention kernel dispatches as
CPU_FLASH_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=None)
def cpu_sdpa_kernel(*, heads: int, kv_heads: int, head_dim: int, dtype: str) -> str:
    """``'flash'`` or ``'math'``: the kernel this torch runs for causal sdpa without a mask or dropout
    on the CPU, with ``heads`` query heads and ``kv_heads`` key/value heads passed as transformers does
    (``enable_gqa`` where they differ) of ``head_dim`` in ``dtype``. Measured once per process and
    shape: a 2-token sdpa on real CPU tensors, outside any fake or meta mode the caller is in."""
    from torch.utils._python_dispatch import _disable_current_modes

    if dtype not in _DTYPES:
        raise ResacctError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
    for label, value in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{label} {value!r}: expected a whole number ≥ 1")
    if heads % kv_heads:
        raise ResacctError(f"heads {heads} and kv_heads {kv_heads}: expected the query heads to be a multiple of the key/value heads")
    with _disable_current_modes(), _unfaked(), torch.no_grad():
        def tensor(count: int) -> torch.Tensor:
            return torch.zeros(1, count, 2, head_dim, dtype=_DTYPES[dtype], device="cpu")

        q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
        gqa = _takes_enable_gqa()
        recorder = _OpNames()
        with recorder:
            if kv_heads == heads:
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif gqa:
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:  # torch < 2.5 has no enable_gqa: k and v go in repeated to every query head (transformers' repeat_kv)
                repeat = heads // kv_heads
                torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1), is_causal=True)
    return "flash" if CPU_FLASH_OP in recorder.names else "math"


def _takes_enable_gqa() -> bool:
    try:
        torch.nn.functional.scaled_dot_product_attention(*(torch.zeros(1, 1, 1, 1) for _ in range(3)), enable_gqa=False)
    except TypeError:
        return False
    return True


def _unfaked() -> Any:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()
