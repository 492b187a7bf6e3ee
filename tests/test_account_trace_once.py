"""Issue 34's shortcuts in a prediction, each against the slower way it replaced, to the byte:

- the Adam/AdamW state a steady step starts from made as ``Adam._init_group`` makes it
  (:func:`resacct.account.peak.step_peak.made_adam_state`) instead of by a first step on zero gradients;
- on meta, the measured state made by the optimizer's own ``_init_group`` without the update's arithmetic
  (``step_measurements._state_made_on_meta``; ``tests/test_account_speed.py`` compares the state with two real steps').
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.peak import step_peak as peak  # noqa: E402
from resacct.account.peak.step_peak import account_recipe_step_peak, made_adam_state, predict_step_peak  # noqa: E402
from resacct.facts.recipes import parse_recipe  # noqa: E402


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def _loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs).square().mean()


def _both_ways(monkeypatch: pytest.MonkeyPatch, run):  # type: ignore[no-untyped-def]
    """``run()`` with the state made directly, then with the first step (the shortcut switched off)."""
    direct = run()
    with monkeypatch.context() as patched:
        patched.setattr(peak, "made_adam_state", lambda optimizer: False)
        stepped = run()
    return direct, stepped


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.AdamW(p, lr=1e-3),
    lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=False),
], ids=["adamw", "adam-amsgrad", "adamw-for-loop"])
def test_direct_adam_state_predicts_the_same_step(monkeypatch: pytest.MonkeyPatch, make_optimizer) -> None:  # type: ignore[no-untyped-def]
    inputs = torch.empty(8, 16, device="meta")
    direct, stepped = _both_ways(monkeypatch, lambda: predict_step_peak(_mlp().to("meta"), inputs, _loss, make_optimizer))
    assert direct == stepped  # the peak, what is live at it, the whole timeline, the ops seen
    assert direct.peak.bytes_by_kind["optimizer state"] > 0


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "bf16-fp32-master", "bf16-autocast", "bf16-fp32-master-free-bf16-grads"])
@pytest.mark.slow  # ~1.2 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_direct_adam_state_on_a_transformers_model_and_each_recipe(monkeypatch: pytest.MonkeyPatch, recipe: str) -> None:
    pytest.importorskip("transformers")
    from tests.fixtures_hf_models import tiny_llama

    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output

    with torch.device("meta"):
        model = tiny_llama()
    model.train()
    inputs = default_inputs(model, batch=2, seq=16, device="meta")

    def run():  # type: ignore[no-untyped-def]
        return account_recipe_step_peak(model, inputs, lambda m, x: loss_of_output(call_model(m, x), "model"), recipe=parse_recipe(recipe),
                                        optimizer="adamw", measure=False)

    direct, stepped = _both_ways(monkeypatch, run)
    assert direct.gap == stepped.gap
    assert direct.predicted == stepped.predicted
    if direct.predicted is not None:
        assert direct.predicted.peak.bytes_by_kind["optimizer state"] > 0


def test_direct_adam_state_leaves_other_optimizers_to_the_step() -> None:
    weight = nn.Parameter(torch.ones(4, 4))
    frozen = nn.Parameter(torch.ones(4), requires_grad=False)
    assert not made_adam_state(torch.optim.SGD([weight], lr=0.1, momentum=0.9))
    assert not made_adam_state(torch.optim.Adagrad([weight]))
    assert not made_adam_state(torch.optim.AdamW([weight, frozen]))  # a first step makes no state for a parameter without a gradient
    adamw = torch.optim.AdamW([weight])
    assert made_adam_state(adamw)
    assert not made_adam_state(adamw)  # state already there: made once
    stepped = torch.optim.AdamW([nn.Parameter(torch.ones(4, 4))])
    for parameter in stepped.param_groups[0]["params"]:
        parameter.grad = torch.zeros_like(parameter)
    stepped.step()
    made, real = adamw.state[weight], next(iter(stepped.state.values()))
    assert sorted(made) == sorted(real)
    for name in real:
        assert (made[name].shape, made[name].dtype, made[name].stride(), made[name].device) == (
            real[name].shape, real[name].dtype, real[name].stride(), real[name].device), name
    assert made["step"].item() == real["step"].item() == 1.0


def _account_dict(model: nn.Module, inputs, **kwargs) -> dict:  # type: ignore[no-untyped-def]
    from resacct.account.answers.generic import account_module

    return account_module(model, inputs, measure_peaks=False, **kwargs).to_dict()


@pytest.mark.parametrize("case", ["mlp-cpu-fp32", "mlp-cpu-sgd", "mlp-meta-bf16-autocast", "mlp-cpu-bf16-model",
                                  # 1.26 and 1.20 s idle on 2026-11-28: a transformers model accounted twice
                                  pytest.param("llama-meta", marks=pytest.mark.slow), pytest.param("gpt2-meta", marks=pytest.mark.slow)])
def test_account_module_in_one_pass_accounts_the_same(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """account_module's FLOPs, state and saved tensors from one forward and backward of the recipe's copy
    (:func:`resacct.account.trace.step_measurements.measure_step_once`) against the three passes it replaced."""
    from resacct.account.answers import generic

    torch.manual_seed(0)
    kwargs: dict = {}
    if case.startswith("mlp"):
        model, inputs = _mlp(), torch.randn(8, 16)
        if case == "mlp-cpu-sgd":
            kwargs["optimizer"] = "sgd-momentum"
        if case == "mlp-meta-bf16-autocast":
            model, inputs, kwargs["recipe"] = model.to("meta"), inputs.to("meta"), "bf16-autocast"
        if case == "mlp-cpu-bf16-model":
            model, inputs, kwargs["recipe"] = model.to(torch.bfloat16), inputs.to(torch.bfloat16), "bf16"
    else:
        pytest.importorskip("transformers")
        from tests.fixtures_hf_models import tiny_gpt2, tiny_llama

        from resacct.account.load.model_io import default_inputs

        with torch.device("meta"):
            model = tiny_llama() if case == "llama-meta" else tiny_gpt2()
        model.train()
        inputs = default_inputs(model, batch=2, seq=16, device="meta")
    calls: list[bool] = []
    one_pass = generic._copy_runs_as_the_model
    monkeypatch.setattr(generic, "_copy_runs_as_the_model", lambda *a: calls.append(one_pass(*a)) or calls[-1])
    once = _account_dict(model, inputs, **kwargs)
    assert calls == [True]  # every case here takes the one pass
    monkeypatch.setattr(generic, "_copy_runs_as_the_model", lambda *a: False)
    assert once == _account_dict(model, inputs, **kwargs)


def test_account_module_keeps_three_passes_where_the_copy_differs() -> None:
    from resacct.account.answers.generic import _copy_runs_as_the_model
    from resacct.facts.recipes import get_recipe

    parameters = list(_mlp().parameters())
    assert _copy_runs_as_the_model(parameters, get_recipe("fp32"), "cpu")
    assert not _copy_runs_as_the_model(parameters, get_recipe("bf16"), "cpu")  # the copy is bf16, the model float32
    assert not _copy_runs_as_the_model(parameters, get_recipe("bf16-autocast"), "cpu")  # autocast on the CPU: casts the model does not make
    assert _copy_runs_as_the_model(parameters, get_recipe("bf16-autocast"), "meta")  # no autocast on meta


@pytest.mark.parametrize(("device", "optimizer", "recipe", "shortcut"), [
    ("meta", "adamw", "fp32", True), ("meta", "adam", "bf16-fp32-master", True), ("meta", "sgd-momentum", "fp32", False),
    ("cpu", "adamw", "fp32", False)])
def test_measured_state_on_meta_is_the_step_s_without_its_arithmetic(monkeypatch: pytest.MonkeyPatch, device: str, optimizer: str,
                                                                     recipe: str, shortcut: bool) -> None:
    """measure_step_once on meta: Adam/AdamW's state by its own ``_init_group`` (no update run) — the same measurement
    as the real step's, gradients cleared as the step clears them; any other optimizer, or a device with values, steps."""
    from resacct.account.trace import step_measurements as sm
    from resacct.measurement.memory import get_state_recipe

    model = _mlp().to(device)
    inputs = torch.randn(8, 16).to(device)
    taken: list[bool] = []
    made = sm._state_made_on_meta
    monkeypatch.setattr(sm, "_state_made_on_meta", lambda run: taken.append(made(run)) or taken[-1])
    once = sm.measure_step_once(model, lambda m: _loss(m, inputs), get_state_recipe(recipe), optimizer)
    assert taken == [shortcut]
    monkeypatch.setattr(sm, "_state_made_on_meta", lambda run: False)
    stepped = sm.measure_step_once(model, lambda m: _loss(m, inputs), get_state_recipe(recipe), optimizer)
    assert once.state == stepped.state and once.flops == stepped.flops
    if optimizer.startswith("adam"):
        assert once.state.parts_bytes["step counters"] > 0 and once.state.parts_bytes["optimizer moments"] > 0
    assert all(p.grad is None for p in once.model.parameters())


def test_the_tracker_answers_a_fake_tensor_s_device_as_the_fake_mode_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prim.device`` (a fake tensor's ``.device``, over half of a fake step's dispatches) answered by the tracker
    itself: the model sees the fake device, and the prediction — peak, timeline, ops seen — is the one the fake
    mode's own answer gives (the shortcut switched off)."""
    from resacct.account.peak import tracker

    seen: list[str] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.device.type)
            return self.inner(x)

    inputs = torch.empty(8, 16, device="meta")
    adamw = lambda parameters: torch.optim.AdamW(parameters, lr=1e-3)  # noqa: E731
    shortcut = predict_step_peak(Probe().to("meta"), inputs, _loss, adamw)
    with monkeypatch.context() as patched:
        patched.setattr(tracker, "_DEVICE_QUERY", object())  # no op is it: every call goes through the fake mode
        through = predict_step_peak(Probe().to("meta"), inputs, _loss, adamw)
    assert seen == ["cpu", "cpu"]
    assert shortcut.ops_seen.get("prim.device.default", 0) > 0
    assert shortcut == through
