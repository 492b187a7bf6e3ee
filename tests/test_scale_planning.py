"""Unit tests of resacct.formulas.parallelism, resacct.formulas.plan, resacct.formulas.scaling, resacct.formulas.utilization and the
``plan``, ``optimal`` and ``mfu`` commands (fast; the published figures are claims in
resacct/specs/scale.claims.yaml)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.formulas.parallelism import ParallelLayout, activation_bytes_per_layer, pipeline_activation_factor
from resacct.formulas.plan import plan_memory
from resacct.formulas.scaling import chinchilla_approach3_optimum, chinchilla_loss, gpu_hours, tokens_per_parameter_optimum
from resacct.formulas.utilization import gpt_iteration_flops, palm_model_flops_per_token

dims = st.integers(min_value=1, max_value=64)


@settings(max_examples=50, deadline=None)
@given(s=dims, b=dims, heads=st.sampled_from([1, 2, 4, 8, 16]), width=dims, t=st.sampled_from([1, 2, 4, 8]))
def test_sequence_parallel_divides_everything_by_t(s: int, b: int, heads: int, width: int, t: int) -> None:
    """Korthikanti eq. 4: with sequence parallelism, Table 2's no-parallelism row divided by t."""
    h = heads * width
    plain = activation_bytes_per_layer(s, b, h, heads)
    split = activation_bytes_per_layer(s, b, h, heads, tensor_parallel=t, sequence_parallel=t > 1)
    assert split == pytest.approx(plain / t)
    assert activation_bytes_per_layer(s, b, h, heads, tensor_parallel=t, recompute="full") == 2 * s * b * h


def test_recompute_only_ever_saves_memory() -> None:
    none, selective, full = (activation_bytes_per_layer(2048, 1, 12288, 96, tensor_parallel=8, recompute=mode)
                             for mode in ("none", "selective", "full"))
    assert none > selective > full


def test_pipeline_factor_is_one_for_1f1b_and_more_when_interleaved() -> None:
    assert pipeline_activation_factor(8) == 1
    assert pipeline_activation_factor(8, 3) == pytest.approx(1 + 7 / 24)


def test_largest_micro_batch_is_the_boundary() -> None:
    layout = ParallelLayout(tensor=8, pipeline=4, data=16, zero_stage=1, sequence_parallel=True)
    common = dict(parameters=70e9, layers=80, hidden=8192, heads=64, seq=4096, layout=layout, recipe="mixed-adam",
                  recompute="selective", device_memory_bytes=80e9)
    largest = plan_memory(micro_batch=1, **common).largest_micro_batch
    assert largest >= 1
    assert plan_memory(micro_batch=largest, **common).fits
    assert not plan_memory(micro_batch=largest + 1, **common).fits


@pytest.mark.parametrize("bad", [
    dict(heads=60, layout=ParallelLayout(tensor=8)),
    dict(layers=3, layout=ParallelLayout(pipeline=4)),  # a stage without layers (uneven splits are allowed: issue 24)
    dict(parameters=float("nan")),
    dict(recompute="some"),
])
def test_plan_refuses_bad_layouts(bad: dict) -> None:
    args = dict(parameters=7e9, layers=80, hidden=4096, heads=64, seq=2048, micro_batch=1, layout=ParallelLayout(),
                recipe="mixed-adam", recompute="none", device_memory_bytes=80e9)
    args.update(bad)
    with pytest.raises(ResacctError):
        plan_memory(**args)


def test_approach3_optimum_minimises_the_fitted_loss_on_its_isoflop() -> None:
    budget = 1e22
    n, d = chinchilla_approach3_optimum(budget)
    assert 6 * n * d == pytest.approx(budget)
    best = chinchilla_loss(n, d)
    for factor in (0.8, 0.9, 1.1, 1.25):
        assert chinchilla_loss(n * factor, d / factor) > best


