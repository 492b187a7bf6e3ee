"""Raw Hugging Face models under ``resacct account`` (transformers from configs only: no
weights, no hub). Skipped when transformers is not installed (the ``resacct[hf]`` extra)."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from resacct.account_generic import account_model  # noqa: E402
from resacct.cli import main  # noqa: E402
from resacct.step_measurements import trace_step_flops  # noqa: E402
from tests.fixtures_hf_models import tiny_llama  # noqa: E402


def _eager_twin_flops(batch: int, seq: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = tiny_llama("eager")
    ids = torch.randint(0, 128, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return int(counter.get_total_flops())


def test_llama_sdpa_on_a_real_cpu_step_counts_what_its_eager_twin_counts():
    """Issue 12's bar: a raw LlamaForCausalLM (GQA, causal) with sdpa attention on a real CPU
    step — resacct's count equals FlopCounterMode's on the eager-attention twin, ratio 1.000;
    FlopCounterMode alone misses the fused kernel (and resacct warns about it)."""
    model = tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 16))
    filled = trace_step_flops(model, lambda: model(input_ids=ids, labels=ids).loss)
    alone = trace_step_flops(model, lambda: model(input_ids=ids, labels=ids).loss, fill_tracer_gaps=False)
    eager = _eager_twin_flops(2, 16)
    assert filled.step_flops / eager == 1.0
    assert alone.step_flops < eager and any("flash_attention_for_cpu" in warning for warning in alone.warnings)
    assert filled.warnings == [] and filled.gap_filled_flops == eager - alone.step_flops
    assert filled.attention_recompute_flops == 2 * 2 * 4 * 16 * 16 * 16 * 2  # q·kᵀ again per layer: 2·(b·h)·s·d·s, 2 layers


def test_cli_accounts_a_raw_llama_with_its_own_loss(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_llama", "--batch", "2", "--seq", "16", "--no-measure", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_class"] == "LlamaForCausalLM" and report["input_shape"] == [2, 16] and report["input_dtype"] == "int64"
    assert report["loss"] == "model" and report["device"] == "meta" and report["warnings"] == []
    step = {row["quantity"]: row for row in report["flops"]}["step"]
    assert step["measured_flops"] == _eager_twin_flops(2, 16)
    state = {row["quantity"]: row for row in report["training_state"]}["at optimizer step (fp32, AdamW)"]
    assert state["measured_bytes"] == state["predicted_bytes"]


def test_cli_accounts_a_raw_gpt2_from_its_logits(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_gpt2", "--batch", "2", "--seq", "8", "--loss", "mean", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "(GPT2LMHeadModel): input (2, 8) int64, mean loss" in out and "on meta" in out


def test_seq_longer_than_the_config_allows_is_one_line(capsys):
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_gpt2", "--seq", "33"]) == 2
    assert "seq 33 is longer than the model's context length 32; expected seq ≤ 32" in capsys.readouterr().err


def test_default_seq_of_a_token_model_is_its_context():
    account = account_model("tests.fixtures_hf_models:tiny_gpt2", batch=1, measure=False)
    assert account.input_shape == (1, 32) and account.device == "meta"
