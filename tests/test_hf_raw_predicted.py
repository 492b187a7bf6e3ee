"""A raw transformers model under ``resacct account --model module:factory`` is predicted as
``--hf-config`` predicts it (resacct.account.answers.providers): resacct's formulas from the model's config
beside the raw path's own measurements — activations against torch's ``saved_tensors_hooks``
(resacct.measurement.activations.record_saved_activations, by storage), never the formula against itself.
Skipped when transformers is not installed (the ``resacct[hf]`` extra)."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from resacct.account.answers.generic import ModelAccount, account_named_model  # noqa: E402
from resacct.cli import main  # noqa: E402
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel  # noqa: E402

LLAMA = "tests.fixtures_hf_models:tiny_llama"  # GQA: 4 query heads, 2 key/value heads
GPT2 = "tests.fixtures_hf_models:tiny_gpt2"  # Conv1D, tied head, dropout 0.1 everywhere


def assert_predicted_equals_measured(account: ModelAccount) -> None:
    """Every predicted activation byte against the saved-tensor measurement: the step, the first
    layer, each module; parameters, state and checkpoint against the built model and optimizer."""
    assert account.hf is not None, account.notes
    assert account.hf.activation_formula_gap() is None
    assert account.predicted_saved_bytes == account.saved.activation_bytes > 0
    rows = {(row.section, row.quantity): row for row in account.rows()}
    for key in (("activations", "saved for backward"), ("activations", "one layer (the first)"), ("parameter counts", "total"),
                ("parameter counts", "tensors"), ("checkpoint", "weights + master + optimizer state")):
        assert rows[key].predicted == rows[key].measured, (key, rows[key])
    for module in account.per_module_rows():
        assert module.predicted_saved_bytes == module.measured_saved_bytes, module
    at_step = [row for (section, quantity), row in rows.items() if quantity.startswith("at optimizer step")]
    assert at_step and at_step[0].predicted == at_step[0].measured


@pytest.mark.parametrize(("spec", "model_args", "batch", "seq"), [
    (LLAMA, {}, 2, 16),                        # sdpa: the CPU flash kernel; the math decomposition on meta
    (LLAMA, {"attention": "eager"}, 1, 12),    # batch 1: the shifted labels are a view
    (GPT2, {}, 2, 8),                          # sdpa with dropout: the math kernel, its masks
    (GPT2, {"attention": "eager"}, 1, 8),      # batch 1: q is a view of the qkv output
])
@pytest.mark.parametrize("measure", [True, False], ids=["cpu", "meta"])
@pytest.mark.slow  # 8 cases, 6.1 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_a_raw_model_is_predicted_to_the_byte(spec, model_args, batch, seq, measure):
    account = account_named_model(spec, model_args=model_args, batch=batch, seq=seq, measure=measure)
    assert account.device == ("cpu" if measure else "meta")
    assert_predicted_equals_measured(account)
    if not measure:  # FlopCounterMode alone (on the CPU sdpa's fused kernel is filled by resacct: not a measurement)
        assert account.predicted_step_flops == account.flops.step_flops


def test_a_broken_formula_term_fails_the_comparison(monkeypatch):
    """The comparison has teeth: drop RMSNorm's float32 rsqrt (4·T bytes) from the formula."""
    import resacct.formulas.hf_activation_formulas as formulas

    account = account_named_model(LLAMA, batch=2, seq=8, measure=True)
    assert_predicted_equals_measured(account)
    right = formulas._rms_norm
    monkeypatch.setattr(formulas, "_rms_norm", lambda *args: [term for term in right(*args) if "rsqrt" not in term.what])
    with pytest.raises(AssertionError):
        assert_predicted_equals_measured(account)
    assert account.saved.activation_bytes - account.predicted_saved_bytes == 5 * 4 * 2 * 8  # 2 norms × 2 layers + the final one


@pytest.mark.slow
@pytest.mark.parametrize("measure", [True, False], ids=["cpu", "meta"])
def test_a_raw_mixtral_with_batched_mm_experts_is_predicted_to_the_byte(measure):
    assert_predicted_equals_measured(account_named_model("tests.fixtures_hf_models:tiny_mixtral", batch=2, seq=8, measure=measure))