def test_twenty_tokens_rule_and_goodput() -> None:
    n, d = tokens_per_parameter_optimum(1.2e21)
    assert d == pytest.approx(20 * n) and 6 * n * d == pytest.approx(1.2e21)
    assert gpu_hours(1e24, peak_flops_per_sec=1e15, mfu=0.5, goodput=0.5) == pytest.approx(4 * gpu_hours(1e24, peak_flops_per_sec=1e15, mfu=1.0))
    with pytest.raises(ResacctError, match="goodput"):
        gpu_hours(1e24, peak_flops_per_sec=1e15, mfu=0.5, goodput=1.5)


def test_palm_per_token_equals_korthikanti_per_iteration_for_a_gpt() -> None:
    """6N + 12·L·H·Q·T with N = 12Lh² + Vh is 72·B·s·L·h²·(1 + s/(6h) + V/(12Lh)) per token."""
    layers, hidden, heads, seq, vocab = 4, 256, 8, 128, 1000
    n = 12 * layers * hidden**2 + vocab * hidden
    per_token = palm_model_flops_per_token(n, layers, heads, hidden // heads, seq)
    assert per_token * seq == pytest.approx(gpt_iteration_flops(1, seq, layers, hidden, vocab))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    fields = _json(capsys, "plan", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "4096",
                   "--tp", "8", "--pp", "4", "--dp", "16", "--zero", "1", "--sp", "--recompute", "selective", "--device", "h100")
    assert fields["world_size"] == 512 and fields["fits"] is True
    assert fields["total_bytes"] == pytest.approx(fields["training_state_bytes"] + fields["activation_bytes"])


def test_optimal_and_mfu_commands_json(capsys: pytest.CaptureFixture[str]) -> None:
    optimal = _json(capsys, "optimal", "--flops", "5.76e23", "--peak", "275e12", "--mfu", "0.5", "--devices", "6144")
    assert optimal["device_hours"] == pytest.approx(5.76e23 / (275e12 * 0.5) / 3600)
    mfu = _json(capsys, "mfu", "--params", "540.35B", "--tokens-per-sec", "238.3k", "--devices", "6144", "--peak", "275e12",
                "--layers", "118", "--heads", "48", "--head-dim", "256", "--seq", "2048", "--recompute", "full")
    assert mfu["hfu"] > mfu["mfu"] and mfu["device"] is None
    achieved = _json(capsys, "mfu", "--achieved-tflops", "312", "--device", "a100")
    assert achieved["mfu"] == pytest.approx(1.0)


@pytest.mark.parametrize("argv, message", [
    (["plan", "--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "4096", "--device", "h100"], "give --params N, or --vocab"),
    (["plan", "--params", "7B", "--layers", "8", "--hidden", "64", "--heads", "8", "--seq", "64", "--tp", "3", "--device", "h100"], "not divisible"),
    (["optimal", "--flops", "1e24", "--device", "h100", "--peak", "1e15"], "not both"),
    (["mfu", "--achieved-tflops", "300", "--tokens-per-sec", "5", "--device", "h100"], "is a rate already"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("t, sp, recompute", [(1, False, "none"), (2, False, "none"), (4, True, "none"), (1, False, "selective"),
                                               (8, False, "selective"), (4, True, "selective")])
def test_eager_layer_model_reduces_to_table2_with_korthikantis_assumptions(t: int, sp: bool, recompute: str) -> None:
    """1-byte masks, no LayerNorm statistics, no causal mask, shard-only storage under SP: the
    eager-layer model (written term by term) gives Table 2's row (written as printed)."""
    from resacct.formulas.parallelism import torch_layer_saved_bytes

    kwargs = dict(tensor_parallel=t, sequence_parallel=sp, recompute=recompute)
    assert torch_layer_saved_bytes(32, 3, 128, 8, **kwargs) == pytest.approx(activation_bytes_per_layer(32, 3, 128, 8, **kwargs))


def test_chinchilla_approach2_through_table_a3() -> None:
    """Approach 2's fit reproduces Table 2's exponents and passes through Table A3's rows."""
    from resacct.formulas.scaling import CHINCHILLA_TABLE_A3_APPROACH2, chinchilla_approach2_fit, chinchilla_approach2_optimum

    assert chinchilla_approach2_fit()[0] == pytest.approx(0.49, abs=0.005)
    assert chinchilla_approach2_fit(tokens=True)[0] == pytest.approx(0.51, abs=0.005)
    for parameters, flops, _ in CHINCHILLA_TABLE_A3_APPROACH2:
        n, d = chinchilla_approach2_optimum(flops)
        assert 6 * n * d == pytest.approx(flops)
        assert n == pytest.approx(parameters, rel=0.04)  # the 67B row is 3.3% off the line (a refuted claim)


@pytest.mark.parametrize("approach", [1, 2, 3])
def test_optimal_approach_flag(capsys: pytest.CaptureFixture[str], approach: int) -> None:
    from resacct.formulas.scaling import chinchilla_optimum

    fields = _json(capsys, "optimal", "--flops", "5.76e23", "--approach", str(approach))
    assert fields["approach"] == approach
    assert (fields["parameters"], fields["tokens"]) == pytest.approx(chinchilla_optimum(5.76e23, approach))
    assert _json(capsys, "optimal", "--flops", "1e24")["approach"] == 1  # the default


@pytest.mark.parametrize("bad", ["4", "0", "x", "1.5", ""])
def test_optimal_bad_approach_exits_2_naming_the_value(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    assert main(["optimal", "--flops", "1e24", "--approach", bad]) == 2
    err = capsys.readouterr().err
    assert repr(bad) in err and "choose 1" in err and "2 (IsoFLOP" in err and err.count("\n") == 1


def test_chinchilla_optimum_refuses_other_approaches() -> None:
    from resacct.formulas.scaling import chinchilla_optimum

    for bad in (0, 4, True):
        with pytest.raises(ResacctError, match="not one of 1, 2, 3"):
            chinchilla_optimum(1e24, bad)


# ── the ZeRO paper's activation estimate beside Korthikanti's (issue 23) ──────────────────────────


def test_zero_paper_estimate_is_12_hbsl_16_bit_values_and_layer_inputs_when_checkpointed() -> None:
    from resacct.formulas.parallelism import zero_paper_activation_bytes

    # §3.2: the 1.5B GPT-2 (48 layers, hidden 1600; Table 4) at 1K × 32 "requires about 60 GB"
    assert zero_paper_activation_bytes(48, 1024, 32, 1600) == 12 * 1600 * 32 * 1024 * 48 * 2 == pytest.approx(60e9, rel=0.01)
    full = zero_paper_activation_bytes(48, 1024, 32, 1600, recompute="full")
    assert full == 1600 * 32 * 1024 * 48 * 2 == 48 * activation_bytes_per_layer(1024, 32, 1600, 25, recompute="full")
    assert zero_paper_activation_bytes(48, 1024, 32, 1600, recompute="selective") is None
    assert zero_paper_activation_bytes(2, 8, 1, 16, element_bytes=4) == 12 * 16 * 8 * 2 * 4
    with pytest.raises(ResacctError, match="recompute"):
        zero_paper_activation_bytes(2, 8, 1, 16, recompute="partial")


def test_plan_offers_the_zero_paper_estimate_beside_korthikanti(capsys: pytest.CaptureFixture[str]) -> None:
    shape = ("plan", "--params", "1.5B", "--layers", "48", "--hidden", "1600", "--heads", "25", "--seq", "1024", "--micro-batch", "32",
             "--memory-gb", "80")
    plain = _json(capsys, *shape)
    assert plain["activation_bytes_zero_paper"] == pytest.approx(60.4e9, rel=1e-3)
    assert plain["total_bytes"] == pytest.approx(plain["training_state_bytes"] + plain["activation_bytes"])  # not in the total
    assert _json(capsys, *shape, "--recompute", "full")["activation_bytes_zero_paper"] == pytest.approx(5.033e9, rel=1e-3)
    assert _json(capsys, *shape, "--recompute", "selective")["activation_bytes_zero_paper"] is None
    assert main(list(shape)) == 0
    text = capsys.readouterr().out
    assert "ZeRO paper     60.40 GB" in text and "12·h·b·s·L 16-bit values" in text and "not in the total" in text
