"""Unit tests of resacct.training.optim: each from-scratch optimizer trains a real model exactly as its
torch.optim counterpart, keeps the same state, and refuses bad hyper-parameters."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from resacct.training import optim
from resacct.errors import ResacctError, UnknownNameError
from resacct.training.models import Cruncher

PAIRS = [
    (optim.SGD, torch.optim.SGD, dict(lr=0.05)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.5, dampening=0.5)),
    (optim.AdaGrad, torch.optim.Adagrad, dict(lr=0.1)),
    (optim.AdaGrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)),
    (optim.RMSProp, torch.optim.RMSprop, dict(lr=0.01)),
    (optim.RMSProp, torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.01)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=0.01)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, betas=(0.5, 0.9), weight_decay=0.3)),
]


def _train(optimizer_class, kwargs, steps=15, seed=0):
    torch.manual_seed(seed)
    model = Cruncher(dim=8, num_layers=3)
    optimizer = optimizer_class(model.parameters(), **kwargs)
    data = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 8, generator=data), torch.randn(4, 1, generator=data)  # one batch: the loss must fall
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, optimizer, losses


@pytest.mark.parametrize("ours, theirs, kwargs", PAIRS, ids=lambda value: getattr(value, "__name__", None) or str(value))
def test_training_a_cruncher_matches_torch(ours, theirs, kwargs):
    model_ours, _, losses_ours = _train(ours, kwargs)
    model_torch, _, losses_torch = _train(theirs, kwargs)
    assert losses_ours == pytest.approx(losses_torch, rel=1e-5, abs=1e-7)
    for a, b in zip(model_ours.parameters(), model_torch.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert losses_ours[-1] < losses_ours[0]


@pytest.mark.parametrize("ours, theirs, kwargs", PAIRS, ids=lambda value: getattr(value, "__name__", None) or str(value))
def test_state_matches_torch_key_for_key(ours, theirs, kwargs):
    _, optimizer_ours, _ = _train(ours, kwargs, steps=3)
    _, optimizer_torch, _ = _train(theirs, kwargs, steps=3)
    for state_ours, state_torch in zip(optimizer_ours.state.values(), optimizer_torch.state.values()):
        assert sorted(state_ours) == sorted(state_torch)
        for key, value in state_torch.items():
            if key == "step":
                assert state_ours["step"] == int(value.item()) == 3  # resacct: a Python int
            else:
                torch.testing.assert_close(state_ours[key], value, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name, make", [
    ("sgd", lambda p: optim.SGD(p, lr=0.1)),
    ("sgd_momentum", lambda p: optim.SGD(p, lr=0.1, momentum=0.9)),
    ("adagrad", optim.AdaGrad),
    ("rmsprop", optim.RMSProp),
    ("adam", optim.Adam),
    ("adamw", optim.AdamW),
])  # fmt: skip
def test_state_tensors_per_parameter_table(name, make):
    param = torch.nn.Parameter(torch.randn(3, 4))
    optimizer = make([param])
    param.grad = torch.randn(3, 4)
    optimizer.step()
    shaped = [value for value in optimizer.state[param].values() if isinstance(value, torch.Tensor) and value.shape == param.shape]
    assert len(shaped) == optim.state_tensors_per_parameter(name)


def test_state_dict_round_trip_resumes_identically():
    model, optimizer, _ = _train(optim.AdamW, dict(lr=0.01), steps=5)
    model_copy = copy.deepcopy(model)
    resumed = optim.AdamW(model_copy.parameters(), lr=0.01)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for m, o in ((model, optimizer), (model_copy, resumed)):
        o.zero_grad()
        F.mse_loss(m(x), y).backward()
        o.step()
    for a, b in zip(model.parameters(), model_copy.parameters()):
        assert torch.equal(a, b)


def test_param_groups_keep_their_own_learning_rates():
    fast, slow = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = optim.SGD([{"params": [fast], "lr": 1.0}, {"params": [slow]}], lr=0.1)
    fast.grad, slow.grad = torch.ones(2), torch.ones(2)
    optimizer.step()
    assert fast.tolist() == [-1.0, -1.0] and slow.detach().allclose(torch.full((2,), -0.1))


def test_step_runs_the_closure_and_returns_its_loss():
    param = torch.nn.Parameter(torch.tensor([2.0]))
    optimizer = optim.Adam([param], lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss.item() == 4.0 and param.item() == pytest.approx(1.9)


def test_parameters_without_gradients_are_left_alone():
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    optimizer = optim.Adam([used, unused], lr=0.1)
    used.grad = torch.ones(2)
    optimizer.step()
    assert unused.tolist() == [1.0, 1.0] and unused not in optimizer.state or not optimizer.state[unused]


def test_zero_grad_frees_gradients_by_default():
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    optim.SGD([param], lr=0.1).zero_grad()
    assert param.grad is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: optim.SGD(p, lr=-0.1), "lr -0.1: expected a finite number ≥ 0"),
        (lambda p: optim.SGD(p, lr=0.1, momentum=-0.5), "momentum -0.5"),
        (lambda p: optim.SGD(p, lr=0.1, nesterov=True), "nesterov needs momentum > 0"),
        (lambda p: optim.AdaGrad(p, eps=-1e-10), "eps -1e-10"),
        (lambda p: optim.AdaGrad(p, lr_decay=-1.0), "lr_decay -1.0"),
        (lambda p: optim.RMSProp(p, alpha=-0.9), "alpha -0.9"),
        (lambda p: optim.Adam(p, betas=(1.0, 0.999)), "beta1 1.0: expected a number in [0, 1)"),
        (lambda p: optim.AdamW(p, betas=(0.9, -0.1)), "beta2 -0.1"),
        (lambda p: optim.AdamW(p, weight_decay=float("nan")), "weight_decay nan"),
    ],
)
def test_bad_hyperparameters_raise_value_errors_that_echo_the_value(make, message):
    with pytest.raises(ValueError) as error:
        make([torch.nn.Parameter(torch.ones(2))])
    assert isinstance(error.value, ResacctError)
    assert message in str(error.value)


def test_torch_refuses_the_same_negative_learning_rate():
    with pytest.raises(ValueError, match="Invalid learning rate"):
        torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=-0.1)


def test_unknown_optimizer_name():
    with pytest.raises(UnknownNameError, match=r"unknown optimizer 'adamW'; did you mean .*'adamw'"):
        optim.state_tensors_per_parameter("adamW")


@pytest.mark.typecheck
def test_update_rules_refuse_mismatched_shapes():
    import beartype.roar
    import jaxtyping

    with pytest.raises((jaxtyping.TypeCheckError, beartype.roar.BeartypeException)):
        optim.sgd_update_(torch.zeros(3), torch.zeros(4), None, lr=0.1)
