"""resacct's own formulas for one training step of a stack of Linear layers and activation
functions — the lecture's deep linear model (:class:`resacct.training.models.Cruncher`) and MLPs
(``nn.Sequential`` of ``nn.Linear`` and ReLU / GELU / Tanh / Sigmoid / SiLU): the matmul FLOPs of
forward and backward per module, and the bytes autograd saves for backward per module.

What autograd saves (measured with ``saved_tensors_hooks``, one entry per storage):

- a Linear saves its **input** (for its weight gradient) — also the raw batch, which needs no
  gradient itself — and its weight (a parameter: no extra memory);
- ReLU, Tanh and Sigmoid save their **output** (their derivative is a function of it); the next
  Linear saves that same tensor as its input: one storage, counted once;
- GELU and SiLU save their **input** (the pre-activation), and the next Linear saves their output:
  two tensors per hidden layer;
- the loss: ``mean`` and ``sum`` save nothing; ``mse`` (against zeros) saves the prediction and
  the target; ``cross-entropy`` saves the log-softmax (rows × classes), the int64 targets and a
  0-dim total weight.

So a Cruncher (L layers of D, batch B, mean loss) saves E·B·D·(L + 1) bytes — the lecture's
B·D·num_layers plus the input batch — and a GELU MLP D → H → D saves E·B·(D + 2·H).

FLOPs (what FlopCounterMode counts: matmuls only): a Linear costs 2·T·in·out forward (T rows), its
weight gradient 2·T·in·out, and its input gradient 2·T·in·out unless its input needs no gradient
(the first layer's).

>>> from resacct.training.models import Cruncher
>>> prediction = predict_stack_step(Cruncher(dim=4, num_layers=2), (2, 4), element_bytes=4)
>>> prediction.saved_bytes, prediction.forward_flops, prediction.backward_flops   # 4·2·4·3; 2·2·(16+16+4)
(96, 144, 224)
>>> predict_stack_step(torch.nn.Sequential(torch.nn.Conv1d(1, 1, 1)), (2, 1, 4), element_bytes=4) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from resacct.measurement.activations import OUTSIDE_SCOPE
from resacct.errors import ResacctError
from resacct.training.models import Cruncher
from resacct.training.models import Linear as LectureLinear

__all__ = ["LOSSES", "SAVES_OUTPUT", "SAVES_INPUT", "StackPrediction", "is_stack", "predict_stack_step", "mlp_saved_bytes"]

LOSSES = ("mean", "sum", "mse", "cross-entropy")
SAVES_OUTPUT = (nn.ReLU, nn.Tanh, nn.Sigmoid)  # derivative from the output
SAVES_INPUT = (nn.GELU, nn.SiLU)  # derivative from the input


@dataclass
class StackPrediction:
    """resacct's prediction for one step: matmul FLOPs and saved bytes, per module path."""

    forward_by_module: dict[str, int] = field(default_factory=dict)
    backward_by_module: dict[str, int] = field(default_factory=dict)
    saved_by_module: dict[str, int] = field(default_factory=dict)

    @property
    def forward_flops(self) -> int:
        return sum(self.forward_by_module.values())

    @property
    def backward_flops(self) -> int:
        return sum(self.backward_by_module.values())

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved_by_module.values())

    def _add(self, table: dict[str, int], module: str, value: int) -> None:
        if value:
            table[module] = table.get(module, 0) + value


class NoFormula(Exception):
    pass


