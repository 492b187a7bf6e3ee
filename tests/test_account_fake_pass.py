"""Trace once (issue 34): account_module's FLOPs, saved tensors and training state recorded on the
step peak's fake pass (:mod:`resacct.account.trace.fake_pass`) against the meta pass they replace,
the whole account compared — every figure, per module, the peak and its timeline — to the byte."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.answers import generic  # noqa: E402
from resacct.account.peak import one_pass  # noqa: E402
from resacct.account.answers.generic import account_module  # noqa: E402
from resacct.account.load.model_io import default_inputs  # noqa: E402


from resacct.account.trace.fake_pass import FAKE_PASS_FROM_TORCH, torch_release  # noqa: E402

#: before FAKE_PASS_FROM_TORCH the fake pass feeds nothing (the meta pass runs): the accounts are equal all the same
TRACED_ONCE = torch_release() >= FAKE_PASS_FROM_TORCH
needs_traced_once = pytest.mark.skipif(not TRACED_ONCE, reason=f"the fake pass feeds the account from torch "
                                       f"{'.'.join(map(str, FAKE_PASS_FROM_TORCH))} (this is torch {torch.__version__})")


def _both_ways(monkeypatch: pytest.MonkeyPatch, model: nn.Module, inputs: Any, **kwargs: Any) -> tuple[Any, Any, int]:
    """The account traced once, then with the fake pass's records thrown away (the meta pass runs);
    the number of accounts the fake pass fed."""
    return _accounted_both_ways(monkeypatch, lambda: account_module(model, inputs, **kwargs))


def _accounted_both_ways(monkeypatch: pytest.MonkeyPatch, account: Any) -> tuple[Any, Any, int]:
    """``account()`` traced once, then with the fake pass's records thrown away; how many passes the fake pass fed."""
    fed = []
    original = one_pass.trace_once

    def counted(*args: Any, **kw: Any) -> Any:
        once = original(*args, **kw)
        fed.append(once is not None and once[0] is not None)
        return once

    with monkeypatch.context() as patched:
        patched.setattr(one_pass, "trace_once", counted)
        once = account()
    with monkeypatch.context() as patched:
        patched.setattr(one_pass, "trace_once", lambda *args, **kw: None)
        meta = account()
    return once, meta, sum(fed)


def _assert_same(once: Any, meta: Any) -> None:
    assert once.to_dict() == meta.to_dict()
    assert once.flops == meta.flops  # per module, forward and backward, the uncounted ops
    assert once.state == meta.state
    assert once.saved == meta.saved  # every storage: its module, shape, dtype, bytes, whether a parameter
    assert once.step_peak.predicted == meta.step_peak.predicted  # the peak, what is live at it, the timeline, the ops seen
    assert once.notes == meta.notes


def _meta_mlp() -> nn.Module:
    with torch.device("meta"):
        return generic.mlp(dim=32, hidden=64, depth=2)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "sgd-momentum", "adagrad"])
def test_a_meta_mlp_is_accounted_the_same_from_the_fake_pass(monkeypatch: pytest.MonkeyPatch, optimizer: str) -> None:
    model = _meta_mlp()
    once, meta, fed = _both_ways(monkeypatch, model, torch.empty(8, 32, device="meta"), optimizer=optimizer)
    assert fed == int(TRACED_ONCE)
    _assert_same(once, meta)
    assert once.saved.activation_bytes > 0 and once.flops.step_flops > 0 and once.state.at_step_bytes > 0


def test_a_partly_frozen_model_is_accounted_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen parameter: counted among the parameters, without a gradient or optimizer state."""
    model = _meta_mlp()
    model[0].requires_grad_(False)
    once, meta, fed = _both_ways(monkeypatch, model, torch.empty(8, 32, device="meta"))
    assert fed == int(TRACED_ONCE)
    _assert_same(once, meta)
    assert once.state.parts_bytes["parameters"] > once.state.parts_bytes["gradients"]


def test_resacct_gpt_with_its_own_loss_is_accounted_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.training.gpt import build_gpt

    model = build_gpt("gpt-nano", device="meta")
    model.train()
    tokens = torch.zeros(2, 16, dtype=torch.long, device="meta")
    once, meta, fed = _both_ways(monkeypatch, model, (tokens,), loss="cross-entropy")
    assert fed == int(TRACED_ONCE)
    _assert_same(once, meta)


@pytest.mark.parametrize("recipe", ["bf16", "bf16-autocast", "bf16-fp32-master"])
def test_recipes_the_fake_cpu_step_runs_differently_keep_the_meta_pass(monkeypatch: pytest.MonkeyPatch, recipe: str) -> None:
    """On the CPU a bf16 layer norm keeps bf16 statistics, the meta kernel float32; autocast runs on
    the CPU, not on meta; master weights are parted otherwise: those stay on the meta pass."""
    model = _meta_mlp()
    once, meta, fed = _both_ways(monkeypatch, model, torch.empty(8, 32, device="meta"), recipe=recipe)
    assert fed == 0
    assert (once.flops, once.state, once.saved) == (meta.flops, meta.state, meta.saved)  # a bf16 peak's timeline varies run to run


class _Checkpointed(nn.Module):
    """Two blocks of Linear → GELU → Linear, each under ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


