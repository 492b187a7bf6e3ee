"""The providers of ``resacct account --model``: ONE ordered registry
(:mod:`resacct.account.answers.providers`) that :mod:`resacct.account.answers.generic` asks once — a model family is
added in one place — and the FLOP rows that say where their numbers come from (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resacct.account.answers import providers
from resacct.account.answers.generic import account_module
from resacct.account.answers.providers import PROVIDER_ORDER, PROVIDERS, Prediction, Provider, no_formula_note, register_provider
from resacct.errors import ResacctError
from resacct.formulas.account_formulas import StackPrediction

GENERIC = Path(providers.__file__).with_name("generic.py")


class Toy(nn.Module):
    """A model no shipped provider claims: one Linear under a forward of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 2


class Attention(nn.Module):
    """One causal self-attention through ``F.scaled_dot_product_attention`` (the fused CPU kernel on a real step)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (part.reshape(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for part in self.qkv(x).chunk(3, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, dim))


def test_the_registry_order_is_the_documented_one():
    """linear-stack, transformers-causal-lm, none: as the module's docstring lists them, the fallback last."""
    assert [provider.name for provider in PROVIDERS] == list(PROVIDER_ORDER) == ["linear-stack", "transformers-causal-lm", "none"]
    documented = [providers.__doc__.index(f"``{name}``") for name in PROVIDER_ORDER]
    assert documented == sorted(documented)
    assert PROVIDERS[-1].applies(Toy()) and not any(provider.applies(Toy()) for provider in PROVIDERS[:-1])
    assert PROVIDERS[0].applies(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)))


def test_the_generic_path_asks_the_registry_and_names_no_provider():
    """generic.py imports the registry's entry points only: no provider's formula by name."""
    tree = ast.parse(GENERIC.read_text(encoding="utf-8"))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert not names & {"predict_stack_step", "hf_raw_account", "no_formula_note", "transformers_class"}, names
    assert {"predict_step", "untraced_note"} <= names


def test_a_provider_registered_in_one_place_predicts_account_module():
    """A dummy family, registered once, is what account_module uses — given the step's own
    measurements — and taking it out gives the fallback's line again."""
    seen = []

    def predict(step):  # type: ignore[no-untyped-def]
        seen.append(step)
        matmul = 2 * 3 * 4 * 2
        return Prediction("toy", stack=StackPrediction({"linear": matmul}, {"linear": matmul}, {"linear": 3 * 4 * 4}), note="predicted by the toy formula")

    x = torch.randn(3, 4)
    remove = register_provider(Provider("toy", applies=lambda model: isinstance(model, Toy), predict=predict))
    try:
        assert [provider.name for provider in PROVIDERS] == ["linear-stack", "transformers-causal-lm", "toy", "none"]
        account = account_module(Toy(), x, optimizer="sgd", measure_peaks=False)
    finally:
        remove()
    assert [provider.name for provider in PROVIDERS] == list(PROVIDER_ORDER)
    assert len(seen) == 1 and seen[0].flops is account.flops and seen[0].saved is account.saved and seen[0].loss == "mean"
    assert account.notes == ["predicted by the toy formula"]
    flops = {row.quantity: row for row in account.rows() if row.section == "FLOPs"}
    assert flops["forward"].predicted == flops["forward"].measured == 48
    assert account.predicted_step_flops == 96 and account.predicted_saved_bytes == 48
    without = account_module(Toy(), x, optimizer="sgd", measure_peaks=False)
    assert without.predicted is None and without.notes == [no_formula_note(Toy())]


def test_a_provider_name_is_registered_once():
    with pytest.raises(ResacctError, match="provider 'none' is registered already"):
        register_provider(Provider("none", applies=lambda model: True, predict=lambda step: Prediction("none")))
    assert [provider.name for provider in PROVIDERS] == list(PROVIDER_ORDER)


def test_the_flop_rows_say_when_part_of_the_number_is_resaccts_sdpa_fill():
    """Issue 22: a real CPU step through the fused attention kernel (FlopCounterMode counts it 0,
    resacct fills it from the call's shapes) is not labelled "FlopCounterMode (matmuls)"."""
    account = account_module(Attention(), torch.randn(2, 16, 16), optimizer="sgd", measure_peaks=False)
    filled, step = account.flops.gap_filled_flops, account.flops.step_flops
    assert 0 < filled < step
    notes = {row.quantity: row.note for row in account.rows() if row.section == "FLOPs"}
    assert notes == {"forward": "FlopCounterMode + resacct's sdpa fill", "backward": "FlopCounterMode + resacct's sdpa fill",
                     "step": f"FlopCounterMode + resacct's sdpa fill ({filled:,} of {step:,} FLOPs)"}


def test_the_flop_rows_of_plain_matmuls_keep_their_label():
    account = account_module(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(5, 4), optimizer="sgd", measure_peaks=False)
    assert {row.note for row in account.rows() if row.section == "FLOPs"} == {"FlopCounterMode (matmuls)"}
    assert account.flops.gap_filled_flops == 0


@pytest.mark.slow
def test_the_gpt_flop_rows_say_how_much_is_the_sdpa_fill():
    from resacct.account import account_gpt

    account = account_gpt("gpt-nano", batch=1, seq=8, attention="sdpa", measure=True, time_step=False)
    f = account.flops
    assert f.gap_filled_flops > 0
    step = {row.quantity: row.note for row in account.rows()}["step (exact per-matmul formula)"]
    assert step == f"FlopCounterMode + resacct's sdpa fill ({f.gap_filled_flops:,} of {f.step_flops:,} FLOPs)"


@pytest.mark.slow  # 1.44 s idle on 2026-11-28
def test_no_account_module_imports_the_package_back_under_type_checking(monkeypatch):
    """Issue 21: ``if TYPE_CHECKING:`` imports hide circles from the layer test (they never run);
    counted here, no circle may pass through resacct.account (layout.py imported StepAccount back)."""
    import tests.test_import_layers as layers
    from resacct.account import StepAccount, StepTiming
    from resacct.account.render.step_account import StepAccount as Defined

    assert StepAccount is Defined and StepTiming.__module__ == "resacct.account.render.step_account"
    monkeypatch.setattr(layers, "_is_type_checking_block", lambda node: False)
    cycles = [sorted(cycle) for cycle in layers.import_cycles(layers.import_graph()) if any(m.startswith("resacct.account") for m in cycle)]
    assert cycles == []
