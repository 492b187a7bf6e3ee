"""Optimizers written from scratch, update rule by update rule, on ``torch.optim.Optimizer``.

Each class keeps the standard API (``param_groups``, ``state``, ``step()``, ``zero_grad()``,
``state_dict()``) and the exact update rule and defaults of its ``torch.optim`` counterpart,
so the claims in ``resacct/specs/optim.claims.yaml`` can run both side by side:

============  =====================  ======================================  ==============
resacct       torch.optim            state per parameter (besides ``step``)   defaults
============  =====================  ======================================  ==============
SGD           SGD                    none; ``momentum_buffer`` if momentum   lr 1e-3
AdaGrad       Adagrad                ``sum`` (Σ g²)                          lr 1e-2, eps 1e-10
RMSProp       RMSprop                ``square_avg`` (+ buffers if momentum   lr 1e-2, alpha 0.99,
                                     or centered)                            eps 1e-8
Adam          Adam                   ``exp_avg``, ``exp_avg_sq``              lr 1e-3, betas (0.9,
AdamW         AdamW                  ``exp_avg``, ``exp_avg_sq``              0.999), eps 1e-8;
                                                                             AdamW wd 1e-2
============  =====================  ======================================  ==============

resacct keeps ``state["step"]`` as a Python int; torch keeps it as a float32 0-dim tensor
(4 bytes per parameter tensor), which ``resacct.measurement.memory`` accounts for. The update rules, one
tensor at a time, live in :mod:`resacct.training.optim_updates` (re-exported here).

>>> import torch
>>> weight = torch.nn.Parameter(torch.ones(2))
>>> optimizer = AdaGrad([weight], lr=0.5)
>>> weight.grad = torch.tensor([1.0, -2.0])
>>> optimizer.step()
>>> weight.detach().tolist()  # each parameter moves by lr · g / |g| on the first step
[0.5, 1.5]
>>> sorted(optimizer.state[weight])
['step', 'sum']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from jaxtyping import Float

from resacct.errors import ResacctError
from resacct.facts.optimizer_state import STATE_TENSORS_PER_PARAMETER, state_tensors_per_parameter  # re-exported
from resacct.training.optim_updates import adagrad_update_, adam_update_, rmsprop_update_, sgd_update_

__all__ = [
    "HyperparameterError",
    "SGD",
    "AdaGrad",
    "RMSProp",
    "Adam",
    "AdamW",
    "OPTIMIZERS",
    "STATE_TENSORS_PER_PARAMETER",
    "state_tensors_per_parameter",
    "sgd_update_",
    "adagrad_update_",
    "rmsprop_update_",
    "adam_update_",
]


class HyperparameterError(ResacctError, ValueError):
    """A hyper-parameter is out of range (a ``ValueError``, as torch.optim raises)."""


Tensor = torch.Tensor
Params = Iterable[Float[torch.Tensor, "..."]] | Iterable[dict[str, Any]]


def _at_least_zero(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise HyperparameterError(f"{name} {value!r}: expected a finite number ≥ 0")
    return float(value)


def _fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise HyperparameterError(f"{name} {value!r}: expected a number in [0, 1)")
    return float(value)


# ── optimizers ──────────────────────────────────────────────────────────────────────────────


def _parameters_with_gradients(group: dict[str, Any]) -> Iterable[Float[torch.Tensor, "..."]]:
    for param in group["params"]:
        if param.grad is None:
            continue
        if param.grad.is_sparse:
            raise ResacctError("resacct optimizers take dense gradients; got a sparse gradient")
        yield param


class _FromScratch(torch.optim.Optimizer):
    """Shared step loop: run the closure, update every parameter that has a gradient."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Update every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                for param in _parameters_with_gradients(group):
                    self._update(param, param.grad, self.state[param], group)
        return loss

    def _update(
        self, param: Float[Tensor, "*shape"], grad: Float[Tensor, "*shape"], state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        raise NotImplementedError


class SGD(_FromScratch):
    """Stochastic gradient descent, with optional momentum (torch.optim.SGD's rule).

    >>> weight = torch.nn.Parameter(torch.zeros(1))
    >>> optimizer = SGD([weight], lr=0.1, momentum=0.9)
    >>> for _ in range(2):
    ...     weight.grad = torch.ones(1)
    ...     optimizer.step()
    >>> round(weight.item(), 6)  # 0.1 · 1 + 0.1 · (0.9 + 1)
    -0.29
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        defaults = dict(
            lr=_at_least_zero("lr", lr),
            momentum=_at_least_zero("momentum", momentum),
            dampening=float(dampening),
            weight_decay=_at_least_zero("weight_decay", weight_decay),
            nesterov=nesterov,
        )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise HyperparameterError(f"nesterov needs momentum > 0 and dampening 0, got momentum {momentum!r}, dampening {dampening!r}")
        super().__init__(params, defaults)

    def _update(
        self, param: Float[Tensor, "*shape"], grad: Float[Tensor, "*shape"], state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        buffer = sgd_update_(
            param,
            grad,
            state.get("momentum_buffer"),
            lr=group["lr"],
            momentum=group["momentum"],
            dampening=group["dampening"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
        )
        if buffer is not None:
            state["momentum_buffer"] = buffer


class AdaGrad(_FromScratch):
    """AdaGrad: divide each step by the root of the running sum of squared gradients
    (torch.optim.Adagrad's rule: eps = 1e-10 outside the root)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ):
        defaults = dict(
            lr=_at_least_zero("lr", lr),
            lr_decay=_at_least_zero("lr_decay", lr_decay),
            weight_decay=_at_least_zero("weight_decay", weight_decay),
            initial_accumulator_value=_at_least_zero("initial_accumulator_value", initial_accumulator_value),
            eps=_at_least_zero("eps", eps),
        )
        super().__init__(params, defaults)
        for group in self.param_groups:  # torch builds the sums eagerly, at construction
            for param in group["params"]:
                self.state[param]["step"] = 0
                self.state[param]["sum"] = torch.full_like(param, group["initial_accumulator_value"], memory_format=torch.preserve_format)

    def _update(
        self, param: Float[Tensor, "*shape"], grad: Float[Tensor, "*shape"], state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        state["step"] += 1
        adagrad_update_(
            param,
            grad,
            state["sum"],
            step=state["step"],
            lr=group["lr"],
            lr_decay=group["lr_decay"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
        )


class RMSProp(_FromScratch):
    """RMSProp: AdaGrad with an exponential average (``alpha``) of squared gradients in place
    of their sum (torch.optim.RMSprop's rule, no bias correction)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ):
        defaults = dict(
            lr=_at_least_zero("lr", lr),
            alpha=_at_least_zero("alpha", alpha),
            eps=_at_least_zero("eps", eps),
            weight_decay=_at_least_zero("weight_decay", weight_decay),
            momentum=_at_least_zero("momentum", momentum),
            centered=centered,
        )
        super().__init__(params, defaults)

    def _update(
        self, param: Float[Tensor, "*shape"], grad: Float[Tensor, "*shape"], state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        if not state:
            state["step"] = 0
            state["square_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["momentum"] > 0:
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["centered"]:
                state["grad_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] += 1
        rmsprop_update_(
            param,
            grad,
            state["square_avg"],
            state.get("momentum_buffer"),
            state.get("grad_avg"),
            lr=group["lr"],
            alpha=group["alpha"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
        )


class Adam(_FromScratch):
    """Adam: RMSProp plus momentum, both exponential averages, with bias correction
    (torch.optim.Adam's rule; ``weight_decay`` is L2, added to the gradient)."""

    decoupled_weight_decay = False

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise HyperparameterError(f"betas {betas!r}: expected a pair (beta1, beta2)")
        defaults = dict(
            lr=_at_least_zero("lr", lr),
            betas=(_fraction("beta1", betas[0]), _fraction("beta2", betas[1])),
            eps=_at_least_zero("eps", eps),
            weight_decay=_at_least_zero("weight_decay", weight_decay),
        )
        super().__init__(params, defaults)

    def _update(
        self, param: Float[Tensor, "*shape"], grad: Float[Tensor, "*shape"], state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        adam_update_(
            param,
            grad,
            state["exp_avg"],
            state["exp_avg_sq"],
            step=state["step"],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled_weight_decay=self.decoupled_weight_decay,
        )


class AdamW(Adam):
    """Adam with decoupled weight decay: p ← p·(1 − lr·wd) before the Adam step
    (torch.optim.AdamW's rule; default weight_decay 1e-2)."""

    decoupled_weight_decay = True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": SGD,
    "adagrad": AdaGrad,
    "rmsprop": RMSProp,
    "adam": Adam,
    "adamw": AdamW,
}
