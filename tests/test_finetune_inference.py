"""Unit tests of issue 24's additions: resacct.formulas.kv_cache, lora, offload, config_shapes, the
uneven pipeline split and GQA term of resacct.formulas.plan, and the ``infer``, ``lora`` and
``plan`` commands (text, strict --json, --units binary, bad input one line with exit status 2).
The measured claims are resacct/specs/inference, finetune, plan and offload.claims.yaml."""

from __future__ import annotations

import json
import sys

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.formulas.config_shapes import architecture_from_values
from resacct.formulas.kv_cache import generate_cache_tokens, inference_memory, kv_cache_bytes, weight_bytes
from resacct.formulas.lora import NF4_DOUBLE_QUANT_BITS, lora_adapter_parameters, lora_training_memory
from resacct.formulas.offload import deepspeed_zero2_bytes, deepspeed_zero3_bytes
from resacct.formulas.plan import gqa_activation_saving_bytes_per_layer, plan_memory, stage_layers
from resacct.formulas.hf_formulas import HfArchitecture, predict_parameters
from resacct.account.load.hf_models import load_hf_config
from resacct.formulas.parallelism import ParallelLayout
from tests.trace_memo import INFER_8B_GROUP, LORA_7B_GROUP, memoized_infer_gpu_answer, memoized_lora_trace  # noqa: F401  (fixtures)

LLAMA2_7B = HfArchitecture(family="llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, mlp=11008, positions=4096)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))


# ── formulas ─────────────────────────────────────────────────────────────────────────────────────
def test_kv_cache_scales_with_kv_heads_not_query_heads() -> None:
    mha = kv_cache_bytes(batch=2, tokens=100, layers=4, kv_heads=8, head_dim=64, element_bytes=2)
    gqa = kv_cache_bytes(batch=2, tokens=100, layers=4, kv_heads=2, head_dim=64, element_bytes=2)
    assert mha == 2 * 2 * 100 * 4 * 8 * 64 * 2 and mha == 4 * gqa
    assert generate_cache_tokens(prompt=1, new_tokens=1) == 1


def test_largest_batch_and_context_are_the_boundary() -> None:
    common = dict(parameters=8.03e9, layers=32, kv_heads=8, head_dim=128, device_memory_bytes=80e9)
    memory = inference_memory(batch=8, context=8192, **common)
    assert inference_memory(batch=memory.largest_batch, context=8192, **common).fits
    assert not inference_memory(batch=memory.largest_batch + 1, context=8192, **common).fits
    assert inference_memory(batch=8, context=memory.largest_context, **common).fits
    assert not inference_memory(batch=8, context=memory.largest_context + 1, **common).fits


@pytest.mark.parametrize("call", [
    lambda: kv_cache_bytes(batch=0, tokens=1, layers=1, kv_heads=1, head_dim=1, element_bytes=2),
    lambda: weight_bytes(7e9, "int3"),
    lambda: weight_bytes(float("nan"), "bf16"),
    lambda: inference_memory(parameters=1e9, layers=2, kv_heads=2, head_dim=8, batch=1, context=8, kv_format="int4"),
    lambda: lora_adapter_parameters(LLAMA2_7B, rank=0, targets=("q_proj",)),
    lambda: lora_adapter_parameters(LLAMA2_7B, rank=8, targets=("qkv",)),
    lambda: deepspeed_zero3_bytes(1e9, 2e9),
    lambda: deepspeed_zero2_bytes(1e9, gpus_per_node=0),
    lambda: stage_layers(3, 4),
    lambda: stage_layers(70, 12, first=5, last=7),
])
def test_bad_input_raises_resacct_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResacctError):
        call()


def test_lora_state_breakdown_for_llama2_7b_r16() -> None:
    state = lora_training_memory(LLAMA2_7B, rank=16, targets=("q_proj", "v_proj"))
    assert state.adapter_parameters == 32 * 2 * 16 * (4096 + 4096)
    assert state.adapter_tensors == 32 * 2 * 2
    assert state.base_bytes == 2 * predict_parameters(LLAMA2_7B)
    assert state.state_bytes == state.base_bytes + 16 * state.adapter_parameters + 4 * state.adapter_tensors


def test_qlora_base_is_nf4_for_block_linears_and_bf16_elsewhere() -> None:
    assert NF4_DOUBLE_QUANT_BITS == pytest.approx(4.127, abs=5e-4)   # QLoRA §3
    nf4 = lora_training_memory(LLAMA2_7B, rank=64, targets=("all-linear",), base_format="nf4")
    linears = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    constants = 32 * 7 * (16 * 4 + 256 * 4 + 4)  # bitsandbytes' float32 NF4 code, nested code and absmax mean per quantised layer
    assert nf4.base_bytes == pytest.approx(linears * NF4_DOUBLE_QUANT_BITS / 8 + constants + (predict_parameters(LLAMA2_7B) - linears) * 2, rel=1e-12)