def _checkpoint_runs_on_meta() -> bool:
    """torch 2.4's non-reentrant checkpoint looks up a device module ``torch.meta``, which it lacks."""
    from torch.utils.checkpoint import checkpoint

    try:
        checkpoint(torch.nn.functional.gelu, torch.empty(2, device="meta", requires_grad=True), use_reentrant=False)
    except AttributeError:
        return False
    return True


@pytest.mark.skipif(not _checkpoint_runs_on_meta(), reason=f"torch {torch.__version__}'s checkpoint does not run on meta (no torch.meta)")
def test_an_activation_checkpointed_model_is_accounted_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    with torch.device("meta"):
        model = _Checkpointed()
    once, meta, fed = _both_ways(monkeypatch, model, torch.empty(8, 32, device="meta"))
    assert fed == int(TRACED_ONCE)
    _assert_same(once, meta)
    assert once.flops.backward_flops > 2 * once.flops.forward_flops  # the blocks' forward again in backward


class _SavesItsOutput(torch.autograd.Function):
    """exp, saving its output (as a custom function does): a saved output that is no op's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.exp()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        return grad * out


class _InPlace(nn.Module):
    """In-place ops that save their result (relu_, sigmoid_) or a copy of ``self`` made before they run
    (div_ by a tensor), and a custom function saving its output: the saves autograd treats apart."""

    def __init__(self, *, modifies_a_saved_tensor: bool = False) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(32, 64), nn.Linear(64, 32)
        self.modifies_a_saved_tensor = modifies_a_saved_tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        h = torch.relu_(h.div_(h.sum(-1, keepdim=True) + 1))
        h = _SavesItsOutput.apply(self.second(h))
        return h.sigmoid_() if self.modifies_a_saved_tensor else h.sigmoid()  # sigmoid_ overwrites what exp saved


@pytest.mark.parametrize("modifies", [False, True], ids=["valid", "modifies-a-saved-tensor"])
def test_in_place_ops_and_a_custom_function_are_accounted_the_same(monkeypatch: pytest.MonkeyPatch, modifies: bool) -> None:
    """A step that overwrites a saved tensor cannot run (autograd raises in backward) — with saved-tensor hooks
    autograd no longer checks, so the recorder does: the fake pass fails as it does alone, the meta pass runs."""
    with torch.device("meta"):
        model = _InPlace(modifies_a_saved_tensor=modifies)
    once, meta, fed = _both_ways(monkeypatch, model, torch.empty(8, 32, device="meta"))
    assert fed == (0 if modifies or not TRACED_ONCE else 1)
    _assert_same(once, meta)
    assert (once.step_peak.predicted is None) == modifies


@pytest.mark.parametrize("case", ["gpt2", "llama-gqa", "mixtral"])
@pytest.mark.slow  # each a transformers model accounted twice
def test_transformers_models_are_accounted_the_same(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """GPT-2 (its sdpa call takes the math path on the fake CPU step, as on meta) from the fake pass; Llama
    with grouped-query attention and Mixtral take the CPU flash kernel there — meta the math path, which
    saves other tensors — so their FLOPs, state and saved tensors come from the meta pass, the peak from the fake one."""
    pytest.importorskip("transformers")
    from tests.fixtures_hf_models import tiny_gpt2, tiny_llama, tiny_mixtral

    with torch.device("meta"):
        model = {"gpt2": tiny_gpt2, "llama-gqa": tiny_llama, "mixtral": tiny_mixtral}[case]()
    if case == "llama-gqa":
        assert model.config.num_key_value_heads < model.config.num_attention_heads
    model.train()
    inputs = default_inputs(model, batch=2, seq=16, device="meta")
    once, meta, fed = _both_ways(monkeypatch, model, inputs)
    assert fed == (1 if case == "gpt2" and TRACED_ONCE else 0)
    _assert_same(once, meta)


def _hf_both_ways(monkeypatch: pytest.MonkeyPatch, spec: Any, **kwargs: Any) -> tuple[Any, Any, int]:
    """``account_hf_config`` traced once, then with the fake pass's records thrown away; how many builds the fake pass fed."""
    from resacct.account.answers.hf import account_hf_config

    return _accounted_both_ways(monkeypatch, lambda: account_hf_config(spec, **kwargs))


