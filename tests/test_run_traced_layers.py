"""``resacct run --hf-config``'s traced FLOPs per token (issue 34, fast answers): a deep stack of repeated layers is
traced at three shallow depths and extrapolated, as the account is, and must equal FlopCounterMode over every layer
(``--trace-all-layers``) — a plain stack, one with a prefix built apart (DeepSeek-V3's dense layers) and one whose
layers alternate kinds (Gemma-2's sliding and full attention, a unit of two)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from resacct.cli import main  # noqa: E402

_DECODER = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 160,
            "max_position_embeddings": 128}
CONFIGS = {
    "llama": ({"model_type": "llama", **_DECODER, "num_hidden_layers": 20}, "depths 3, 4, 5 (12 layers, not 20)"),
    "deepseek_v3": ({"model_type": "deepseek_v3", "vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                     "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                     "first_k_dense_replace": 2, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                     "v_head_dim": 16, "n_group": 1, "topk_group": 1, "max_position_embeddings": 128, "num_hidden_layers": 24},
                    "depths 5, 6, 7 (18 layers, not 24)"),
    "gemma2": ({"model_type": "gemma2", **_DECODER, "head_dim": 16, "sliding_window": 16, "num_hidden_layers": 30},
               "depths 6, 8, 10 (24 layers, not 30)"),
}


def _traced(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict:
    assert main(["run", "--hf-config", str(path), "--tokens", "1e9", "--devices", "8", "--mfu", "0.4", "--seq", "24", *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["traced"]


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name != "llama" else []) for name in sorted(CONFIGS)])  # 5-10 s each
def test_runs_sampled_flops_per_token_are_every_layer_traced(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values, depths = CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    sampled = _traced(capsys, path)
    whole = _traced(capsys, path, "--trace-all-layers")
    assert depths in sampled["layers"] and whole["layers"] == f"all {values['num_hidden_layers']} layers traced"
    assert sampled["step_flops_per_token"] == whole["step_flops_per_token"] > 0


def test_trace_all_layers_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--params", "7B", "--tokens", "1e12", "--devices", "8", "--mfu", "0.4", "--trace-all-layers"]) == 2
    assert "--trace-all-layers applies to --hf-config" in capsys.readouterr().err