def test_uneven_pipeline_split_and_busiest_stage() -> None:
    assert stage_layers(70, 12) == (6,) * 10 + (5,) * 2 and sum(stage_layers(126, 16, first=7, last=7)) == 126
    layout = ParallelLayout(tensor=8, pipeline=12, sequence_parallel=True)
    plan = plan_memory(parameters=70e9, layers=70, hidden=8192, heads=64, seq=4096, micro_batch=1, layout=layout, recipe="mixed-adam",
                       recompute="selective", device_memory_bytes=80e9)
    assert plan.stage == 0 and plan.stage_layers[0] == 6
    assert plan.parameters_per_gpu == pytest.approx(70e9 * 6 / 70 / 8)
    # the first stage holds p micro-batches in flight × its 6 layers
    even = plan_memory(parameters=70e9, layers=72, hidden=8192, heads=64, seq=4096, micro_batch=1, layout=layout, recipe="mixed-adam",
                       recompute="selective", device_memory_bytes=80e9)
    assert plan.activation_bytes == pytest.approx(even.activation_bytes)   # 6 layers × 12 in flight = 72 layers, as an even 72/12
    with pytest.raises(ResacctError, match="interleaved"):
        plan_memory(parameters=70e9, layers=70, hidden=8192, heads=64, seq=4096, micro_batch=1, recipe="mixed-adam", recompute="none",
                    layout=ParallelLayout(tensor=8, pipeline=12, interleaved_chunks=2), device_memory_bytes=80e9)


def test_gqa_shrinks_k_and_v_activations_only() -> None:
    assert gqa_activation_saving_bytes_per_layer(4096, 1, 8192, 64, 64) == 0
    assert gqa_activation_saving_bytes_per_layer(4096, 1, 8192, 64, 8, tensor_parallel=8) == 4 * 4096 * 8192 * (1 - 8 / 64) / 8
    assert gqa_activation_saving_bytes_per_layer(4096, 1, 8192, 64, 8, recompute="full") == 0


def test_tensor_parallel_must_divide_kv_heads() -> None:
    common = dict(parameters=7e9, layers=32, hidden=4096, heads=32, seq=4096, micro_batch=1, recipe="mixed-adam", recompute="none",
                  device_memory_bytes=80e9)
    with pytest.raises(ResacctError, match="tensor-parallel size 8 does not divide 4 key/value heads: Megatron-LM"):
        plan_memory(layout=ParallelLayout(tensor=8), kv_heads=4, **common)
    assert plan_memory(layout=ParallelLayout(tensor=4), kv_heads=4, **common).fits is not None


def test_swiglu_mlp_term_replaces_korthikantis_gelu_mlp() -> None:
    from resacct.formulas.plan import mlp_activation_bytes_per_layer, mlp_activation_extra_bytes_per_layer

    s, b, h, f = 4096, 1, 4096, 11008
    assert mlp_activation_bytes_per_layer(s, b, h, 4 * h, gated=False) == 18 * s * b * h            # Korthikanti's MLP without its mask
    assert mlp_activation_extra_bytes_per_layer(s, b, h, f, gated=True) == (8 * f - 16 * h) * s * b
    assert mlp_activation_extra_bytes_per_layer(s, b, h, f, gated=True, tensor_parallel=8) == (8 * f - 16 * h) * s * b / 8
    assert mlp_activation_extra_bytes_per_layer(s, b, h, f, gated=True, recompute="full") == 0
    assert mlp_activation_extra_bytes_per_layer(s, b, h, 4 * h, gated=False) == 0
    common = dict(parameters=7e9, layers=32, hidden=h, heads=32, seq=s, micro_batch=1, recipe="mixed-adam", recompute="selective",
                  device_memory_bytes=80e9, layout=ParallelLayout())
    assert plan_memory(mlp=f, gated_mlp=True, **common).activation_bytes - plan_memory(**common).activation_bytes == 32 * (8 * f - 16 * h) * s


def test_deepspeed_docs_figures() -> None:
    cpu, gpu = deepspeed_zero2_bytes(2851e6, gpus_per_node=8, offload_optimizer=False, estimator="docs")
    assert (round(cpu / 2**30, 2), round(gpu / 2**30, 2)) == (127.45, 15.93)
    assert round(deepspeed_zero2_bytes(2851e6, gpus_per_node=8, offload_optimizer=False)[1] / 2**30, 2) == 11.28   # DeepSpeed ≥ 0.14.3
    cpu, gpu = deepspeed_zero3_bytes(2851e6, 32e6, gpus_per_node=8, offload_optimizer=False, offload_param=False)
    assert (round(cpu / 2**30, 2), round(gpu / 2**30, 2)) == (1.43, 6.09)


