"""resacct.training.optim side by side with torch.optim, written to kill the mutants mutmut left alive
(docs/mutation.md): every hyper-parameter away from its default, every default, several steps,
the parameters and the optimizer state compared with torch's after each step."""

from __future__ import annotations

import pytest
import torch

from resacct.training import optim
from resacct.errors import UnknownNameError

CONFIGS = [
    ("SGD", "SGD", {"lr": 0.1}),
    ("SGD", "SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", "SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.05}),
    ("SGD", "SGD", {"lr": 0.1, "momentum": 0.8, "nesterov": True, "weight_decay": 0.1}),
    ("AdaGrad", "Adagrad", {"lr": 0.2}),
    ("AdaGrad", "Adagrad", {"lr": 0.2, "lr_decay": 0.3, "weight_decay": 0.1, "initial_accumulator_value": 0.5, "eps": 0.01}),
    ("RMSProp", "RMSprop", {"lr": 0.05}),
    ("RMSProp", "RMSprop", {"lr": 0.05, "alpha": 0.7, "eps": 0.01, "weight_decay": 0.1}),
    ("RMSProp", "RMSprop", {"lr": 0.05, "alpha": 0.8, "momentum": 0.6, "centered": True}),
    ("RMSProp", "RMSprop", {"lr": 0.05, "momentum": 0.6}),
    ("RMSProp", "RMSprop", {"lr": 0.05, "centered": True, "eps": 0.1}),
    ("Adam", "Adam", {"lr": 0.1}),
    ("Adam", "Adam", {"lr": 0.1, "betas": (0.5, 0.8), "eps": 0.01, "weight_decay": 0.2}),
    ("AdamW", "AdamW", {"lr": 0.1}),
    ("AdamW", "AdamW", {"lr": 0.1, "betas": (0.6, 0.7), "eps": 0.05, "weight_decay": 0.3}),
]


def _run(optimizer_class, kwargs, steps=4):
    generator = torch.Generator().manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(3, 2, generator=generator)), torch.nn.Parameter(torch.randn(4, generator=generator))]
    optimizer = optimizer_class(weights, **kwargs)
    history = []
    for step in range(steps):
        for weight in weights:
            weight.grad = torch.randn(weight.shape, generator=generator) * (step + 1)
        optimizer.step()
        snapshot = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in optimizer.state[w].items()} for w in weights]
        history.append(([w.detach().clone() for w in weights], snapshot))
    return history


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CONFIGS, ids=[f"{o}-{sorted(k)}" for o, _, k in CONFIGS])
def test_every_step_and_state_tensor_matches_torch(ours, theirs, kwargs):
    mine = _run(getattr(optim, ours), kwargs)
    reference = _run(getattr(torch.optim, theirs), {**kwargs, "foreach": False})
    for (our_weights, our_state), (their_weights, their_state) in zip(mine, reference):
        for ours_w, theirs_w in zip(our_weights, their_weights):
            torch.testing.assert_close(ours_w, theirs_w)
        for ours_s, theirs_s in zip(our_state, their_state):
            tensors = {k for k, v in theirs_s.items() if isinstance(v, torch.Tensor) and k != "step"}
            assert {k for k in ours_s if k != "step"} == tensors
            for key in tensors:
                torch.testing.assert_close(ours_s[key], theirs_s[key])
            if "step" in theirs_s:
                assert ours_s["step"] == int(theirs_s["step"])


@pytest.mark.parametrize(("ours", "theirs"), [("SGD", "SGD"), ("AdaGrad", "Adagrad"), ("RMSProp", "RMSprop"), ("Adam", "Adam"), ("AdamW", "AdamW")])
def test_defaults_are_torch_defaults(ours, theirs):
    weight = torch.nn.Parameter(torch.ones(2))
    mine = getattr(optim, ours)([weight]).defaults
    reference = getattr(torch.optim, theirs)([weight]).defaults
    for key, value in mine.items():
        assert reference[key] == value, key
        assert type(reference[key]) is type(value) or isinstance(value, float), key
    if ours != "SGD":  # torch.optim.SGD's lr default is 1e-3 too, but torch marks it required in some versions
        assert mine["lr"] == reference["lr"]
    # Defaults drive the update: one step from defaults equals torch's.
    mine_steps = _run(getattr(optim, ours), {}, steps=2)
    reference_steps = _run(getattr(torch.optim, theirs), {"foreach": False}, steps=2)
    for (our_weights, _), (their_weights, _) in zip(mine_steps, reference_steps):
        for a, b in zip(our_weights, their_weights):
            torch.testing.assert_close(a, b)


