"""The optimizer state a predicted step starts from, made on fake tensors without the ops of a first
step (:func:`made_adam_state`); re-exported by :mod:`resacct.account.peak.step_peak`."""

from __future__ import annotations

import torch

__all__ = ["made_adam_state"]


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
    for group in groups:
        for parameter in group["params"]:
            state = inner.state[parameter]
            state["step"] = torch.tensor(1.0, dtype=_get_scalar_dtype(), device="cpu")
            state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
    return True
