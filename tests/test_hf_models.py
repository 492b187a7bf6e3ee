"""Raw Hugging Face models under ``resacct account`` (transformers from configs only: no
weights, no hub). Skipped when transformers is not installed (the ``resacct[hf]`` extra)."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from resacct.account.answers.generic import account_named_model  # noqa: E402
from resacct.cli import main  # noqa: E402
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel  # noqa: E402


def _bar() -> dict:
    """The claim hf-llama-sdpa-fill-equals-eager-twin's measurement (cached: measured once per run)."""
    from resacct.checks.hf import sdpa_over_eager_flops

    outcome = sdpa_over_eager_flops(layers=2, batch=2, seq=16)
    return {"ratio": outcome.measured, **outcome.quantities}


@pytest.mark.slow
def test_llama_sdpa_on_a_real_cpu_step_counts_what_its_eager_twin_counts():
    """Issue 12's bar: a raw LlamaForCausalLM (GQA, causal; tests.fixtures_hf_models.tiny_llama's
    config) with sdpa attention on a real CPU step — resacct's count equals FlopCounterMode's on
    the eager-attention twin, ratio 1.000; FlopCounterMode alone misses the fused kernel and
    resacct warns about it."""
    bar = _bar()
    assert bar["ratio"] == 1.0
    if cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=16, dtype="float32") == "math":
        # torch 2.8 runs this grouped-query sdpa on the CPU by the math kernel: FlopCounterMode counts its matmuls, no gap
        assert bar["flop_counter_alone_flops"] == bar["eager_flops"] and bar["gap_filled_flops"] == bar["attention_recompute_flops"] == 0
        assert bar["alone_warnings"] == bar["filled_warnings"] == 0
        return
    assert bar["flop_counter_alone_flops"] < bar["eager_flops"] and bar["alone_warnings"] == 2  # the forward and the backward kernel
    assert bar["filled_warnings"] == 0 and bar["gap_filled_flops"] == bar["eager_flops"] - bar["flop_counter_alone_flops"]
    assert bar["attention_recompute_flops"] == 2 * (2 * 4) * 16 * 16 * 16 * 2  # q·kᵀ again per layer: 2·(b·h)·s·e·s, 2 layers


@pytest.mark.slow  # ~1.1 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_cli_accounts_a_raw_llama_with_its_own_loss(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_llama", "--batch", "2", "--seq", "16", "--no-measure", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_class"] == "LlamaForCausalLM" and report["input_shape"] == [2, 16] and report["input_dtype"] == "int64"
    assert report["loss"] == "model" and report["device"] == "meta" and report["warnings"] == []
    step = {row["quantity"]: row for row in report["flops"]}["step"]
    assert step["measured_flops"] == _bar()["eager_flops"]  # on meta sdpa decomposes into the eager matmuls
    state = {row["quantity"]: row for row in report["training_state"]}["at optimizer step (fp32, AdamW)"]
    assert state["measured_bytes"] == state["predicted_bytes"]


@pytest.mark.slow  # ~0.8 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_cli_accounts_a_raw_gpt2_from_its_logits(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_gpt2", "--batch", "2", "--seq", "8", "--loss", "mean", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "(GPT2LMHeadModel): input (2, 8) int64, mean loss" in out and "on meta" in out


def test_seq_longer_than_the_config_allows_is_one_line(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_gpt2", "--seq", "33"]) == 2
    assert "seq 33 is longer than the model's context length 32; expected seq ≤ 32" in capsys.readouterr().err


def test_default_seq_of_a_token_model_is_its_context():
    account = account_named_model("tests.fixtures_hf_models:tiny_gpt2", batch=1, measure=False)
    assert account.input_shape == (1, 32) and account.device == "meta"
