"""The training loop (resacct.training.train): one test per argument proving it changes what happens,
plus the schedule and clipping helpers."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from resacct.training.checkpoint import read_checkpoint
from resacct.training.data import TokenBatchSampler
from resacct.errors import ResacctError, UnknownNameError
from resacct.training.models import Cruncher
from resacct.training.train import (
    EvalRecord,
    StepRecord,
    clipped_grad_norm,
    cosine_lr,
    cosine_schedule,
    global_grad_norm,
    train,
)

DIM = 4


def model_for(seed: int = 0, dtype: torch.dtype = torch.float32) -> Cruncher:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Cruncher(dim=DIM, num_layers=2).to(dtype)


class Batches:
    """A reproducible batch source that counts how often it is called; stateful, so that
    checkpoints keep its position."""

    def __init__(self, seed: int = 0, batch_size: int = 3, dtype: torch.dtype = torch.float32):
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_size = batch_size
        self.dtype = dtype
        self.calls = 0
        self.drawn: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        x = torch.randn(self.batch_size, DIM, generator=self.generator).to(self.dtype)
        y = torch.randn(self.batch_size, 1, generator=self.generator).to(self.dtype)
        self.drawn.append((x, y))
        return x, y

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.calls = state["calls"]


def parameters_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def run(steps: int = 4, *, seed: int = 0, lr: float = 0.05, batches: Batches | None = None, **options) -> tuple[Cruncher, Batches, object]:
    model = model_for(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = batches or Batches(seed)
    result = train(model, optimizer, batches, F.mse_loss, steps=steps, **options)
    return model, batches, result


# --- the loop itself ---------------------------------------------------------------------------


def test_equals_the_lecture_loop_bit_for_bit():
    model = model_for()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = Batches()
    for _ in range(5):
        x, y = batches()
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    trained = model_for()
    train(trained, torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9), Batches(), F.mse_loss, steps=5)
    assert same(parameters_of(model), parameters_of(trained))


def test_steps_sets_how_many_optimizer_steps_and_batches():
    model = model_for()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = Batches()
    result = train(model, optimizer, batches, F.mse_loss, steps=5)
    assert batches.calls == 5 and result.final_step == 5
    assert float(optimizer.state[model.final.weight]["step"]) == 5


def test_zero_steps_changes_nothing():
    before = parameters_of(model_for())
    model, batches, result = run(steps=0)
    assert batches.calls == 0 and result.records == [] and result.final_step == 0
    assert same(before, parameters_of(model))


def test_model_optimizer_batches_and_loss_fn_all_matter():
    reference = parameters_of(run()[0])
    assert not same(reference, parameters_of(run(seed=1)[0]))  # another model initialisation
    assert not same(reference, parameters_of(run(lr=0.1)[0]))  # another optimizer setting
    assert not same(reference, parameters_of(run(batches=Batches(seed=7))[0]))  # other batches
    model = model_for()
    train(model, torch.optim.SGD(model.parameters(), lr=0.05), Batches(), F.l1_loss, steps=4)
    assert not same(reference, parameters_of(model))  # another loss


# --- gradient accumulation ---------------------------------------------------------------------


def test_grad_accumulation_draws_k_batches_per_step_and_equals_one_large_batch():
    micro_batches, steps = 3, 2
    model, batches, _ = run(steps=steps, grad_accumulation_steps=micro_batches)
    assert batches.calls == micro_batches * steps

    large = model_for()
    optimizer = torch.optim.SGD(large.parameters(), lr=0.05)
    for step in range(steps):
        chunk = batches.drawn[step * micro_batches : (step + 1) * micro_batches]
        x, y = torch.cat([x for x, _ in chunk]), torch.cat([y for _, y in chunk])
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(large(x), y).backward()
        optimizer.step()
    for accumulated, whole in zip(model.parameters(), large.parameters()):
        torch.testing.assert_close(accumulated, whole, rtol=1e-6, atol=1e-7)
    assert not same(parameters_of(model), parameters_of(run(steps=steps)[0]))


def test_logged_loss_is_the_mean_over_micro_batches():
    _, batches, result = run(steps=1, lr=0.0, grad_accumulation_steps=2)
    model = model_for()
    with torch.no_grad():
        expected = sum(float(F.mse_loss(model(x), y)) for x, y in batches.drawn) / 2
    assert result.records[0].loss == pytest.approx(expected, rel=1e-6)


# --- clipping -----------------------------------------------------------------------------------


def test_grad_clip_norm_bounds_the_update_and_records_the_norm():
    model_before = parameters_of(model_for())
    model, batches, result = run(steps=1, lr=1.0, grad_clip_norm=0.01)
    update = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(parameters_of(model), model_before)))
    assert update <= 0.01 * (1 + 1e-5)
    reference = model_for()
    F.mse_loss(reference(batches.drawn[0][0]), batches.drawn[0][1]).backward()
    assert result.records[0].grad_norm == pytest.approx(global_grad_norm(reference.parameters()), rel=1e-5)
    assert result.records[0].grad_norm > 0.01
    unclipped_model, _, unclipped = run(steps=1, lr=1.0)
    assert unclipped.records[0].grad_norm is None
    assert not same(parameters_of(model), parameters_of(unclipped_model))


# --- learning-rate schedule --------------------------------------------------------------------


def test_lr_schedule_sets_the_rate_of_every_step():
    schedule = cosine_schedule(0.1, 0.01, warmup_steps=2, total_steps=6)
    model = model_for()
    optimizer = torch.optim.SGD([{"params": list(model.layers.parameters())}, {"params": list(model.final.parameters()), "lr": 9.0}], lr=1.0)
    result = train(model, optimizer, Batches(), F.mse_loss, steps=6, lr_schedule=schedule)
    assert [record.learning_rate for record in result.records] == [schedule(step) for step in range(6)]
    assert all(group["lr"] == schedule(5) for group in optimizer.param_groups)


def test_zero_learning_rate_schedule_freezes_the_model():
    before = parameters_of(model_for())
    model, _, result = run(steps=3, lr_schedule=lambda step: 0.0)
    assert same(before, parameters_of(model))
    assert not same(before, parameters_of(run(steps=3)[0]))


# --- evaluation, logging, progress ---------------------------------------------------------------


def test_eval_every_runs_eval_fn_without_grad_in_eval_mode():
    seen = []

    def evaluate(model: torch.nn.Module) -> float:
        seen.append((torch.is_grad_enabled(), model.training))
        return 1.5

    model, _, result = run(steps=6, eval_every=2, eval_fn=evaluate)
    assert [(e.step, e.eval_loss) for e in result.evaluations] == [(2, 1.5), (4, 1.5), (6, 1.5)]
    assert seen == [(False, False)] * 3
    assert model.training


def test_eval_fn_alone_evaluates_once_at_the_end():
    _, _, result = run(steps=3, eval_fn=lambda model: 0.25)
    assert result.evaluations == [EvalRecord(3, 0.25)]


def test_eval_every_without_eval_fn_is_refused():
    with pytest.raises(ResacctError, match=r"eval_every 2 needs eval_fn"):
        run(eval_every=2)


def test_log_every_sets_the_cadence_of_records():
    _, _, every_two = run(steps=6, log_every=2)
    assert [record.step for record in every_two.records] == [2, 4, 6]
    assert all(isinstance(record, StepRecord) and record.elapsed_seconds >= 0 for record in every_two.records)
    _, _, silent = run(steps=6, log_every=None)
    assert silent.records == []


def test_logged_loss_is_the_loss_of_that_step():
    _, batches, result = run(steps=2, lr=0.0)
    model = model_for()
    with torch.no_grad():
        expected = [float(F.mse_loss(model(x), y)) for x, y in batches.drawn]
    assert [record.loss for record in result.records] == pytest.approx(expected)


def test_on_log_receives_records_and_evaluations_in_order():
    received = []
    run(steps=4, log_every=2, eval_every=4, eval_fn=lambda model: 0.0, on_log=received.append)
    assert [(type(entry).__name__, entry.step) for entry in received] == [("StepRecord", 2), ("StepRecord", 4), ("EvalRecord", 4)]


def test_progress_draws_a_bar_on_a_terminal_console():
    screen = io.StringIO()
    run(steps=3, progress=Console(file=screen, force_terminal=True, width=100))
    assert "3/3" in screen.getvalue() and "step 3" in screen.getvalue()
    not_a_terminal = io.StringIO()
    run(steps=3, progress=Console(file=not_a_terminal, force_terminal=False))
    assert not_a_terminal.getvalue() == ""


def test_progress_true_stays_quiet_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture):
    run(steps=2, progress=True)
    assert capsys.readouterr().err == ""


# --- checkpoints -----------------------------------------------------------------------------------


def test_checkpoint_every_writes_checkpoints_on_cadence(tmp_path: Path):
    path = tmp_path / "ckpt.pt"
    steps_saved = []
    _, _, result = run(steps=6, checkpoint_every=3, checkpoint_path=path, on_log=lambda e: steps_saved.append(read_checkpoint(path)["step"] if path.exists() else None))
    assert result.checkpoints == [path, path]
    assert steps_saved == [None, None, None, 3, 3, 3]  # each record is logged before that step's checkpoint
    assert read_checkpoint(path)["step"] == 6
    assert read_checkpoint(path)["data"]["calls"] == 6  # the batch source's position


def test_checkpoint_path_alone_saves_at_the_end(tmp_path: Path):
    _, _, result = run(steps=4, checkpoint_path=tmp_path / "final.pt")
    assert result.checkpoints == [tmp_path / "final.pt"]
    assert read_checkpoint(tmp_path / "final.pt")["step"] == 4


def test_checkpoint_every_without_a_path_is_refused():
    with pytest.raises(ResacctError, match=r"checkpoint_every 3 needs checkpoint_path"):
        run(checkpoint_every=3)


def test_a_plain_function_as_batch_source_saves_no_data_state(tmp_path: Path):
    batches = Batches()
    model = model_for()
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda: batches(), F.mse_loss, steps=1, checkpoint_path=tmp_path / "c.pt")
    assert read_checkpoint(tmp_path / "c.pt")["data"] is None


def test_resume_from_continues_exactly(tmp_path: Path):
    def fresh() -> tuple[Cruncher, torch.optim.Optimizer, TokenBatchSampler]:
        model = model_for()
        sampler = TokenBatchSampler(np.arange(300, dtype=np.uint16) % 17, batch_size=3, context_length=DIM, seed=5)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2), sampler

    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(prediction, target[:, -1:].float() / 17)

    def batch_source(sampler: TokenBatchSampler):
        class Features:
            def __call__(self):
                x, y = sampler()
                return x.float() / 17, y

            state_dict = sampler.state_dict
            load_state_dict = sampler.load_state_dict

        return Features()

    schedule = cosine_schedule(1e-2, 1e-3, 1, 6)
    model, optimizer, sampler = fresh()
    train(model, optimizer, batch_source(sampler), loss, steps=6, lr_schedule=schedule)
    uninterrupted = parameters_of(model)

    model, optimizer, sampler = fresh()
    train(model, optimizer, batch_source(sampler), loss, steps=3, lr_schedule=schedule, checkpoint_path=tmp_path / "c.pt")
    model, optimizer, sampler = fresh()
    result = train(model, optimizer, batch_source(sampler), loss, steps=6, lr_schedule=schedule, resume_from=tmp_path / "c.pt")
    assert result.start_step == 3 and [record.step for record in result.records] == [4, 5, 6]
    assert same(uninterrupted, parameters_of(model))


def test_resume_from_refuses_a_checkpoint_past_steps_or_missing(tmp_path: Path):
    run(steps=4, checkpoint_path=tmp_path / "c.pt")
    with pytest.raises(ResacctError, match=r"the checkpoint is at step 4, past steps=2"):
        run(steps=2, resume_from=tmp_path / "c.pt")
    with pytest.raises(ResacctError, match=r"missing\.pt: no checkpoint there"):
        run(steps=2, resume_from=tmp_path / "missing.pt")


def test_resume_from_a_finished_run_takes_no_step(tmp_path: Path):
    run(steps=3, checkpoint_path=tmp_path / "c.pt")
    model, batches, result = run(steps=3, resume_from=tmp_path / "c.pt")
    assert batches.drawn == [] and batches.calls == 3  # its position came back from the checkpoint
    assert result.start_step == result.final_step == 3 and result.records == []


# --- precision ---------------------------------------------------------------------------------


def test_bf16_autocast_changes_the_numbers_but_keeps_fp32_parameters():
    _, _, full = run(steps=2, lr=0.0)
    model, _, mixed = run(steps=2, lr=0.0, precision="bf16-autocast")
    assert all(parameter.dtype == torch.float32 for parameter in model.parameters())
    assert [r.loss for r in mixed.records] != [r.loss for r in full.records]
    assert [r.loss for r in mixed.records] == pytest.approx([r.loss for r in full.records], rel=0.05)


def test_fp16_recipe_scales_the_loss_and_checkpoints_the_scaler(tmp_path: Path):
    before = parameters_of(model_for())
    model, _, result = run(steps=4, precision="fp16-autocast-scaled", grad_clip_norm=1.0, checkpoint_path=tmp_path / "c.pt")
    scaler_state = read_checkpoint(tmp_path / "c.pt")["grad_scaler"]
    assert scaler_state is not None and scaler_state["scale"] == result.records[-1].loss_scale > 1
    previous_scales = [65536.0] + [record.loss_scale for record in result.records[:-1]]
    for record, previous in zip(result.records, previous_scales):  # an overflow halves the scale, else it stays
        assert record.loss_scale == (previous if math.isfinite(record.grad_norm) else previous / 2)
    assert {math.isfinite(record.grad_norm) for record in result.records} == {True, False}
    assert all(bool(torch.isfinite(parameter).all()) for parameter in model.parameters())
    assert not same(before, parameters_of(model))
    _, _, plain = run(steps=1, checkpoint_path=tmp_path / "p.pt")
    assert read_checkpoint(tmp_path / "p.pt")["grad_scaler"] is None


def test_bf16_cast_model_recipe_needs_a_bf16_model():
    with pytest.raises(ResacctError, match=r"precision 'bf16-cast-model' keeps parameters in bfloat16, but the model's are float32"):
        run(precision="bf16-cast-model")
    model = model_for(dtype=torch.bfloat16)

    def float32_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # CPU mse has no bf16 kernel in torch 2.4
        return (output.float() - target.float()).pow(2).mean()

    train(model, torch.optim.AdamW(model.parameters()), Batches(dtype=torch.bfloat16), float32_mse, steps=1, precision="bf16-cast-model")
    assert model.final.weight.dtype == torch.bfloat16


def test_unknown_precision_recipe_is_refused():
    with pytest.raises(UnknownNameError, match=r"unknown precision recipe 'bf17'; did you mean 'bf16'"):
        run(precision="bf17")


def test_a_master_weight_recipe_is_refused_by_train():
    with pytest.raises(ResacctError, match=r"precision 'mixed': train\(\) keeps no master copy of the weights; expected one of fp32, "):
        run(precision="mixed")


# --- argument validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"steps": -1}, r"steps -1: expected ≥ 0"),
        ({"grad_accumulation_steps": 0}, r"grad_accumulation_steps 0: expected ≥ 1"),
        ({"grad_clip_norm": 0.0}, r"grad_clip_norm 0.0: expected > 0"),
        ({"eval_every": 0, "eval_fn": lambda model: 0.0}, r"eval_every 0: expected ≥ 1"),
        ({"log_every": 0}, r"log_every 0: expected ≥ 1"),
    ],
)
def test_bad_arguments_are_refused(options: dict, expected: str):
    arguments = {"steps": 2, **options}
    with pytest.raises(ResacctError, match=expected):
        run(**arguments)


def test_a_model_without_parameters_is_refused():
    with pytest.raises(ResacctError, match=r"Identity has no parameters to train"):
        train(torch.nn.Identity(), torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]), Batches(), F.mse_loss, steps=1)


# --- schedule and clipping helpers -------------------------------------------------------------


def test_cosine_lr_shape():
    rates = [cosine_lr(step, 1.0, 0.1, 10, 100) for step in range(120)]
    assert rates[0] == 0.0 and rates[5] == 0.5 and rates[10] == 1.0
    assert rates[100] == pytest.approx(0.1) and rates[119] == 0.1
    assert all(a < b for a, b in zip(rates[:10], rates[1:11]))  # warm-up rises
    assert all(a >= b for a, b in zip(rates[10:100], rates[11:101]))  # cosine falls
    assert rates[55] == pytest.approx(0.55)  # halfway down the cosine
    assert cosine_lr(0, 1.0, 0.1, 0, 10) == 1.0  # no warm-up


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ((-1, 1.0, 0.1, 10, 100), r"step -1: expected ≥ 0"),
        ((0, 1.0, 0.1, 10, 10), r"warmup_steps 10, total_steps 10: expected 0 ≤ warmup_steps < total_steps"),
        ((0, 1.0, 2.0, 10, 100), r"min_lr 2.0, max_lr 1.0: expected 0 ≤ min_lr ≤ max_lr"),
    ],
)
def test_cosine_lr_refuses_bad_settings(arguments: tuple, expected: str):
    with pytest.raises(ResacctError, match=expected):
        cosine_lr(*arguments)
    if arguments[0] >= 0:
        with pytest.raises(ResacctError, match=expected):
            cosine_schedule(*arguments[1:])


def test_global_grad_norm_matches_torch():
    model = model_for()
    F.mse_loss(model(torch.ones(2, DIM)), torch.zeros(2, 1)).backward()
    expected = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert global_grad_norm(model.parameters()) == pytest.approx(expected, rel=1e-6)
    assert global_grad_norm(torch.nn.Linear(2, 2).parameters()) == 0.0  # no gradients yet


def test_clipped_grad_norm():
    assert clipped_grad_norm(0.5, 1.0) == 0.5
    assert clipped_grad_norm(10.0, 1.0) == pytest.approx(1.0, rel=1e-6) and clipped_grad_norm(10.0, 1.0) < 1.0
    with pytest.raises(ResacctError, match=r"max_norm 0: expected > 0"):
        clipped_grad_norm(1.0, 0)
