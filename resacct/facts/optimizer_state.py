"""How many parameter-sized tensors each optimizer keeps (torch.optim's and resacct's from-scratch
ones in :mod:`resacct.training.optim` alike; measured against torch in ``specs/optim.claims.yaml``).

Kept apart from the optimizers themselves so napkin math (``resacct memory``) never imports torch.

>>> state_tensors_per_parameter("adamw")
2
"""

from __future__ import annotations

from resacct.errors import UnknownNameError

__all__ = ["STATE_TENSORS_PER_PARAMETER", "OPTIMIZER_DISPLAY_NAMES", "state_tensors_per_parameter"]

# Tensors of the parameter's shape each optimizer keeps per parameter (the step counter aside).
STATE_TENSORS_PER_PARAMETER: dict[str, int] = {
    "sgd": 0,
    "sgd_momentum": 1,  # momentum_buffer
    "adagrad": 1,  # sum of squared gradients
    "rmsprop": 1,  # square_avg
    "adam": 2,  # exp_avg, exp_avg_sq
    "adamw": 2,
}

#: How tables write each command-line optimizer name (the same words as
#: ``resacct.account.load.optimizers.optimizer_display_name``, which builds the torch.optim ones).
OPTIMIZER_DISPLAY_NAMES: dict[str, str] = {
    "adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd-momentum": "SGD momentum", "adagrad": "Adagrad", "rmsprop": "RMSprop",
}


def state_tensors_per_parameter(optimizer: str) -> int:
    """How many parameter-sized tensors ``optimizer`` keeps per parameter (step counters aside).

    >>> state_tensors_per_parameter("sgd_momentum")
    1
    """
    try:
        return STATE_TENSORS_PER_PARAMETER[optimizer]
    except KeyError:
        raise UnknownNameError("optimizer", optimizer, list(STATE_TENSORS_PER_PARAMETER)) from None
