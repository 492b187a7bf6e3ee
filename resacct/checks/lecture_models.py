"""Measuring the lecture's own models, optimizers and training loop (``lecture_02.py``).

The Cruncher here is the lecture's code today (bias-free layers, output squeezed to ``[B]``),
kept apart from the seeds' variant with biases in :mod:`resacct.training.models`. FLOPs come from
FlopCounterMode on the meta device, bytes from the storages autograd and the optimizer hold.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from resacct.harness.registry import Outcome, check
from resacct.training.lecture import (
    LectureAdaGrad,
    LectureCruncher,
    LectureSGD,
    get_num_parameters,
    lecture_optimizer_demo,
    linear_regression_batch,
    train,
)
from resacct.measurement.memory import distinct_storage_bytes, record_saved_tensors
from resacct.training.models import Cruncher as SeedsCruncher
from resacct.training.seeding import seed_torch


def _cruncher(dim: int, num_layers: int, device: str = "cpu", seed: int = 0) -> LectureCruncher:
    seed_torch(seed)
    with torch.device(device):
        return LectureCruncher(dim=dim, num_layers=num_layers)


@check("lecture.cruncher_parameters", evidence="measured", quantities=("state_dict_numel", "parameter_tensors"))
def cruncher_parameters(dim: int, num_layers: int, count: str = "parameters") -> Outcome:
    """The lecture's ``get_num_parameters`` of its own Cruncher (built on the meta device), or with
    ``count: tensors`` the number of parameter tensors; the state_dict's total numel and the
    number of parameter tensors as quantities."""
    model = _cruncher(dim, num_layers, device="meta")
    counts = {"parameters": get_num_parameters(model), "tensors": len(list(model.parameters()))}
    return Outcome(
        measured=counts[count],
        quantities={
            "state_dict_numel": sum(value.numel() for value in model.state_dict().values()),
            "parameter_tensors": len(list(model.parameters())),
        },
    )


@check("lecture.cruncher_state_dict", evidence="measured")
def cruncher_state_dict(dim: int, num_layers: int) -> Outcome:
    """``[(name, param.numel()) for name, param in model.state_dict().items()]`` (custom_model, L615-618)."""
    model = _cruncher(dim, num_layers, device="meta")
    return Outcome(measured=[[name, value.numel()] for name, value in model.state_dict().items()])


@check("lecture.cruncher_shapes", evidence="measured")
def cruncher_shapes(batch: int, dim: int, num_layers: int, stage: str) -> Outcome:
    """Shapes in the lecture's Cruncher forward on x (batch×dim): ``final`` (after the D×1 head,
    L665), ``squeezed`` (L669) or ``output``."""
    model = _cruncher(dim, num_layers)
    output = model(torch.randn(batch, dim))
    shapes = {"final": list(model.final_shapes[0]), "squeezed": list(model.final_shapes[1]), "output": list(output.shape)}
    return Outcome(measured=shapes[stage])


@check("lecture.mse_against_targets", evidence="measured")
def mse_against_targets(model: str, batch: int = 2, dim: int = 4) -> Outcome:
    """The first warning ``F.mse_loss(model(x), y)`` raises with y of shape [batch] (the
    optimizer demo's ``y = torch.tensor([4., 5.])``), or "none": ``lecture`` (output [B]) or
    ``seeds`` (resacct's Cruncher with biases, output [B, 1])."""
    seed_torch(0)
    network = LectureCruncher(dim, 2) if model == "lecture" else SeedsCruncher(dim, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.mse_loss(network(torch.randn(batch, dim)), torch.arange(4.0, 4.0 + batch))
    return Outcome(measured=type(caught[0].message).__name__ if caught else "none")


def _flops(run: Any) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


@check("lecture.cruncher_step_flops", evidence="measured", quantities=("params", "batch_size"))
def cruncher_step_flops(batch: int, dim: int, num_layers: int, phase: str) -> Outcome:
    """FlopCounterMode's count for the lecture's Cruncher (meta device) under
    ``F.mse_loss(model(x), y)``: ``forward``, ``backward`` or ``step`` (both)."""
    model = _cruncher(dim, num_layers, device="meta")
    x, y = torch.randn(batch, dim, device="meta"), torch.randn(batch, device="meta")
    losses: list[torch.Tensor] = []
    forward = _flops(lambda: losses.append(F.mse_loss(model(x), y)))
    backward = _flops(lambda: losses[0].backward())
    measured = {"forward": forward, "backward": backward, "step": forward + backward}[phase]
    return Outcome(measured=measured, quantities={"params": get_num_parameters(model), "batch_size": batch})


@check("lecture.two_layer_flops", evidence="measured")
def two_layer_flops(batch: int, dim: int, outputs: int, phase: str) -> Outcome:
    """FlopCounterMode's count for gradients_flops (L517-537): x (ones, no grad) → w1 (D×D) → h1 →
    w2 (D×K) → h2, loss = h2.pow(2).mean(), on the meta device: ``forward`` or ``backward``."""
    with torch.device("meta"):
        x = torch.ones(batch, dim)
        w1 = torch.randn(dim, dim, requires_grad=True)
        w2 = torch.randn(dim, outputs, requires_grad=True)
    losses: list[torch.Tensor] = []
    forward = _flops(lambda: losses.append((x @ w1 @ w2).pow(2).mean()))
    backward = _flops(lambda: losses[0].backward())
    return Outcome(measured={"forward": forward, "backward": backward}[phase])


@check("lecture.cruncher_step_bytes", evidence="measured", quantities=("params", "saved_elements"))
def cruncher_step_bytes(batch: int, dim: int, num_layers: int) -> Outcome:
    """Bytes of every distinct storage one float32 step of the lecture's optimizer demo holds:
    parameters, what autograd saves (forward + mse_loss), gradients and the lecture's AdaGrad
    state after the step. Quantities: params and saved_elements (everything saved that is not
    a parameter)."""
    model = _cruncher(dim, num_layers)
    params = list(model.parameters())
    optimizer = LectureAdaGrad(params, lr=0.01)
    x, y = torch.randn(batch, dim), torch.randn(batch)
    with record_saved_tensors() as saved:
        loss = F.mse_loss(model(x), y)
    loss.backward()
    gradients = [p.grad for p in params]
    optimizer.step()
    state = [value for per_parameter in optimizer.state.values() for value in per_parameter.values()]
    return Outcome(
        measured=distinct_storage_bytes(params + saved.tensors + gradients + state),
        quantities={"params": get_num_parameters(model), "saved_elements": saved.elements(excluding=params)},
    )


@check("lecture.cruncher_saved", evidence="measured", quantities=("input_elements",))
def cruncher_saved(batch: int, dim: int, num_layers: int, count: str) -> Outcome:
    """Numbers autograd saves (distinct storages, parameters left out) for ``F.mse_loss(model(x), y)``
    with the lecture's Cruncher: ``saved`` (all of them) or ``hidden`` (the layers' outputs only:
    x, y and the prediction left out)."""
    model = _cruncher(dim, num_layers)
    params = list(model.parameters())
    x, y = torch.randn(batch, dim), torch.randn(batch)
    with record_saved_tensors() as saved:
        prediction = model(x)
        F.mse_loss(prediction, y)
    excluded = params + ([x, y, prediction] if count == "hidden" else [])
    return Outcome(measured=saved.elements(excluding=excluded), quantities={"input_elements": x.numel()})


@check("lecture.optimizer_demo", evidence="measured", quantities=("lr",))
def optimizer_demo(field: str, seed: int = 0) -> Outcome:
    """The optimizer demo (L777-806) with ``torch.manual_seed(seed)``: ``largest_move`` /
    ``smallest_move`` (max/min |Δp| over all parameters after the step), ``state_keys``,
    ``state_tensors``, ``state_bytes`` (the AdaGrad state) or ``params``."""
    model, optimizer, before, after = lecture_optimizer_demo(seed)
    moves = torch.cat([(after[name] - before[name]).abs().flatten() for name in before])
    state = [value for per_parameter in optimizer.state.values() for value in per_parameter.values()]
    fields = {
        "largest_move": lambda: float(moves.max()),
        "smallest_move": lambda: float(moves.min()),
        "state_keys": lambda: sorted({key for per_parameter in optimizer.state.values() for key in per_parameter}),
        "state_tensors": lambda: len(state),
        "state_bytes": lambda: distinct_storage_bytes(state),
        "params": lambda: get_num_parameters(model),
    }
    return Outcome(measured=fields[field](), quantities={"lr": 0.01})


def _same_steps(ours: type, theirs: Any, steps: int) -> float:
    seed_torch(0)
    first, second = LectureCruncher(4, 2), LectureCruncher(4, 2)
    second.load_state_dict(first.state_dict())
    optimizers = [ours(first.parameters(), lr=0.01), theirs(second.parameters(), lr=0.01)]
    for step in range(steps):
        x, y = torch.randn(2, 4), torch.randn(2)
        for model, optimizer in zip((first, second), optimizers):
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        return max(float((a - b).abs().max()) for a, b in zip(first.parameters(), second.parameters()))


@check("lecture.optimizer_vs_torch", evidence="measured")
def optimizer_vs_torch(optimizer: str, steps: int = 5) -> Outcome:
    """Largest |difference| of parameters after ``steps`` identical steps of the lecture's
    optimizer class and torch's namesake (lr 0.01, defaults otherwise)."""
    pairs = {"sgd": (LectureSGD, torch.optim.SGD), "adagrad": (LectureAdaGrad, torch.optim.Adagrad)}
    return Outcome(measured=_same_steps(*pairs[optimizer], steps))


@check("lecture.adagrad_g2_over_g_squared", evidence="measured")
def adagrad_g2_over_g_squared(steps: int) -> Outcome:
    """The lecture's AdaGrad state g2 ÷ g² after ``steps`` steps under a constant gradient g."""
    weight = nn.Parameter(torch.zeros(3))
    optimizer = LectureAdaGrad([weight], lr=0.01)
    gradient = torch.tensor([0.5, -2.0, 3.0])
    for _ in range(steps):
        weight.grad = gradient.clone()
        optimizer.step()
    return Outcome(measured=float((optimizer.state[weight]["g2"] / gradient.square()).mean()))


@check("lecture.step_with_unused_parameter", evidence="measured")
def step_with_unused_parameter(optimizer: str) -> Outcome:
    """What ``optimizer.step()`` does when one parameter got no gradient (p.grad is None): "ok",
    or the exception's type name."""
    used, unused = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    classes = {"lecture_sgd": LectureSGD, "lecture_adagrad": LectureAdaGrad, "torch_sgd": torch.optim.SGD, "torch_adagrad": torch.optim.Adagrad}
    instance = classes[optimizer]([used, unused], lr=0.01)
    used.sum().backward()
    try:
        instance.step()
    except Exception as error:  # the measurement is which error the lecture's code raises
        return Outcome(measured=type(error).__name__)
    return Outcome(measured="ok")


@check("lecture.train", evidence="measured", quantities=("initial_loss", "parameters"))
def train_run(field: str, lr: float = 0.01, num_layers: int = 0, num_train_steps: int = 10, other_lr: float = 0.1, seed: int = 0,
              as_in_seeds: bool = False) -> Outcome:
    """The lecture's ``train("simple", get_batch, D=16, num_layers, B=4, num_train_steps, lr)`` with
    ``torch.manual_seed(seed)``: ``loss_ratio`` (MSE on 1024 held-out examples of the same
    linear data after training ÷ before, from the same initial weights), ``parameters`` of the
    trained model, or ``lr_difference`` (largest |Δ| between final weights trained with lr and
    with other_lr from the same seed)."""
    def run(rate: float) -> tuple[nn.Module, list[float]]:
        seed_torch(seed)
        return train("simple", linear_regression_batch, D=16, num_layers=num_layers, B=4, num_train_steps=num_train_steps, lr=rate,
                     as_in_seeds=as_in_seeds)

    seed_torch(seed)
    initial = LectureCruncher(dim=16, num_layers=0)  # the same draws train() starts from
    model, _ = run(lr)
    x, y = linear_regression_batch(1024, 16)
    with torch.no_grad():
        initial_loss, final_loss = float(F.mse_loss(initial(x), y)), float(F.mse_loss(model(x), y))
    if field == "lr_difference":
        other, _ = run(other_lr)
        with torch.no_grad():
            measured: Any = float((model.final.weight - other.final.weight).abs().max())
    else:
        measured = {"loss_ratio": final_loss / initial_loss, "parameters": get_num_parameters(model)}[field]
    return Outcome(measured=measured, quantities={"initial_loss": initial_loss, "parameters": get_num_parameters(model)})


@check("lecture.linear_regression_fit", evidence="measured")
def linear_regression_fit(batch: int = 64, dim: int = 16) -> Outcome:
    """Least-squares weights (torch.linalg.lstsq) fitted to one batch of train_loop's synthetic
    data (x ~ randn(B, D), y = x @ true_w), rounded to 4 decimals."""
    seed_torch(0)
    x, y = linear_regression_batch(batch, dim)
    solution = torch.linalg.lstsq(x.double(), y.double().unsqueeze(-1)).solution.squeeze(-1)
    return Outcome(measured=[round(float(value), 4) for value in solution])
