"""Measuring optimizers with torch.optim: resacct's from-scratch optimizers run side by side
with torch's on the same parameters and gradients; state is counted in ``optimizer.state``;
single steps and running averages are read from torch's own parameters and buffers."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

from resacct.training import optim as ours
from resacct.harness.registry import Outcome, check
from resacct.harness.strategies import strategy
from resacct.training.models import Cruncher
from resacct.training.seeding import seed_torch

# ── strategies: only valid hyper-parameters ─────────────────────────────────────────────────


@strategy("optim_lr")
def _learning_rates() -> st.SearchStrategy:
    return st.floats(1e-4, 0.3)


@strategy("optim_momentum")
def _momenta() -> st.SearchStrategy:
    return st.floats(0.0, 0.99)


@strategy("optim_positive_momentum")
def _positive_momenta() -> st.SearchStrategy:
    return st.floats(0.05, 0.99)  # momentum 0 keeps no buffer at all


@strategy("optim_beta1")
def _beta1s() -> st.SearchStrategy:
    return st.floats(0.0, 0.99)


@strategy("optim_beta2")
def _beta2s() -> st.SearchStrategy:
    return st.floats(0.9, 0.9999)


@strategy("optim_alpha")
def _alphas() -> st.SearchStrategy:
    return st.floats(0.5, 0.999)


@strategy("optim_weight_decay")
def _weight_decays() -> st.SearchStrategy:
    return st.floats(0.0, 0.1)


@strategy("optim_eps")
def _epsilons() -> st.SearchStrategy:
    return st.sampled_from([1e-10, 1e-8, 1e-6, 1e-3])


@strategy("optim_flag")
def _flags() -> st.SearchStrategy:
    return st.booleans()


@strategy("optim_steps")
def _steps() -> st.SearchStrategy:
    return st.integers(1, 60)


@strategy("optim_value")
def _values() -> st.SearchStrategy:
    return st.floats(-10.0, 10.0)


@strategy("optim_positive_gradient")
def _positive_gradients() -> st.SearchStrategy:
    return st.floats(1e-3, 10.0)


# ── side by side with torch ─────────────────────────────────────────────────────────────────

STEPS = 20


def _deviation_from_torch(
    build_ours: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    build_torch: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    shape: list,
    seed: int,
    steps: int = STEPS,
) -> float:
    """Run both optimizers ``steps`` times on copies of the same float32 parameters (a tensor
    of ``shape`` and a 3-vector) with the same gradients (random, scales 1e-4…10), and return
    max over parameters of ‖ours − torch‖ / ‖torch − start‖: 0 when they agree exactly,
    1 when ours did not move at all."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [tuple(shape), (3,)]
    start = [torch.randn(s, generator=generator) for s in shapes]
    scales = torch.logspace(-4, 1, steps=steps)[torch.randperm(steps, generator=generator)]
    gradients = [[torch.randn(s, generator=generator) * scale for s in shapes] for scale in scales.tolist()]
    mine = [nn.Parameter(tensor.clone()) for tensor in start]
    theirs = [nn.Parameter(tensor.clone()) for tensor in start]
    optimizer_mine, optimizer_theirs = build_ours(mine), build_torch(theirs)
    for step_gradients in gradients:
        for params in (mine, theirs):
            for param, gradient in zip(params, step_gradients):
                param.grad = gradient.clone()
        optimizer_mine.step()
        optimizer_theirs.step()
    deviations = []
    for a, b, s in zip(mine, theirs, start):
        moved = (b.detach() - s).norm().item()
        difference = (a.detach() - b.detach()).norm().item()
        deviations.append(0.0 if difference == 0 else difference / max(moved, 1e-30))
    return max(deviations)


@check("optim.sgd_matches_torch", evidence="measured")
def sgd_matches_torch(
    shape: list, seed: int, lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False
) -> Outcome:
    """Relative deviation of resacct's SGD from torch.optim.SGD after 20 steps."""
    kwargs = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov and momentum > 0 and dampening == 0)
    return Outcome(measured=_deviation_from_torch(lambda p: ours.SGD(p, **kwargs), lambda p: torch.optim.SGD(p, **kwargs), shape, seed))


@check("optim.adagrad_matches_torch", evidence="measured")
def adagrad_matches_torch(
    shape: list, seed: int, lr: float, lr_decay: float = 0.0, weight_decay: float = 0.0, initial_accumulator_value: float = 0.0, eps: float = 1e-10
) -> Outcome:
    """Relative deviation of resacct's AdaGrad from torch.optim.Adagrad after 20 steps."""
    kwargs = dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, initial_accumulator_value=initial_accumulator_value, eps=eps)
    return Outcome(measured=_deviation_from_torch(lambda p: ours.AdaGrad(p, **kwargs), lambda p: torch.optim.Adagrad(p, **kwargs), shape, seed))


@check("optim.rmsprop_matches_torch", evidence="measured")
def rmsprop_matches_torch(
    shape: list, seed: int, lr: float, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False
) -> Outcome:
    """Relative deviation of resacct's RMSProp from torch.optim.RMSprop after 20 steps."""
    kwargs = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered)
    return Outcome(measured=_deviation_from_torch(lambda p: ours.RMSProp(p, **kwargs), lambda p: torch.optim.RMSprop(p, **kwargs), shape, seed))


