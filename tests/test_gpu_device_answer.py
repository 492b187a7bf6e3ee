"""``--device BOARD`` without a GPU (issue 31): ``resacct account --hf-config`` and ``resacct fit``
print the CUDA caching allocator's predicted allocated and reserved peaks of the step and name what
calibrates them; a loss-scaled recipe gets one line instead of a number; fit judges the reserved peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from resacct.account.gpu.tracing.cuda_step import GQA_MATH_LABEL, predict_cuda_step_memory
from resacct.account.gpu.answers.device_answer import calibration_text, fit_gpu_answer, gpu_step_answer
from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
from resacct.cli import main
from resacct.facts.hardware import get_accelerator
from resacct.facts.recipes import get_recipe
from resacct.measurement.torch_limits import GQA_FLOPS_LIMIT, gqa_attention_flops_countable

# torch 2.8 to 2.11's FLOP counter asserts on grouped-query attention: these trace a grouped-query model's FLOPs (docs/matrix.md)
needs_gqa_flops = pytest.mark.skipif(not gqa_attention_flops_countable(), reason=GQA_FLOPS_LIMIT)

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}


@pytest.fixture()
def config_path(tmp_path: Path) -> str:
    pytest.importorskip("transformers")  # every use builds the model (torch 2.4: transformers 5.x cannot)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def _loss(module, inputs):  # type: ignore[no-untyped-def]
    return loss_of_output(call_model(module, inputs), "model")


def _model(config_path: str):  # type: ignore[no-untyped-def]
    from resacct.account.load.hf_models import build_hf_model, load_hf_config

    model = build_hf_model(load_hf_config(config_path), device="meta")
    model.train()
    return model


def test_a_bf16_llama_on_meta_gets_cuda_peaks_with_flash_attention(config_path: str) -> None:
    model = _model(config_path)
    inputs = default_inputs(model, batch=2, seq=16, device="meta")
    answer = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("bf16"), optimizer="adamw", board=get_accelerator("h100"))
    assert answer.gap is None and answer.attention.startswith("flash")
    # the same as the CUDA step predicted directly on the bf16 model with flash attention, plus the two
    # 32 MiB cuBLAS workspaces of an sm90 board (its own 32 MiB segment each, never freed: +64 MiB on both peaks)
    assert answer.workspaces.sizes == (32 * 2**20, 32 * 2**20) and answer.lines(str)[2].startswith("  cuBLAS workspaces: 64 MiB") and "confirmed on an H200" in answer.lines(str)[3]
    direct = predict_cuda_step_memory(model.to(torch.bfloat16), inputs, _loss, attention="flash")
    assert (answer.allocated_bytes, answer.reserved_bytes) == (direct.peak_allocated_bytes + 64 * 2**20, direct.peak_reserved_bytes + 64 * 2**20)
    assert answer.reserved_bytes >= answer.allocated_bytes > 0


def test_sdpa_runs_on_a_v100_the_kernel_pytorch_allows_there(config_path: str) -> None:
    """PyTorch's sdp_utils.cpp: flash needs sm80, and before sm80 the memory-efficient kernel takes float16 and float32
    only — on a V100 (sm70) a bfloat16 step runs sdpa's math path, a float16 one the efficient kernel. ``account`` and
    ``fit --device`` said flash for any 16-bit step (their own rule, not the board's); ``lora``, ``infer`` and ``shard``
    said efficient for bfloat16 too."""
    from resacct.account.gpu.answers.command_answers import sdpa_kernel_for

    v100, h100 = get_accelerator("v100"), get_accelerator("h100")
    assert [sdpa_kernel_for(v100, dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)] == [None, "efficient", "efficient"]
    assert [sdpa_kernel_for(h100, dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)] == ["flash", "flash", "efficient"]
    model = _model(config_path)
    inputs = default_inputs(model, batch=16, seq=64, device="meta")  # activations above the optimizer step's peak
    answer = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("bf16"), optimizer="adamw", board=v100)
    assert answer.gap is None and answer.attention == "math (sdpa: no fused kernel for this dtype on this board)"
    # the same as the CUDA step predicted directly, sdpa left to its math path, with the cuBLAS workspaces of an sm70 board
    direct = predict_cuda_step_memory(model.to(torch.bfloat16), inputs, _loss, attention=None, workspaces=answer.workspaces.sizes)
    assert (answer.allocated_bytes, answer.reserved_bytes) == (direct.peak_allocated_bytes, direct.peak_reserved_bytes)
    flash = predict_cuda_step_memory(model.to(torch.bfloat16), inputs, _loss, attention="flash", workspaces=answer.workspaces.sizes)
    assert flash.peak_allocated_bytes < direct.peak_allocated_bytes  # the math path keeps the s² scores flash never writes


def test_a_loss_scaled_recipe_says_why_there_is_no_number(config_path: str) -> None:
    model = _model(config_path)
    inputs = default_inputs(model, batch=1, seq=16, device="meta")
    answer = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("fp16-autocast-scaled"), optimizer="adamw", board=get_accelerator("h100"))
    assert answer.allocated_bytes is None and answer.reserved_bytes is None and "GradScaler" in answer.gap
    assert len(answer.lines(str)) == 1 and "no prediction" in answer.lines(str)[0]


def test_an_autocast_recipe_is_predicted_under_cuda_autocasts_casts(config_path: str) -> None:
    """bf16-autocast: float32 parameters, the forward under CUDA autocast (tests/test_gpu_autocast.py
    checks the casts against torch's)."""
    model = _model(config_path)
    inputs = default_inputs(model, batch=16, seq=64, device="meta")  # activations above the optimizer step's peak
    board = get_accelerator("h100")
    autocast = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("bf16-autocast"), optimizer="adamw", board=board)
    fp32 = gpu_step_answer(model, inputs, _loss, recipe=get_recipe("fp32"), optimizer="adamw", board=board)
    assert autocast.gap is None and autocast.attention == "flash" and fp32.attention == GQA_MATH_LABEL  # fp32: no flash, efficient refuses GQA
    assert autocast.allocated_bytes != fp32.allocated_bytes and autocast.reserved_bytes >= autocast.allocated_bytes > 0


def test_the_calibration_names_the_record_or_says_datasheet_only() -> None:
    assert "verified against record docs/gpu/2026-11-26-h100-80gb-hbm3.json" in calibration_text(get_accelerator("h100"))
    assert "no record for this board (a100-sxm-40gb): datasheet only" in calibration_text(get_accelerator("a100-sxm-40gb"))


@needs_gqa_flops
@pytest.mark.slow  # 2.5 CPU s: two accounts with their CUDA traces (measured with 5 agents on 2 cores)
def test_account_hf_config_device_h100_prints_both_peaks_and_the_record(config_path: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["account", "--hf-config", config_path, "--seq", "16", "--recipe", "bf16", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "on h100-sxm (CUDA caching allocator, predicted): allocated peak" in out and "reserved peak" in out
    assert "verified against record docs/gpu/2026-11-26-h100-80gb-hbm3.json" in out
    assert main(["account", "--hf-config", config_path, "--seq", "16", "--device", "a100-sxm-40gb", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    gpu = document["gpu"]
    assert gpu["predicted_allocated_peak_bytes"] > 0 and gpu["predicted_reserved_peak_bytes"] >= gpu["predicted_allocated_peak_bytes"]
    assert "datasheet only" in gpu["calibration"]
    assert not any("a100-sxm-40gb" in note for note in document["notes"])  # the answer is `gpu`'s, not repeated in a note


def test_account_device_board_without_hf_config_or_unknown_is_one_line(config_path: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["account", "--device", "h100"]) == 2
    err = capsys.readouterr().err
    assert "answers for --hf-config only" in err and len(err.strip().splitlines()) == 1
    assert main(["account", "--hf-config", config_path, "--seq", "16", "--device", "tpu-v9"]) == 2
    err = capsys.readouterr().err
    assert "unknown accelerator 'tpu-v9'" in err and "Traceback" not in err


@needs_gqa_flops
@pytest.mark.slow  # 3.8 CPU s: two fit searches and their CUDA traces (measured with 5 agents on 2 cores)
def test_fit_on_a_board_judges_the_reserved_peak_and_steps_down(config_path: str) -> None:
    from resacct.account.fit.search import fit_step, hf_config_target

    target = hf_config_target(config_path)
    board = get_accelerator("h100")
    loose = fit_step(target, memory_bytes=board.memory_bytes, batch=1, seq=16, device=board, recipe="bf16", max_batch=4)
    dtypes_before = {parameter.dtype for parameter in target.model.parameters()}
    found = fit_gpu_answer(loose, target, board=board, recipe="bf16", optimizer="adamw")
    assert {parameter.dtype for parameter in target.model.parameters()} == dtypes_before == {torch.float32}  # not converted in place
    assert found["largest"] == loose.largest == 4 and found["gpu"].reserved_bytes <= loose.budget_bytes
    # a budget the CPU engine's peak fits at batch 4 but the allocator's 2 MiB and 20 MiB segments do not
    tight = fit_step(target, memory_bytes=loose.peak_bytes * 1.01, batch=1, seq=16, device=board, recipe="bf16", max_batch=4)
    assert tight.largest == 4
    found = fit_gpu_answer(tight, target, board=board, recipe="bf16", optimizer="adamw")
    assert found["traces"] >= 2 and (found["largest"] is None or found["largest"] < 4)
    assert found["largest"] is None or found["gpu"].reserved_bytes <= tight.budget_bytes


@pytest.mark.slow  # a fit search on the CPU kernels' step, then up to 6 CUDA traces and two more to check
def test_fit_on_a_board_searches_up_where_the_board_holds_less(tmp_path: Path) -> None:
    """GPT-2's sdpa call takes the math path on the CPU (the s² scores kept) and flash attention on a board (a
    logsumexp): the board's step holds less, so its largest batch is larger than the CPU kernels' — searched up
    from it, and exact: the batch found fits by the board's reserved peak and the next one does not."""
    pytest.importorskip("transformers")
    from resacct.account.fit.search import fit_step, hf_config_target

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 256, "n_positions": 512}))
    target = hf_config_target(str(path))
    board = get_accelerator("h100")
    cpu = fit_step(target, memory_bytes=120e6, seq=512, device=board, recipe="bf16")
    found = fit_gpu_answer(cpu, target, board=board, recipe="bf16", optimizer="adamw")
    search = found["search"]
    assert search is not None and search.exact and search.start == cpu.largest
    assert found["largest"] > cpu.largest, (found["largest"], cpu.largest)

    def reserved(batch: int) -> int:
        return gpu_step_answer(_step_copy(target), target.make_inputs(batch, 512), target.loss_fn(), recipe=get_recipe("bf16"),
                               optimizer="adamw", board=board).reserved_bytes

    assert reserved(found["largest"]) <= cpu.budget_bytes < reserved(found["largest"] + 1)
    assert found["gpu"].reserved_bytes == reserved(found["largest"]) and found["size"] == found["largest"]


@pytest.mark.slow  # a sequence search on the CPU kernels' step, then up to 6 CUDA traces and two more to check
def test_fit_on_a_board_searches_the_sequence_length_up_too(tmp_path: Path) -> None:
    """``--search seq``: the CPU kernels' math attention keeps s² scores, the board's flash attention a logsumexp — the
    board's longest sequence, searched up from the CPU kernels' answer, fits by its reserved peak and the next does not."""
    pytest.importorskip("transformers")
    from resacct.account.fit.search import fit_step, hf_config_target

    path = tmp_path / "config.json"
    # 8 heads of 8: flash's backward workspaces at 16 heads of 4 (padded to 8, rounded to 32 in dq_accum) put the board's answer below the CPU's
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 8, "n_layer": 2, "vocab_size": 256, "n_positions": 4096}))
    target = hf_config_target(str(path))
    board = get_accelerator("h100")
    cpu = fit_step(target, memory_bytes=100e6, search="seq", batch=2, device=board, recipe="bf16")
    found = fit_gpu_answer(cpu, target, board=board, recipe="bf16", optimizer="adamw")
    search = found["search"]
    assert search is not None and search.what == "seq" and search.start == cpu.largest and found["largest"] > cpu.largest

    def reserved(seq: int) -> int:
        return gpu_step_answer(_step_copy(target), target.make_inputs(2, seq), target.loss_fn(), recipe=get_recipe("bf16"),
                               optimizer="adamw", board=board).reserved_bytes

    assert reserved(found["largest"]) <= cpu.budget_bytes == search.budget_bytes
    above = min(size for size, held in search.traced if held > search.budget_bytes)  # exact: largest + 1; else the bracket's top
    assert above > found["largest"] and reserved(above) > cpu.budget_bytes
    assert search.exact == (above == found["largest"] + 1)
    assert search.line("{:.0f} B".format).startswith("by the reserved peak: the largest seq that fits the 100000000 B budget")
    from resacct.account.gpu.answers.device_answer import fit_gpu_fields

    fields = fit_gpu_fields(found)  # --json's gpu: the search named by what it searched
    assert fields["largest_seq_by_reserved"]["largest"] == fields["largest_by_reserved_peak"] == found["largest"]
    assert "largest_batch_by_reserved" not in fields


