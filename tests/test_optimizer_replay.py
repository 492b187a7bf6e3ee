"""The optimizer step replayed from one traced parameter of each class
(:mod:`resacct.account.peak.optimizer_replay`) against tracing every parameter — the peak, what is live
at it, the whole timeline and the ops seen, to the byte — for every optimizer resacct builds, weight
decay on and off, the recipes with master weights; against the CPU allocator on a real model; and the
cases it leaves to the whole step."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.load.optimizers import OPTIMIZER_NAMES, build_optimizer  # noqa: E402
from resacct.account.peak import optimizer_replay  # noqa: E402
from resacct.account.peak.step_peak import account_recipe_step_peak, measure_step_peak, predict_step_peak  # noqa: E402
from resacct.facts.recipes import parse_recipe  # noqa: E402


class _Net(nn.Module):
    """Parameters of several classes in an order where a class's predecessor varies; one frozen, one unused."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 24)
        self.up = nn.Linear(24, 48)
        self.norm = nn.LayerNorm(48)
        self.down = nn.Linear(48, 24)
        self.up2 = nn.Linear(24, 48)
        self.norm2 = nn.LayerNorm(48)
        self.down2 = nn.Linear(48, 24)
        self.head = nn.Linear(24, 40, bias=False)
        self.unused = nn.Linear(24, 24)  # no gradient: not stepped
        self.norm2.bias.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.down(torch.relu(self.norm(self.up(x))))
        x = x + self.down2(torch.relu(self.norm2(self.up2(x))))
        return self.head(x)


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).square().mean()


def _both_ways(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any, int]:
    """``run()`` with the replay, then without it; how many steps were replayed."""
    replayed = []
    original = optimizer_replay._apply

    def counted(tracker: Any, actions: Any) -> None:
        replayed.append(len(actions))
        original(tracker, actions)

    with monkeypatch.context() as patched:
        patched.setattr(optimizer_replay, "_apply", counted)
        fast = run()
    with monkeypatch.context() as patched:
        patched.setattr(optimizer_replay, "replay_enabled", False)
        whole = run()
    return fast, whole, len(replayed)


_VARIANTS = {
    **{name: (lambda name: lambda p: build_optimizer(name, p))(name) for name in OPTIMIZER_NAMES},
    "adam-decay": lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=0.1),
    "adamw-no-decay": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    "adamw-maximize": lambda p: torch.optim.AdamW(p, lr=1e-3, maximize=True),
    "sgd-decay": lambda p: torch.optim.SGD(p, lr=1e-3, weight_decay=0.1),
    "sgd-nesterov-decay": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, nesterov=True, weight_decay=0.1),
    "adagrad-decay": lambda p: torch.optim.Adagrad(p, weight_decay=0.1),
    "rmsprop-centered-momentum": lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True, weight_decay=0.1),
}


@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_replayed_step_predicts_what_tracing_every_parameter_does(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    ids = torch.zeros(4, 16, dtype=torch.long)
    fast, whole, replayed = _both_ways(monkeypatch, lambda: predict_step_peak(_Net(), ids, _loss, _VARIANTS[variant]))
    assert replayed == 1
    assert fast == whole  # the peak, what is live at it, the whole timeline, the ops seen
    assert fast.ops_seen.get("aten.mul_.Tensor", 0) + fast.ops_seen.get("aten.add_.Tensor", 0) >= 10  # the step's ops counted, replayed ones too


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum", "rmsprop"])
def test_replayed_prediction_is_the_cpu_allocator_s_peak(optimizer: str) -> None:
    """Against torch's own count: the CPU allocator over the same step of the real model."""
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64))
    inputs = torch.randn(32, 64)
    make = _VARIANTS[optimizer]
    predicted = predict_step_peak(model, inputs, lambda m, x: m(x).mean(), make)
    measured = measure_step_peak(model, inputs, lambda m, x: m(x).mean(), make)
    assert predicted.peak_bytes == measured.peak_bytes
    assert predicted.timeline.peak_of_phase("optimizer step") == measured.peak_of_phase("optimizer step")