@check("optim.adam_matches_torch", evidence="measured")
def adam_matches_torch(
    shape: list, seed: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False
) -> Outcome:
    """Relative deviation of resacct's Adam (decoupled: AdamW) from torch.optim.Adam (AdamW)
    after 20 steps."""
    kwargs = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    mine, theirs = (ours.AdamW, torch.optim.AdamW) if decoupled else (ours.Adam, torch.optim.Adam)
    return Outcome(measured=_deviation_from_torch(lambda p: mine(p, **kwargs), lambda p: theirs(p, **kwargs), shape, seed))


_TORCH_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}


@check("optim.defaults_match_torch", evidence="measured")
def defaults_match_torch(optimizer: str, shape: list, seed: int) -> Outcome:
    """Relative deviation of resacct's optimizer from torch's, both built with nothing but the
    parameters (every hyper-parameter at its default), after 20 steps."""
    return Outcome(measured=_deviation_from_torch(ours.OPTIMIZERS[optimizer], _TORCH_OPTIMIZERS[optimizer], shape, seed))


# ── what torch keeps ────────────────────────────────────────────────────────────────────────

_STATE_RECIPES: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.01),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p),
    "rmsprop": lambda p: torch.optim.RMSprop(p),
    "adam": lambda p: torch.optim.Adam(p),
    "adamw": lambda p: torch.optim.AdamW(p),
}


def _torch_optimizer_after_one_step(optimizer: str, dim: int = 4, num_layers: int = 2, batch: int = 2) -> tuple[torch.optim.Optimizer, list[nn.Parameter]]:
    seed_torch(0)
    model = Cruncher(dim=dim, num_layers=num_layers)
    parameters = list(model.parameters())
    torch_optimizer = _STATE_RECIPES[optimizer](parameters)
    loss = F.mse_loss(model(torch.randn(batch, dim)), torch.randn(batch, 1))
    loss.backward()
    torch_optimizer.step()
    return torch_optimizer, parameters


@check("optim.state_tensors_per_parameter", evidence="measured", quantities=("scalar_tensors",))
def state_tensors_per_parameter(optimizer: str) -> Outcome:
    """Tensors of the parameter's shape in ``torch.optim``'s ``state[p]`` after one real step on a
    Cruncher (the same for every parameter), with the 0-dim tensors (step counters) per parameter."""
    torch_optimizer, parameters = _torch_optimizer_after_one_step(optimizer)
    shaped, scalars = set(), set()
    for param in parameters:
        tensors = [value for value in torch_optimizer.state[param].values() if isinstance(value, torch.Tensor)]
        shaped.add(sum(1 for tensor in tensors if tensor.shape == param.shape))
        scalars.add(sum(1 for tensor in tensors if tensor.dim() == 0))
    if len(shaped) != 1 or len(scalars) != 1:
        raise AssertionError(f"parameters of one model hold different amounts of state: {sorted(shaped)}, {sorted(scalars)}")
    return Outcome(measured=shaped.pop(), predicted=ours.state_tensors_per_parameter(optimizer), quantities={"scalar_tensors": scalars.pop()})


@check("optim.torch_state_keys", evidence="measured")
def torch_state_keys(optimizer: str) -> Outcome:
    """Sorted keys of ``torch.optim``'s ``state[p]`` for one parameter after one real step."""
    torch_optimizer, parameters = _torch_optimizer_after_one_step(optimizer)
    return Outcome(measured=sorted(torch_optimizer.state[parameters[0]]))


@check("optim.torch_step_counter", evidence="measured")
def torch_step_counter(optimizer: str) -> Outcome:
    """``[is a tensor, dtype, dim, storage bytes]`` of ``state[p]["step"]`` in torch.optim."""
    torch_optimizer, parameters = _torch_optimizer_after_one_step(optimizer)
    step = torch_optimizer.state[parameters[0]]["step"]
    if not isinstance(step, torch.Tensor):
        return Outcome(measured=[False, type(step).__name__, 0, 0])
    return Outcome(measured=[True, str(step.dtype).removeprefix("torch."), step.dim(), step.untyped_storage().nbytes()])


# ── single steps and running averages, read from torch ─────────────────────────────────────

_FIRST_STEP: dict[str, Callable[[list[nn.Parameter], float], torch.optim.Optimizer]] = {
    "sgd": lambda p, lr: torch.optim.SGD(p, lr=lr),
    "adagrad": lambda p, lr: torch.optim.Adagrad(p, lr=lr),
    "rmsprop": lambda p, lr: torch.optim.RMSprop(p, lr=lr),
    "adam": lambda p, lr: torch.optim.Adam(p, lr=lr),
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0),
}