def module_leaves(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    """The modules a forward runs in order, for the architectures resacct has formulas for."""
    if isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            yield from module_leaves(child, f"{prefix}{name}")
    elif type(module) is Cruncher:
        for index, layer in enumerate(module.layers):
            yield from module_leaves(layer, f"{prefix}layers.{index}")
        yield from module_leaves(module.final, f"{prefix}final")
    elif isinstance(module, (nn.Linear, LectureLinear, nn.Identity, *SAVES_OUTPUT, *SAVES_INPUT)):
        yield prefix.rstrip(".") or "(model)", module
    else:
        raise NoFormula(type(module).__name__)


def is_stack(model: nn.Module) -> bool:
    """Whether ``model`` is a stack resacct has formulas for: Linear layers and activation
    functions, in an ``nn.Sequential`` or a :class:`~resacct.training.models.Cruncher`.

    >>> is_stack(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.GELU())), is_stack(torch.nn.Conv1d(1, 1, 1))
    (True, False)
    """
    try:
        list(module_leaves(model, ""))
    except NoFormula:
        return False
    return True


def linear_widths(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.weight.shape[1]  # resacct's Linear stores (in, out)


def predict_stack_step(model: nn.Module, input_shape: tuple[int, ...], *, element_bytes: int, loss: str = "mean") -> StackPrediction | None:
    """resacct's formula for one step of ``model`` on a floating input of ``input_shape`` whose
    activations take ``element_bytes`` each, with ``loss`` (:data:`LOSSES`); None when the model
    holds a module resacct has no formula for (or a frozen parameter, or non-float input).

    >>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    >>> predict_stack_step(mlp, (3, 8), element_bytes=4).saved_by_module   # x; GELU input; its output
    {'0': 96, '1': 192, '2': 192}
    >>> predict_stack_step(mlp, (3, 8), element_bytes=4, loss="cross-entropy").saved_by_module["(loss)"]  # 48 + 24 + 4
    76
    """
    if loss not in LOSSES:
        raise ResacctError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    if any(not parameter.requires_grad for parameter in model.parameters()):
        return None
    try:
        leaves = list(module_leaves(model, ""))
    except NoFormula:
        return None
    prediction = StackPrediction()
    shape, needs_grad, already_saved = tuple(input_shape), False, False
    for name, module in leaves:
        elements = math.prod(shape)
        if isinstance(module, (nn.Linear, LectureLinear)):
            width_in, width_out = linear_widths(module)
            if not shape or shape[-1] != width_in:
                return None
            rows = elements // width_in
            matmul = 2 * rows * width_in * width_out
            prediction._add(prediction.forward_by_module, name, matmul)
            prediction._add(prediction.backward_by_module, name, matmul * (2 if needs_grad else 1))
            if not already_saved:
                prediction._add(prediction.saved_by_module, name, elements * element_bytes)
            shape, needs_grad, already_saved = (*shape[:-1], width_out), True, False
        elif isinstance(module, SAVES_OUTPUT):  # a new tensor; saved only where a gradient flows
            if needs_grad:
                prediction._add(prediction.saved_by_module, name, elements * element_bytes)
            already_saved = needs_grad
        elif isinstance(module, SAVES_INPUT):
            if needs_grad and not already_saved:
                prediction._add(prediction.saved_by_module, name, elements * element_bytes)
            already_saved = False
    elements = math.prod(shape)
    if loss == "mse":
        saved = (1 if already_saved else 2) * elements * element_bytes  # prediction (unless saved) and target
        prediction._add(prediction.saved_by_module, OUTSIDE_SCOPE, saved)
    elif loss == "cross-entropy":
        rows = elements // shape[-1]
        saved = elements * element_bytes + rows * torch.tensor(0, dtype=torch.int64).element_size() + element_bytes
        prediction._add(prediction.saved_by_module, OUTSIDE_SCOPE, saved)  # log-softmax, targets, total weight
    return prediction


def mlp_saved_bytes(batch: int, dim: int, hidden: int, depth: int, *, activation: str = "gelu", element_bytes: int = 4) -> int:
    """Bytes an MLP of :func:`resacct.account.answers.generic.mlp` (``depth`` hidden layers of ``hidden``,
    mean loss) saves: the input, then per hidden layer one tensor (ReLU, Tanh, Sigmoid: the output
    the next Linear also saves) or two (GELU, SiLU: the input and the output).

    >>> mlp_saved_bytes(3, 8, 16, 1, activation="gelu"), mlp_saved_bytes(3, 8, 16, 1, activation="relu")
    (480, 288)
    """
    per_hidden = {"relu": 1, "tanh": 1, "sigmoid": 1, "gelu": 2, "silu": 2}
    if activation not in per_hidden:
        raise ResacctError(f"activation {activation!r}: expected one of {', '.join(per_hidden)}")
    return element_bytes * batch * (dim + per_hidden[activation] * hidden * depth)
