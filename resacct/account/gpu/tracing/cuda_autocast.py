"""``torch.autocast("cuda")`` for tensors on any device — the meta tensors a CUDA step is traced on.

Meta tensors have no autocast ("unsupported autocast device_type 'meta'"), and fake ``cuda`` tensors
abort a CPU-only torch as soon as autograd records them. So :class:`CudaAutocast` applies CUDA
autocast's casting policy itself, as a ``TorchFunctionMode`` (above autograd, as the ``AutocastCUDA``
dispatch key is: the casts are recorded and saved for backward as on a GPU), following
``aten/src/ATen/autocast_mode.cpp``'s CUDA lists:

- **lower precision** (:data:`LOWER_PRECISION`): matmuls, convolutions, ``linear``, sdpa, RNN cells —
  every floating input other than float64 cast to the autocast dtype;
- **float32** (:data:`FLOAT32`): losses, norms, ``exp``/``log``/``pow``…, ``softmax``, ``sum`` … —
  cast to float32 (``softmax``, ``log_softmax``, ``sum``, ``prod``, ``cumsum``, ``cumprod`` get
  ``dtype=torch.float32`` instead where none is given: ``fp32_set_opt_dtype``);
- **promote** (:data:`PROMOTE`): ``addcmul``, ``dot``, ``index_put`` … — every floating input cast to
  the widest floating dtype among them;
- the **cast cache**: a float32 leaf that requires grad (a parameter) is cast once per autocast region
  and the copy kept until the region ends (``cached_cast``); other casts are made each time.

The names are checked against torch's own CUDA autocast test lists
(``torch.testing._internal.autocast_test_lists.AutocastTestLists``) in ``tests/test_gpu_autocast.py``,
and the allocations of a step under it against a real ``torch.autocast("cpu")`` step where the CPU
and CUDA policies agree.
"""

from __future__ import annotations

from typing import Any, no_type_check

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["CudaAutocast", "LOWER_PRECISION", "FLOAT32", "FLOAT32_DTYPE_ARGUMENT", "PROMOTE", "autocast_policy"]

LOWER_PRECISION = frozenset({
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__", "einsum",
    "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention"})
FLOAT32_DTYPE_ARGUMENT = frozenset({"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum", "linalg_vector_norm", "linalg_matrix_norm"})
FLOAT32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__",
    "__rpow__", "softplus", "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "norm", "frobenius_norm", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "cross_entropy",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"})
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "scatter_add", "tensordot"})


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def autocast_policy(name: str) -> str | None:
    """``"lower"``, ``"float32"``, ``"float32-dtype"``, ``"promote"`` or None (run as is) for a function's name."""
    if name in LOWER_PRECISION:
        return "lower"
    if name in FLOAT32_DTYPE_ARGUMENT:
        return "float32-dtype"
    if name in FLOAT32:
        return "float32"
    if name in PROMOTE:
        return "promote"
    return None


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _eligible(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


class CudaAutocast(TorchFunctionMode):
    """``with CudaAutocast(torch.bfloat16):`` casts as ``torch.autocast("cuda", torch.bfloat16)`` would,
    whatever the tensors' device. The cast cache lives until the mode exits."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"autocast dtype {dtype}: expected torch.bfloat16 or torch.float16")
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(parameter) -> (parameter, its cast)
        self.casts = 0

    def __exit__(self, *exc: Any) -> Any:
        self._cache.clear()  # autocast's exit clears the cast cache (the casts autograd saved live on there)
        return super().__exit__(*exc)

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = dtype == self.dtype and value.dtype == torch.float32 and value.requires_grad and value.is_leaf and not value._is_view()
        if cacheable and id(value) in self._cache and self._cache[id(value)][0] is value:
            return self._cache[id(value)][1]
        self.casts += 1
        cast = value.to(dtype)
        if cacheable and torch.is_grad_enabled():
            self._cache[id(value)] = (value, cast)
        return cast

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        policy = autocast_policy(getattr(func, "__name__", ""))
        if policy is None:
            return func(*args, **kwargs)
        if policy == "float32-dtype":
            first = next((value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)), None)
            if _eligible(first) and kwargs.get("dtype") is None and not any(isinstance(value, torch.dtype) for value in args):
                kwargs = {**kwargs, "dtype": torch.float32}
            return func(*args, **kwargs)
        if policy == "promote":
            floating = [value.dtype for value in tree_flatten((args, kwargs))[0] if _eligible(value)]
            target = max(floating, key=lambda dtype: torch.finfo(dtype).bits, default=None)
            if target is None or len(set(floating)) == 1:
                return func(*args, **kwargs)
            args, kwargs = self._cast_all((args, kwargs), target)
            return func(*args, **kwargs)
        args, kwargs = self._cast_all((args, kwargs), self.dtype if policy == "lower" else torch.float32)
        return func(*args, **kwargs)

    @no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
    def _cast_all(self, tree: Any, dtype: torch.dtype) -> Any:
        """Every argument cast, the **last first**: the C++ kernels cast their arguments in one call
        expression, which GCC (the CUDA wheels' compiler) evaluates right to left — the order of the
        allocations (``linear``: the bias's cast, the weight's, then the input's)."""
        values, spec = tree_flatten(tree)
        cast = [self._cast(value, dtype) for value in reversed(values)][::-1]
        return tree_unflatten(cast, spec)