def test_architecture_from_values_matches_every_llama_config() -> None:
    a = architecture_from_values(load_hf_config("llama-2-70b").values)
    assert (a.heads, a.kv_heads, a.head_dim, a.mlp) == (64, 8, 128, 28672)
    assert predict_parameters(architecture_from_values(load_hf_config("gpt2").values)) == 124439808


# ── commands ─────────────────────────────────────────────────────────────────────────────────────
@pytest.mark.usefixtures("memoized_infer_gpu_answer")
@pytest.mark.xdist_group(INFER_8B_GROUP)
@pytest.mark.slow  # 1.98 s idle on 2026-11-28: llama-3-8b's prefill traced for the h100
def test_infer_json_and_binary_units(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, "infer", "--hf-config", "llama-3-8b", "--batch", "8", "--context", "8192", "--device", "h100")
    assert fields["kv_cache_bytes"] == 8 * 8192 * 2 * 32 * 8 * 128 * 2 and fields["fits"] is True
    assert fields["total_bytes"] == fields["weight_bytes"] + fields["kv_cache_bytes"]
    assert fields["largest_batch"] >= 8 and fields["device_memory_bytes"] == 80e9
    no_device = _json(capsys, "infer", "--hf-config", "llama-3-8b", "--context", "1024")
    assert no_device["fits"] is None and no_device["largest_batch"] is None
    assert main(["infer", "--hf-config", "llama-3-8b", "--memory-gb", "80", "--units", "binary"]) == 0
    out = capsys.readouterr().out
    assert "GiB" in out and "74.51 GiB" in out


