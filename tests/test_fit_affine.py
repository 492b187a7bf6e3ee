"""Fit by few traces (resacct.account.fit.search.largest_fitting): the line through the probes at
1 and 2 names the answer and two more traces confirm it — four traces for an affine peak up to an
answer of 128 — and the answer is the one a plain doubling-and-bisection search finds, on real
models' traced step peaks (an MLP over budgets drawn by hypothesis, gpt-nano, a tiny HF Llama) and
where the peak is not affine (the search falls back and still finds it)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from resacct.account.fit.search import (
    MAX_BATCH,
    FitTarget,
    affine_deviation_bytes,
    fit_step,
    largest_fitting,
    phase_peaks_bytes,
    step_peak_function,
)
from resacct.facts.recipes import get_recipe


def bisect_largest(peak_of, budget_bytes, limit):
    """The reference: the largest n ≤ limit with peak_of(n) ≤ budget by doubling, then bisection (no model of the peak)."""
    if peak_of(1) > budget_bytes:
        return None
    low = 1
    while low < limit and peak_of(min(2 * low, limit)) <= budget_bytes:
        low = min(2 * low, limit)
    if low == limit:
        return low
    high = min(2 * low, limit)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if peak_of(middle) <= budget_bytes else (low, middle)
    return low


@given(base=st.integers(0, 10**12), slope=st.integers(1, 10**10), answer=st.integers(1, 10**6), spare=st.floats(0, 0.999))
@example(base=1, slope=9_211_030_141, answer=977_871, spare=0.0)  # peaks past 2**53 bytes: float slopes were off by 2 B
@settings(max_examples=200, deadline=None)
def test_an_affine_peak_takes_four_traces_up_to_128_and_one_more_per_64_fold(base, slope, answer, spare):
    budget = base + slope * answer + int(spare * slope)  # the answer fits, one more does not
    largest, probes = largest_fitting(lambda n: base + slope * n, budget, limit=MAX_BATCH)
    assert largest == min(answer, MAX_BATCH)
    capped, size = [], 128  # the line is trusted up to 64 × the largest size that fits
    while size < answer:
        capped, size = [*capped, size], 64 * size
    expected = {1: [1, 2], 2: [1, 2, 3]}.get(answer, [1, 2, *capped, answer, answer + 1])
    if answer < MAX_BATCH:
        assert [p.size for p in probes] == expected
        assert affine_deviation_bytes(probes) in (None, 0)


@given(base=st.integers(0, 10**9), slope=st.integers(1, 10**6), bend=st.integers(0, 50), budget=st.integers(0, 10**10),
       first=st.integers(1, 5000), second=st.integers(1, 10**5), limit=st.integers(1, 10**6))
@settings(max_examples=200, deadline=None)
def test_a_search_from_a_known_size_finds_what_doubling_and_bisection_find(base, slope, bend, budget, first, second, limit):
    """``first``: a size whose peak the caller holds (lora's own --batch). Affine or convex peaks, any
    budget: the answer is the reference's; the first size is the first probe, batch 1 is traced only
    where it does not fit; the answer fits and one more does not, both probed."""
    first = min(first, limit)

    def peak(n):
        return base + slope * n + bend * n * n

    largest, probes = largest_fitting(peak, budget, limit=limit, first=first, second=second)
    sizes = [p.size for p in probes]
    assert largest == bisect_largest(peak, budget, limit)
    assert sizes[0] == first and len(sizes) == len(set(sizes))
    assert (1 in sizes) == (first == 1 or peak(first) > budget)
    if largest is not None:
        assert largest in sizes and (largest == limit or largest + 1 in sizes)
    assert all(p.peak_bytes == peak(p.size) and p.fits == (p.peak_bytes <= budget) for p in probes)


def test_a_first_size_past_the_limit_is_refused():
    with pytest.raises(ValueError, match="first size 9: expected 1 to the limit 8"):
        largest_fitting(lambda n: n, 100, limit=8, first=9)


def test_a_curved_peak_falls_back_and_still_finds_the_answer():
    def peak(n):  # convex: the line through 1 and 2 promises far more than fits
        return 1000 + 10 * n + n * n

    budget = 10**6
    truth = max(n for n in range(1, 2000) if peak(n) <= budget)
    largest, probes = largest_fitting(peak, budget, limit=MAX_BATCH)
    sizes = [p.size for p in probes]
    assert largest == truth == bisect_largest(peak, budget, MAX_BATCH)
    assert any(not p.fits and p.size > truth + 1 for p in probes)  # a line's answer did not fit: the search went on from there
    assert {truth, truth + 1} <= set(sizes) and len(sizes) > 4
    assert affine_deviation_bytes(probes) > 0


def test_a_peak_flat_then_rising_falls_back_to_doubling():
    def peak(n):  # the optimizer step holds the peak up to 64, the activations after
        return max(5000, 1000 + 60 * n)

    largest, probes = largest_fitting(peak, 20_000, limit=MAX_BATCH)
    assert largest == bisect_largest(peak, 20_000, MAX_BATCH) == 316
    assert [p.size for p in probes][:4] == [1, 2, 16, 128]  # no rise yet: × 8


def _counted(peak_of):
    calls: list[int] = []

    @functools.lru_cache(maxsize=None)
    def cached(size):
        calls.append(size)
        return peak_of(size)

    return cached, calls


def _mlp_target():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to("meta")
    return FitTarget("mlp", model, lambda batch, seq: torch.empty(batch, 64, device="meta"), loss=lambda m, x: m(x).mean(), seq_limit=None)


_MLP = {}


def _mlp_peak():
    if not _MLP:
        target = _mlp_target()
        kept: dict = {}
        peak, _ = _counted(step_peak_function(target, target.model, search="batch", fixed=None, recipe=get_recipe("fp32"), optimizer="adamw",
                                              keep=kept))
        _MLP["peak"] = peak, lambda size: phase_peaks_bytes(kept[size])
    return _MLP["peak"]


@pytest.mark.slow
@given(budget=st.integers(300_000, 3_000_000))
@settings(max_examples=15, deadline=None)
def test_an_mlp_step_peak_over_drawn_budgets_gives_the_binary_search_answer(budget):
    peak, phases = _mlp_peak()
    largest, probes = largest_fitting(peak, budget, limit=MAX_BATCH)
    assert largest == bisect_largest(peak, budget, MAX_BATCH)
    assert largest_fitting(peak, budget, limit=MAX_BATCH, phase_peaks_of=phases)[0] == largest
    assert len(probes) <= 4 or affine_deviation_bytes(probes) > 0  # more than four traces only where the peak is not affine


def _gpt_nano_target():
    from resacct.measurement.activation_checkpointing import gpt_loss
    from resacct.training.gpt import build_gpt

    model = build_gpt("gpt-nano", device="meta")

    def make_inputs(batch, seq):
        tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        return tokens, tokens

    return FitTarget("gpt-nano", model, make_inputs, loss=lambda m, inputs: gpt_loss(m, *inputs), seq_limit=64)


def _tiny_llama_target():
    pytest.importorskip("transformers")
    from resacct.account.fit.search import named_model_target

    return named_model_target("tests.fixtures_hf_models:tiny_llama")


@pytest.mark.slow
@pytest.mark.parametrize("make_target", [_gpt_nano_target, _tiny_llama_target], ids=["gpt-nano", "tiny-llama"])
def test_real_models_get_the_binary_search_answer_at_several_budgets(make_target):
    target = make_target()
    kept: dict = {}
    peak, calls = _counted(step_peak_function(target, target.model, search="batch", fixed=16, recipe=get_recipe("fp32"), optimizer="adamw",
                                              keep=kept))
    first, slope = peak(1), peak(2) - peak(1)
    assert slope > 0
    for extra_batches in (0.5, 3.2, 17.9, 200.4):
        budget = first + extra_batches * slope
        by_total = largest_fitting(peak, budget, limit=MAX_BATCH)
        largest, probes = largest_fitting(peak, budget, limit=MAX_BATCH, phase_peaks_of=lambda size: phase_peaks_bytes(kept[size]))
        assert largest == by_total[0] == bisect_largest(peak, budget, MAX_BATCH), (target.name, budget)
        assert largest >= 1 and {largest, largest + 1} <= {p.size for p in probes}
        # each phase's line (forward, backward, optimizer step …) names the answer; the total's line, held by the
        # optimizer step at 1 and 2, misses it at the larger budgets
        assert len(probes) <= min(4, len(by_total[1])), ([p.size for p in probes], [p.size for p in by_total[1]])


@pytest.mark.slow
def test_fit_step_reports_its_traces_and_how_far_the_probes_are_from_the_line():
    answer = fit_step(_mlp_target(), memory_bytes=2_000_000)
    fields = answer.to_dict()
    assert fields["traces"] == len(fields["probes"]) == answer.traces
    assert fields["affine_deviation_bytes"] == affine_deviation_bytes(answer.probes)


def test_each_phases_line_names_the_answer_where_the_totals_line_misses():
    def phases(n):  # the optimizer step holds the peak at small batches, backward past 81
        return {"optimizer step": 50_000 + n, "backward": 1000 + 600 * n}

    def peak(n):
        return max(phases(n).values())

    by_phase = largest_fitting(peak, 60_000, limit=MAX_BATCH, phase_peaks_of=phases)
    by_total = largest_fitting(peak, 60_000, limit=MAX_BATCH)
    assert by_phase[0] == by_total[0] == bisect_largest(peak, 60_000, MAX_BATCH) == 98
    assert [p.size for p in by_phase[1]] == [1, 2, 98, 99]
    assert [p.size for p in by_total[1]] == [1, 2, 128, 127, 99, 98]  # the total's line is the optimizer's: it misses, then the line at 127
