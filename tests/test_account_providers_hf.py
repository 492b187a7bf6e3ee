"""A raw Mixtral at transformers' defaults (issue 22): its experts kernel — ``grouped_mm`` (float32
refused on meta) or ``eager`` (``nonzero``'s data-dependent shape) — cannot run on the meta
device. The account still shows resacct's predictions, measured "—", and one line names the
kernel and what to do (``--measure``, or ``experts_implementation='batched_mm'``); an error from
anything else still stops with its own line. Skipped without transformers."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from resacct.account.answers.generic import account_named_model  # noqa: E402
from resacct.account.load.user_code import UserCodeError  # noqa: E402
from resacct.cli import main  # noqa: E402
from resacct.formulas.hf_formulas import architecture_of, predict_step_flops  # noqa: E402

DEFAULT = "tests.test_account_providers_hf:default_mixtral"
EAGER = ("tests.fixtures_hf_models:tiny_mixtral", {"experts_implementation": "eager"})


def default_mixtral():  # type: ignore[no-untyped-def]
    """tests.fixtures_hf_models' tiny Mixtral with transformers' own default experts kernel."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
    return MixtralForCausalLM._from_config(config, attn_implementation="sdpa")


class DataDependent(nn.Module):
    """A step that cannot run on meta for a reason no provider knows: the error stands."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)[torch.nonzero(x[:, 0] > 0)[:, 0]]


def data_dependent():  # type: ignore[no-untyped-def]
    return DataDependent(), torch.randn(3, 4)


def test_transformers_default_experts_kernel_is_not_batched_mm():
    """The premise: at transformers' defaults a Mixtral's experts are not the kernel meta traces."""
    assert default_mixtral().config._experts_implementation in ("grouped_mm", "eager")


@pytest.mark.parametrize(("spec", "model_args"), [(DEFAULT, {}), EAGER], ids=["default", "eager"])
@pytest.mark.parametrize("measure", [False, None], ids=["meta", "auto"])
def test_a_mixtral_meta_cannot_trace_is_predicted_with_one_line_saying_why(spec, model_args, measure):
    account = account_named_model(spec, model_args=model_args, batch=2, seq=8, measure=measure)
    if not model_args and not hasattr(torch, "_grouped_mm"):
        # torch < 2.8 has no torch._grouped_mm: transformers' grouped_mm kernel runs its own fallback, which meta traces
        # (measured on torch 2.6): the account traces the step as any model's, no line, FLOPs measured
        assert not [note for note in account.notes if "experts kernel" in note]
        assert {(row.section, row.quantity): row for row in account.rows()}["FLOPs", "step"].measured > 0
        return
    assert account.device == "meta" and account.hf is not None and account.loss == "model"
    kernel = "eager" if model_args else default_mixtral().config._experts_implementation
    lines = [note for note in account.notes if "experts kernel" in note]
    assert lines == [f"predicted only: MixtralForCausalLM's experts kernel {kernel!r} cannot be traced on the meta device "
                     f"({'NotImplementedError' if kernel == 'eager' else 'RuntimeError'} in MixtralExperts); measure it with --measure (on the CPU), "
                     "or build the model with experts_implementation='batched_mm' (traceable on meta)"]
    predicted = predict_step_flops(architecture_of(default_mixtral().config), batch=2, seq=8)
    rows = {(row.section, row.quantity): row for row in account.rows()}
    for quantity, value in (("forward", predicted.forward_flops), ("backward", predicted.backward_flops), ("step", predicted.step_flops)):
        assert rows["FLOPs", quantity].predicted == value > 0 and rows["FLOPs", quantity].measured is None
        assert rows["FLOPs", quantity].note == "not traced (see the note)"
    state = [row for (section, _), row in rows.items() if section == "training state"]
    assert state and all(row.predicted and row.measured is None for row in state)
    assert rows["parameter counts", "total"].predicted == rows["parameter counts", "total"].measured == 63904
    assert rows["checkpoint", "weights (float32)"].predicted == rows["checkpoint", "weights (float32)"].measured
    assert rows["activations", "saved for backward"].measured is None
    assert account.step_peak is not None and account.step_peak.predicted is None


def test_the_command_line_shows_the_predictions_and_the_line(capsys):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch._grouped_mm: transformers' grouped_mm falls back to ops meta traces (nothing refused)")
    assert main(["account", "--model", DEFAULT, "--batch", "2", "--seq", "8"]) == 0
    out = capsys.readouterr().out
    step = [line.split("│") for line in out.splitlines() if "│ step " in line][0]
    assert step[3].strip() == "3.465 MFLOPs" and step[4].strip() == "—"
    assert out.count("note: predicted only: MixtralForCausalLM's experts kernel 'grouped_mm' cannot be traced on the meta device") == 1
    assert main(["account", "--model", DEFAULT, "--batch", "2", "--seq", "8", "--no-measure", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    flops = {row["quantity"]: row for row in report["flops"]}["step"]
    assert flops["predicted_flops"] == 3465216 and flops["measured_flops"] is None
    assert report["tracer_gaps"] == [] and report["warnings"] == []


def test_the_python_api_reports_the_prediction_and_nothing_measured():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch._grouped_mm: transformers' grouped_mm falls back to ops meta traces (nothing refused)")
    from resacct.api import account_model

    report = account_model(DEFAULT, batch=2, seq=8, measure=False)
    assert report.flops.predicted == 3465216 and report.flops.measured is None
    assert report.state.predicted and report.state.measured is None
    assert "measured —" in str(report)


def test_an_error_no_provider_knows_still_stops_with_its_line():
    with pytest.raises(UserCodeError, match=r"the step of DataDependent \(forward, loss or backward\) raised NotImplementedError"):
        account_named_model("tests.test_account_providers_hf:data_dependent", measure=False)


@pytest.mark.slow
def test_on_the_cpu_the_default_mixtral_is_measured_as_before():
    """--measure: grouped_mm runs on the CPU; nothing is left out."""
    account = account_named_model(DEFAULT, batch=2, seq=8, measure=True)
    assert account.device == "cpu" and not [note for note in account.notes if "experts kernel" in note]
    assert account.flops.step_flops > 0 and account.saved.activation_bytes > 0