@pytest.mark.usefixtures("memoized_lora_trace")
@pytest.mark.xdist_group(LORA_7B_GROUP)
@pytest.mark.slow  # 17.05 s idle on 2026-11-28: the 7B LoRA step traced
def test_lora_answers_the_24gb_question(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, "lora", "--hf-config", "llama-2-7b", "--rank", "16", "--batch", "1", "--seq", "2048", "--memory-gb", "24",
                   "--gradient-checkpointing")
    assert fields["adapter_parameters"] == 8388608 and fields["fits"] is True and fields["largest_batch"] >= 1
    assert fields["state_and_activation_bytes"] == pytest.approx(fields["training_state_bytes"] + fields["activation_bytes"])
    assert fields["total_bytes"] == fields["step_peak_bytes"] > fields["training_state_bytes"]  # the traced step's peak decides
    assert fields["activation_basis"] == "estimate" and fields["headroom_bytes"] == pytest.approx(24e9 - fields["total_bytes"])
    assert main(["lora", "--hf-config", "llama-2-7b", "--base", "nf4", "--targets", "all-linear", "--memory-gb", "24"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("QLoRA r=16") and "frozen base (nf4)" in text and "largest batch" in text


@pytest.mark.usefixtures("memoized_lora_trace")
@pytest.mark.xdist_group(LORA_7B_GROUP)
@pytest.mark.parametrize("board", ["l4", "a10", "rtx-4090"])
@pytest.mark.slow  # 16.50 s idle on 2026-11-28: the 7B LoRA step traced, a CUDA answer per board
def test_lora_on_a_24gb_board_is_the_24gb_answer(capsys: pytest.CaptureFixture[str], board: str) -> None:
    """The table's 24 GB boards give --memory-gb 24's answer: "r=16 LoRA on a 7B, on a 24 GB card?" by name."""
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    argv = ["lora", "--hf-config", "llama-2-7b", "--rank", "16", "--batch", "1", "--seq", "2048"]
    by_name, by_size = _json(capsys, *argv, "--device", board), _json(capsys, *argv, "--memory-gb", "24")
    assert by_name["device_memory_bytes"] == 24e9 and by_name["fits"] is by_size["fits"] is False
    assert by_name["total_bytes"] == by_size["total_bytes"] and by_name["largest_batch"] == by_size["largest_batch"]


def test_plan_hf_config_and_uneven_split(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, "plan", "--hf-config", "llama-3-70b", "--seq", "8192", "--tp", "8", "--pp", "12", "--memory-gb", "80",
                   "--recompute", "selective", "--sp")
    assert fields["parameters"] == predict_parameters(architecture_from_values(load_hf_config("llama-3-70b").values))
    assert fields["kv_heads"] == 8 and fields["stage_layers"] == [7] * 8 + [6] * 4
    assert main(["plan", "--hf-config", "llama-3-70b", "--pp", "8", "--memory-gb", "80", "--units", "binary"]) == 0
    assert "GiB" in capsys.readouterr().out


def test_plan_parameter_breakdown_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")  # builds the model (torch 2.4: transformers 5.x cannot)
    fields = _json(capsys, "plan", "--hf-config", "llama-3-8b", "--memory-gb", "80")
    b = fields["parameter_breakdown"]
    assert b["total"] == fields["parameters"] == b["embeddings"] + b["layers"] * b["per_layer"] + b["final_norm"] + b["lm_head"]
    assert (b["attention_per_layer"], b["mlp_per_layer"], b["norms_per_layer"], b["tied_head"]) == (41943040, 176160768, 8192, False)
    assert fields["mlp"] == 14336 and fields["mlp_kind"] == "swiglu"
    assert _json(capsys, "plan", "--hf-config", "gpt2", "--memory-gb", "80")["parameter_breakdown"]["lm_head"] == 0
    no_shape = _json(capsys, "plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--memory-gb", "80")
    assert no_shape["parameter_breakdown"] is None and no_shape["mlp"] is None
    assert main(["plan", "--hf-config", "gpt2", "--memory-gb", "80"]) == 0
    text = capsys.readouterr().out
    assert "parameters by component" in text and "tied to the token embedding" in text and "124,439,808" in text


def test_plan_kv_heads_counts_a_llama_shape(capsys: pytest.CaptureFixture[str]) -> None:
    gqa = _json(capsys, "plan", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--mlp", "28672", "--vocab", "32000",
                "--seq", "4096", "--memory-gb", "80")
    assert gqa["parameters"] == predict_parameters(architecture_from_values(load_hf_config("llama-2-70b").values))


@pytest.mark.parametrize("argv, message", [
    (["infer", "--hf-config", "llama-3-8b", "--weights", "int3"], "'int3' is not a weight format; choose one of"),
    (["infer", "--hf-config", "llama-3-8b", "--kv-format", "q4"], "'q4' is not a KV-cache format"),
    (["infer", "--hf-config", "llama-3-8b", "--units", "si"], "'si' is not a unit system; choose decimal"),
    (["infer", "--layers", "2"], "--hidden, --heads, --mlp, --vocab missing"),
    (["infer", "--hf-config", "llama-3-8b", "--layers", "2"], "give the model by one of them"),
    (["infer", "--hf-config", "llama-3-8b", "--device", "h100", "--memory-gb", "80"], "not both"),
    (["lora", "--hf-config", "llama-2-7b", "--targets", "q_proj,qkv"], "LoRA targets are a comma-separated list"),
    (["lora", "--hf-config", "llama-2-7b", "--base", "int4"], "'int4' is not a base format"),
    (["lora", "--hf-config", "llama-2-7b", "--targets", "all-linear,q_proj"], "LoRA targets are a comma-separated list"),
    (["lora", "--hf-config", "llama-2-7b", "--rank", "0"], "'0' must be a whole number greater than 0"),
    (["plan", "--layers", "3", "--hidden", "64", "--heads", "4", "--seq", "64", "--pp", "4", "--params", "1B", "--memory-gb", "80"],
     "leave a stage without layers"),
    (["plan", "--hf-config", "llama-3-70b", "--pp", "12", "--first-stage-layers", "5", "--memory-gb", "80"], "share them evenly"),
    (["plan", "--layers", "8", "--hidden", "64", "--heads", "8", "--kv-heads", "2", "--vocab", "100", "--seq", "64", "--memory-gb", "80"],
     "give its --mlp width"),
    (["plan", "--hf-config", "llama-3-70b", "--memory-gb", "80", "--units", "GiB"], "'GiB' is not a unit system"),
    (["plan", "--hf-config", "llama-3-8b", "--tp", "16", "--memory-gb", "80"], "tensor-parallel size 16 does not divide 8 key/value heads"),
    (["lora", "--hf-config", "llama-2-7b", "--dropout", "1.5"], "'1.5' is not a dropout probability; expected a number in [0, 1)"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    if "--hf-config" in argv:
        pytest.importorskip("transformers")  # torch 2.4: the command refuses the model before it reads this argument
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


# ── optional dependencies ───────────────────────────────────────────────────────────────────────
def test_lora_claims_skip_without_peft(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.checks.finetune import lora_step
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setitem(sys.modules, "peft", None)
    monkeypatch.setattr("resacct.measurement.torch_limits.transformers_unusable", lambda: None)  # as where none is installed
    with pytest.raises(NotMeasurable, match=r"peft is not installed \(the optional extra: pip install 'resacct\[finetune\]'\)"):
        lora_step(quantity="trainable_parameters", rank=4, targets="q_proj")


def test_inference_claims_skip_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.checks.inference import generate_kv_cache
    from resacct.harness.registry import NotMeasurable

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr("resacct.measurement.torch_limits.transformers_unusable", lambda: None)  # as where none is installed
    with pytest.raises(NotMeasurable, match="transformers is not installed"):
        generate_kv_cache(layers=1, kv_heads=1, groups=1, head_dim=4, batch=1, prompt=1, new_tokens=1)
