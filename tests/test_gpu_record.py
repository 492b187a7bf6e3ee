"""tools/gpu_record.py, the GPU recorder (issue 31; docs/gpu.md "Recording a board"): its dry run on
the CPU runs the recorder's own code on tiny shapes, so it cannot rot between GPU loans.

In a dry run the trace comes from resacct's allocation recorder and allocator model, not from a
GPU, so its replay holding is a check of the plumbing (format, window, replay), not of the model.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_record.py"
sys.path.insert(0, str(REPO / "tools"))

import gpu_record  # noqa: E402
import gpu_record_origins  # noqa: E402
import gpu_record_serve  # noqa: E402
import gpu_record_step  # noqa: E402

from resacct.account.gpu.records.board_record import ceilings_in_brief  # noqa: E402
from tests.fake_wheel import make_wheel  # noqa: E402
from resacct.account.gpu.records.record import check_record_layout  # noqa: E402

#: one step of each model family and of each recipe kind: the slow test's dry run
DRY_STEPS = ["gpt2-small/fp32/math", "hf-gpt2/bf16-autocast/flash", "llama-3.2-1b-lora/bf16/flash",
             "mixtral-small/bf16-autocast/batched_mm-experts", "gpt2-small/fp32/efficient/expandable"]
#: and one served model (infer's prefill and decode)
DRY_SERVING = ["hf-gpt2/fp32/serve"]


def test_the_matrix_spans_what_issue_31_asks() -> None:
    matrix = gpu_record.MATRIX
    assert len(matrix) >= 10
    families = {family for family, *_ in matrix.values()}
    recipes = {recipe for _, _, recipe, *_ in matrix.values()}
    attentions = {attention for _, _, _, attention, *_ in matrix.values()}
    models = {json.dumps(model, sort_keys=True) for _, model, *_ in matrix.values()}
    assert families == {"resacct", "hf", "lora"}
    assert {"fp32", "bf16-autocast", "bf16-fp32-master"} <= recipes
    assert {"flash", "efficient", "math"} <= attentions
    assert len(models) == 5  # resacct's gpt2-small, HF GPT-2, Llama-3.2-1B, a GQA Llama, Mixtral
    assert {extra.get("experts") for *_, extra in matrix.values()} >= {"eager", "batched_mm", "grouped_mm"}  # grouped_mm: what --device predicts
    gqa = gpu_record.GQA_LLAMA
    assert gqa["num_attention_heads"] > gqa["num_key_value_heads"] > 1
    assert any(extra.get("expandable_segments") for *_, extra in matrix.values())
    serving = gpu_record.SERVING  # what infer --device predicts: a prefill and its decode, bf16 and fp32 weights, grouped-query attention too
    assert len(serving) >= 2 and {weights for _, weights, *_ in serving.values()} >= {"bf16", "fp32"}
    assert any(model is gqa for model, *_ in serving.values()) and all(tokens >= 16 for *_, tokens in serving.values())
    assert not set(serving) & set(matrix)


def test_unknown_step_and_missing_out_are_usage_errors(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--only", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("gpu_record.py: unknown step 'nope'") and "Traceback" not in done.stderr
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "no --out and no $OUT" in done.stderr


def test_a_usage_error_answers_before_torch_is_imported(tmp_path: Path) -> None:
    """The recorder's bad arguments are refused at once (0.15 s, not the 3 s torch's import took until session 25)."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['gpu_record.py', '--dry-run', '--out', {str(tmp_path)!r}, '--only', 'nope']\n"
            "try:\n    runpy.run_path(sys.argv_path, run_name='__main__')\nexcept SystemExit as stop:\n    print(stop.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code.replace("sys.argv_path", repr(str(SCRIPT)))], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.stdout.split() == ["2", "False"], done.stderr[-2000:]


#: the tests reading the one dry run: on one xdist worker, so the ~70 s run is made once a tier, not once per worker
same_dry_run = pytest.mark.xdist_group("gpu-record-dry-run")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("transformers")  # the HF steps build models (torch 2.4: transformers 5.x cannot)
    out = tmp_path_factory.mktemp("gpu-record-out")
    wheels = tmp_path_factory.mktemp("wheels")  # the device run's --wheels path, with a wheel made here (a device carries transformers')
    make_wheel(wheels)
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", ",".join(DRY_STEPS + DRY_SERVING), "--step-limit", "240",
                           "--budget", "1500", "--wheels", str(wheels)], cwd=REPO, capture_output=True, text=True, timeout=1600)
    return done, out