BAD = [
    ("SGD", {"lr": -0.1}, r"^lr -0\.1: expected a finite number ≥ 0$"),
    ("SGD", {"momentum": -1.0}, r"^momentum -1\.0: expected a finite number ≥ 0$"),
    ("SGD", {"weight_decay": -1.0}, r"^weight_decay -1\.0: expected a finite number ≥ 0$"),
    ("SGD", {"nesterov": True}, r"^nesterov needs momentum > 0 and dampening 0, got momentum 0\.0, dampening 0\.0$"),
    ("SGD", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, r"dampening 0\.1$"),
    ("AdaGrad", {"lr_decay": -1.0}, r"^lr_decay -1\.0: "),
    ("AdaGrad", {"weight_decay": -1.0}, r"^weight_decay -1\.0: "),
    ("AdaGrad", {"initial_accumulator_value": -1.0}, r"^initial_accumulator_value -1\.0: "),
    ("AdaGrad", {"eps": -1.0}, r"^eps -1\.0: "),
    ("AdaGrad", {"lr": float("nan")}, r"^lr nan: "),
    ("RMSProp", {"alpha": -0.5}, r"^alpha -0\.5: "),
    ("RMSProp", {"eps": -1.0}, r"^eps -1\.0: "),
    ("RMSProp", {"weight_decay": -1.0}, r"^weight_decay -1\.0: "),
    ("RMSProp", {"momentum": -1.0}, r"^momentum -1\.0: "),
    ("RMSProp", {"lr": -1.0}, r"^lr -1\.0: "),
    ("Adam", {"betas": (1.0, 0.9)}, r"^beta1 1\.0: expected a number in \[0, 1\)$"),
    ("Adam", {"betas": (0.9, -0.1)}, r"^beta2 -0\.1: expected a number in \[0, 1\)$"),
    ("Adam", {"eps": -1.0}, r"^eps -1\.0: "),
    ("Adam", {"weight_decay": -1.0}, r"^weight_decay -1\.0: "),
    ("Adam", {"lr": -1.0}, r"^lr -1\.0: "),
    ("AdamW", {"betas": (0.9, 1.0)}, r"^beta2 1\.0: "),
]


@pytest.mark.parametrize(("ours", "kwargs", "message"), BAD, ids=[f"{o}-{sorted(k)}" for o, k, _ in BAD])
def test_out_of_range_hyperparameters_are_refused_like_torch(ours, kwargs, message):
    theirs = {"AdaGrad": "Adagrad", "RMSProp": "RMSprop"}.get(ours, ours)
    weight = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError):  # torch refuses the same value (its own message)
        getattr(torch.optim, theirs)([weight], **kwargs)
    with pytest.raises(optim.HyperparameterError, match=message):
        getattr(optim, ours)([weight], **kwargs)


def test_fraction_and_at_least_zero_accept_their_bounds():
    weight = torch.nn.Parameter(torch.ones(2))
    optim.Adam([weight], betas=(0.0, 0.0), eps=0.0, lr=0.0, weight_decay=0.0)
    torch.optim.Adam([weight], betas=(0.0, 0.0), eps=0.0, lr=0.0, weight_decay=0.0)
    for flag in (True, False):
        with pytest.raises(optim.HyperparameterError, match=rf"^beta1 {flag}: expected a number in \[0, 1\)$"):
            optim.Adam([weight], betas=(flag, 0.9))
    with pytest.raises(optim.HyperparameterError, match=r"^lr True: "):
        optim.SGD([weight], lr=True)


def test_sparse_gradients_are_refused_and_closures_return_their_loss():
    weight = torch.nn.Parameter(torch.ones(3))
    for name in ("SGD", "AdaGrad", "RMSProp", "Adam", "AdamW"):
        optimizer = getattr(optim, name)([weight], lr=0.1)
        weight.grad = torch.ones(3).to_sparse()
        with pytest.raises(optim.ResacctError, match=r"^resacct optimizers take dense gradients; got a sparse gradient$"):
            optimizer.step()
        weight.grad = None
        assert optimizer.step(lambda: torch.tensor(2.5)) == torch.tensor(2.5)


def test_state_tensor_counts_are_the_tensors_torch_keeps():
    for key, (theirs, kwargs) in {
        "sgd": ("SGD", {"lr": 0.1}), "sgd_momentum": ("SGD", {"lr": 0.1, "momentum": 0.9}), "adagrad": ("Adagrad", {}),
        "rmsprop": ("RMSprop", {}), "adam": ("Adam", {}), "adamw": ("AdamW", {}),
    }.items():
        weight = torch.nn.Parameter(torch.ones(5))
        optimizer = getattr(torch.optim, theirs)([weight], **kwargs)
        weight.grad = torch.ones(5)
        optimizer.step()
        sized = [v for v in optimizer.state[weight].values() if isinstance(v, torch.Tensor) and v.shape == weight.shape]
        assert optim.state_tensors_per_parameter(key) == len(sized), key
    with pytest.raises(UnknownNameError, match=r"^unknown optimizer 'adamm'; did you mean 'adam'") as error:
        optim.state_tensors_per_parameter("adamm")
    assert error.value.kind == "optimizer"
    assert set(error.value.known) == set(optim.STATE_TENSORS_PER_PARAMETER)


def _torch_one_step(name, weight, grad, **kwargs):
    param = torch.nn.Parameter(weight.clone())
    optimizer = getattr(torch.optim, name)([param], foreach=False, **kwargs)
    param.grad = grad.clone()
    optimizer.step()
    return param.detach(), optimizer.state[param]


