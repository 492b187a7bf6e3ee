"""``resacct lora``, ``infer`` and ``shard`` with ``--device BOARD`` and no GPU (issue 31): the CUDA
caching allocator's predicted allocated and reserved peaks there (and the step time where the command
has a step), what calibrates them, one line for a board that is not in the table, no number (and
why) for a board that does not run the CUDA caching allocator."""

from __future__ import annotations

import json

import pytest
import torch

from resacct.account.gpu.tracing.cuda_step import GQA_MATH_LABEL
from resacct.cli import main
from resacct.measurement.torch_limits import GQA_FLOPS_LIMIT, gqa_attention_flops_countable

from tests.sharded_engines import sharded_gap
from tests.test_gpu_device_answer import config_path  # noqa: F401  the tiny Llama config file, one fixture for both files

# torch 2.8 to 2.11's FLOP counter asserts on grouped-query attention: these trace a grouped-query model's FLOPs (docs/matrix.md)
needs_gqa_flops = pytest.mark.skipif(not gqa_attention_flops_countable(), reason=GQA_FLOPS_LIMIT)

RECORD = "docs/gpu/2026-11-26-h100-80gb-hbm3.json"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", [["lora", "--seq", "16"], ["infer", "--context", "16"], ["shard", "--devices", "2"]])
def test_an_unknown_board_is_one_line_naming_every_board(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command[0], "--hf-config", "gpt2", *command[1:], "--device", "tpu-v9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "'tpu-v9' is not a board" in err and "did you mean tpu-v4" in err
    assert all(name in err for name in ("h100-sxm", "h200-sxm", "a100-sxm-40gb", "mi300x", "tpu-v5p"))


@needs_gqa_flops
@pytest.mark.slow  # 4.6 CPU s: the CPU engine's LoRA account twice and the CUDA trace (measured with 5 agents on 2 cores)
def test_lora_on_an_h100_predicts_cuda_peaks_and_a_step_time_from_the_record(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    fields = _json(capsys, "lora", "--hf-config", config_path, "--batch", "2", "--seq", "32", "--device", "h100")
    gpu = fields["gpu"]
    assert gpu["board"] == "h100-sxm" and gpu["gap"] is None and gpu["attention"] == "flash"
    # what the caching allocator holds is at least the step's training state, counted by the CPU engine's trace
    assert gpu["predicted_reserved_peak_bytes"] >= gpu["predicted_allocated_peak_bytes"] >= fields["training_state_bytes"]
    assert gpu["predicted_reserved_peak_bytes"] % (2 * 2**20) == 0  # segments of 2 MiB (small pool) or multiples of 2 MiB
    # two 32 MiB cuBLAS workspaces on an sm90 board (forward thread, autograd's backward thread; no Linear has a bias)
    assert gpu["library_workspace_bytes"] == 2 * 32 * 2**20 and len(gpu["library_workspaces"]) == 2
    # the same step's peak on fake CPU tensors (another engine, CPU kernels): within 10 % of the CUDA allocator's allocated peak less them
    assert gpu["predicted_allocated_peak_bytes"] - gpu["library_workspace_bytes"] == pytest.approx(fields["step_peak_bytes"], rel=0.10)
    assert RECORD in gpu["calibration"] and RECORD in gpu["step_time_basis"] and "bf16 matmul" in gpu["step_time_basis"]
    assert 0 < gpu["predicted_step_sec"] < 1
    assert main(["lora", "--hf-config", config_path, "--batch", "2", "--seq", "32", "--device", "h100"]) == 0
    text = capsys.readouterr().out
    assert "on h100-sxm (CUDA caching allocator, predicted): allocated peak" in text and "step time there (predicted):" in text


@needs_gqa_flops
@pytest.mark.slow  # two CUDA passes of a tiny LoRA step on meta and a third for the old way
def test_the_lora_step_time_runs_attention_as_the_board_does(config_path: str) -> None:
    """The step time's ops come from the pass that predicts the peaks: sdpa as the board runs it (flash for a bf16 base
    on an H100), not sdpa's math path on meta tensors, which materialises the s² scores a flash kernel never writes
    (`resacct lora --hf-config llama-2-7b --seq 2048 --device h100`: 209.5 ms over 8,370 ops, 419.6 ms over 9,900 before; docs/gpu.md)."""
    pytest.importorskip("peft")
    from resacct.account.gpu.answers.command_answers import _LORA_TRACES, board_rates, lora_gpu_answer
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
    from resacct.account.gpu.timing.board_rates import step_seconds
    from resacct.account.gpu.timing.step_time import predict_step_seconds, trace_step_ops
    from resacct.account.load.hf_models import load_hf_config, transformers_config
    from resacct.account.trace.lora_step import adamw_over, build_lora_model, lora_loss, lora_step_inputs
    from resacct.facts.hardware import get_accelerator

    board, config = get_accelerator("h100"), transformers_config(load_hf_config(config_path))
    _LORA_TRACES.clear()
    answer = lora_gpu_answer(config, rank=8, targets=("q_proj", "v_proj"), base="bf16", batch=2, seq=64, dropout=0.0,
                             gradient_checkpointing=False, board=board)
    model = build_lora_model(config, rank=8, targets=("q_proj", "v_proj"), base="bf16", dropout=0.0)
    model.train()
    inputs = lora_step_inputs(config, batch=2, seq=64)
    flash: list = []
    predict_cuda_step_memory(model, inputs, lora_loss, adamw_over, attention="flash", ops=flash)
    assert any("flash_attention" in op.op for op in flash)
    # priced as every --device answer prices a step (board_rates.step_seconds: since session 30 the H200's calibrated model
    # moved to the H100), and the per-op roofline on the H100's rates beside it: the flash trace's ops, not the math path's
    rates = board_rates(board, "bf16")
    assert answer.attention == "flash" and answer.step_sec == step_seconds(flash, board, "bf16")[0]
    math = trace_step_ops(model, inputs, lora_loss, adamw_over)
    assert not any("flash_attention" in op.op for op in math) and step_seconds(math, board, "bf16")[0] != answer.step_sec
    assert predict_step_seconds(math, rates).step_sec != predict_step_seconds(flash, rates).step_sec
    # traced for its peaks only first (a batch search), then timed: the same pass again, the same step time
    _LORA_TRACES.clear()
    kwargs = dict(rank=8, targets=("q_proj", "v_proj"), base="bf16", batch=2, seq=64, dropout=0.0, gradient_checkpointing=False, board=board)
    assert lora_gpu_answer(config, timed=False, **kwargs).step_sec is None
    assert lora_gpu_answer(config, **kwargs).step_sec == answer.step_sec


@pytest.mark.slow  # 1.2 CPU s: the LoRA account and its CUDA trace (measured with 5 agents on 2 cores)
def test_lora_on_a_board_without_a_record_says_datasheet_only(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = _json(capsys, "lora", "--hf-config", config_path, "--seq", "16", "--base", "fp32", "--device", "a100")["gpu"]
    assert "no record for this board (a100-sxm-80gb): datasheet only" in gpu["calibration"]
    assert "no record for a100-sxm-80gb: fp32 matmul 0.7 × the datasheet's" in gpu["step_time_basis"]
    # float32: no flash; sdpa's efficient kernel refuses this grouped-query model (4 query heads, 2 key/value heads): its math path
    assert gpu["attention"] == GQA_MATH_LABEL and gpu["predicted_allocated_peak_bytes"] > 0


def test_lora_without_a_traceable_step_says_why(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = _json(capsys, "lora", "--hf-config", config_path, "--seq", "16", "--base", "nf4", "--device", "h100")["gpu"]
    assert gpu["predicted_allocated_peak_bytes"] is None and "bitsandbytes" in gpu["gap"]
    shaped = _json(capsys, "lora", "--layers", "2", "--hidden", "64", "--heads", "4", "--mlp", "128", "--vocab", "256", "--seq", "16",
                   "--device", "h100")["gpu"]
    assert shaped["predicted_allocated_peak_bytes"] is None and "--hf-config" in shaped["gap"]


@needs_gqa_flops
def test_infer_on_an_h100_holds_the_weights_and_the_cache(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    fields = _json(capsys, "infer", "--hf-config", config_path, "--batch", "2", "--context", "64", "--device", "h100")
    gpu = fields["gpu"]
    assert gpu["gap"] is None and gpu["timed"] == "prefill"
    # the weights and the KV cache (the model's own cache after a meta forward, counted by infer itself) are held at the peak
    assert gpu["predicted_reserved_peak_bytes"] >= gpu["predicted_allocated_peak_bytes"] > fields["weight_bytes"] + fields["kv_cache_bytes"]
    assert main(["infer", "--hf-config", config_path, "--batch", "2", "--context", "64", "--device", "h100"]) == 0
    text = capsys.readouterr().out
    assert "on h100-sxm (CUDA caching allocator, predicted)" in text and "prefill time there (predicted):" in text and "decode there (predicted):" in text
    # each time on its own line, what it rests on in the lines under it (--json keeps them in one line each)
    lines = text.splitlines()
    decode = next(index for index, line in enumerate(lines) if "decode there (predicted):" in line)
    assert lines[decode].endswith(" ms a token") and lines[decode + 1].strip() == gpu["decode_detail"][0] and gpu["decode_detail"][0].startswith("bound by the ")
    prefill = next(index for index, line in enumerate(lines) if "prefill time there (predicted):" in line)
    assert [line.strip() for line in lines[prefill + 1:prefill + 1 + len(gpu["step_time_detail"])]] == gpu["step_time_detail"]
    assert "note: on h100-sxm" not in text


@needs_gqa_flops
def test_infer_on_a_board_times_the_prefill_and_a_generated_token(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The prefill timed from the ops of its traced pass (attention as the board runs it); a generated token no faster
    than reading the weights and the KV cache once — bytes infer counts itself (its own formula and the model's cache) —
    at the bandwidth the step time uses, and no faster at a larger batch, whose cache is larger."""
    from resacct.account.gpu.timing.board_rates import board_rates
    from resacct.facts.hardware import get_accelerator

    one, many = (_json(capsys, "infer", "--hf-config", config_path, "--batch", str(batch), "--context", "64", "--device", "h100")
                 for batch in (1, 64))
    bandwidth = board_rates(get_accelerator("h100"), "bf16").bandwidth_bytes_per_sec
    for fields in (one, many):
        gpu = fields["gpu"]
        read = fields["weight_bytes"] + fields["kv_cache_bytes"]
        assert gpu["predicted_step_sec"] > 0 and RECORD in gpu["step_time_basis"]
        assert gpu["predicted_decode_sec_per_token"] >= read / bandwidth and f"{int(read):,} bytes" in gpu["decode_basis"]
    assert many["kv_cache_bytes"] == 64 * one["kv_cache_bytes"]  # 64 sequences' caches read each token, not one
    assert many["gpu"]["predicted_decode_sec_per_token"] >= one["gpu"]["predicted_decode_sec_per_token"]
    # a tiny model is bound by the host on both (the same forward's ops): its prefill's time is its ops × the overhead
    assert "bound by the host" in one["gpu"]["step_time_basis"] and "bound by the host" in one["gpu"]["decode_basis"]


def test_a_step_time_takes_the_rate_of_its_own_format(capsys: pytest.CaptureFixture[str]) -> None:
    """fp16 is timed by the fp16 peak (every 16-bit step was timed as bf16: an fp16 LoRA on a V100, which has no bf16
    peak, lost its peaks with it); the H100 record measured fp32 and bf16 matmuls, not fp16: its datasheet then, said so."""
    from resacct.account.gpu.answers.command_answers import board_rates
    from resacct.errors import ResacctError
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec

    v100, h100 = get_accelerator("v100"), get_accelerator("h100")
    assert board_rates(v100, "fp16").matmul_flops_per_sec == pytest.approx(0.7 * peak_flops_per_sec(v100, "fp16"))
    assert "its record measured no fp16 matmul" in board_rates(h100, "fp16").source
    assert RECORD in board_rates(h100, "bf16").source and board_rates(h100, "bf16").matmul_flops_per_sec != board_rates(h100, "fp16").matmul_flops_per_sec
    with pytest.raises(ResacctError, match="no bf16 peak"):
        board_rates(v100, "bf16")
    with pytest.raises(ResacctError, match="expected one of fp32, bf16, fp16"):
        board_rates(h100, "int8")


@pytest.mark.slow  # two LoRA accounts and their CUDA traces
def test_lora_on_a_v100_keeps_its_peaks_where_the_board_has_no_rate(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = _json(capsys, "lora", "--hf-config", config_path, "--seq", "32", "--device", "v100")["gpu"]
    assert bf16["gap"] is None and bf16["predicted_reserved_peak_bytes"] > 0 and bf16["predicted_step_sec"] is None
    assert "has no bf16 peak" in bf16["step_time_basis"]
    fp16 = _json(capsys, "lora", "--hf-config", config_path, "--seq", "32", "--base", "fp16", "--device", "v100")["gpu"]
    assert fp16["gap"] is None and fp16["predicted_step_sec"] > 0 and "fp16 matmul 0.7 × the datasheet's 125 TFLOP/s" in fp16["step_time_basis"]


@pytest.mark.parametrize(("weights", "attention"), [("bf16", "math (sdpa: no fused kernel for this dtype on this board)"), ("fp16", GQA_MATH_LABEL),
                                                     ("fp32", GQA_MATH_LABEL)])
def test_infer_on_a_v100_runs_the_attention_sm70_has(config_path: str, weights: str, attention: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No flash kernel before sm80, and the efficient one takes bf16 only from sm80 (PyTorch's sdp_utils.cpp), nor grouped-query
    attention (this model's 4 query heads share 2 key/value heads; an H200 refused it, docs/gpu.md): sdpa's math path."""
    gpu = _json(capsys, "infer", "--hf-config", config_path, "--context", "16", "--weights", weights, "--kv-format", weights, "--device", "v100")["gpu"]
    assert gpu["board"] == "v100-sxm2-32gb" and gpu["gap"] is None and gpu["attention"] == attention


def test_infer_prefill_on_meta_allocates_what_the_real_prefill_does(config_path: str) -> None:
    """The prefill traced on meta (what ``infer --device`` feeds the allocator model) against the same
    prefill run for real on CPU tensors, both through the allocator model: the same peaks to the byte
    (sdpa's math kernel on both sides: meta tensors take it when no CUDA kernel is chosen; both allocating as CUDA's
    kernels do where one op hides it — the mask added in place, ``_safe_softmax``'s temporaries: cuda_composites)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
    from resacct.account.gpu.answers.command_answers import kv_prefill
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory, sdpa_routing
    from resacct.account.load.hf_models import build_hf_model, load_hf_config

    spec = load_hf_config(config_path)
    ids = torch.zeros(2, 64, dtype=torch.long)
    predicted = predict_cuda_step_memory(build_hf_model(spec, device="meta").to(torch.bfloat16).eval(), ids, kv_prefill, None)
    real = build_hf_model(spec, device="cpu").to(torch.bfloat16).eval()
    with sdpa_kernel(SDPBackend.MATH), sdpa_routing(None), AllocationRecorder(device="cpu", cuda_kernels=True) as recorder:
        for tensor in [*real.parameters(), *real.buffers(), ids]:
            recorder.track(tensor)
        start = recorder.allocator.allocated_bytes
        recorder.start_window()
        kept = kv_prefill(real, ids)
    assert kept.output.past_key_values is not None
    assert (predicted.start_allocated_bytes, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes) == (
        start, recorder.allocator.peak_allocated_bytes, recorder.allocator.peak_reserved_bytes)


def test_infer_says_why_there_is_no_number(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    tpu = _json(capsys, "infer", "--hf-config", config_path, "--context", "16", "--device", "tpu-v5p")["gpu"]
    assert tpu["predicted_allocated_peak_bytes"] is None and "does not run PyTorch's CUDA caching allocator" in tpu["gap"]
    quantised = _json(capsys, "infer", "--hf-config", config_path, "--context", "16", "--weights", "int4", "--device", "h100")["gpu"]
    assert quantised["predicted_allocated_peak_bytes"] is None and "int4" in quantised["gap"]
    kv = _json(capsys, "infer", "--hf-config", config_path, "--context", "16", "--kv-format", "fp8", "--device", "h100")["gpu"]
    assert kv["predicted_allocated_peak_bytes"] is None and "--kv-format bf16" in kv["gap"]


@pytest.mark.slow  # two child processes (~30 s here); the tracker it uses is checked in the quick tier below
def test_shard_on_an_h100_gives_each_rank_cuda_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    argv = ["shard", "--model", "tests.fixtures_hf_models:tiny_llama", "--batch", "2", "--seq", "16", "--devices", "2", "--device", "h100"]
    if (gap := sharded_gap("fsdp2")) is not None:  # torch 2.6: one line naming the torch, exit 2, no traceback
        assert main([*argv, "--json"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and gap in err and f"torch {torch.__version__}" in err
        return
    fields = _json(capsys, *argv)
    gpu = fields["gpu"]
    assert gpu["board"] == "h100-sxm" and RECORD in gpu["calibration"] and "one stream" in gpu["note"]
    assert [rank["rank"] for rank in gpu["ranks"]] == [rank["rank"] for rank in fields["ranks"]] == [0, 1]
    for cuda, cpu in zip(gpu["ranks"], fields["ranks"]):
        assert cuda["peak_reserved_bytes"] >= cuda["peak_allocated_bytes"] > 0
        # the same rank's step on fake CPU tensors (gloo's buffers, the CPU allocator): within 10 %, less the cuBLAS workspaces the CPU has not
        assert cuda["peak_allocated_bytes"] - cuda["library_workspace_bytes"] == pytest.approx(cpu["predicted_peak_bytes"], rel=0.10)
        assert 0 < cuda["compute_step_sec"] < 1 and "collectives not timed" in cuda["compute_step_basis"] and RECORD in cuda["compute_step_basis"]
        # each rank its own process: two 32 MiB cuBLAS workspaces (forward and backward threads; Llama's Linears have no bias)
        assert cuda["library_workspace_bytes"] == 2 * 32 * 2**20 and len(cuda["library_workspaces"]) == 2
    from resacct.cli.shard import _gpu_text

    text = _gpu_text(gpu, None, "si")
    lines = text.splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("    cuBLAS workspaces: 64 MiB in the peaks above = "))
    assert lines[at].endswith("on each rank (its own process)") and "confirmed on an H200: sm90, torch 2.11, the 2026-11-30 record's library probe" in lines[at + 1]


@pytest.mark.slow  # two child processes, one rank each (~10 s each here, 5 agents on 2 cores)
def test_shard_device_adds_each_ranks_cublas_workspaces_to_both_peaks() -> None:
    """``shard --device h100``: each rank is its own process, so it takes a training step's workspaces as a
    one-process step does (two 32 MiB cuBLAS ones: the forward's thread and autograd's), kept from before the
    optimizer's state. The same rank's step with no board (no workspaces) is the measure: its start, both
    peaks and its reserved memory 64 MiB lower, to the byte (the blocks are kept, never reused)."""
    pytest.importorskip("transformers")
    if (gap := sharded_gap("fsdp2")) is not None:
        pytest.skip(f"{gap} (the command refuses in one line: the test above)")
    from resacct.account.fit.search import ModelSource
    from resacct.account.gpu.answers.sharded_cuda import _predict_cuda_in_child, predict_sharded_cuda_peaks
    from resacct.facts.hardware import get_accelerator
    from resacct.measurement.distributed import run_isolated

    source = ModelSource(factory="tests.fixtures_hf_models:tiny_llama")
    kernels = {torch.float32: "efficient", torch.bfloat16: "flash", torch.float16: "flash"}  # what sdpa_kernel_for gives an h100
    bare = run_isolated(_predict_cuda_in_child, source, "zero1", 2, (0,), 2, 16, kernels, None, timeout_seconds=300)
    assert not isinstance(bare, str), bare
    (on_board,) = predict_sharded_cuda_peaks(source, engine="zero1", world_size=2, ranks=(0,), batch=2, seq=16, board=get_accelerator("h100"))
    assert bare[0]["library_workspace_bytes"] is None and on_board["library_workspace_bytes"] == 2 * 32 * 2**20
    for key in ("start_allocated_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
        assert on_board[key] - bare[0][key] == 2 * 32 * 2**20, key


def test_the_sharded_tracker_feeds_resizes_to_the_allocator_model() -> None:
    """FSDP allocates and frees its unsharded parameters by ``UntypedStorage.resize_``: a resize up is
    an allocation of the allocator model, a resize to 0 its free."""
    from resacct.account.gpu.answers.sharded_cuda import CudaShardedTracker

    tracker = CudaShardedTracker()
    with tracker:
        storage = torch.empty(0).untyped_storage()
        storage.resize_(3 * 2**20)  # 3 MiB: a 20 MiB segment
        assert (tracker.allocator.allocated_bytes, tracker.allocator.reserved_bytes) == (3 * 2**20, 20 * 2**20)
        storage.resize_(0)
        assert tracker.allocator.allocated_bytes == 0 and tracker.allocator.peak_allocated_bytes == 3 * 2**20
        kept = torch.ones(1000)  # 4000 B through the dispatcher: a 4096-byte block of a 2 MiB segment
        assert tracker.allocator.allocated_bytes == 4096
        del kept
    assert tracker.allocator.allocated_bytes == 0


@pytest.mark.parametrize("command", [["infer", "--context", "16"], ["lora", "--seq", "16"]])
def test_a_model_given_by_its_shape_with_a_board_never_imports_torch(command: list[str]) -> None:
    """The napkin path stays a napkin path with --device: one line saying why there is no CUDA number."""
    import subprocess
    import sys

    argv = [command[0], "--layers", "2", "--hidden", "64", "--heads", "4", "--mlp", "128", "--vocab", "256", *command[1:], "--device", "h100", "--json"]
    probe = ("import json, sys\nfrom resacct.cli import main\ncode = main(" + repr(argv) + ")\n"
             "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    result = json.loads(done.stderr.strip().splitlines()[-1])
    assert result == {"code": 0, "torch": False}, done.stderr
    gpu = json.loads(done.stdout)["gpu"]
    assert gpu["board"] == "h100-sxm" and gpu["predicted_allocated_peak_bytes"] is None and "--hf-config" in gpu["gap"]


@pytest.mark.skipif(tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5),
                    reason=f"torch {torch.__version__} has no public torch.distributed.tensor.DTensor (torch 2.4.1)")
@pytest.mark.slow  # 1.4 CPU s: two traces of a gpt-tiny step (measured with 5 agents on 2 cores)
def test_the_sharded_tracker_feeds_the_allocator_as_the_verified_recorder_does() -> None:
    """One process, no sharding: the tracker ``shard --device`` uses over fake CPU tensors gives the
    allocator model what :func:`predict_cuda_step_memory` gives it over meta tensors (the path equal to
    the H100's ``max_memory_allocated``): the same start, peaks and reserved, AdamW's step counts kept
    off the device as CUDA keeps them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from resacct.account.gpu.tracing.cuda_step import cuda_adamw, predict_cuda_step_memory
    from resacct.account.gpu.answers.sharded_cuda import CudaShardedTracker, _step_counts
    from resacct.measurement.activation_checkpointing import gpt_loss
    from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step
    from resacct.training.gpt import build_gpt, get_gpt_config

    def loss(model, batch):  # type: ignore[no-untyped-def]
        return gpt_loss(model, *batch)

    tokens = torch.zeros(8, 128, dtype=torch.long)
    predicted = predict_cuda_step_memory(build_gpt(get_gpt_config("gpt-tiny"), device="meta", seed=None), (tokens, tokens), loss)
    tracker = CudaShardedTracker()
    with FakeTensorMode():
        net, fake_tokens = build_gpt(get_gpt_config("gpt-tiny"), device="cpu", seed=None), torch.zeros(8, 128, dtype=torch.long)
        with tracker:
            tracker.classify(list(net.parameters()), "parameters")
            tracker.classify([fake_tokens], "inputs")
            optimizer = cuda_adamw(list(net.parameters()))
            make_optimizer_state(net, optimizer)
            tracker.on_host(_step_counts(optimizer))
            run_training_step(net, (fake_tokens, fake_tokens), loss, optimizer, tracker.mark)
    assert tracker.window is not None
    assert (tracker.window[0], tracker.allocator.peak_allocated_bytes, tracker.allocator.peak_reserved_bytes) == (
        predicted.start_allocated_bytes, predicted.peak_allocated_bytes, predicted.peak_reserved_bytes)


@pytest.mark.skipif(tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5),
                    reason=f"torch {torch.__version__} has no meta kernel for _scaled_dot_product_efficient_attention (torch 2.4.1)")
def test_flash_routing_sends_values_of_another_head_size_to_the_efficient_kernel() -> None:
    """DeepSeek's MLA: queries and keys of 192, values of 128. CUDA's flash kernel needs one head
    size, so sdpa takes the efficient kernel there; flash's meta kernel would return 192-wide outputs
    (and o_proj would refuse them: ``infer --hf-config deepseek-v3 --device h100`` did)."""
    import torch.nn.functional as F

    from resacct.account.gpu.tracing.cuda_step import _CudaAttention

    query, value = torch.empty(1, 4, 16, 192, device="meta"), torch.empty(1, 4, 16, 128, device="meta")
    with _CudaAttention("flash") as routing:
        mixed = F.scaled_dot_product_attention(query, query, value, is_causal=True)
        same = F.scaled_dot_product_attention(query, query, query, is_causal=True)
    assert routing.calls == 2 and mixed.shape[-1] == 128 and same.shape[-1] == 192
    # what the kernels themselves return: flash keeps the queries' width, efficient the values'
    assert torch.ops.aten._scaled_dot_product_flash_attention(query, query, value, 0.0, True)[0].shape[-1] == 192


MIXTRAL = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256, "num_local_experts": 8, "num_experts_per_tok": 2}


@needs_gqa_flops
def test_infer_of_a_mixtral_on_a_board_holds_its_weights_not_a_weight_copy_per_token(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``infer --hf-config mixtral-8x7b --device h100`` said 2980.60 GB at 1 × 4096 where the weights are 93.41 GB:
    transformers' ``batched_mm`` experts (what resacct builds Mixtral with) gather the expert weights for every
    (token, expert) pair. On a CUDA board transformers runs ``grouped_mm`` by default: the answer is the weights,
    the cache and the prefill's activations, as the CPU ``infer`` counts the first two."""
    pytest.importorskip("transformers")
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    batch, context = 2, 128
    fields = _json(capsys, "infer", "--hf-config", str(path), "--batch", str(batch), "--context", str(context), "--device", "h100")
    gpu = fields["gpu"]
    held = fields["weight_bytes"] + fields["kv_cache_bytes"] + gpu["library_workspace_bytes"]  # and the prefill's cuBLAS workspace
    assert gpu["gap"] is None and gpu["predicted_reserved_peak_bytes"] >= gpu["predicted_allocated_peak_bytes"] > held
    # what batched_mm gathered in one layer: a bf16 copy of the gate, up and down weights for each of T·k rows
    gathered_one_layer = batch * context * MIXTRAL["num_experts_per_tok"] * 3 * MIXTRAL["hidden_size"] * MIXTRAL["intermediate_size"] * 2
    assert gpu["predicted_allocated_peak_bytes"] - held < gathered_one_layer / 10


@pytest.mark.slow  # a real CPU prefill beside the meta one (1.4-1.8 s here); the quick tier keeps the CLI test above
def test_grouped_experts_traced_on_meta_allocate_what_the_real_prefill_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The grouped experts of ``infer --device`` on meta against the same prefill run for real on CPU tensors
    (transformers' grouped_mm forward, its grouped matmul by transformers' fallback op on both), both through
    the allocator model: the same peaks to the byte; and batched_mm's weight copies, which it replaces."""
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
    from resacct.account.gpu.answers.command_answers import grouped_experts, kv_prefill
    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory, sdpa_routing
    from resacct.account.load.hf_models import build_hf_model, load_hf_config

    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    spec, ids = load_hf_config(str(path)), torch.zeros(2, 64, dtype=torch.long)
    batched = build_hf_model(spec, device="meta").to(torch.bfloat16).eval()
    assert batched.config._experts_implementation == "batched_mm"
    grouped = predict_cuda_step_memory(grouped_experts(build_hf_model(spec, device="meta")).to(torch.bfloat16).eval(), ids, kv_prefill, None)
    real = grouped_experts(build_hf_model(spec, device="cpu")).to(torch.bfloat16).eval()
    with sdpa_kernel(SDPBackend.MATH), sdpa_routing(None), AllocationRecorder(device="cpu", cuda_kernels=True) as recorder:
        for tensor in [*real.parameters(), *real.buffers(), ids]:
            recorder.track(tensor)
        recorder.start_window()
        kv_prefill(real, ids)
    assert (grouped.peak_allocated_bytes, grouped.peak_reserved_bytes) == (recorder.allocator.peak_allocated_bytes, recorder.allocator.peak_reserved_bytes)
    copies = predict_cuda_step_memory(batched, ids, kv_prefill, None)
    assert copies.peak_allocated_bytes - copies.start_allocated_bytes > 10 * (grouped.peak_allocated_bytes - grouped.start_allocated_bytes)


@needs_gqa_flops
@pytest.mark.slow  # four infer commands, each a traced prefill and decode (4.8 s)
def test_infer_on_a_recorded_board_says_what_its_record_measured_of_generated_tokens(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Beside the decode prediction, the H200 record's served models in the same weight format, with sdpa's own choice:
    bf16 ran cuDNN's attention, whose host time a call made a token 38-41 ms (docs/gpu.md) — numbers read from the record."""
    from resacct.account.gpu.records.board_record import read_board_record
    from resacct.account.gpu.records.recorded_serving import recorded_decodes

    measured = {decode.name: decode for decode in recorded_decodes(read_board_record("docs/gpu/2026-11-30-h200-record.json.gz"))}
    assert measured["llama-3.2-1b/bf16/serve"].attention == "cuDNN" and measured["hf-gpt2/fp32/serve"].attention == "efficient"
    assert measured["llama-3.2-1b/bf16/serve"].token_sec > 10 * measured["llama-3.2-1b/bf16/serve"].kernels_sec  # the host's token
    bf16 = _json(capsys, "infer", "--hf-config", config_path, "--context", "64", "--weights", "bf16", "--device", "h200")["gpu"]
    assert "llama-3.2-1b/bf16/serve (1 × 1,057 cached) 40.9 ms a token" in bf16["decode_recorded"] and "cuDNN's set-up" in bf16["decode_recorded"]
    assert "hf-gpt2" not in bf16["decode_recorded"]
    fp32 = _json(capsys, "infer", "--hf-config", config_path, "--context", "64", "--weights", "fp32", "--kv-format", "fp32", "--device", "h200")["gpu"]
    assert fp32["decode_recorded"].count("/serve") == 1 and "attention efficient" in fp32["decode_recorded"] and "cuDNN" not in fp32["decode_recorded"]
    assert _json(capsys, "infer", "--hf-config", config_path, "--context", "64", "--device", "a100")["gpu"]["decode_recorded"] is None  # no record
    assert main(["infer", "--hf-config", config_path, "--context", "64", "--weights", "bf16", "--device", "h200"]) == 0
    assert "    decode measured on the board's record (2026-11-30;" in capsys.readouterr().out


def test_a_gap_from_a_known_torch_limit_names_the_limit_not_a_bare_assertion() -> None:
    """torch 2.8 and 2.9's FLOP counter asserts on grouped-query attention without a message: a command's GPU answer said
    "the prefill could not be traced on meta tensors (AssertionError: )". It names the limit now."""
    from resacct.account.gpu.answers.command_answers import _why

    def sdpa_flop_count() -> None:  # torch's function, as the traceback shows it
        raise AssertionError()  # the bare assert torch 2.8 makes (an `assert` here would carry pytest's rewritten message)

    gap = ""
    try:
        sdpa_flop_count()
    except AssertionError as error:
        gap = _why(error, "the prefill")
    assert gap.startswith(f"the prefill could not be traced on meta tensors: torch {torch.__version__}'s FlopCounterMode cannot count")
    assert "AssertionError" not in gap
    try:
        raise RuntimeError("some other failure\nsecond line")
    except RuntimeError as error:
        assert _why(error, "the prefill") == "the prefill could not be traced on meta tensors (RuntimeError: some other failure)"
