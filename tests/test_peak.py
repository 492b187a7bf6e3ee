"""The step peak predicted on fake tensors (resacct.account.peak.step_peak) against the CPU allocator
(resacct.measurement.memory_timeline), the breakdown at the peak, the timeline PNG and the CLI."""

from __future__ import annotations

import json
import resource

import pytest
import torch

from resacct.account.peak import kernel_workspace
from resacct.account.peak import tracker as peak_tracker
from resacct.account.peak.step_peak import account_model_step_peak, measure_step_peak, predict_step_peak
from resacct.account.peak.models import peak_model, selective_checkpointing_missing
from resacct.cli import main
from resacct.errors import ResacctError
from resacct.account.peak.recipes import recipe_step
from resacct.facts.recipes import parse_recipe
from resacct.measurement.memory_timeline import STEP_PHASES
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel


def _adamw(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)


def _both(name: str, batch: int, seq: int):
    model, inputs, loss_fn = peak_model(name, batch=batch, seq=seq)
    return predict_step_peak(model, inputs, loss_fn, _adamw), measure_step_peak(model, inputs, loss_fn, _adamw)


def _predicted(name: str, batch: int, seq: int):
    """The prediction alone, on a freshly built model (the blind predictions below: the allocator's truth is unchanged)."""
    model, inputs, loss_fn = peak_model(name, batch=batch, seq=seq)
    return predict_step_peak(model, inputs, loss_fn, _adamw)


@pytest.mark.parametrize(("name", "batch", "seq"), [("mlp", 16, 1), ("mlp-mse", 16, 1), ("sdpa-block", 2, 64), ("gpt-math", 2, 16), ("gpt-sdpa", 2, 16),
                                                    ("gpt-checkpointed", 2, 16), ("gpt-checkpointed-selective", 2, 32),
                                                    ("gpt-checkpointed-first-block", 2, 32), ("llama-sdpa", 2, 16)])
def test_predicted_peak_equals_the_allocator_to_the_byte_in_every_phase(name, batch, seq):
    pytest.importorskip("transformers") if name.startswith("llama") else None
    if name.endswith("selective") and selective_checkpointing_missing():
        pytest.skip(selective_checkpointing_missing())
    predicted, measured = _both(name, batch, seq)
    assert predicted.peak_bytes == measured.peak_bytes
    assert predicted.timeline.start_bytes == measured.start_bytes
    assert predicted.peak.phase == measured.peak_phase
    assert {p: predicted.timeline.peak_of_phase(p) for p in STEP_PHASES} == {p: measured.peak_of_phase(p) for p in STEP_PHASES}


def test_the_breakdown_at_the_peak_sums_to_the_peak_and_names_the_state():
    predicted, _ = _both("mlp", 32, 1)
    kinds = predicted.peak.bytes_by_kind
    assert sum(kinds.values()) == predicted.peak_bytes
    parameters = sum(p.numel() for p in peak_model("mlp", batch=1, seq=1)[0].parameters())
    assert kinds["parameters"] == kinds["gradients"] == 4 * parameters
    assert kinds["optimizer state"] == 8 * parameters + 4 * 4  # m and v, and 4 float32 step counters
    assert predicted.peak.phase == "optimizer step" and predicted.attention_kernel == "none (no attention)"


def test_the_flash_kernel_workspace_follows_the_thread_count_and_without_it_the_prediction_is_wrong(monkeypatch):
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            predicted, measured = _both("sdpa-block", 4, 256)
            assert predicted.peak_bytes == measured.peak_bytes, count
            assert predicted.attention_kernel.startswith("flash (CPU)")
        assert predicted.peak.op.startswith("aten._scaled_dot_product_flash_attention_for_cpu")  # 2 threads: the backward's buffers decide
        monkeypatch.setattr(peak_tracker, "kernel_workspace_bytes", lambda *args: 0)
        blind = _predicted("sdpa-block", 4, 256)  # the allocator's peak at 2 threads is the one measured above
        assert blind.peak_bytes < measured.peak_bytes
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # ~1.0 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_python_numbers_wrapped_by_torch_are_counted_and_without_them_the_prediction_is_wrong(monkeypatch):
    pytest.importorskip("transformers")
    predicted, measured = _both("gpt2-eager", 2, 16)  # gelu_new keeps 0.5, 0.044715, √(2/π) per layer
    assert predicted.peak_bytes == measured.peak_bytes
    monkeypatch.setattr(peak_tracker, "wrapped_number_bytes", lambda *args: 0)
    blind = _predicted("gpt2-eager", 2, 16)  # the same step's allocator peak is the one measured above
    assert blind.peak_bytes != measured.peak_bytes