def test_update_functions_default_to_torch_defaults():
    """The public update rules called with only what they require step as torch.optim's defaults do."""
    generator = torch.Generator().manual_seed(1)
    weight, grad = torch.randn(5, generator=generator), torch.randn(5, generator=generator)

    param = weight.clone()
    assert optim.sgd_update_(param, grad, None, lr=0.1) is None  # no momentum: no buffer made
    torch.testing.assert_close(param, _torch_one_step("SGD", weight, grad, lr=0.1)[0])

    param, total = weight.clone(), torch.zeros(5)
    optim.adagrad_update_(param, grad, total, step=1, lr=0.1)
    expected, state = _torch_one_step("Adagrad", weight, grad, lr=0.1)
    torch.testing.assert_close(param, expected)
    torch.testing.assert_close(total, state["sum"])

    param, square = weight.clone(), torch.zeros(5)
    optim.rmsprop_update_(param, grad, square, lr=0.1)
    expected, state = _torch_one_step("RMSprop", weight, grad, lr=0.1)
    torch.testing.assert_close(param, expected)
    torch.testing.assert_close(square, state["square_avg"])

    param, m, v = weight.clone(), torch.zeros(5), torch.zeros(5)
    optim.adam_update_(param, grad, m, v, step=1, lr=0.1)
    expected, state = _torch_one_step("Adam", weight, grad, lr=0.1)
    torch.testing.assert_close(param, expected)
    torch.testing.assert_close(m, state["exp_avg"])
    torch.testing.assert_close(v, state["exp_avg_sq"])


@pytest.mark.parametrize(("ours", "theirs"), [("SGD", "SGD"), ("AdaGrad", "Adagrad"), ("RMSProp", "RMSprop"), ("Adam", "Adam"), ("AdamW", "AdamW")])
def test_weight_decay_of_exactly_one_matches_torch(ours, theirs):
    mine = _run(getattr(optim, ours), {"lr": 0.05, "weight_decay": 1.0}, steps=2)
    reference = _run(getattr(torch.optim, theirs), {"lr": 0.05, "weight_decay": 1.0, "foreach": False}, steps=2)
    for (our_weights, _), (their_weights, _) in zip(mine, reference):
        for a, b in zip(our_weights, their_weights):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("ours", "theirs"), [("SGD", "SGD"), ("AdaGrad", "Adagrad"), ("RMSProp", "RMSprop"), ("Adam", "Adam"), ("AdamW", "AdamW")])
def test_parameters_without_gradients_are_skipped_not_the_rest(ours, theirs):
    results = []
    for module, name in ((optim, ours), (torch.optim, theirs)):
        frozen, trained = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
        kwargs = {"lr": 0.1} if module is optim else {"lr": 0.1, "foreach": False}
        optimizer = getattr(module, name)([frozen, trained], **kwargs)
        trained.grad = torch.tensor([1.0, -2.0, 0.5])
        assert optimizer.step() is None  # no closure: torch returns None
        results.append((frozen.detach().clone(), trained.detach().clone()))
    (our_frozen, our_trained), (their_frozen, their_trained) = results
    torch.testing.assert_close(our_frozen, their_frozen)
    torch.testing.assert_close(our_trained, their_trained)
    assert not torch.equal(our_trained, torch.ones(3))


def test_update_function_defaults_over_two_steps_with_the_optional_state_given():
    """Defaults that only act from the second step on, or with optional state: still torch's."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(4, generator=generator)
    grads = [torch.randn(4, generator=generator) for _ in range(2)]

    def torch_steps(name, **kwargs):
        param = torch.nn.Parameter(weight.clone())
        optimizer = getattr(torch.optim, name)([param], foreach=False, **kwargs)
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        return param.detach()

    param, buffer = weight.clone(), None
    for grad in grads:
        buffer = optim.sgd_update_(param, grad, buffer, lr=0.1, momentum=0.9)  # dampening 0, no nesterov
    torch.testing.assert_close(param, torch_steps("SGD", lr=0.1, momentum=0.9))

    param, total = weight.clone(), torch.zeros(4)
    for step, grad in enumerate(grads, start=1):
        optim.adagrad_update_(param, grad, total, step=step, lr=0.1)  # lr_decay 0
    torch.testing.assert_close(param, torch_steps("Adagrad", lr=0.1))

    param, square, momentum_buffer = weight.clone(), torch.zeros(4), torch.zeros(4)
    for grad in grads:
        optim.rmsprop_update_(param, grad, square, momentum_buffer, lr=0.1)  # momentum 0
    torch.testing.assert_close(param, torch_steps("RMSprop", lr=0.1))

    param, m, v = weight.clone(), torch.zeros(4), torch.zeros(4)
    for step, grad in enumerate(grads, start=1):
        optim.adam_update_(param, grad, m, v, step=step, lr=0.1, weight_decay=0.1)  # L2, as torch.optim.Adam
    torch.testing.assert_close(param, torch_steps("Adam", lr=0.1, weight_decay=0.1))
