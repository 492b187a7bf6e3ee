"""Will it fit: the largest micro-batch (or sequence) whose predicted step peak fits a memory budget
(resacct.account.fit.search, resacct fit) — the answer fits and one more does not, by fresh
predictions; on the CPU the answer's predicted peak is the allocator's; bad arguments are one line."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.account.fit.search import FitTarget, fit_step, largest_fitting
from resacct.account.peak.step_peak import measure_step_peak, predict_step_peak
from resacct.cli import main
from resacct.errors import ResacctError
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel


def _adamw(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))


def _loss(model, x):
    return model(x).mean()


@given(base=st.integers(0, 10**6), slope=st.integers(0, 10**4), bend=st.integers(0, 50), budget=st.integers(0, 3 * 10**6),
       limit=st.sampled_from([1, 7, 64, 1000, 1 << 20]))
@settings(max_examples=120, deadline=None)
def test_the_search_finds_the_largest_size_within_the_budget_and_probes_one_more(base, slope, bend, budget, limit):
    def peak(n):  # grows with n: affine, flat then rising, or curved
        return max(base, base // 2 + slope * n) + bend * n * n

    largest, probes = largest_fitting(peak, budget, limit=limit)
    truth = max((n for n in range(1, min(limit, 3000) + 1) if peak(n) <= budget), default=None)
    if limit <= 3000 or truth is None or truth < 3000:
        assert largest == truth
    sizes = {probe.size for probe in probes}
    if largest is not None and largest < limit:
        assert {largest, largest + 1} <= sizes
    assert all(probe.fits == (probe.peak_bytes <= budget) for probe in probes)


@pytest.mark.slow
def test_the_answer_fits_one_more_does_not_and_the_cpu_agrees():
    model = _mlp()
    target = FitTarget("mlp", model.to("meta"), lambda batch, seq: torch.empty(batch, 64, device="meta"), loss=_loss, seq_limit=None)
    budget = 700_000
    answer = fit_step(target, memory_bytes=budget, search="batch")
    b = answer.largest
    fresh = [predict_step_peak(_mlp(), torch.randn(n, 64), _loss, _adamw).peak_bytes for n in (b, b + 1)]
    assert fresh == [answer.peak_bytes, answer.next_peak_bytes]
    assert fresh[0] <= budget < fresh[1]
    assert answer.headroom_bytes == budget - fresh[0] and answer.budget_bytes == budget
    assert measure_step_peak(_mlp(), torch.randn(b, 64), _loss, _adamw).peak_bytes == fresh[0]


@pytest.mark.slow
def test_a_reserve_and_a_recipe_and_accumulation_change_the_answer():
    target = FitTarget("mlp", _mlp().to("meta"), lambda batch, seq: torch.empty(batch, 64, device="meta"), loss=_loss, seq_limit=None)
    plain = fit_step(target, memory_bytes=900_000)
    reserved = fit_step(target, memory_bytes=900_000, reserve_bytes=100_000)
    accumulated = fit_step(target, memory_bytes=900_000, micro_batches=2)
    master = fit_step(target, memory_bytes=900_000, recipe="bf16-fp32-master")
    assert reserved.largest < plain.largest and reserved.peak_bytes <= 800_000
    assert accumulated.largest < plain.largest  # the first micro-step's gradients stay through the second
    assert master.largest != plain.largest and master.recipe == "bf16-fp32-master"


def test_nothing_fits_and_bad_sizes_are_one_line():
    target = FitTarget("mlp", _mlp().to("meta"), lambda batch, seq: torch.empty(batch, 64, device="meta"), loss=_loss, seq_limit=None)
    answer = fit_step(target, memory_bytes=1000)
    assert answer.largest is None and answer.peak_bytes is None and answer.next_peak_bytes > 1000
    for kwargs, message in (({"search": "depth"}, "expected one of batch, seq"), ({"search": "seq"}, "no sequence length"),
                            ({"micro_batches": 0}, "whole number ≥ 1"), ({"reserve_bytes": 2000}, "0 ≤ reserve < memory")):
        with pytest.raises(ResacctError, match=message) as error:
            fit_step(target, memory_bytes=1000, **kwargs)
        assert len(str(error.value).splitlines()) == 1


@pytest.mark.slow
def test_cli_finds_a_factory_models_micro_batch_with_its_headroom(capsys):
    assert main(["fit", "--model", "resacct.account.answers.generic:mlp", "--memory-gb", "0.0008", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["largest"] > 1 and report["predicted_peak_bytes"] <= report["budget_bytes"] == 800_000 < report["next_predicted_peak_bytes"]
    assert report["headroom_bytes"] == 800_000 - report["predicted_peak_bytes"] and report["device"] is None
    assert main(["fit", "--model", "resacct.account.answers.generic:mlp", "--memory-gb", "0.0008", "--reserve-gb", "0.0001"]) == 0
    text = capsys.readouterr().out
    assert "largest micro-batch that fits" in text and "headroom" in text and "reserved" in text


@pytest.mark.slow
def test_cli_parses_the_device_once_into_its_datasheet_and_searches_a_sequence(capsys):
    pytest.importorskip("transformers")
    assert main(["fit", "--model", "tests.fixtures_hf_models:tiny_llama", "--device", "h100", "--search", "seq", "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "h100-sxm" and report["memory_bytes"] == 80e9
    assert report["largest"] == report["limit"] == 64 and report["next_predicted_peak_bytes"] is None  # the context length
    # the kernel the step traced: CPU flash, or the math kernel where torch refuses flash for grouped-query attention (2.8)
    flash = cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=16, dtype="float32") == "flash"
    assert report["attention_kernel"].startswith("flash (CPU)" if flash else "math: ")


@pytest.mark.parametrize(("argv", "message"), [
    (["--memory-gb", "1", "--seq", "64"], "--seq search a real model's step: give --hf-config NAME or --model"),
    (["--hf-config", "llama-2-7b", "--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1"], "exactly one of --hf-config"),
    (["--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1", "--devices", "8", "--zero", "3"], "--devices, --zero belong to the napkin fit"),
    (["--model", "resacct.account.answers.generic:mlp"], "--device NAME"),
    (["--model", "resacct.account.answers.generic:mlp", "--device", "h100", "--memory-gb", "1"], "not both"),
    (["--model", "resacct.account.answers.generic:mlp", "--device", "no-such-board"], "unknown accelerator"),
    (["--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1", "--reserve-gb", "2"], "expected a reserve below the memory"),
    (["--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1", "--search", "depth"], "choose from 'batch', 'seq'"),
    (["--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1", "--batch", "4"], "--batch 4 is searched"),
    (["--model", "resacct.account.answers.generic:mlp", "--memory-gb", "1", "--recipe", "2+2+12"], "a model's step runs a named recipe"),
    (["--hf-config", "llama-2-7b", "--memory-gb", "80", "--loss", "mse"], "apply to --model"),
])
def test_cli_bad_arguments_are_one_line_exit_2(capsys, argv, message):
    """``resacct fit`` has two forms (the napkin largest model; a real model's micro-batch): a flag of
    one form given to the other is one line naming it."""
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
