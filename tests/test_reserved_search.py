"""The largest batch by the board's reserved peak (resacct/account/gpu/answers/reserved_search.py): on any
non-decreasing staircase of reserved bytes — a line rounded up to the allocator's segments — and from any
CPU answer, an ``exact`` answer is the true largest batch, never more traces than allowed, and what is said
fits; and ``lora --device`` judges its CPU answer so (a tiny Llama on an H100)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.account.gpu.answers.reserved_search import MAX_RESERVED_TRACES, largest_by_reserved

MIB = 2**20


def _staircase(start_bytes: int, per_batch_bytes: int, step_bytes: int):  # noqa: ANN202
    return lambda batch: -(-(start_bytes + per_batch_bytes * batch) // step_bytes) * step_bytes


@given(start_bytes=st.integers(0, 10_000 * MIB), per_batch_bytes=st.integers(1, 500 * MIB), step=st.sampled_from([1, 2 * MIB, 20 * MIB]),
       budget_bytes=st.integers(1, 80_000 * MIB), cpu_answer=st.integers(1, 5000))
@settings(max_examples=300, deadline=None)
def test_an_exact_answer_is_the_true_largest_batch(start_bytes: int, per_batch_bytes: int, step: int, budget_bytes: int, cpu_answer: int) -> None:
    reserved = _staircase(start_bytes, per_batch_bytes, step)
    calls: list[int] = []
    search = largest_by_reserved(lambda batch: calls.append(batch) or reserved(batch), cpu_answer, budget_bytes)
    assert search is not None and len(calls) == len(search.traced) <= MAX_RESERVED_TRACES and calls[0] == cpu_answer
    low, high = 0, 2 * budget_bytes + 2  # reserved(high) > budget: every batch adds a byte at least
    while high - low > 1:  # the true largest batch, by bisection over the staircase (non-decreasing)
        middle = (low + high) // 2
        low, high = (middle, high) if reserved(middle) <= budget_bytes else (low, middle)
    truth = low
    if search.exact:
        assert search.largest == truth
    elif search.largest is not None:
        assert 1 <= search.largest <= truth  # a lower bound that fits
    assert all(held == reserved(batch) for batch, held in search.traced)


def test_an_affine_step_closes_in_four_traces_or_fewer_from_either_side() -> None:
    reserved = _staircase(1_000, 97, 1)
    for cpu_answer in (41, 42, 50, 3000):
        search = largest_by_reserved(reserved, cpu_answer, 5_000)
        assert search is not None and (search.largest, search.exact) == (41, True) and len(search.traced) <= 4, search


def test_no_prediction_gives_no_search_and_the_lines_say_what_was_found() -> None:
    assert largest_by_reserved(lambda batch: None, 4, 10) is None
    text = "{:.0f} B".format
    assert largest_by_reserved(_staircase(0, 10, 1), 3, 25).line(text) == (
        "by the reserved peak: the largest batch that fits the 25 B budget is 2 (reserved 20 B); batch 3 does not (30 B) — the CPU kernels' step said 3")
    assert largest_by_reserved(_staircase(100, 10, 1), 1, 50).line(text) == (
        "by the reserved peak: not even batch 1 fits the 50 B budget (reserved 110 B)")
    assert largest_by_reserved(_staircase(0, 10, 1), 0, 15).line(text) == (  # the CPU kernels said none fits; the board's step holds less
        "by the reserved peak: the largest batch that fits the 15 B budget is 1 (reserved 10 B); batch 2 does not (20 B) — the CPU kernels' step said 0")
    short = largest_by_reserved(_staircase(0, 10, 1), 1, 10**6, max_traces=2)  # every batch traced fits: a lower bound
    assert (short.largest, short.exact) == (2, False)
    assert short.line(text) == ("by the reserved peak: the largest batch that fits the 1000000 B budget is 2 (reserved 20 B), at least: "
                                "batch 2 still fits after 2 traces — the CPU kernels' step said 1")


def test_no_batch_above_the_limit_is_traced() -> None:
    """``fit --max-batch``: the search stops at the limit when it fits, and says so; below it, the limit changes nothing."""
    traced: list[int] = []

    def reserved(batch: int) -> int:
        traced.append(batch)
        return 1_000 + 97 * batch

    capped = largest_by_reserved(reserved, 30, 5_000, limit=35)
    assert (capped.largest, capped.exact, capped.at_limit) == (35, False, True) and max(traced) == 35
    assert capped.line("{:.0f} B".format) == ("by the reserved peak: the largest batch that fits the 5000 B budget is 35 (reserved 4395 B): "
                                              "the limit searched — the CPU kernels' step said 30")
    assert capped.to_dict()["limit"] == 35
    assert largest_by_reserved(reserved, 60, 5_000, limit=100).largest == 41
    assert largest_by_reserved(reserved, 60, 5_000, limit=20).largest == 20  # the CPU kernels' answer past the limit starts at it


@pytest.mark.slow  # the tiny Llama's LoRA step on the CPU engine and a few traces of the board's step, twice (JSON, text): ~11 s
def test_lora_on_a_board_judges_its_largest_batch_by_the_reserved_peak(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from resacct.account.gpu.answers.command_answers import lora_gpu_answer
    from resacct.account.load.hf_models import load_hf_config, transformers_config
    from resacct.cli import main
    from resacct.facts.hardware import get_accelerator
    from tests.test_gpu_device_answer import CONFIG

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "max_position_embeddings": 4096}))
    assert main(["lora", "--hf-config", str(path), "--seq", "2048", "--device", "h100", "--no-cache", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    search = fields["gpu"]["largest_batch_by_reserved"]
    assert search["cpu_engine_largest"] == fields["largest_batch"] and search["budget_bytes"] == 80e9
    board, config = get_accelerator("h100"), transformers_config(load_hf_config(str(path)))

    def reserved(batch: int) -> int:  # the board's step traced afresh, as the command traces it
        return lora_gpu_answer(config, rank=16, targets=("q_proj", "v_proj"), base="bf16", batch=batch, seq=2048, dropout=0.0,
                               gradient_checkpointing=False, board=board, timed=False).reserved_bytes

    assert all(reserved(each["batch"]) == each["reserved_bytes"] for each in search["traced"][:2])
    if search["exact"]:
        assert reserved(search["largest"]) <= 80e9 < reserved(search["largest"] + 1)
    assert main(["lora", "--hf-config", str(path), "--seq", "2048", "--device", "h100"]) == 0  # the text (traced again: the suite caches nothing)
    second = capsys.readouterr().out.splitlines()[1]
    at_least = "" if search["exact"] or search["largest"] == search["limit"] else " at least"
    assert second.startswith(f"  answer on h100-sxm: batch{at_least} {search['largest']:,} at seq 2048, by the predicted reserved peak")


def _found(search, gpu: object = object()) -> dict:  # noqa: ANN001
    return {"gpu": gpu, "search": search}


def test_fit_on_a_board_puts_the_boards_answer_first_and_says_how_sure_it_is() -> None:
    from resacct.account.gpu.answers.device_answer import fit_gpu_headline
    from resacct.account.gpu.answers.reserved_search import ReservedSearch

    text = "{:.0f} B".format
    exact = ReservedSearch(budget_bytes=1000, start=9, largest=7, exact=True, traced=((9, 1200), (7, 980), (8, 1010)))
    assert fit_gpu_headline(_found(exact), "h100-sxm", text) == (
        "  answer on h100-sxm: micro-batch 7, by the predicted reserved peak (980 B of the 1000 B budget; the board's step, below the CPU "
        "kernels' answer)")
    open_above = ReservedSearch(budget_bytes=1000, start=3, largest=5, exact=False, traced=((3, 500), (5, 700)))
    assert "micro-batch at least 5," in fit_gpu_headline(_found(open_above), "h100-sxm", text)
    capped = ReservedSearch(budget_bytes=1000, start=3, largest=4, exact=False, traced=((3, 500), (4, 600)), limit=4)
    assert "micro-batch 4," in fit_gpu_headline(_found(capped), "h100-sxm", text)  # the limit asked about: no "at least"
    seq = ReservedSearch(budget_bytes=1000, start=512, largest=0, exact=True, traced=((1, 1500),), what="seq")
    assert fit_gpu_headline(_found(seq), "a100-sxm-80gb", text) == (
        "  answer on a100-sxm-80gb: no sequence length fits — seq 1 is predicted at 1500 B reserved, over the 1000 B budget (the board's step, below)")
    unanswered = ReservedSearch(budget_bytes=1000, start=3, largest=None, exact=False, traced=((3, 1500),))
    assert fit_gpu_headline(_found(unanswered), "h100-sxm", text) is None
    assert fit_gpu_headline(_found(exact, gpu=None), "h100-sxm", text) is None  # no board step predicted
    assert fit_gpu_headline({"gpu": object(), "search": None}, "h100-sxm", text) is None


@pytest.mark.slow  # a fit search of a tiny GPT-2 and its board traces (~3 CPU s)
def test_fit_device_prints_the_boards_answer_second_and_json_agrees(tmp_path, capsys) -> None:  # noqa: ANN001
    pytest.importorskip("transformers")
    from resacct.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 256, "n_positions": 512}))
    argv = ["fit", "--hf-config", str(path), "--seq", "512", "--reserve-gb", "79.88", "--device", "h100", "--no-cache", "--no-progress"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert main([*argv, "--json"]) == 0
    largest = json.loads(capsys.readouterr().out)["gpu"]["largest_by_reserved_peak"]
    assert lines[1].startswith(f"  answer on h100-sxm: micro-batch {largest:,}, by the predicted reserved peak")
