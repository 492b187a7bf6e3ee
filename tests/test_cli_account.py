"""``resacct account``: the table, --json with units in the names, --per-module, and bad
input answered with one line and exit status 2."""

from __future__ import annotations

import json

import pytest

from resacct.cli import main
from resacct.cli.account import format_quantity


def _json(capsys, *argv: str) -> dict:
    assert main(["account", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rows(report: dict, section: str) -> dict[str, dict]:
    return {row["quantity"]: row for row in report[section]}


@pytest.mark.slow
def test_default_run_prints_predicted_measured_and_ratio(capsys):
    assert main(["account", "--no-time"]) == 0
    out = capsys.readouterr().out
    assert "gpt-tiny: batch 4 × seq 128 = 512 tokens, 940,800 parameters, fp32 AdamW, math attention, on cpu" in out
    for fragment in ("predicted", "measured", "ratio", "step (exact per-matmul formula)", "3.221 GFLOPs", "1.000",
                     "step, 6N rule (lecture)", "1.115", "Korthikanti", "AdamW step transient (foreach)", "forward + backward peak",
                     "ops FlopCounterMode does not count"):
        assert fragment in out, fragment


@pytest.mark.slow  # ~1.5 s (a loaded run's seconds ÷ 6.2) on 2026-11-28
def test_json_fields_carry_units_and_exact_numbers(capsys):
    report = _json(capsys, "--model", "gpt-nano", "--batch", "2", "--seq", "16", "--no-time")
    assert report["model"] == "gpt-nano" and report["parameters"] == 120576 and report["tokens"] == 32 and report["device"] == "cpu"
    flops = _rows(report, "flops")
    assert flops["step (exact per-matmul formula)"] == {"quantity": "step (exact per-matmul formula)", "predicted_flops": 22806528,
                                                        "measured_flops": 22806528, "ratio": 1.0, "note": "FlopCounterMode"}
    state = _rows(report, "training_state")
    assert state["bytes per parameter at step"]["measured_bytes_per_parameter"] == pytest.approx(16 + 4 * 28 / 120576)
    assert _rows(report, "activations")["saved for backward (resacct formula)"]["measured_bytes"] == 321924
    assert _rows(report, "peak")["AdamW step transient (foreach)"]["predicted_bytes"] == 4 * 120576
    assert "per_module" not in report and "time" not in report
    assert {gap["op"] for gap in report["tracer_gaps"]} >= {"aten._softmax.default", "aten.gelu.default"}


@pytest.mark.slow
def test_gpt2_small_runs_on_meta_by_default(capsys):
    report = _json(capsys, "--model", "gpt2-small", "--batch", "1", "--seq", "1024")
    assert report["device"] == "meta" and report["parameters"] == 124439808
    assert _rows(report, "flops")["step, 6N rule (lecture)"]["ratio"] == pytest.approx(1.1444, abs=1e-4)
    assert _rows(report, "activations")["saved for backward (resacct formula)"]["measured_bytes"] == 1432915972
    assert "peak" not in report and any("meta device" in note for note in report["notes"])


@pytest.mark.slow
def test_checkpointing_accumulation_and_per_module(capsys):
    report = _json(capsys, "--model", "gpt-nano", "--batch", "4", "--seq", "32", "--checkpoint-segments", "2", "--grad-accum", "2",
                   "--per-module", "--no-time")
    checkpointing = _rows(report, "checkpointing")
    assert checkpointing["held after forward, k=2"]["ratio"] == 1.0
    assert checkpointing["held after forward, k=2"]["measured_bytes"] < checkpointing["held after forward, no checkpointing"]["measured_bytes"]
    assert checkpointing["recompute FLOPs, k=2"]["ratio"] == 1.0
    assert _rows(report, "grad_accumulation")["held per micro-batch of 2 (× 2)"]["ratio"] == pytest.approx(1.0, abs=1e-4)
    modules = {row["module"]: row for row in report["per_module"]}
    assert modules["lm_head"]["traced_forward_flops"] == modules["lm_head"]["predicted_forward_flops"] == 2 * 128 * 64 * 256
    assert modules["blocks.0.attention"]["measured_saved_bytes"] == modules["blocks.0.attention"]["predicted_saved_bytes"]


def test_per_module_table_and_sdpa_note_in_text(capsys):
    assert main(["account", "--model", "gpt-nano", "--batch", "2", "--seq", "16", "--attention", "sdpa", "--per-module", "--no-time"]) == 0
    out = capsys.readouterr().out
    assert "per module" in out and "blocks.1.mlp.down" in out
    assert "FlopCounterMode alone" in out and "_scaled_dot_product_flash_attention_for_cpu" in out


@pytest.mark.slow
def test_mfu_and_projection(capsys):
    report = _json(capsys, "--model", "gpt-nano", "--batch", "2", "--seq", "16", "--peak-tflops", "1", "--train-tokens", "1B")
    time_rows = _rows(report, "time")
    achieved = time_rows["achieved"]["measured_flops_per_sec"]
    assert time_rows["MFU"]["measured_fraction"] == pytest.approx(achieved / 1e12)
    assert time_rows["1e+09 tokens on 1 such device(s)"]["measured_days"] > 0


def test_help_has_examples(capsys):
    assert main(["account", "--help"]) == 0
    out = capsys.readouterr().out
    assert "resacct account --model gpt2-small --batch 1 --seq 1024" in out and "--checkpoint-segments" in out and "bf16-fp32-master" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "gpt2-smal"], "unknown model config 'gpt2-smal'; did you mean 'gpt2-small'"),
        (["--seq", "4096"], "seq 4096 is longer than the model's context length 128; expected seq ≤ 128"),
        (["--batch", "0"], "argument --batch: '0' must be a whole number greater than 0"),
        (["--batch", "-3"], "argument --batch: '-3' must be a whole number greater than 0"),
        (["--seq", "1.5"], "argument --seq: '1.5' must be a whole number greater than 0"),
        (["--checkpoint-segments", "-1"], "argument --checkpoint-segments: '-1' must be 0 or more"),
        (["--checkpoint-segments", "5"], "checkpoint segments 5 exceed the 4 layers"),
        (["--grad-accum", "3"], "batch 4 is not divisible by 3 gradient accumulation steps"),
        (["--recipe", "fp33"], "unknown precision recipe 'fp33'; did you mean 'fp32'"),
        (["--attention", "flash"], "argument --attention: invalid choice: 'flash'"),
        (["--accelerator", "h1000"], "unknown accelerator 'h1000'"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, fragment):
    assert main(["account", *argv, "--no-time"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("resacct account: error: ") and fragment in err, err


@pytest.mark.parametrize(("recipe", "fmt"), [("fp16-autocast-scaled", "fp16"), ("bf16", "bf16"), ("fp32-adamw", "fp32"), ("mixed", "bf16")])
def test_the_mfu_peak_is_the_recipes_matmul_format(recipe: str, fmt: str) -> None:
    """--accelerator's peak is in the format the recipe's matmuls run in: fp16 for fp16-autocast-scaled (it took the bf16
    peak, and on a V100, which lists none, the command failed)."""
    import argparse

    from resacct.cli.account import _peak
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec
    from resacct.facts.recipes import get_recipe

    peak, source = _peak(argparse.Namespace(peak_tflops=None, accelerator="v100" if fmt != "bf16" else "h100", recipe=get_recipe(recipe)))
    board = get_accelerator("v100" if fmt != "bf16" else "h100")
    assert peak == peak_flops_per_sec(board, fmt) and fmt in source


def test_format_quantity():
    assert format_quantity(None, "bytes") == "—"
    assert format_quantity(512, "bytes") == "512 B"
    assert format_quantity(3.221e9, "FLOPs") == "3.221 GFLOPs"
    assert format_quantity(0.5, "") == "0.5"


# ── --optimizer, and any nn.Module through --model module:factory ───────────────────────


@pytest.mark.slow
def test_optimizer_flag_changes_the_state(capsys):
    sgd = _rows(_json(capsys, "--model", "gpt-nano", "--batch", "1", "--seq", "8", "--no-measure", "--optimizer", "sgd"), "training_state")
    adamw = _rows(_json(capsys, "--model", "gpt-nano", "--batch", "1", "--seq", "8", "--no-measure"), "training_state")
    assert sgd["bytes per parameter at step"]["measured_bytes_per_parameter"] == 8.0
    assert sgd["at optimizer step (fp32, SGD)"]["ratio"] == 1.0 and "at optimizer step (fp32, AdamW)" in adamw


def test_model_factory_with_model_args_and_per_module(capsys):
    small = _json(capsys, "--model", "resacct.account.answers.generic:mlp", "--model-arg", "dim=8", "--model-arg", "hidden=16", "--batch", "3",
                  "--per-module", "--optimizer", "adagrad")
    wide = _json(capsys, "--model", "resacct.account.answers.generic:mlp", "--model-arg", "dim=8", "--model-arg", "hidden=32", "--batch", "3")
    saved = _rows(small, "activations")["saved for backward"]
    assert saved["predicted_bytes"] == saved["measured_bytes"] == 4 * 3 * (8 + 2 * 16)
    assert _rows(wide, "activations")["saved for backward"]["measured_bytes"] == 4 * 3 * (8 + 2 * 32)
    assert small["optimizer"] == "adagrad" and small["input_shape"] == [3, 8]
    modules = {row["module"]: row for row in small["per_module"]}
    assert modules["0"]["traced_forward_flops"] == modules["0"]["predicted_forward_flops"] == 2 * 3 * 8 * 16


def test_model_factory_text_shows_dashes_without_a_formula(capsys):
    assert main(["account", "--model", "tests.fixtures_user_model:build_conv", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "tests.fixtures_user_model:build_conv (TinyConv)" in out and "—" in out and "no FLOP or activation formula" in out


def test_input_shape_dtype_and_loss_flags(capsys):
    base = ["--model", "tests.fixtures_user_model:build_embedding", "--input-shape", "2,3", "--input-dtype", "int64"]
    mean = _json(capsys, *base)
    cross = _json(capsys, *base, "--loss", "cross-entropy")
    assert mean["input_shape"] == [2, 3] and mean["input_dtype"] == "int64"
    saved = lambda report: _rows(report, "activations")["saved for backward"]["measured_bytes"]
    assert saved(cross) > saved(mean)
    cruncher = ["--model", "resacct.training.models:Cruncher", "--model-arg", "dim=4", "--model-arg", "num_layers=2"]
    assert _json(capsys, *cruncher, "--input-shape", "5,4")["input_shape"] == [5, 4]
    assert _json(capsys, *cruncher, "--no-measure")["device"] == "meta"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "no_such_module_xyz:build"], "cannot import 'no_such_module_xyz'"),
        (["--model", "resacct.training.models:Nope"], "module 'resacct.training.models' has no attribute 'Nope'"),
        (["--model", "tests.fixtures_user_model:not_a_module"], "returned a str; expected an nn.Module"),
        (["--model", "resacct.training.models:Cruncher", "--model-arg", "dim"], "model argument 'dim': expected key=value"),
        (["--model", "resacct.training.models:Cruncher", "--model-arg", "width=3"], "refused the model arguments"),
        (["--model", "resacct.account.answers.generic:mlp", "--attention", "sdpa"], "--attention apply to the resacct.training.gpt models"),
        (["--model", "resacct.account.answers.generic:mlp", "--seq", "3", "--input-shape", "2,8"], "seq 3 and input shape 2,8 both give the input (--seq and --input-shape"),
        (["--input-shape", "2,3"], "--input-shape apply to --model module:factory"),
        (["--model", "resacct.account.answers.generic:mlp", "--input-shape", "2,x"], "argument --input-shape: '2,x' must be sizes ≥ 1"),
        (["--optimizer", "adamx"], "argument --optimizer: invalid choice: 'adamx'"),
        (["--model", "resacct.account.answers.generic:mlp", "--loss", "hinge"], "argument --loss: invalid choice: 'hinge'"),
    ],
)
def test_bad_factory_input_exits_2_with_one_line(capsys, argv, fragment):
    assert main(["account", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("resacct account: error: ") and fragment in err, err


_FIXTURES = "tests.fixtures_user_model:"


@pytest.mark.parametrize(
    ("argv", "fragment", "frame"),
    [
        ([_FIXTURES + "raises_in_factory", "--model-arg", "width=3"], "factory 'tests.fixtures_user_model:raises_in_factory' raised ValueError: width 3 must be even",
         "fixtures_user_model.py:"),
        ([_FIXTURES + "type_error_in_factory"], "raised TypeError: ", "fixtures_user_model.py:"),
        ([_FIXTURES + "two_inputs", "--input-shape", "2,4"], "the step of TwoInputs (forward, loss or backward) raised TypeError: ", "fixtures_user_model.py:"),
        ([_FIXTURES + "shape_mismatch", "--input-shape", "2,4"], "the step of ShapeMismatch (forward, loss or backward) raised RuntimeError: ", "fixtures_user_model.py:"),
        ([_FIXTURES + "detached", "--input-shape", "2,4"], "needs no gradient (no trainable parameter reaches it)", ""),
        ([_FIXTURES + "returns_text", "--input-shape", "2,4"], "the model returned a str; expected a tensor", ""),
        ([_FIXTURES + "backward_raises", "--input-shape", "2,4"], "raised ArithmeticError: no gradient for you", "fixtures_user_model.py:"),
        (["resacct.account.answers.generic:mlp", "--batch", "9e15", "--seq", "4096"], "more than a torch tensor can hold (2^63 − 1); expected a smaller --batch", ""),
        (["gpt-tiny", "--batch", "9e15", "--seq", "128", "--no-time"], "more than a torch tensor can hold (2^63 − 1); expected a smaller --batch", ""),
        (["resacct.account.answers.generic:mlp", "--loss", "model"], "--loss model: the model returned a Tensor without a .loss", ""),
    ],
)
def test_errors_inside_user_code_are_one_line_naming_the_frame(capsys, argv, fragment, frame):
    """Issue 13: a factory that raises, a forward needing two inputs, a shape mismatch, a failing
    backward, --batch 9e15 × --seq 4096 …: one line, exit 2, the user's file:line where there is one."""
    assert main(["account", "--model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("resacct account: error: ") and fragment in err, err
    assert frame in err and "Traceback" not in err, err


def test_seq_with_a_factory_is_the_middle_axis_of_a_linear_input(capsys):
    report = _json(capsys, "--model", "resacct.account.answers.generic:mlp", "--model-arg", "dim=8", "--model-arg", "hidden=16", "--batch", "2", "--seq", "3")
    assert report["input_shape"] == [2, 3, 8] and report["loss"] == "mean"
    assert _rows(report, "flops")["forward"]["measured_flops"] == 2 * 6 * (8 * 16 + 16 * 8)


def test_an_uncounted_matmul_is_a_warning_line_never_cut_off(capsys):
    """Issue 12: FlopCounterMode counts torch.mv as 0; the table says so on a warning line of its own."""
    assert main(["account", "--model", "tests.fixtures_user_model:matrix_vector", "--input-shape", "4", "--no-measure"]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings and all("a matmul-class op: the FLOPs above miss it" in line for line in warnings), out
    assert any("aten.mv.default" in line and "(forward)" in line for line in warnings), out
    report = _json(capsys, "--model", "tests.fixtures_user_model:matrix_vector", "--input-shape", "4", "--no-measure")
    assert report["warnings"] == [line.removeprefix("warning: ") for line in warnings]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["--model", "gpt-nano", "--batch", "1", "--seq", "8"],                       # resacct's GPT
    ["--model", "tests.fixtures_user_model:build_conv", "--batch", "2"],         # any nn.Module
], ids=["gpt", "generic"])
def test_the_recipe_is_parsed_once_at_the_command_line(monkeypatch, capsys, argv):
    """Issue 21: the recipe becomes one typed Recipe at the CLI edge and travels as that object —
    no function downstream looks a recipe name up again."""
    from resacct.account.answers import generic, gpt_step, hf
    from resacct.account.trace import step_measurements
    from resacct.facts import recipes
    from resacct.measurement import memory

    looked_up: list[str] = []
    original = recipes.get_recipe

    def spy(recipe):  # type: ignore[no-untyped-def]
        if isinstance(recipe, str):
            looked_up.append(recipe)
        return original(recipe)

    for module in (recipes, memory, generic, gpt_step, hf, step_measurements):
        for name in ("get_recipe", "get_state_recipe"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, spy)
    assert main(["account", *argv, "--recipe", "mixed", "--no-time", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"] == "bf16-fp32-master"
    # argparse's type looked "mixed" up once (the other names are the commands' defaults, built with the
    # parser); the old code handed "bf16-fp32-master" (recipe.name) on, to be looked up again downstream
    assert looked_up.count("mixed") == 1 and "bf16-fp32-master" not in looked_up, looked_up