@pytest.mark.slow
@same_dry_run
def test_dry_run_writes_a_whole_record_that_replays(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-record-summary.json", "gpu-record.json.gz", "gpu-record.log"]
    record = json.loads(gzip.open(out / "gpu-record.json.gz", "rt").read())
    assert check_record_layout(record) == []
    assert record["dry_run"] is True and [step["name"] for step in record["steps"]] == DRY_STEPS
    assert record["wheels"].startswith("installed resacct_wheel_probe-0.1-py3-none-any.whl (transformers ")  # every step ran with them
    for step in record["steps"]:
        assert step["trace_complete"] and step["trace"][0][0] == "segment_alloc"
        assert 0 < step["window_start"] < len(step["trace"])
        assert step["replay"]["holds"], step["name"]
        assert step["max_memory_reserved"] >= step["max_memory_allocated"] > 0
        assert step["step_time_sec"]["median"] > 0 and len(step["step_time_sec"]["all"]) == gpu_record.TIMED_STEPS_DRY
        # the host's time to the step's last launch, each no longer than its step; each phase's, as the step marks them
        enqueued = step["host_enqueue_sec"]["all"]
        assert len(enqueued) == gpu_record.TIMED_STEPS_DRY and all(0 < host <= whole for host, whole in zip(enqueued, step["step_time_sec"]["all"]))
        assert list(step["host_phase_sec"]) == ["forward", "backward", "optimizer step", "zero_grad"] and all(v > 0 for v in step["host_phase_sec"].values())
        mm = [op for op in step["ops"] if op["name"] in ("aten::mm", "aten::addmm", "aten::bmm")]
        assert mm and all(op["shapes"] and op["calls"] > 0 for op in mm)
    ceilings = record["ceilings"]
    assert set(ceilings["matmul"]) >= {"bf16", "fp16", "tf32", "fp32"}
    assert ceilings["matmul"]["fp32"]["max_flops_per_sec"] > 0 and ceilings["copy"]["bandwidth_bytes_per_sec"] > 0
    assert ceilings["launch"]["per_launch_sec"] > 0
    assert len(record["library_probe"]["stages"]) == 4 and record["library_probe"]["device"] == "cpu"  # the cuBLAS workspace probe
    # sdpa's kernels over a sweep of shapes (a dry run: the CPU's math kernel on two tiny shapes), each timed forward and with its backward
    assert [row["kernel"] for row in ceilings["attention"]["decode"]] == ["math"] and ceilings["attention"]["decode"][0]["growing_sec"] > 0
    attention = ceilings["attention"]["sweep"]
    assert [(row["batch"], row["seq"]) for row in attention] == [(1, 16), (2, 32)] and ceilings["attention"]["skipped"] == 0
    assert all(row["forward_backward_sec"] > row["forward_sec"] > 0 and row["forward_flops"] == 4 * row["batch"] * row["heads"] * row["seq"] ** 2
               * row["head_size"] for row in attention)
    # where a transformers step's process's first allocations come from: each with its Python frames, innermost first
    origins = record["allocation_origins"]
    assert origins["step"] == "hf-gpt2/fp32/efficient" and len(origins["allocations"]) == gpu_record_origins.KEPT_ALLOCATIONS
    assert origins["allocations"][0]["size"] == origins["first_parameter_bytes"]  # on a CPU the model's embedding comes first
    assert any(frame.startswith("transformers/models/gpt2/modeling_gpt2.py:") for frame in origins["allocations"][0]["frames"])
    summary = json.loads((out / "gpu-record-summary.json").read_text())
    assert summary["failed"] == [] and summary["record_bytes"] < 10 * 2**20 and summary["library_probe_status"] == "ok"
    assert summary["allocation_origins_status"] == "ok"
    assert all(row["status"] == "ok" and row["replay"]["holds"] for row in summary["steps"])
    # the summary the commands read (board_record.board_ceilings): the record's own ceilings in brief, its date and board
    assert summary["ceilings"] == ceilings_in_brief(record["ceilings"]) and summary["when"] == record["when"] and summary["dry_run"] is True
    assert set(summary["ceilings"]["matmul_flops_per_sec"]) >= {"bf16", "fp16", "tf32", "fp32"}
    # each step keeps the config its model was built from (a dry run's tiny one): a replay rebuilds that model
    assert record["steps"][0]["model_config"]["n_layers"] == 2 and record["steps"][1]["model_config"]["n_embd"] == gpu_record.TINY["n_embd"]
    # the served model: weights, the first prefill with its cache kept (traced from the first allocation), then its times
    (served,) = record["serving"]
    assert served["name"] == DRY_SERVING[0] and served["window_start"] == 0 and served["replay"]["holds"]
    assert served["model_config"]["n_embd"] == gpu_record.TINY["n_embd"] and (served["batch"], served["context"]) == gpu_record_serve.DRY_SIZES[:2]
    assert served["max_memory_allocated"] >= served["weight_bytes"] + served["kv_cache_bytes"] > served["weight_bytes"] > 0
    assert len(served["prefill_sec"]["all"]) == gpu_record_serve.TIMED_PREFILLS and len(served["decode_sec_per_token"]["all"]) == served["new_tokens"]
    # as many tokens again with the entry's own kernel forced (the board's own choice for one query may be another kernel)
    forced = served["decode_forced_sec_per_token"]
    assert forced["kernel"] == served["attention"] and len(forced["all"]) == served["new_tokens"] and forced["median"] > 0
    assert any(op["name"] in ("aten::mm", "aten::addmm") for op in served["ops"])
    # one more token's forward profiled: its ops beside the prefill's (what infer --device traces for a decode step)
    assert any(op["name"] in ("aten::mm", "aten::addmm") for op in served["decode_ops"]) and served["decode_ops"] != served["ops"]
    assert [row["name"] for row in summary["serving"]] == DRY_SERVING and summary["serving"][0]["decode_sec_per_token"] > 0
    assert summary["serving"][0]["decode_forced_sec_per_token"] == forced["median"]


@pytest.mark.slow
@same_dry_run
def test_dry_run_records_the_recipes_and_kernels_it_names(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    record = json.loads(gzip.open(dry_run[1] / "gpu-record.json.gz", "rt").read())
    steps = {step["name"]: step for step in record["steps"]}
    def ops(name: str) -> set[str]:
        return {op["name"] for op in steps[name]["ops"]}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops("hf-gpt2/bf16-autocast/flash")  # the CPU's flash kernel
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in ops("gpt2-small/fp32/math")
    assert any("BFloat16" in json.dumps(op["dtypes"]) or "c10::BFloat16" in json.dumps(op["dtypes"]) for op in steps["hf-gpt2/bf16-autocast/flash"]["ops"])
    lora = steps["llama-3.2-1b-lora/bf16/flash"]
    assert lora["parameters"] > 0 and lora["max_memory_allocated"] < steps["mixtral-small/bf16-autocast/batched_mm-experts"]["max_memory_allocated"]


@pytest.mark.slow
@same_dry_run
def test_replay_reads_the_record_back(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(dry_run[1] / "gpu-record.json.gz")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = len(DRY_STEPS + DRY_SERVING)
    assert "DRY RUN" in done.stdout and f"{recorded} of {recorded} recorded steps replay exactly" in done.stdout


@pytest.mark.slow  # 3.4 CPU s: a child process importing torch (measured with 5 agents on 2 cores)
def test_replay_of_a_broken_record_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "resacct-gpu-record/1", "steps": []}))
    done = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a whole record (no 'board')" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(tmp_path / "absent.json.gz")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "absent.json.gz: no such file" in done.stderr and "Traceback" not in done.stderr


