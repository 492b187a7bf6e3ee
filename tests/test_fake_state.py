"""The fake tensors a predicted step starts from, made without FakeTensorMode's dispatch
(:mod:`resacct.account.peak.fake_state`), against the ones its dispatch makes: each tensor, and the
prediction both ways — to the byte, the timeline included; the ops seen differ only by the copy's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from resacct.account.peak import fake_state
from resacct.account.peak import step_peak
from resacct.account.peak.fake_state import _fake_step_counters, fake_like
from resacct.account.peak.step_peak import predict_step_peak


def _sources() -> list[torch.Tensor]:
    base = torch.empty(6, 8, device="meta")
    return [base, base.t(), torch.empty(2, 3, 4, 5, device="meta").to(memory_format=torch.channels_last), torch.empty((), device="meta"),
            torch.empty(5, dtype=torch.bfloat16, device="meta"), base[:, ::2], torch.empty(0, 3, device="meta")]


def _described(tensor: torch.Tensor) -> tuple[object, ...]:
    return (type(tensor), tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, tensor.fake_device, tensor.requires_grad,
            tensor.untyped_storage().nbytes(), tensor.constant, tensor.is_contiguous())


@pytest.mark.parametrize("like", [False, True], ids=["empty_strided", "zeros_like"])
def test_fake_like_makes_what_the_fake_mode_makes(like: bool) -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        sources = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu") for t in _sources()]
        made = fake_like(mode, sources if like else _sources(), like=like)
        dispatched = [torch.zeros_like(t, memory_format=torch.preserve_format) if like else t for t in sources]
    assert [_described(t) for t in made] == [_described(t) for t in dispatched]
    assert all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in made)
    assert len({id(t.untyped_storage()) for t in made}) == len(made)  # each its own storage


def test_step_counters_are_torch_tensor_s_under_the_fake_mode() -> None:
    """The constant, and the converter's memo: ``step += 1`` on the constants returns the counter itself."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        made = _fake_step_counters(mode, 2, torch.float32)
        dispatched = torch.tensor(1.0, dtype=torch.float32, device="cpu")
        assert [_described(t) for t in made] == [_described(dispatched)] * 2
        for counter in [*made, dispatched]:
            storage = counter.untyped_storage()
            assert counter.add_(1) is counter and counter.untyped_storage() is storage
            assert counter.item() == 2.0


def _net() -> nn.Module:
    model = nn.Sequential(nn.Embedding(32, 16), nn.LayerNorm(16), nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 32))
    model.register_buffer("scale", torch.ones(16))
    return model


@pytest.mark.parametrize("optimizer", ["adamw", "adam-amsgrad", "sgd"])
def test_the_prediction_is_the_same_with_the_dispatched_tensors(monkeypatch: pytest.MonkeyPatch, optimizer: str) -> None:
    make = {"adamw": lambda p: torch.optim.AdamW(p, lr=1e-3), "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
            "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)}[optimizer]
    model, ids = _net().to("meta"), torch.zeros(4, 8, dtype=torch.long, device="meta")

    def run() -> step_peak.PredictedStepPeak:
        return predict_step_peak(model, ids, lambda m, x: m(x).square().mean(), make)

    direct = run()
    with monkeypatch.context() as patched:
        patched.setattr(step_peak, "active_fake_mode", lambda: None)  # the copy through the fake mode's dispatch
        patched.setattr(fake_state, "_state_mode", lambda groups: None)  # the state too
        dispatched = run()
    assert direct.peak == dispatched.peak and direct.timeline == dispatched.timeline and direct.segments == dispatched.segments
    extra = {op: dispatched.ops_seen[op] - direct.ops_seen.get(op, 0) for op in dispatched.ops_seen if dispatched.ops_seen[op] != direct.ops_seen.get(op)}
    copied = len({id(t) for t in [*model.parameters(), *model.buffers()]})
    parameters = len(list(model.parameters()))
    assert set(extra) == {"aten.empty_strided.default", "aten.detach.default"}  # the copy's own ops only:
    assert extra["aten.empty_strided.default"] == copied  # one a tensor
    assert extra["aten.detach.default"] in (parameters, 2 * parameters)  # nn.Parameter's detach (two on torch 2.4)