def test_a_meta_model_is_predicted_without_allocating_it():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8192, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192))  # 537 MB of float32
        inputs = torch.empty(64, 8192)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    predicted = predict_step_peak(model, inputs, lambda m, x: m(x).mean(), _adamw)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    parameters = 2 * (8192 * 8192 + 8192)
    assert predicted.peak.bytes_by_kind["parameters"] == 4 * parameters
    assert predicted.peak_bytes > 16 * parameters
    assert grown_kib < 100 * 1024  # far below the 2.1 GB the step would hold


def test_a_step_fake_tensors_cannot_run_is_one_line():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ResacctError, match="cannot run on fake tensors"):
        predict_step_peak(model, torch.ones(3, 4), lambda m, x: m(x)[m(x).sum(1) > 0].sum() * float(m(x).sum()), _adamw)


def _phase_peaks(timeline) -> dict[str, int]:
    return {phase: timeline.peak_of_phase(phase) for phase in STEP_PHASES}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bf16", "bf16-autocast", "bf16-fp32-master", "bf16-fp32-master-free-bf16-grads"])
def test_a_recipe_step_is_predicted_to_the_byte_in_every_phase(recipe):
    """A Llama under each recipe runnable on fake tensors."""
    pytest.importorskip("transformers")
    model, inputs, loss_fn = peak_model("llama-sdpa", batch=2, seq=16)
    step = recipe_step(parse_recipe(recipe), model, inputs, loss_fn, "adamw")
    predicted = predict_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    measured = measure_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured) and predicted.timeline.start_bytes == measured.start_bytes
    kinds = predicted.peak.bytes_by_kind
    parameters = sum(p.numel() for p in model.parameters())
    if "master" in recipe:
        assert kinds["master weights"] == 4 * parameters and kinds["parameters"] == 2 * parameters
        assert kinds["master gradients"] == 4 * parameters and predicted.peak.phase == "optimizer step"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", pytest.param("gpt-math", marks=pytest.mark.xfail(
    torch.__version__.startswith("2.4."), strict=False,
    reason="torch 2.4.1 (AVX-512 BF16 CPU, 2026-11-28): the prediction is 1,280 B above the allocator at the forward and backward "
           "peaks of the bf16 gpt-math step (mlp is exact); not investigated (issue 32)"))])
def test_a_bf16_step_with_biased_matmuls_and_a_bf16_mean_is_predicted_to_the_byte_in_every_phase(name):
    """Where bf16 matmuls go through oneDNN (AMX, AVX-512 BF16, its AVX-512 emulation) each holds a
    scratchpad while it runs, measured once per matmul (resacct.measurement.kernel_probe); a bf16
    mean sums a float32 copy of its input (resacct.account.peak.kernel_workspace). Exact on every kind."""
    model, inputs, loss_fn = peak_model(name, batch=16 if name == "mlp" else 2, seq=1 if name == "mlp" else 32)
    step = recipe_step(parse_recipe("bf16"), model, inputs, loss_fn, "adamw")
    predicted = predict_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    measured = measure_step_peak(step.model, step.inputs, step.loss_fn, step.make_optimizer)
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured) and predicted.unprobed_matmuls == 0


@pytest.mark.slow
def test_recipes_in_the_account_are_predicted_and_loss_scaling_says_why_not():
    model, inputs, _ = peak_model("mlp", batch=2, seq=1)
    account = account_model_step_peak(model, inputs, loss="mean", recipe=parse_recipe("bf16-fp32-master"), optimizer="adamw", measure=True)
    assert account.predicted.peak_bytes == account.measured.peak_bytes
    assert any("float32 master weights" in note for note in account.notes)
    scaled = account_model_step_peak(model, inputs, loss="mean", recipe=parse_recipe("fp16-autocast-scaled"), optimizer="adamw", measure=False)
    assert scaled.predicted is None and "GradScaler" in scaled.gap and len(scaled.gap.splitlines()) == 1
    assert scaled.to_dict()["predicted_peak_bytes"] is None


@pytest.mark.slow
@pytest.mark.parametrize(("name", "batch", "seq"), [("mlp", 256, 1), ("gpt-math", 2, 16)])
def test_gradient_accumulation_is_predicted_to_the_byte_in_every_phase(name, batch, seq):
    model, inputs, loss_fn = peak_model(name, batch=batch, seq=seq)
    predicted = predict_step_peak(model, inputs, loss_fn, _adamw, micro_batches=2)
    measured = measure_step_peak(model, inputs, loss_fn, _adamw, micro_batches=2)
    single = measure_step_peak(model, inputs, loss_fn, _adamw)
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured)
    assert predicted.peak_bytes == measured.peak_bytes > single.peak_bytes  # the first micro-step's gradients live on
    assert predicted.timeline.phases.count("forward") > 1 and predicted.peak.bytes_by_kind["gradients"] > 0
    with pytest.raises(ResacctError, match="whole number ≥ 1"):
        predict_step_peak(model, inputs, loss_fn, _adamw, micro_batches=0)