def _step_copy(target):  # type: ignore[no-untyped-def]
    from resacct.account.peak.recipes import model_in_dtype

    return model_in_dtype(target.model, torch.bfloat16)


MIXTRAL = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256, "num_local_experts": 8, "num_experts_per_tok": 2}


def _measured_cuda_order_step(model, batch, loss_fn, make_optimizer) -> int:  # type: ignore[no-untyped-def]
    """The step run for real on CPU tensors (sdpa's math kernel), its allocations fed to the allocator model in the
    order predict_cuda_step_memory gives a board's (parameters, batch, the optimizer's state, then the step, foreach
    AdamW as on CUDA): its allocated peak, less AdamW's step counts (CUDA keeps them on the host)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
    from resacct.account.gpu.allocator.cuda_allocator import round_size
    from resacct.account.gpu.tracing.cuda_step import _as_on_cuda
    from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step

    with sdpa_kernel(SDPBackend.MATH), AllocationRecorder(device="cpu") as recorder:
        for tensor in [*model.parameters(), *model.buffers(), *{id(t): t for t in batch.values()}.values()]:
            recorder.track(tensor)
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
        _as_on_cuda(optimizer)
        make_optimizer_state(model, optimizer)
        recorder.start_window()
        run_training_step(model, batch, loss_fn, optimizer)
    host = sum(round_size(state["step"].untyped_storage().nbytes()) for state in optimizer.state.values())
    return recorder.allocator.peak_allocated_bytes - host


@pytest.mark.slow  # a real CPU training step of a tiny Mixtral beside three meta traces (~3 CPU s, 5 agents on 2 cores)
def test_a_mixtral_training_step_on_a_board_runs_its_experts_grouped(tmp_path: Path) -> None:
    """``account``/``fit --device``: transformers runs a Mixtral's experts by ``grouped_mm`` on a CUDA board;
    resacct builds it with ``batched_mm``, which keeps a copy of the expert weights per (token, expert) for
    backward. The answer runs them grouped, says so, and leaves the caller's model as it was; measured against the
    same step run for real on CPU tensors with grouped experts (the allocator model fed in a board's order)."""
    pytest.importorskip("transformers")
    from resacct.account.gpu.tracing.cuda_experts import grouped_experts
    from resacct.account.load.hf_models import build_hf_model, load_hf_config

    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    spec, ids = load_hf_config(str(path)), torch.zeros(2, 64, dtype=torch.long)
    batch = {"input_ids": ids, "labels": ids}
    model = build_hf_model(spec, device="meta").train()
    answer = gpu_step_answer(model, batch, _loss, recipe=get_recipe("fp32"), optimizer="adamw", board=get_accelerator("h100"))
    assert model.config._experts_implementation == "batched_mm"  # restored: fit's search goes on with the CPU engine's model
    assert answer.experts is not None and "grouped" in answer.experts and any("experts: grouped" in line for line in answer.lines(str))
    assert answer.to_dict()["experts"] == answer.experts
    torch.manual_seed(0)
    measured = _measured_cuda_order_step(grouped_experts(build_hf_model(spec, device="cpu")).train(), batch, _loss, torch.optim.AdamW)
    predicted = answer.allocated_bytes - answer.workspaces.total_bytes
    assert predicted == pytest.approx(measured, rel=0.05)  # flash/efficient attention on the board, math here: not to the byte
    copies = predict_cuda_step_memory(build_hf_model(spec, device="meta").train(), batch, _loss)  # batched_mm: what the answer was
    gathered_one_layer = 2 * 64 * MIXTRAL["num_experts_per_tok"] * 3 * MIXTRAL["hidden_size"] * MIXTRAL["intermediate_size"] * 4
    assert copies.peak_allocated_bytes - measured > gathered_one_layer > 10 * abs(predicted - measured)


@pytest.mark.slow  # a real CPU LoRA step of a tiny Mixtral beside its CUDA trace (~3 CPU s, 5 agents on 2 cores)
def test_lora_of_a_mixtral_on_a_board_runs_its_experts_grouped(tmp_path: Path) -> None:
    """``lora --device``: the same for peft's LoRA step (adapters on q and v; the experts frozen but still run):
    grouped, said so, and its peak the real CPU LoRA step's with grouped experts (within 5 %); the step time
    counts the grouped matmuls' FLOPs (transformers' op, which torch's flop registry does not know)."""
    pytest.importorskip("peft")
    from resacct.account.gpu.answers.command_answers import lora_gpu_answer
    from resacct.account.gpu.tracing.cuda_experts import grouped_experts
    from resacct.account.gpu.timing.step_time import trace_step_ops
    from resacct.account.load.hf_models import load_hf_config, transformers_config
    from resacct.account.trace.lora_step import adamw_over, build_lora_model, lora_loss, lora_step_inputs

    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    config = transformers_config(load_hf_config(str(path)))
    answer = lora_gpu_answer(config, rank=8, targets=("q_proj", "v_proj"), base="fp32", batch=2, seq=64, dropout=0.0,
                             gradient_checkpointing=False, board=get_accelerator("h100"))
    assert answer.gap is None and answer.experts is not None and "grouped" in answer.experts
    torch.manual_seed(0)
    real = grouped_experts(build_lora_model(config, rank=8, targets=("q_proj", "v_proj"), base="fp32", device="cpu"))
    measured = _measured_cuda_order_step(real, lora_step_inputs(config, batch=2, seq=64, device="cpu"), lora_loss, adamw_over)
    assert answer.allocated_bytes - answer.workspaces.total_bytes == pytest.approx(measured, rel=0.05)
    ops = trace_step_ops(real, lora_step_inputs(config, batch=2, seq=64), lora_loss, adamw_over)
    grouped = [op for op in ops if "grouped_mm_fallback" in op.op]
    # each layer: gate_up (2·S·d·2f) and down (2·S·f·d) forward, the input's gradients backward (the weights are frozen: no weight gradient
    # is asked, but transformers' backward op computes both, 2× the forward)
    rows = 2 * 64 * MIXTRAL["num_experts_per_tok"]
    forward = 2 * rows * MIXTRAL["hidden_size"] * 2 * MIXTRAL["intermediate_size"] + 2 * rows * MIXTRAL["intermediate_size"] * MIXTRAL["hidden_size"]
    assert grouped and sum(op.flops for op in grouped) == MIXTRAL["num_hidden_layers"] * 3 * forward


def test_experts_run_grouped_inside_the_block_and_as_built_after_it(tmp_path: Path, config_path: str) -> None:
    """The switch ``account``/``fit --device`` make around their trace: a Mixtral's ``batched_mm`` experts run
    resacct's grouped forward inside, ``batched_mm`` again after (fit's search goes on with that model);
    a model without experts is left alone and gets no experts line."""
    from resacct.account.gpu.tracing.cuda_experts import GROUPED_EXPERTS_NOTE, experts_as_on_cuda
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.account.load.moe_routing import EXPERTS_IMPLEMENTATION

    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    model = build_hf_model(load_hf_config(str(path)), device="meta")
    experts = [module for module in model.modules() if type(module).__name__ == "MixtralExperts"]
    assert experts and model.config._experts_implementation == "batched_mm"
    with experts_as_on_cuda(model) as note:
        assert note == GROUPED_EXPERTS_NOTE
        assert {module.config._experts_implementation for module in experts} == {EXPERTS_IMPLEMENTATION}
    assert {module.config._experts_implementation for module in experts} == {"batched_mm"}
    with experts_as_on_cuda(_model(config_path)) as note:
        assert note is None