@pytest.mark.parametrize(("spec", "model_args", "options", "gap"), [
    ("tests.fixtures_hf_models:tiny_mixtral", {"experts_implementation": "grouped_mm"}, {"measure": True},
     "experts implementation 'grouped_mm': resacct's Mixtral activation formula is for 'batched_mm'"),
    ("tests.fixtures_hf_models:tiny_mistral", {"sliding_window": 8}, {"seq": 8, "measure": True},
     "seq 8 is not shorter than the sliding window 8: resacct predicts the CPU flash kernel without a mask only; expected seq < 8"),
    (GPT2, {}, {"loss": "mean", "measure": False}, "loss 'mean': resacct's activation formula is for the model's own next-token loss"),
])
def test_a_step_outside_the_formula_says_why_and_keeps_the_rest(spec, model_args, options, gap):
    account = account_named_model(spec, model_args=model_args, batch=2, **{"seq": 8, **options})
    assert account.hf is not None and account.predicted_saved_bytes is None
    assert gap in account.hf.activation_formula_gap()
    saved = {row.quantity: row for row in account.rows() if row.section == "activations"}["saved for backward"]
    assert saved.predicted is None and f"measured only: {gap}" in saved.note
    parameters = {row.quantity: row for row in account.rows()}["total"]
    assert parameters.predicted == parameters.measured


@pytest.mark.slow  # 1.16 s idle on 2026-11-28
def test_the_sliding_window_boundary_is_measured():
    """One token short of the window sdpa gets no mask: exact; at the window it does (refused
    above): transformers then repeats k and v to every query head and torch runs its CPU flash
    kernel with the mask, which keeps more than the maskless flash kernel (k and v on 2 heads) and
    less than the maskless math kernel (s² scores) that torch 2.8 runs grouped-query attention by."""
    below = account_named_model("tests.fixtures_hf_models:tiny_mistral", model_args={"sliding_window": 9}, batch=2, seq=8, measure=True)
    assert_predicted_equals_measured(below)
    at = account_named_model("tests.fixtures_hf_models:tiny_mistral", model_args={"sliding_window": 8}, batch=2, seq=8, measure=True)
    if cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=16, dtype="float32") == "flash":
        assert at.saved.activation_bytes > below.saved.activation_bytes
    else:
        assert at.saved.activation_bytes < below.saved.activation_bytes


@pytest.mark.parametrize(("spec", "line"), [
    pytest.param("tests.fixtures_hf_models:tiny_bert", "predicted: — (transformers BertForMaskedLM: architecture 'bert' not modelled; "
                 "resacct models the causal LMs of gpt2, llama, mistral, mixtral)", marks=pytest.mark.slow),  # imports BERT: 0.8 s
    ("tests.fixtures_hf_models:tiny_llama_classifier", "predicted: — (transformers LlamaForSequenceClassification: "
                                                       "resacct models llama as LlamaForCausalLM, with its own next-token loss)"),
])
@pytest.mark.slow  # 0.82 s idle on 2026-11-28
def test_a_transformers_model_resacct_does_not_model_is_one_line(capsys, spec, line):
    assert main(["account", "--model", spec, "--batch", "2", "--seq", "8", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"note: {line}") == 1, out
    saved = [text for text in out.splitlines() if "saved for backward" in text]
    assert saved and saved[0].split("│")[3].strip() == "—"


@pytest.mark.slow  # ~0.8 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_json_carries_the_predicted_fields_with_units(capsys):
    assert main(["account", "--model", LLAMA, "--batch", "2", "--seq", "16", "--no-measure", "--json", "--per-module"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hf_model_type"] == "llama" and report["device"] == "meta"
    saved = {row["quantity"]: row for row in report["activations"]}
    assert saved["saved for backward"]["predicted_bytes"] == saved["saved for backward"]["measured_bytes"] == 355460
    assert saved["one layer (the first)"]["ratio"] == 1.0
    totals = {row["quantity"]: row for row in report["parameter_counts"]}["total"]
    assert totals["predicted_parameters"] == totals["measured_parameters"] == 90432
    step = {row["quantity"]: row for row in report["flops"]}["step"]
    assert step["predicted_flops"] == step["measured_flops"] == 16515072
    assert all(row["predicted_bytes"] == row["measured_bytes"] for row in report["checkpoint"])
    assert all(module["predicted_saved_bytes"] == module["measured_saved_bytes"] for module in report["per_module"])
    assert any(note.startswith("predicted by resacct's llama formulas") for note in report["notes"])


def test_text_shows_predicted_beside_measured(capsys):
    assert main(["account", "--model", GPT2, "--batch", "2", "--seq", "8", "--no-measure"]) == 0
    out = capsys.readouterr().out
    saved = [text.split("│") for text in out.splitlines() if "saved for backward" in text][0]
    assert saved[3].strip() == saved[4].strip() == "150.5 kB" and saved[5].strip() == "1.000"
    assert "predicted by resacct's gpt2 formulas from GPT2LMHeadModel's config" in out
