"""``resacct lora``'s largest batch, searched as ``fit`` searches (resacct.account.fit.lora_batch):
the answer is the largest batch whose real peft step's peak — torch's CPU allocator
(:func:`resacct.account.peak.step_peak.measure_step_peak`) — fits the budget, and one more batch
does not. The one-trace estimate it replaces (the peak's growth per sequence at one batch) said 6
where 7 fits on the 2-layer Llama below."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from resacct.account.fit.lines import FitProbe
from resacct.account.fit.lora_batch import LoraBatchAnswer
from tests.trace_memo import memoized_lora_trace  # noqa: F401  (a fixture)

#: a 2-layer Llama (d 64, 4 query and 2 key/value heads), adapters of rank 4 on q and v, 16 tokens a sequence
TINY_LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}
RANK, TARGETS, SEQ = 4, ("q_proj", "v_proj"), 16


def _config():  # type: ignore[no-untyped-def]
    from resacct.account.load.hf_models import HfConfigSpec, transformers_config

    return transformers_config(HfConfigSpec(name="tiny-llama", source="test", values=dict(TINY_LLAMA)))


def _measured_peaks(base: str, batches: range) -> dict[int, int]:
    """The CPU allocator's peak of a real peft LoRA step (forward, backward, AdamW step) at each batch."""
    from resacct.account.peak.step_peak import measure_step_peak
    from resacct.account.trace.lora_step import adamw_over, build_lora_model, lora_loss

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_lora_model(_config(), rank=RANK, targets=TARGETS, base=base, device="cpu")
    peaks = {}
    for batch in batches:
        ids = torch.randint(0, 128, (batch, SEQ), generator=torch.Generator().manual_seed(batch))
        peaks[batch] = measure_step_peak(model, {"input_ids": ids, "labels": ids}, lora_loss, adamw_over).peak_bytes
    return peaks


def _budget_where_7_fits() -> int:
    """1000 B over the allocator's peak at batch 7 on this torch (well under batch 8's: a sequence is
    ~110 KB): the batch-7 answer on every torch, whose peaks differ (2.13: 1,123,848 B at 7; 2.8: 1,179,456)."""
    measured = _measured_peaks("fp32", range(7, 9))
    assert measured[8] - measured[7] > 100_000
    return measured[7] + 1000


def _largest(peaks: dict[int, int], budget: float) -> int:
    """The largest batch of a run of measured batches 1, 2, … whose peak fits (the run must reach one that does not)."""
    fitting = [batch for batch in sorted(peaks) if peaks[batch] <= budget]
    assert max(peaks) not in fitting, "measure one batch past the answer"
    return max(fitting, default=0)


