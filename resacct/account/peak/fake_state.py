"""The fake tensors a predicted step starts from — the model's copy (:func:`fake_like`) and the
optimizer state (:func:`made_adam_state`, without the ops of a first step) — made as FakeTensorMode
makes them, without its dispatch; re-exported by :mod:`resacct.account.peak.step_peak`.

FakeTensorMode answers ``torch.empty_strided(shape, stride, dtype=dtype, device="cpu")`` (and
``torch.zeros_like``, from its cache) with ``FakeTensor(mode, torch.empty_strided(shape, stride,
dtype=dtype, device="meta"), cpu)``, and ``torch.tensor(1.0)`` with a 0-dim one whose ``constant`` is
the real tensor (``lift_fresh``); through its dispatch each costs its cache key and the modes above it
(a tenth of a GPT-2 prediction for 444 state tensors and 148 parameters). Here they are made directly:
``tests/test_fake_state.py`` compares every tensor with the dispatched one and the predictions both ways.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["made_adam_state", "fake_like", "active_fake_mode"]


def active_fake_mode() -> Any:
    """The FakeTensorMode in force (None outside one)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def fake_like(mode: Any, tensors: Iterable[torch.Tensor], *, like: bool = False) -> list[torch.Tensor]:
    """A fake CPU tensor of ``mode`` per tensor, its shape, stride and dtype: what
    ``torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")`` returns under ``mode``
    (``like``: what ``torch.zeros_like(t, memory_format=torch.preserve_format)`` does, its strides
    chosen as ``empty_like`` chooses them) — made without ``mode``'s dispatch or any mode above it."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    cpu = torch.device("cpu")
    with _disable_current_modes():
        made = []
        for tensor in tensors:
            meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
            made.append(FakeTensor(mode, torch.empty_like(meta) if like else meta, cpu))
        return made


def _fake_step_counters(mode: Any, count: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """``count`` of what ``torch.tensor(1.0, dtype=dtype, device="cpu")`` returns under ``mode``: a 0-dim
    fake CPU tensor whose ``constant`` is the real one (``.item()`` reads it), memoized as its fake."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    cpu, made = torch.device("cpu"), []
    with _disable_current_modes():
        for _ in range(count):
            constant = torch.tensor(1.0, dtype=dtype)
            made.append(FakeTensor(mode, torch.empty((), dtype=dtype, device="meta"), cpu, constant=constant))
            # the converter's memo, as lift_fresh leaves it: an op on the constants alone (``step += 1``) is run on
            # them for real and its output, the constant, converted back — to this very tensor, not a new one
            mode.fake_tensor_converter.set_tensor_memo(constant, made[-1])
    return made


def made_adam_state(optimizer: torch.optim.Optimizer) -> bool:
    """Make a ``torch.optim.Adam``/``AdamW``'s state (or a
    :class:`~resacct.account.peak.recipes.MasterWeightsOptimizer` stepping one) as its first step on
    zero gradients leaves it — each parameter's ``step`` counter at 1 (a CPU float scalar) and its
    ``exp_avg`` and ``exp_avg_sq`` (``max_exp_avg_sq`` with amsgrad) shaped like it, as
    ``Adam._init_group`` makes them — without that step's dozen ops a parameter (on fake tensors,
    a fifth of a prediction's time). False, making nothing: another optimizer, fused, capturable or
    differentiable, a parameter without a gradient, or state already there;
    :func:`~resacct.measurement.memory_timeline.make_optimizer_state` then runs the step.
    ``tests/test_account_trace_once.py`` checks the two ways give the same prediction to the byte.

    >>> weight = torch.nn.Parameter(torch.ones(2, 3))
    >>> adamw = torch.optim.AdamW([weight])
    >>> made_adam_state(adamw), sorted(adamw.state[weight]), adamw.state[weight]["step"].item()
    (True, ['exp_avg', 'exp_avg_sq', 'step'], 1.0)
    """
    from torch.optim.optimizer import _get_scalar_dtype

    from resacct.account.peak.recipes import MasterWeightsOptimizer

    inner = optimizer.inner if type(optimizer) is MasterWeightsOptimizer else optimizer
    if type(inner) not in (torch.optim.Adam, torch.optim.AdamW) or inner.state:
        return False
    groups = inner.param_groups
    if any(group["fused"] or group["capturable"] or group["differentiable"] for group in groups):
        return False
    if any(not parameter.requires_grad for group in groups for parameter in group["params"]):
        return False
    if inner is not optimizer and any(not parameter.requires_grad for parameter in optimizer.model_parameters):
        return False
    mode = _state_mode(groups)
    for group in groups:
        names = ["exp_avg", "exp_avg_sq", *(["max_exp_avg_sq"] if group["amsgrad"] else [])]
        parameters = group["params"]
        if mode is not None:  # fake tensors of one mode: made without its dispatch
            counters = _fake_step_counters(mode, len(parameters), _get_scalar_dtype())
            moments = [fake_like(mode, parameters, like=True) for _ in names]
        for index, parameter in enumerate(parameters):
            state = inner.state[parameter]
            if mode is None:  # real tensors, or fake ones of several modes: as Adam._init_group makes them
                state["step"] = torch.tensor(1.0, dtype=_get_scalar_dtype(), device="cpu")
                for name in names:
                    state[name] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            else:
                state["step"] = counters[index]
                for name, made in zip(names, moments):
                    state[name] = made[index]
    return True


def _state_mode(groups: list[dict[str, Any]]) -> Any:
    """The FakeTensorMode of every parameter in ``groups`` (None: real tensors, or several modes)."""
    modes = {id(getattr(parameter, "fake_mode", None)): getattr(parameter, "fake_mode", None) for group in groups for parameter in group["params"]}
    return next(iter(modes.values())) if len(modes) == 1 else None