def test_op_times_carry_shapes_and_dtypes_even_where_function_events_lack_dtypes() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(8, 4), torch.randn(4, 2, dtype=torch.float32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        (a @ b).relu()
    for event in prof.events():
        object.__setattr__(event, "input_dtypes", None)  # torch 2.11's FunctionEvent (the H100 image) has no input_dtypes
    rows = {row["name"]: row for row in gpu_record.op_times(prof)}
    assert rows["aten::mm"]["shapes"] == [[8, 4], [4, 2]] and rows["aten::mm"]["dtypes"] == ["float", "float"]
    assert rows["aten::matmul"]["top_level"] and not rows["aten::mm"]["top_level"] and rows["aten::mm"]["calls"] == 1


@pytest.fixture
def stubbed_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.cuda's calls answered by resacct's allocation recorder, tensors on the CPU; the calls made, in order."""
    pytest.importorskip("transformers")  # an HF step builds its model (torch 2.4: transformers 5.x cannot)
    import torch

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder

    recorder = AllocationRecorder(device="cpu")
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": 2**64 - 1, "expandable_segments": False, "roundup_power2_divisions": [1]}
    calls: list[str] = []

    def history(enabled: str | None = "all", **kwargs: object) -> None:
        calls.append(f"history {enabled} context={kwargs.get('context', 'all')}")
        if enabled:
            recorder.__enter__()
        else:
            recorder.__exit__(None, None, None)

    monkeypatch.setattr(gpu_record_step, "CUDA_DEVICE", "cpu")
    monkeypatch.setattr(gpu_record_serve, "CUDA_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("init"))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {**recorder.snapshot(), "allocator_settings": settings})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: recorder.allocator.reset_peaks())
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: recorder.allocator.peak_allocated_bytes)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: recorder.allocator.peak_reserved_bytes)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: recorder.allocator.allocated_bytes)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: recorder.allocator.reserved_bytes)
    return calls


@pytest.mark.slow  # 2.5 CPU s: a GQA Llama step recorded seven times (measured with 5 agents on 2 cores)
def test_the_cuda_branch_runs_against_a_stubbed_torch_cuda(stubbed_cuda: list[str]) -> None:
    """record_step's CUDA branch (history on, snapshot, peaks, settings), never run on this CPU
    otherwise: torch.cuda's calls answered by resacct's allocation recorder, tensors on the CPU."""
    calls = stubbed_cuda
    step = gpu_record.record_step("gqa-llama/bf16/flash", dry=False)
    assert calls == ["init", "history all context=None", "history None context=all"]
    assert step["allocator_settings"] == {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": 2**64 - 1, "expandable_segments": False}
    assert step["replay"]["holds"] and step["trace_complete"] and 0 < step["window_start"] < len(step["trace"])
    assert len(step["step_time_sec"]["all"]) == gpu_record.TIMED_STEPS and step["ops"]
    assert len(step["host_enqueue_sec"]["all"]) == gpu_record.TIMED_STEPS and 0 < step["host_enqueue_sec"]["median"] <= max(step["step_time_sec"]["all"])
    assert json.loads(json.dumps(step)) == step  # what the child prints must be JSON


@pytest.mark.slow  # a tiny GQA Llama served: 6 prefills and 4 tokens
def test_the_serving_cuda_branch_runs_against_a_stubbed_torch_cuda(stubbed_cuda: list[str]) -> None:
    """record_serving's CUDA branch: the history from before the weights are loaded to the first prefill's end, then off
    (the timed prefills and tokens run without it); the allocator's settings kept; the KV cache's bytes the model's own."""
    served = gpu_record_serve.record_serving("gqa-llama/bf16/serve", dry=False)
    assert stubbed_cuda == ["init", "history all context=None", "history None context=all"]
    assert served["allocator_settings"] == {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": 2**64 - 1, "expandable_segments": False}
    assert served["replay"]["holds"] and served["trace_complete"] and served["window_start"] == 0 and served["trace"][0][0] == "segment_alloc"
    config = served["model_config"]
    batch, context, tokens = gpu_record_serve.DRY_SIZES
    head_dim = config["head_dim"]
    # bf16 keys and values of every layer for batch × context positions (the cache the forward returned, counted)
    assert served["kv_cache_bytes"] == 2 * config["num_hidden_layers"] * batch * context * config["num_key_value_heads"] * head_dim * 2
    assert served["weight_bytes"] == 2 * served["parameters"] and len(served["decode_sec_per_token"]["all"]) == tokens
    assert served["decode_forced_sec_per_token"]["kernel"] == "flash" and len(served["decode_forced_sec_per_token"]["all"]) == tokens
    assert json.loads(json.dumps(served)) == served


def test_the_library_probe_reads_the_allocator_around_the_first_matmuls(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The probe that will confirm or refute the cuBLAS workspaces (docs/gpu.md): its CUDA branch against a
    stubbed torch.cuda (resacct's allocation recorder answers, tensors on the CPU: no workspace can appear,
    so each stage's growth is the tensors' own), and the script's ``--library --dry-run`` child printing JSON."""
    import torch

    from resacct.account.gpu.tracing.allocation_trace import AllocationRecorder
    from resacct.account.gpu.allocator.library_workspaces import probe_library_allocations

    recorder = AllocationRecorder(device="cpu")
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kwargs: recorder.__enter__() if enabled else recorder.__exit__(None, None, None))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", recorder.snapshot)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: recorder.allocator.allocated_bytes)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: recorder.allocator.reserved_bytes)
    probe = probe_library_allocations("cpu", cuda=True)
    inputs = probe["stages"][0]
    assert inputs["allocated"] == 2 * 64 * 64 * 4 + 512 and inputs["reserved"] == 2 * 2**20  # two 16 KiB blocks and a bias in a small segment
    assert all(stage["trace_entries"] >= inputs["trace_entries"] > 0 for stage in probe["stages"])
    assert probe["trace"][0] == ["segment_alloc", 2 * 2**20] and {action for action, _ in probe["trace"]} >= {"alloc", "free_completed"}
    assert json.loads(json.dumps(probe)) == probe
    assert gpu_record.main(["--library", "--dry-run"]) == 0
    assert len(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]) == 4


def test_compare_adds_the_boards_cublas_workspaces_to_a_board_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A board's record holds absolute peaks, the workspaces of the warm-up steps in them: --compare's
    prediction adds what PyTorch's source gives that capability (two 32 MiB on sm90 for a step with a
    backward, no bias here), the probe's environment respected."""
    pytest.importorskip("transformers")
    tiny = {"model_type": "llama", **{key: gpu_record.TINY[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                                                          "num_attention_heads", "num_key_value_heads", "head_dim")}}
    monkeypatch.setitem(gpu_record.MATRIX, "tiny/bf16/flash", ("hf", tiny, "bf16", "flash", 1, 16, {}))
    step = {"name": "tiny/bf16/flash", "batch": 1, "seq": 16, "allocator_settings": {}}
    hopper = gpu_record.predict_recorded_step(step, False, "9.0")
    config = gpu_record.predict_recorded_step(step, False, "9.0", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    # the same step, its two workspaces 32 MiB each by default and 128 KiB each under the probe's CUBLAS_WORKSPACE_CONFIG (kept: exact)
    assert hopper.peak_allocated_bytes - config.peak_allocated_bytes == 2 * (32 * 2**20 - 128 * 1024)
    assert hopper.start_allocated_bytes - config.start_allocated_bytes == 2 * (32 * 2**20 - 128 * 1024)


@pytest.mark.slow
@same_dry_run
def test_compare_predicts_each_recorded_step(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """--compare rebuilds each step on meta tensors and predicts it beside the record (a dry run's
    numbers compare CPU kernels with CUDA's choices: the plumbing is checked, not the ratios)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--compare", str(dry_run[1] / "gpu-record.json.gz")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[2:]}
    assert set(lines) == set(DRY_STEPS + DRY_SERVING)
    # the served model as infer --device predicts it, on the CPU's kernels (a dry run): the recorder loads the weights as
    # the prediction does, so fp32 GPT-2's weights and prefill are predicted to the byte
    assert "cannot predict" not in lines[DRY_SERVING[0]]
    allocated, recorded = (int(word.replace(",", "")) for word in lines[DRY_SERVING[0]].split()[1:3])
    assert allocated == recorded
    assert "cannot predict" not in lines["hf-gpt2/bf16-autocast/flash"]  # CUDA autocast's casts on meta (resacct/account/gpu/tracing/cuda_autocast.py)
    for name in ("gpt2-small/fp32/math", "llama-3.2-1b-lora/bf16/flash", "hf-gpt2/bf16-autocast/flash"):
        if name in lines:
            ratios = [float(word) for word in lines[name].split()[1:] if "." in word and "," not in word]
            assert len(ratios) == 2 and all(0.5 < ratio < 2 for ratio in ratios), lines[name]


@pytest.mark.slow  # two child processes (the library probe, the ceilings): ~6 s
def test_a_spent_budget_skips_steps_and_served_models_and_the_record_stays_whole(tmp_path: Path) -> None:
    """--budget too small for any step (130 s are kept for the ceilings and the bundle): every step and served model is
    written as skipped, the record is whole, the summary names them failed, exit 1; their claims are comments only."""
    from gpu_record_claims import claims_yaml

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "gpt2-small/fp32/math,hf-gpt2/fp32/serve",
                           "--budget", "140"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    record = json.loads(gzip.open(out / "gpu-record.json.gz", "rt").read())
    assert check_record_layout(record) == []
    skipped = {"error": "skipped: the budget was spent"}
    assert record["steps"] == [{"name": "gpt2-small/fp32/math", **skipped}] and record["serving"] == [{"name": "hf-gpt2/fp32/serve", **skipped}]
    summary = json.loads((out / "gpu-record-summary.json").read_text())
    assert summary["failed"] == ["gpt2-small/fp32/math", "hf-gpt2/fp32/serve"] and summary["ceilings_status"] == "ok"
    text = claims_yaml("docs/gpu/x.json.gz", dict(record, dry_run=False, board="NVIDIA H200"))
    assert "- id:" not in text and text.count("not recorded (skipped: the budget was spent): no claims") == 2


def test_a_recorded_step_forcing_the_efficient_kernel_on_grouped_query_attention_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder forces the step's kernel (sdpa_kernel): on the H200 (torch 2.11) the memory-efficient kernel refused
    grouped-query attention ("No available kernel"), so its prediction says so instead of predicting a step that cannot run."""
    pytest.importorskip("transformers")
    from resacct.errors import ResacctError

    tiny = {"model_type": "llama", **{key: gpu_record.TINY[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                                                          "num_attention_heads", "num_key_value_heads", "head_dim")}}
    assert tiny["num_key_value_heads"] < tiny["num_attention_heads"]
    monkeypatch.setitem(gpu_record.MATRIX, "tiny/bf16/efficient", ("hf", tiny, "bf16", "efficient", 1, 16, {}))
    with pytest.raises(ResacctError, match="memory-efficient kernel, which refuses it"):
        gpu_record.predict_recorded_step({"name": "tiny/bf16/efficient", "batch": 1, "seq": 16, "allocator_settings": {}}, False, "9.0")


def test_a_forced_kernel_that_refuses_the_token_is_recorded_as_its_error_and_the_entry_kept() -> None:
    import torch

    class Refusing(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, use_cache: bool = True, past_key_values: object = None) -> None:
            raise RuntimeError("No available kernel. Aborting execution.")

    synced: list[int] = []
    forced = gpu_record_serve.forced_decode_times(Refusing(), torch.zeros(1, 1, dtype=torch.long), object(), "flash", True, 4, lambda: synced.append(1))
    assert forced == {"kernel": "flash", "error": "RuntimeError: No available kernel. Aborting execution."} and synced == [1]


def test_the_origins_probe_keeps_the_boards_first_allocations_with_their_frames() -> None:
    """On a board the probe reads the history's trace (``context="alloc"``): the first allocations, frees left out, each
    with its frames shortened to the package's path (the 4-byte block of the H200 record is what it looks for)."""
    frame = {"filename": "/opt/venv/lib/python3.12/site-packages/transformers/modeling_utils.py", "line": 1234, "name": "post_init"}
    ours = {"filename": "/work/repo/resacct/account/load/hf_models.py", "line": 12, "name": "build_hf_model"}
    trace = [{"action": "segment_alloc", "size": 2097152, "frames": []}, {"action": "alloc", "size": 512, "frames": [frame, ours]},
             {"action": "free_requested", "size": 512, "frames": [frame]}]
    trace += [{"action": "alloc", "size": 65536 * index, "frames": []} for index in range(1, 9)]
    kept = gpu_record_origins._board_allocations({"device_traces": [trace]})
    assert len(kept) == gpu_record_origins.KEPT_ALLOCATIONS and [row["size"] for row in kept[:3]] == [512, 65536, 131072]
    assert kept[0]["frames"] == ["transformers/modeling_utils.py:1234 post_init", "resacct/account/load/hf_models.py:12 build_hf_model"]


def test_the_attention_sweep_times_each_shape_forward_and_backward_within_its_budget() -> None:
    import gpu_record_ceilings

    swept = gpu_record_ceilings.attention_sweep(True, 60.0)
    assert [(row["kernel"], row["batch"], row["seq"]) for row in swept["sweep"]] == [("math", 1, 16), ("math", 2, 32)]
    assert all(row["forward_backward_sec"] > 0 and row["forward_sec"] > 0 for row in swept["sweep"])
    spent = gpu_record_ceilings.attention_sweep(True, 0.0)  # no budget left: nothing timed, each shape counted as skipped
    assert spent["sweep"] == [] and spent["skipped"] == 2
    # one query over a cache of one length, then over a cache one position longer each call (a decode loop's shapes)
    (decode,) = gpu_record_ceilings.decode_attention_calls(True, 60.0)
    assert decode["kernel"] == "math" and decode["repeated_sec"] > 0 and decode["growing_sec"] > 0
    assert gpu_record_ceilings.decode_attention_calls(True, 0.0) == [{"kernel": "math", "skipped": True}]
