"""One LoRA step's FLOPs and saved activations (resacct.formulas.lora: lora_step_flops,
lora_saved_terms) and how ``resacct lora`` shows them: unit tests of the gradient-flow rules,
plus a comparison with real peft steps on the CPU for the branches the claims
(resacct/specs/finetune.claims.yaml) do not reach — eager attention with only some of q, k, v
adapted, a float32 base whose o_proj adapter reads sdpa's output, batch 1, LoRA dropout."""

from __future__ import annotations

import json
import warnings

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import HfArchitecture, predict_step_flops
from resacct.formulas.lora import lora_saved_terms, lora_step_flops, predict_lora_saved_bytes
from tests.trace_memo import LORA_7B_GROUP, memoized_lora_trace  # noqa: F401  (a fixture)

TINY = HfArchitecture(family="llama", vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=96, positions=64)
LLAMA2_7B = HfArchitecture(family="llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, mlp=11008, positions=4096)


def test_forward_is_the_full_forward_plus_the_adapters() -> None:
    full = predict_step_flops(TINY, batch=2, seq=16).forward_flops
    lora = lora_step_flops(TINY, rank=4, targets=("q_proj",), batch=2, seq=16)
    assert lora.forward_flops == full + 2 * TINY.layers * 2 * 16 * 4 * (64 + 64)


def test_backward_skips_the_bases_weight_gradients() -> None:
    full = predict_step_flops(LLAMA2_7B, batch=1, seq=2048)
    lora = lora_step_flops(LLAMA2_7B, rank=16, targets=("q_proj", "v_proj"), batch=1, seq=2048)
    assert 0.66 < lora.step_flops / full.step_flops < 0.70          # about 4NT of 6NT
    assert lora.backward_flops < full.backward_flops


def test_first_layer_before_its_first_adapter_costs_no_backward() -> None:
    mlp_only = lora_step_flops(TINY, rank=4, targets=("down_proj",), batch=2, seq=16)
    attention_too = lora_step_flops(TINY, rank=4, targets=("q_proj", "down_proj"), batch=2, seq=16)
    score_matmul = 2 * 2 * 4 * 16 * 16 * 16
    assert attention_too.backward_by_part["attention"] - mlp_only.backward_by_part["attention"] == 4 * score_matmul
    # eager attention: q's adapter alone asks for the gradients of q and of the scores, not k's nor v's
    eager = lora_step_flops(TINY, rank=4, targets=("q_proj",), batch=2, seq=16, attention="eager")
    assert eager.backward_by_part["attention"] == (TINY.layers - 1) * 4 * score_matmul + 2 * score_matmul


def test_adapter_input_copies_depend_on_the_base_dtype() -> None:
    def adapter_inputs(dtype: str) -> int:
        terms = lora_saved_terms(TINY, rank=4, targets=("q_proj", "k_proj", "v_proj"), batch=2, seq=16, dtype=dtype)
        return sum(t.bytes for t in terms if t.module.endswith("lora_A"))

    tokens = 32
    assert adapter_inputs("bfloat16") == TINY.layers * 3 * 4 * tokens * 64     # a float32 copy per adapter
    assert adapter_inputs("float32") == TINY.layers * 1 * 4 * tokens * 64      # one tensor, shared


def test_dropout_keeps_a_mask_only_where_the_input_needs_a_gradient() -> None:
    terms = lora_saved_terms(TINY, rank=4, targets=("q_proj",), batch=2, seq=16, dropout=0.1)
    masks = [t.module for t in terms if "dropout" in t.module]
    assert masks == ["model.layers.1.self_attn.q_proj.lora_dropout"]


@pytest.mark.usefixtures("memoized_lora_trace")
@pytest.mark.xdist_group(LORA_7B_GROUP)
@pytest.mark.slow  # the 7B LoRA step traced (paid by another test of the lora-7b group until now)
def test_lora_activations_of_a_7b_are_what_the_lora_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")  # the traced LoRA step (torch 2.4: transformers 5.x and peft cannot build it)
    assert main(["lora", "--hf-config", "llama-2-7b", "--rank", "16", "--batch", "1", "--seq", "2048", "--memory-gb", "24", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["activation_bytes"] == predict_lora_saved_bytes(LLAMA2_7B, rank=16, targets=("q_proj", "v_proj"), batch=1, seq=2048)
    assert fields["activation_basis"] == "predicted" and fields["fits"] is False and fields["largest_batch"] == 0
    assert fields["step_flops"] == lora_step_flops(LLAMA2_7B, rank=16, targets=("q_proj", "v_proj"), batch=1, seq=2048).step_flops
    assert fields["headroom_bytes"] == pytest.approx(24e9 - fields["total_bytes"])
    assert main(["lora", "--hf-config", "llama-2-7b", "--rank", "16", "--batch", "1", "--seq", "2048", "--memory-gb", "24"]) == 0
    text = capsys.readouterr().out
    assert "does NOT fit" in text and "try --gradient-checkpointing" in text and "FLOPs a step" in text


@pytest.mark.usefixtures("memoized_lora_trace")
@pytest.mark.xdist_group(LORA_7B_GROUP)
@pytest.mark.slow  # two traces of the 7B LoRA step and three of its peak (the searches'): 27 s with 4 agents on 2 cores (2026-11-28)
def test_largest_batch_is_the_boundary(capsys: pytest.CaptureFixture[str]) -> None:
    """The search traced the answer (it fits) and one more (it does not); the command asked at one more says so too."""
    pytest.importorskip("peft")  # the traced LoRA step (torch 2.4: transformers 5.x and peft cannot build it)
    argv = ["lora", "--hf-config", "llama-2-7b", "--rank", "16", "--seq", "2048", "--memory-gb", "24", "--gradient-checkpointing", "--json"]
    assert main([*argv, "--batch", "1"]) == 0
    fields = json.loads(capsys.readouterr().out)
    largest, search = fields["largest_batch"], fields["largest_batch_search"]
    assert largest > 1 and search["checked"] is True and search["traces"] <= 3
    assert search["predicted_peak_bytes"] <= 24e9 < search["next_predicted_peak_bytes"]
    assert main([*argv, "--batch", str(largest + 1)]) == 0
    over = json.loads(capsys.readouterr().out)
    assert over["fits"] is False and over["step_peak_bytes"] == search["next_predicted_peak_bytes"] and over["largest_batch"] == largest


@pytest.mark.parametrize("call", [
    lambda: lora_step_flops(TINY, rank=4, targets=("q_proj",), batch=0, seq=4),
    lambda: lora_step_flops(TINY, rank=4, targets=("q_proj",), batch=1, seq=4, attention="flash"),
    lambda: lora_saved_terms(TINY, rank=4, targets=("q_proj",), batch=1, seq=4, dtype="int8"),
    lambda: lora_saved_terms(TINY, rank=4, targets=("q_proj",), batch=1, seq=4, dropout=1.0),
])
def test_bad_input_raises_resacct_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResacctError):
        call()


@pytest.mark.slow
@pytest.mark.parametrize("targets, dtype, attention, dropout, batch, seq, kv_heads", [
    ("k_proj", "float32", "eager", 0.0, 2, 6, 2),
    ("v_proj", "bfloat16", "eager", 0.0, 1, 5, 1),
    ("o_proj", "float32", "sdpa", 0.0, 3, 5, 2),
    ("v_proj,o_proj", "float32", "eager", 0.0, 2, 4, 2),
    ("o_proj,up_proj", "bfloat16", "eager", 0.1, 1, 9, 2),
    ("up_proj,down_proj", "float16", "sdpa", 0.0, 2, 3, 1),
])
def test_prediction_equals_a_real_peft_step(targets: str, dtype: str, attention: str, dropout: float, batch: int, seq: int, kv_heads: int) -> None:
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from resacct.measurement.sdpa_choice import cpu_sdpa_kernel

    if attention == "sdpa" and cpu_sdpa_kernel(heads=4, kv_heads=kv_heads, head_dim=16, dtype=dtype) != "flash":
        pytest.skip(f"torch {torch.__version__} runs this grouped-query sdpa on the CPU by the math kernel (its CPU flash kernel wants "
                    "equal heads); resacct's LoRA activation formula is the flash kernel's (its claims: requires_torch >=2.9)")
    from resacct.account.trace.step_measurements import trace_step_flops
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.measurement.activation_recording import record_saved_activations

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    names = targets.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(LlamaForCausalLM._from_config(config, dtype=getattr(torch, dtype), attn_implementation=attention),
                               LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=names))
    model.train()
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    with record_saved_activations(model) as saved:
        model(input_ids=ids, labels=ids)
    traced = trace_step_flops(model, lambda: model(input_ids=ids, labels=ids).loss, fill_tracer_gaps=attention == "sdpa")
    a = architecture_from_values(config.to_dict())
    predicted = lora_step_flops(a, rank=4, targets=names, batch=batch, seq=seq, attention=attention)
    assert (traced.forward_flops, traced.backward_flops) == (predicted.forward_flops, predicted.backward_flops)
    assert saved.activation_bytes == predict_lora_saved_bytes(a, rank=4, targets=names, batch=batch, seq=seq, dtype=dtype, attention=attention,
                                                              dropout=dropout)