@pytest.mark.slow
def test_mse_loss_keeps_its_elementwise_loss_and_without_that_the_backward_is_low(monkeypatch):
    """The reduced mse loss lives in the storage of the element-wise loss (input-sized) until it dies after backward."""
    predicted, measured = _both("mlp-mse", 16, 1)
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured)
    monkeypatch.setattr(peak_tracker, "output_storage_bytes", lambda *args: None)
    blind, _ = _both("mlp-mse", 16, 1)
    assert measured.peak_of_phase("backward") - blind.timeline.peak_of_phase("backward") == 16 * 64 * 4 - 4


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mse_loss_reductions_and_dtypes_are_exact(reduction, dtype):
    try:
        torch.nn.functional.mse_loss(torch.ones(2, dtype=dtype), torch.zeros(2, dtype=dtype))
    except RuntimeError as error:  # torch 2.4: "mse_cpu" not implemented for 'BFloat16'
        pytest.skip(f"torch {torch.__version__} has no CPU mse_loss for {dtype}: {error}")
    weight = torch.nn.Parameter(torch.ones(16, 64, dtype=dtype))
    model = torch.nn.ParameterList([weight])
    x = torch.randn(16, 64, dtype=dtype)

    def loss(m, inputs):
        out = torch.nn.functional.mse_loss(inputs * m[0], torch.zeros_like(inputs), reduction=reduction)
        return out.sum() if reduction == "none" else out

    predicted, measured = predict_step_peak(model, x, loss, _adamw), measure_step_peak(model, x, loss, _adamw)
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured)


def test_the_workspace_formula_block_sizes():
    assert kernel_workspace.flash_block_sizes(1024, 1024) == (256, 512)
    assert kernel_workspace.flash_block_sizes(200, 100) == (64, 100)


@pytest.mark.slow  # 1.23 s idle on 2026-11-28
def test_cli_json_has_the_step_peak_with_its_breakdown_and_the_timeline_png(capsys, tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "step.png"
    assert main(["account", "--model", "tests.fixtures_hf_models:tiny_llama", "--batch", "2", "--seq", "16", "--json", "--timeline", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    peak = report["step_peak"]
    assert peak["predicted_peak_bytes"] == peak["measured_peak_bytes"] > 0
    # the kernel the step traced: CPU flash, or the math kernel where torch refuses flash for grouped-query attention (2.8)
    flash = cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=16, dtype="float32") == "flash"
    assert peak["attention_kernel"].startswith("flash (CPU)" if flash else "math: ")
    assert sum(peak["live_at_peak_bytes"].values()) == peak["predicted_peak_bytes"]
    assert set(peak["predicted_phase_peak_bytes"]) == set(STEP_PHASES)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_gpt_table_shows_the_step_peak(capsys):
    assert main(["account", "--model", "gpt-nano", "--batch", "2", "--seq", "16", "--no-time"]) == 0
    out = capsys.readouterr().out
    assert "step peak" in out and "at the peak: parameters" in out


@pytest.mark.parametrize(("path", "message"), [("/no/such/dir/x.png", "does not exist"), ("step.jpg", "ending in .png")])
def test_cli_bad_timeline_paths_are_one_line_exit_2(capsys, path, message):
    assert main(["account", "--timeline", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "grad_accum"), [("bf16-fp32-master", 1), ("mixed", 1), ("fp32", 2), ("mixed", 2)])
def test_account_gpt_predicts_the_step_peak_under_recipes_and_accumulation(recipe, grad_accum):
    """``resacct account --model gpt-* --recipe … --grad-accum k``: the whole step's peak is predicted
    (it said "predicted for recipes without autocast or master weights so far" before) and equals
    the CPU allocator's peak over the same step to the byte."""
    from resacct.account import account_gpt

    account = account_gpt("gpt-nano", batch=4, seq=32, recipe=recipe, grad_accum=grad_accum, measure=True, time_step=False)
    peak = account.step_peak
    assert peak.gap is None and peak.predicted is not None and peak.measured is not None
    assert peak.predicted.peak_bytes == peak.measured.peak_bytes
    if grad_accum > 1:
        assert peak.measured.phases.count("forward") >= grad_accum


class _TwoBranches(torch.nn.Module):
    """An activation used by two layers: its gradient arrives twice and autograd adds the two."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(64, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.d(self.b(h) + self.c(h))


@pytest.mark.slow
def test_a_gradient_arriving_from_two_branches_is_predicted_to_the_byte_in_every_phase():
    """The autograd engine sums the two gradients of ``h`` (in place only for a plain tensor it holds
    alone; fake tensors never qualify): on torch 2.13 the CPU allocator and the prediction agree."""
    model, inputs = _TwoBranches(), torch.randn(512, 64)
    predicted = predict_step_peak(model, inputs, lambda m, x: m(x).mean(), lambda p: torch.optim.AdamW(p))
    measured = measure_step_peak(model, inputs, lambda m, x: m(x).mean(), lambda p: torch.optim.AdamW(p))
    assert _phase_peaks(predicted.timeline) == _phase_peaks(measured)