@pytest.mark.parametrize("recipe", ["bf16", "bf16-fp32-master", "bf16-fp32-master-free-bf16-grads"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_replayed_step_under_each_recipe(monkeypatch: pytest.MonkeyPatch, recipe: str, optimizer: str) -> None:
    """Parameters in bf16, and master weights (the inner optimizer's step replayed)."""
    model = _Net().to("meta")
    ids = torch.zeros(4, 16, dtype=torch.long, device="meta")

    def run() -> Any:
        return account_recipe_step_peak(model, ids, _loss, recipe=parse_recipe(recipe), optimizer=optimizer, measure=False)

    fast, whole, replayed = _both_ways(monkeypatch, run)
    assert replayed == 1
    assert fast.predicted is not None and fast.predicted == whole.predicted
    assert fast.notes == whole.notes


@pytest.mark.slow  # ~2 s: a transformers model, three recipes both ways
@pytest.mark.parametrize("recipe", ["fp32", "bf16-autocast", "bf16-fp32-master"])
def test_replayed_step_on_a_transformers_model(monkeypatch: pytest.MonkeyPatch, recipe: str) -> None:
    """Llama (tiny, on meta): a model whose classes follow one another in another order than the MLP's."""
    pytest.importorskip("transformers")
    from tests.fixtures_hf_models import tiny_llama

    from resacct.account.load.model_io import default_inputs
    from resacct.account.peak.step_peak import account_model_step_peak

    with torch.device("meta"):
        model = tiny_llama().train()
    batch = default_inputs(model, batch=2, seq=16, device="meta")
    run = lambda: account_model_step_peak(model, batch, loss="auto", recipe=parse_recipe(recipe), optimizer="adamw", measure=False)  # noqa: E731
    fast, whole, replayed = _both_ways(monkeypatch, run)
    assert replayed == 1
    assert fast.predicted is not None and fast.predicted == whole.predicted


class _OwnAdamW(torch.optim.AdamW):
    pass


@pytest.mark.parametrize("case", ["subclass", "foreach", "two groups", "one of each class"])
def test_left_to_the_whole_step(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Where the replay is not sure to be the step, the whole step runs (and the answer is the same)."""
    model, ids = _Net(), torch.zeros(4, 16, dtype=torch.long)
    makers = {
        "subclass": lambda p: _OwnAdamW(p, lr=1e-3),
        "foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
        "two groups": lambda p: torch.optim.AdamW([{"params": p[:3]}, {"params": p[3:]}], lr=1e-3),
        "one of each class": lambda p: torch.optim.AdamW(p[:3], lr=1e-3),  # embedding, up.weight, up.bias: nothing to replay
    }
    fast, whole, replayed = _both_ways(monkeypatch, lambda: predict_step_peak(model, ids, _loss, makers[case]))
    assert replayed == 0
    assert fast == whole


def test_parameters_over_one_storage_are_not_replayed() -> None:
    weight = nn.Parameter(torch.ones(4, 4))
    view = nn.Parameter(weight.detach()[:, :])  # a second parameter over the first's storage
    other = nn.Parameter(torch.ones(4, 4))
    adamw = torch.optim.AdamW([weight, other, *(nn.Parameter(torch.ones(4, 4)) for _ in range(2))], lr=1e-3)
    for parameter in adamw.param_groups[0]["params"]:
        parameter.grad = torch.zeros_like(parameter)
    assert optimizer_replay._reduced_order(adamw, adamw.param_groups[0]["params"]) is not None  # one class of four: replayed
    adamw.param_groups[0]["params"][1] = view
    view.grad = torch.zeros_like(view)
    assert optimizer_replay._reduced_order(adamw, adamw.param_groups[0]["params"]) is None


def test_a_log_that_does_not_make_a_replay_is_refused() -> None:
    """Two members of one class that stepped differently, a free of a storage the step did not make, a
    storage kept: each is refused, not replayed."""
    log = optimizer_replay._StepLog(torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1), [])
    entries = [[8, "optimizer temporaries"], [8, "optimizer temporaries"]]
    log.starts = [0, 3, 6, 8]
    log.events = [("op", "a"), ("add", entries[0], 8, "optimizer temporaries"), ("drop", entries[0], 8, "optimizer temporaries"),
                  ("op", "a"), ("add", entries[1], 8, "optimizer temporaries"), ("drop", entries[1], 8, "optimizer temporaries"),
                  ("op", "a"), ("op", "b"),  # the class of the second one again: other ops
                  ("op", "a"), ("op", "b")]
    with pytest.raises(optimizer_replay._Unreplayable, match="stepped differently"):
        optimizer_replay._replay(log, ["x", "y", "y", "y"], ["x", "y", "y", "y", "y"])
    log.events = [("op", "a"), ("drop", [4, "gradients"], 4, "gradients")]
    log.starts = [0]
    with pytest.raises(optimizer_replay._Unreplayable, match="did not make"):
        optimizer_replay._templates(log)
    log.events = [("op", "a"), ("add", entries[0], 8, "optimizer temporaries")]
    with pytest.raises(optimizer_replay._Unreplayable, match="kept a storage"):
        optimizer_replay._templates(log)


def test_a_first_iteration_that_makes_more_is_refused() -> None:
    """A first iteration that makes one more storage than the rest (a cache of the loop's, say): the
    later ones' frees of "the previous iteration's first storage" would name another one — refused."""
    log = optimizer_replay._StepLog(torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1), [])
    kind = "optimizer temporaries"
    extra, *temps = [[4, kind]] + [[8, kind] for _ in range(4)]
    log.events = [("op", "a"), ("add", extra, 4, kind), ("add", temps[0], 8, kind),              # first: two storages
                  ("op", "a"), ("add", temps[1], 8, kind), ("drop", temps[0], 8, kind),          # each later one frees the one before
                  ("op", "a"), ("add", temps[2], 8, kind), ("drop", temps[1], 8, kind),
                  ("op", "a"), ("add", temps[3], 8, kind), ("drop", temps[2], 8, kind),
                  ("drop", temps[3], 8, kind), ("drop", extra, 4, kind)]
    log.starts = [0, 3, 6, 9]
    with pytest.raises(optimizer_replay._Unreplayable, match="stepped with"):
        optimizer_replay._replay(log, ["x", "y", "x", "x"], ["x", "y", "x", "x", "y"])
    first_extra_op = [("op", "a"), ("op", "b"), ("add", temps[0], 8, kind),  # an op the later ones do not run
                      ("op", "a"), ("add", temps[1], 8, kind), ("drop", temps[0], 8, kind),
                      ("op", "a"), ("add", temps[2], 8, kind), ("drop", temps[1], 8, kind),
                      ("op", "a"), ("add", temps[3], 8, kind), ("drop", temps[2], 8, kind), ("drop", temps[3], 8, kind)]
    log.events, log.starts = first_extra_op, [0, 3, 6, 9]
    with pytest.raises(optimizer_replay._Unreplayable, match="first parameter"):
        optimizer_replay._replay(log, ["x", "y", "x", "x"], ["x", "y", "x", "x", "y"])
    log.events = first_extra_op[:1] + first_extra_op[2:]  # without it: replayed
    log.starts = [0, 2, 5, 8]
    actions = optimizer_replay._replay(log, ["x", "y", "x", "x"], ["x", "y", "x", "x", "y"])
    assert [a for a in actions if a[0] == "add"] == [("add", 8, kind)] * 5 and sum(a[0] == "drop" for a in actions) == 5