def _hf_spec(model_type: str, layers: int) -> Any:
    from resacct.checks.hf import _small_spec

    return _small_spec(model_type, 64, layers, 4, 2 if model_type == "llama" else 4, 96, 160, 128, 0, 0)


@pytest.mark.slow  # 0.9-2.4 s each alone: over the quick tier's line
@pytest.mark.parametrize("model_type, layers, recipe, fed_when_traced_once", [
    ("gpt2", 4, "fp32", 1),  # sdpa on the math path on the fake CPU step: FLOPs, state and saved tensors from the fake pass
    ("gpt2", 4, "bf16-fp32-master", 0),  # master weights: the meta pass runs, the peak from the fake one
    ("llama", 3, "fp32", 0),  # the fake CPU step takes sdpa's flash kernel, meta the math path
])
def test_an_hf_config_is_accounted_the_same_from_the_fake_pass(monkeypatch: pytest.MonkeyPatch, model_type: str, layers: int, recipe: str,
                                                              fed_when_traced_once: int) -> None:
    pytest.importorskip("transformers")
    once, meta, fed = _hf_both_ways(monkeypatch, _hf_spec(model_type, layers), batch=2, seq=24, recipe=recipe, layers="all")
    assert fed == (fed_when_traced_once if TRACED_ONCE else 0)
    assert once.to_dict() == meta.to_dict()
    for part in ("flops", "state", "saved", "notes", "checkpoint_weights_bytes"):
        assert getattr(once, part) == getattr(meta, part), part
    assert once.step_peak.predicted == meta.step_peak.predicted


@pytest.mark.slow  # four traced builds each way
def test_a_sampled_hf_config_is_accounted_the_same_from_the_fake_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 9-layer GPT-2 extrapolated from depths 3, 4 and 5: each sample traced once."""
    pytest.importorskip("transformers")
    once, meta, fed = _hf_both_ways(monkeypatch, _hf_spec("gpt2", 9), batch=2, seq=24, layers="sampled")
    assert fed == (3 if TRACED_ONCE else 0)
    assert once.to_dict() == meta.to_dict()
    assert once.step_peak.predicted == meta.step_peak.predicted


@pytest.mark.slow  # three traced builds, three ways
@pytest.mark.parametrize("model_type, tries", [("llama", 1), ("gpt2", 3)])
def test_a_sampled_config_tries_tracing_once_again_only_where_it_worked(monkeypatch: pytest.MonkeyPatch, model_type: str, tries: int) -> None:
    """A 9-layer Llama's fake CPU step takes sdpa's flash kernel at depth 3: the recording cannot feed the
    account, so depths 4 and 5 do not record again (one try); GPT-2's feeds it, and every depth tries. The
    account equals the one where every depth tries (and the meta pass's)."""
    pytest.importorskip("transformers")
    from resacct.account.answers.hf import account_hf_config

    spec = _hf_spec(model_type, 9)
    original_once, original_try = one_pass.trace_once, one_pass.trace_hf_step_once
    tried: list[int] = []

    def counted(*args: Any, **kw: Any) -> Any:
        tried.append(1)
        return original_once(*args, **kw)

    with monkeypatch.context() as patched:
        patched.setattr(one_pass, "trace_once", counted)
        hinted = account_hf_config(spec, batch=2, seq=24, layers="sampled")
    assert len(tried) == (tries if TRACED_ONCE else 1)  # before FAKE_PASS_FROM_TORCH the first try says no: no more tries

    def every_time(model: Any, inputs: Any, recipe: Any, optimizer: str, hint: Any) -> Any:
        hint.worth_trying = True
        return original_try(model, inputs, recipe, optimizer, hint)

    with monkeypatch.context() as patched:
        patched.setattr(one_pass, "trace_hf_step_once", every_time)
        every = account_hf_config(spec, batch=2, seq=24, layers="sampled")
    assert hinted.to_dict() == every.to_dict()
    assert hinted.step_peak.predicted == every.step_peak.predicted


def test_a_config_that_breaks_is_named_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake pass runs first now: a config whose model fails in its step still gets the meta pass's one line naming it."""
    pytest.importorskip("transformers")
    from resacct.account.answers.hf import account_hf_config
    from resacct.errors import ResacctError

    spec = _hf_spec("gpt2", 2)
    import transformers

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a kernel this build lacks\nsecond line")

    monkeypatch.setattr(transformers.models.gpt2.modeling_gpt2.GPT2MLP, "forward", broken)
    with pytest.raises(ResacctError, match=r"fails in its first step \(RuntimeError: a kernel this build lacks\)"):
        account_hf_config(spec, batch=1, seq=8, layers="all")
