"""The real ``torch.optim`` optimizers ``resacct account`` trains with, and what resacct knows of
their state.

Names as on the command line (``--optimizer``): ``adamw`` (the default), ``adam``, ``sgd``,
``sgd-momentum`` (momentum 0.9), ``adagrad``, ``rmsprop``. Each keeps, per parameter tensor, the
parameter-sized state tensors of :data:`resacct.training.optim.STATE_TENSORS_PER_PARAMETER` (0 / 1 / 1 / 1
/ 2 / 2 for sgd / sgd-momentum / adagrad / rmsprop / adam / adamw) and, for adagrad, rmsprop, adam
and adamw, a float32 0-dim ``step`` counter (:data:`resacct.measurement.memory.OPTIMIZERS_WITH_STEP_TENSORS`).

>>> import torch
>>> weight = torch.nn.Parameter(torch.zeros(3))
>>> optimizer = build_optimizer("sgd-momentum", [weight])
>>> type(optimizer).__name__, optimizer.defaults["momentum"]
('SGD', 0.9)
>>> memory_optimizer_name("sgd-momentum"), optimizer_display_name("adamw")
('sgd_momentum', 'AdamW')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from resacct.errors import UnknownNameError

__all__ = ["OPTIMIZER_NAMES", "build_optimizer", "memory_optimizer_name", "optimizer_display_name"]

#: command-line name → (torch.optim class name, keyword arguments, display name)
_OPTIMIZERS: dict[str, tuple[str, dict[str, Any], str]] = {
    "adamw": ("AdamW", {"lr": 1e-3}, "AdamW"),
    "adam": ("Adam", {"lr": 1e-3}, "Adam"),
    "sgd": ("SGD", {"lr": 1e-3}, "SGD"),
    "sgd-momentum": ("SGD", {"lr": 1e-3, "momentum": 0.9}, "SGD momentum"),
    "adagrad": ("Adagrad", {"lr": 1e-2}, "Adagrad"),
    "rmsprop": ("RMSprop", {"lr": 1e-2}, "RMSprop"),
}

OPTIMIZER_NAMES: tuple[str, ...] = tuple(_OPTIMIZERS)


def _known(name: str) -> tuple[str, dict[str, Any], str]:
    try:
        return _OPTIMIZERS[name]
    except KeyError:
        raise UnknownNameError("optimizer", name, list(_OPTIMIZERS)) from None


def build_optimizer(name: str, parameters: Iterable[torch.Tensor], *, foreach: bool | None = None) -> torch.optim.Optimizer:
    """A ``torch.optim`` optimizer called ``name`` over ``parameters`` (torch's defaults apart
    from the learning rate; ``sgd-momentum`` is SGD with momentum 0.9).

    >>> build_optimizer("adam", [torch.nn.Parameter(torch.zeros(2))]).defaults["lr"]
    0.001
    """
    class_name, options, _ = _known(name)
    extra = {} if foreach is None else {"foreach": foreach}
    return getattr(torch.optim, class_name)(list(parameters), **options, **extra)


def memory_optimizer_name(name: str) -> str:
    """The name :mod:`resacct.measurement.memory` and :mod:`resacct.training.optim` use for ``name``.

    >>> memory_optimizer_name("adamw")
    'adamw'
    """
    _known(name)
    return name.replace("-", "_")


def optimizer_display_name(name: str) -> str:
    """How tables write ``name`` (``AdamW``, ``SGD momentum`` …)."""
    return _known(name)[2]
