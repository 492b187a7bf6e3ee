"""The update rules of resacct's from-scratch optimizers (:mod:`resacct.training.optim`): one parameter
tensor at a time, in place, in torch's order of operations, each the update rule of its
``torch.optim`` counterpart (run side by side in ``resacct/specs/optim.claims.yaml``).
Re-exported by :mod:`resacct.training.optim`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float

__all__ = ["sgd_update_", "adagrad_update_", "rmsprop_update_", "adam_update_"]

Tensor = torch.Tensor


# ── update rules: one parameter tensor at a time, in place, in torch's order of operations ──


def sgd_update_(
    param: Float[Tensor, "*shape"],
    grad: Float[Tensor, "*shape"],
    momentum_buffer: Float[Tensor, "*shape"] | None,
    *,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> Float[Tensor, "*shape"] | None:
    """p ← p − lr·d, with d = g (+ wd·p), or with momentum b ← μ·b + (1 − dampening)·d
    (b = d on the first step) and d = b (nesterov: d + μ·b). Returns the momentum buffer.

    >>> p = torch.ones(2)
    >>> sgd_update_(p, torch.tensor([1.0, 2.0]), None, lr=0.1)
    >>> [round(value, 6) for value in p.tolist()]
    [0.9, 0.8]
    """
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    if momentum != 0:
        if momentum_buffer is None:
            momentum_buffer = grad.detach().clone()
        else:
            momentum_buffer.mul_(momentum).add_(grad, alpha=1 - dampening)
        grad = grad.add(momentum_buffer, alpha=momentum) if nesterov else momentum_buffer
    param.add_(grad, alpha=-lr)
    return momentum_buffer


def adagrad_update_(
    param: Float[Tensor, "*shape"],
    grad: Float[Tensor, "*shape"],
    sum_of_squares: Float[Tensor, "*shape"],
    *,
    step: int,
    lr: float,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-10,
) -> None:
    """Σ ← Σ + g²; p ← p − lr_t · g / (√Σ + eps), lr_t = lr / (1 + (step − 1)·lr_decay).

    eps sits outside the square root (torch's rule), not inside it.

    >>> p, total = torch.zeros(1), torch.zeros(1)
    >>> adagrad_update_(p, torch.tensor([3.0]), total, step=1, lr=1.0)
    >>> total.item(), round(p.item(), 6)
    (9.0, -1.0)
    """
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    step_lr = lr / (1 + (step - 1) * lr_decay)
    sum_of_squares.addcmul_(grad, grad, value=1)
    std = sum_of_squares.sqrt().add_(eps)
    param.addcdiv_(grad, std, value=-step_lr)


def rmsprop_update_(
    param: Float[Tensor, "*shape"],
    grad: Float[Tensor, "*shape"],
    square_avg: Float[Tensor, "*shape"],
    momentum_buffer: Float[Tensor, "*shape"] | None = None,
    grad_avg: Float[Tensor, "*shape"] | None = None,
    *,
    lr: float,
    alpha: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
) -> None:
    """s ← α·s + (1 − α)·g²; p ← p − lr · g / (√s + eps) (no bias correction).

    ``grad_avg`` (centered) subtracts the squared mean gradient under the root;
    ``momentum_buffer`` b ← μ·b + g / (√s + eps), p ← p − lr·b.

    >>> p, s = torch.zeros(1), torch.zeros(1)
    >>> rmsprop_update_(p, torch.tensor([1.0]), s, lr=0.01)  # first step: lr / √(1 − α) = 10·lr
    >>> round(p.item(), 5)
    -0.1
    """
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    if grad_avg is not None:
        grad_avg.lerp_(grad, 1 - alpha)
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
    else:
        avg = square_avg.sqrt()
    avg = avg.add_(eps)
    if momentum_buffer is not None:
        momentum_buffer.mul_(momentum).addcdiv_(grad, avg)
        param.add_(momentum_buffer, alpha=-lr)
    else:
        param.addcdiv_(grad, avg, value=-lr)


def adam_update_(
    param: Float[Tensor, "*shape"],
    grad: Float[Tensor, "*shape"],
    exp_avg: Float[Tensor, "*shape"],
    exp_avg_sq: Float[Tensor, "*shape"],
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled_weight_decay: bool = False,
) -> None:
    """m ← β1·m + (1 − β1)·g; v ← β2·v + (1 − β2)·g²;
    p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + eps).

    Weight decay is L2 (g ← g + wd·p) for Adam, decoupled (p ← p·(1 − lr·wd) first) for AdamW.

    >>> p, m, v = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    >>> adam_update_(p, torch.tensor([5.0]), m, v, step=1, lr=0.1)  # first step: lr · sign(g)
    >>> round(p.item(), 6)
    -0.1
    """
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denominator = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
    param.addcdiv_(exp_avg, denominator, value=-step_size)