@check("optim.first_step", evidence="measured")
def first_step(optimizer: str, start: float, gradient: float, lr: float) -> Outcome:
    """The value of a one-element float64 parameter after one step of ``torch.optim``'s
    optimizer (default hyper-parameters but ``lr``) from ``start`` with gradient ``gradient``."""
    param = nn.Parameter(torch.tensor([start], dtype=torch.float64))
    torch_optimizer = _FIRST_STEP[optimizer]([param], lr)
    param.grad = torch.tensor([gradient], dtype=torch.float64)
    torch_optimizer.step()
    return Outcome(measured=param.item())


_RUNNING: dict[str, tuple[str, Callable[..., torch.optim.Optimizer]]] = {
    "sgd.momentum_buffer": ("momentum_buffer", lambda p, c, d: torch.optim.SGD(p, lr=0.01, momentum=c, dampening=d)),
    "rmsprop.square_avg": ("square_avg", lambda p, c, d: torch.optim.RMSprop(p, alpha=c)),
    "adam.exp_avg": ("exp_avg", lambda p, c, d: torch.optim.Adam(p, betas=(c, 0.999))),
    "adam.exp_avg_sq": ("exp_avg_sq", lambda p, c, d: torch.optim.Adam(p, betas=(0.9, c))),
}


@check("optim.running_state", evidence="measured")
def running_state(buffer: str, coefficient: float, steps: int, gradient: float = 1.0, dampening: float = 0.0) -> Outcome:
    """The value ``torch.optim`` holds in a state buffer (``optimizer.buffer``) after ``steps``
    steps with the same gradient; ``coefficient`` is the buffer's decay (momentum, alpha, beta1
    or beta2). float64 parameters, so the arithmetic adds no rounding worth mentioning."""
    key, build = _RUNNING[buffer]
    param = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    torch_optimizer = build([param], coefficient, dampening)
    for _ in range(steps):
        param.grad = torch.tensor([gradient], dtype=torch.float64)
        torch_optimizer.step()
    return Outcome(measured=torch_optimizer.state[param][key].item())


# ── the AdaGrad of seed 004 ─────────────────────────────────────────────────────────────────


class Seed004AdaGrad(torch.optim.Optimizer):
    """Seed 004's AdaGrad, as printed: the update lives in ``__step__``, which torch never calls."""

    def __init__(self, params: Any, lr: float = 0.01):
        super().__init__(params, dict(lr=lr))

    def __step__(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                state = self.state[p]
                if "g2" not in state:
                    state["g2"] = torch.zeros_like(p)
                state["g2"] += g * g
                p.data.addcdiv_(g, state["g2"].sqrt() + 1e-8, value=-group["lr"])


class Seed004AdaGradRenamed(Seed004AdaGrad):
    """The same body, under the name torch calls: ``step``."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.__step__()


def _parameter_with_gradient() -> nn.Parameter:
    param = nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 0.5)
    return param


@check("optim.seed004_adagrad_updates", evidence="measured")
def seed004_adagrad_updates(lr: float = 0.01) -> Outcome:
    """Whether ``optimizer.step()`` of seed 004's AdaGrad changes the parameters (False when
    torch's ``Optimizer.step`` raises NotImplementedError or leaves them as they were)."""
    param = _parameter_with_gradient()
    before = param.detach().clone()
    try:
        Seed004AdaGrad([param], lr=lr).step()
    except NotImplementedError:
        return Outcome(measured=False)
    return Outcome(measured=not torch.equal(before, param.detach()))


@check("optim.seed004_adagrad_step", evidence="measured")
def seed004_adagrad_step(lr: float = 0.01) -> Outcome:
    """Call ``optimizer.step()`` on seed 004's AdaGrad and report the parameters after it."""
    param = _parameter_with_gradient()
    Seed004AdaGrad([param], lr=lr).step()
    return Outcome(measured=param.detach().tolist())


@check("optim.seed004_adagrad_renamed_matches_torch", evidence="measured")
def seed004_adagrad_renamed_matches_torch(shape: list, seed: int, lr: float) -> Outcome:
    """Relative deviation, after 20 steps, of seed 004's AdaGrad body (renamed to ``step``) from
    torch.optim.Adagrad(lr, eps=1e-8)."""
    return Outcome(
        measured=_deviation_from_torch(
            lambda p: Seed004AdaGradRenamed(p, lr=lr), lambda p: torch.optim.Adagrad(p, lr=lr, eps=1e-8), shape, seed
        )
    )


# ── zero_grad ───────────────────────────────────────────────────────────────────────────────


@check("optim.zero_grad", evidence="measured")
def zero_grad(set_to_none: str) -> Outcome:
    """``[p.grad is None, the old gradient tensor was freed]`` after ``optimizer.zero_grad(...)``
    with ``set_to_none`` true, false or default (called without the argument)."""
    param = nn.Parameter(torch.randn(4, 4))
    (param * 2).sum().backward()
    old_gradient = weakref.ref(param.grad)
    torch_optimizer = torch.optim.SGD([param], lr=0.1)
    if set_to_none == "default":
        torch_optimizer.zero_grad()
    else:
        torch_optimizer.zero_grad(set_to_none={"true": True, "false": False}[set_to_none])
    return Outcome(measured=[param.grad is None, old_gradient() is None])
