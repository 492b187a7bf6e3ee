"""Any model, every command (issue 33): run, plan, infer and lora --hf-config answer for every
architecture resacct ships a config of, from the model built on the meta device."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from resacct.cli import main  # noqa: E402

ARCHITECTURES = ("gpt2", "llama-2-7b", "mistral-7b", "mixtral-8x7b", "qwen2-7b-instruct", "qwen3-8b", "qwen3-30b-a3b", "gemma-2-9b", "gemma-3-12b",
                 "phi-3-mini-4k", "olmo-2-0425-1b", "falcon-7b", "gpt-neox-20b", "bloom-560m", "deepseek-v3", "gpt-oss-20b")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow  # 1.02 s idle on 2026-11-28
def test_infer_counts_the_cache_the_model_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    """Falcon-7B's one key/value head (multi-query): 2 · 32 layers · 1 · 64 · 2 bytes a token in bf16 — read off its
    own past_key_values on meta; Llama-3-8B's beside resacct's closed form 2·L·g·e·b."""
    falcon = _json(capsys, "infer", "--hf-config", "falcon-7b", "--context", "512")
    assert falcon["kv_heads"] == 1 and falcon["kv_cache_bytes_per_token"] == 2 * 32 * 1 * 64 * 2 and falcon["formula_kv_cache_bytes_per_token"] is None
    assert falcon["parameters"] == 6_921_720_704  # the model card: 7B
    llama = _json(capsys, "infer", "--hf-config", "llama-3-8b", "--context", "512")
    assert llama["kv_cache_bytes_per_token"] == llama["formula_kv_cache_bytes_per_token"] == 2 * 32 * 8 * 128 * 2


@pytest.mark.slow  # 4.65 s idle on 2026-11-28
def test_run_takes_a_mixture_of_experts_active_parameters_from_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-30B-A3B on meta: 30.5B parameters, 3.35B a token runs (k = 8 of 128 routed experts) — the model card's 30.5B / 3.3B."""
    fields = _json(capsys, "run", "--hf-config", "qwen3-30b-a3b", "--tokens", "1e12", "--devices", "64", "--mfu", "0.4", "--seq", "256")
    assert fields["parameters_total"] == 30_532_122_624 and fields["parameters_active"] == 3_353_032_704
    assert fields["model_flops_per_token"] == 6 * 3_353_032_704
    # FlopCounterMode on meta: 6·(N less the embedding: a lookup, no matmul) + attention and the router — within 10 % of 6N at seq 256
    embedding = 151_936 * 2048
    assert 6 * (3_353_032_704 - embedding) < fields["traced"]["step_flops_per_token"] < 1.1 * fields["model_flops_per_token"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ARCHITECTURES)
def test_every_command_answers_for_every_architecture(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--hf-config", config, "--tokens", "1e12", "--devices", "64", "--mfu", "0.4", "--seq", "128"]) == 0
    assert main(["plan", "--hf-config", config, "--seq", "512", "--pp", "2", "--device", "h100"]) == 0
    assert main(["infer", "--hf-config", config, "--context", "1024", "--device", "h100"]) == 0
    capsys.readouterr()
    lora = _json(capsys, "lora", "--hf-config", config, "--seq", "128")
    assert lora["step_peak_bytes"] > lora["training_state_bytes"] > 0


def test_offload_reads_any_architecture_off_the_meta_model(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSpeed's largest_layer_params of Falcon-7B: its token embedding, 65,024 × 4,544, the most one module holds directly."""
    from resacct.account.load.meta_facts import meta_model_facts
    from resacct.account.load.hf_models import load_hf_config
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.offload import largest_module_parameters

    fields = _json(capsys, "offload", "--hf-config", "falcon-7b", "--device", "h100")
    assert fields["parameters"] == 6_921_720_704 and fields["largest_layer_parameters"] == 65_024 * 4_544
    llama = architecture_from_values(load_hf_config("llama-2-7b").values)
    assert meta_model_facts("llama-2-7b").largest_module_parameters == largest_module_parameters(llama)  # the closed form, where there is one


def test_plan_counts_the_meta_model_beside_the_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    llama = _json(capsys, "plan", "--hf-config", "llama-3-8b", "--memory-gb", "80")
    assert llama["parameters"] == llama["formula_parameters"] == 8_030_261_248 and "meta" in llama["parameters_basis"]
    assert main(["plan", "--hf-config", "bloom-560m", "--memory-gb", "80"]) == 2  # ALiBi: no context length in the config
    assert "give --seq TOKENS" in capsys.readouterr().err
    bloom = _json(capsys, "plan", "--hf-config", "bloom-560m", "--seq", "2048", "--memory-gb", "80")
    assert bloom["parameters"] == 559_214_592 and bloom["formula_parameters"] is None  # the model card: 559M