@pytest.mark.usefixtures("memoized_lora_trace")  # the text answer below: the --json one's traces, from memory
@pytest.mark.slow  # two traced LoRA steps, a search and two real steps on the CPU: ~5 s loaded (2026-11-28)
def test_the_answer_fits_the_cpu_allocator_and_one_more_does_not(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("peft")
    from resacct.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    budget = _budget_where_7_fits()
    assert main(["lora", "--hf-config", str(path), "--rank", str(RANK), "--targets", ",".join(TARGETS), "--base", "fp32", "--seq", str(SEQ),
                 "--memory-gb", str(budget / 1e9), "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    search = fields["largest_batch_search"]
    largest = fields["largest_batch"]
    measured = _measured_peaks("fp32", range(largest, largest + 2))
    assert measured[largest] <= budget < measured[largest + 1] and largest == 7
    assert search["checked"] is True and search["budget_bytes"] == pytest.approx(budget)
    # batch 1: the command's own trace; 6: what it says alone (the second batch); 7 and 8: the phases' lines through 1 and 6
    assert [p["batch"] for p in search["probes"]] == [1, 6, 7, 8] and search["traces"] == 3
    assert search["predicted_peak_bytes"] == measured[7] and search["next_predicted_peak_bytes"] == measured[8]
    assert fields["largest_batch_basis"] == "traced at the answer and one more"
    assert search["probes"][0]["predicted_peak_bytes"] == fields["step_peak_bytes"]  # batch 1 is the command's own: reused
    assert main(["lora", "--hf-config", str(path), "--rank", str(RANK), "--targets", ",".join(TARGETS), "--base", "fp32", "--seq", str(SEQ),
                 "--memory-gb", str(budget / 1e9)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "largest batch" in line)
    assert line.startswith("  largest batch at seq 16: 7 (checked: batch 7's traced step peak fits, batch 8 does not; 3 traces + 1 reused")
    assert "estimate" not in line


@pytest.mark.slow  # a traced LoRA step and a search: ~1 s loaded (2026-11-28)
def test_the_one_trace_estimate_said_6_where_7_fits() -> None:
    pytest.importorskip("peft")
    from resacct.account.fit.lora_batch import largest_lora_batch
    from resacct.account.trace.lora_step import trace_lora_step

    budget = _budget_where_7_fits()
    traced = trace_lora_step(_config(), rank=RANK, targets=TARGETS, base="fp32", batch=1, seq=SEQ)
    estimate = int((budget - traced.start_bytes) // ((traced.peak_bytes - traced.start_bytes) / 1))  # what lora printed before
    answer = largest_lora_batch(_config(), rank=RANK, targets=TARGETS, base="fp32", seq=SEQ, budget_bytes=budget,
                                known={1: traced.peak}, model=traced.model)
    assert (estimate, answer.largest) == (6, 7)


@pytest.mark.slow  # 7 real peft steps on the CPU, 8 traced: ~6 CPU s loaded (2026-11-28)
@pytest.mark.parametrize("base", ["bf16", "fp32"])
def test_every_budget_gets_the_largest_batch_the_allocator_fits(base: str) -> None:
    """Budgets between the measured peaks of batches 1…6, and on them: every answer is the allocator's.
    Over a bf16 base with two torch threads the peak is not affine at small batches (batch 1→2 adds
    71,552 B, 2→3 84,224 B, then 89,984 B: oneDNN's scratchpad), so the line through the step peaks at
    1 and 2 overshoots — the phases' lines do not; with one thread (the gate's workers) the same peaks
    are affine, so whether the line misses is asked of the measured peaks, not assumed."""
    pytest.importorskip("peft")
    from resacct.account.fit.lines import affine_answer
    from resacct.account.fit.lora_batch import largest_lora_batch, lora_batch_peaks

    measured = _measured_peaks(base, range(1, 8))
    trace = lora_batch_peaks(_config(), rank=RANK, targets=TARGETS, base=base, seq=SEQ)
    predicted = {batch: trace(batch) for batch in range(1, 9)}  # traced once: each search below reads them
    budgets = sorted({measured[1] - 1, *measured.values(), *((measured[b] + measured[b + 1]) // 2 for b in range(1, 6))} - {measured[7]})
    line_missed = 0
    for budget in budgets:
        answer = largest_lora_batch(_config(), rank=RANK, targets=TARGETS, base=base, seq=SEQ, budget_bytes=budget, known=predicted)
        assert answer.largest == _largest(measured, budget), budget
        assert answer.checked and answer.traced == 0 and (answer.largest == 0 or answer.peak_bytes == measured[answer.largest])
        if answer.largest:
            one, two = (FitProbe(b, measured[b], True, 0.0) for b in (1, 2))
            line_missed += affine_answer(one, two, budget) != answer.largest
    steps = {measured[b + 1] - measured[b] for b in range(1, 7)}
    if len(steps) == 1:  # affine measured peaks: the two-point line is right everywhere
        assert line_missed == 0


@pytest.mark.slow  # one traced LoRA step: 0.6-1.8 s loaded (2026-11-28)
def test_nothing_fits_says_so_without_tracing_again(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("peft")
    from resacct.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    assert main(["lora", "--hf-config", str(path), "--rank", str(RANK), "--seq", str(SEQ), "--memory-gb", "0.0001", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["fits"] is False and fields["largest_batch"] == 0
    assert fields["largest_batch_search"]["traces"] == 0 and [p["batch"] for p in fields["largest_batch_search"]["probes"]] == [1]
    assert main(["lora", "--hf-config", str(path), "--rank", str(RANK), "--seq", str(SEQ), "--memory-gb", "0.0001"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "largest batch" in line)
    # one parenthesis: how the search decided, and why (two in a row before)
    assert line == "  largest batch at seq 16: 0 (traced: batch 1's step peak is over the budget; the state alone leaves no room for one sequence)"


def test_checked_needs_the_answer_within_and_one_more_over() -> None:
    def answer(largest: int, *peaks: tuple[int, int], limit: int = 1 << 20) -> LoraBatchAnswer:
        return LoraBatchAnswer(largest=largest, budget_bytes=100, probes=tuple(FitProbe(b, p, p <= 100, 0.0) for b, p in peaks), traced=2,
                               limit=limit)

    assert answer(3, (1, 40), (3, 100), (4, 101)).checked
    assert not answer(3, (1, 40), (3, 100)).checked                # one more never traced
    assert not answer(3, (1, 40), (3, 101), (4, 120)).checked      # the answer itself over
    assert not answer(3, (1, 40), (3, 90), (4, 100)).checked       # one more still fits
    assert answer(8, (1, 40), (8, 90), limit=8).checked            # the search's limit
    assert answer(0, (1, 140)).checked and answer(0, (1, 140)).peak_bytes is None
    assert "batch 4 does not; 2 traces + 1 reused at batches 1, 3, 4" in answer(3, (1, 40), (3, 100), (4, 101)).text()


@pytest.mark.slow  # the claim's check twice: ~3 CPU s loaded (2026-11-28)
def test_the_claims_check_fails_an_answer_one_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """finetune.lora_largest_batch (claims lora-largest-batch-*) refutes an answer one batch short or long:
    the allocator's peak says so, whatever the search claims."""
    pytest.importorskip("peft")
    import dataclasses

    from resacct.account.fit import lora_batch
    from resacct.checks.finetune import lora_largest_batch

    assert lora_largest_batch(1_130_000, base="fp32").measured == [True, True]
    search = lora_batch.largest_lora_batch

    def shifted(shift: int):  # type: ignore[no-untyped-def]
        return lambda *args, **keywords: dataclasses.replace(answer := search(*args, **keywords), largest=answer.largest + shift)

    for shift, verdict in ((-1, [True, False]), (1, [False, True])):
        monkeypatch.setattr(lora_batch, "largest_lora_batch", shifted(shift))
        assert lora_largest_batch(1_130_000, base="fp32").measured == verdict
