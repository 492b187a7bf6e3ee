"""The board's step traced on the second core beside the CPU kernels' search (resacct/account/gpu/answers/traced_beside.py;
issue 34's ``fit --device`` bar): what the child traces is what the parent would, a failure there costs nothing but
the parent's own trace, and ``fit --device`` and ``lora --device`` answer the same with it and without it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resacct.account.gpu.answers import traced_beside
from resacct.account.gpu.answers.traced_beside import TracedBeside
from resacct.cli import main


def _square_with_pid(size: int, fixed: int) -> tuple[int, int]:
    return size * size + fixed, os.getpid()


def _refuses_three(size: int, fixed: int) -> int:
    if size == 3:
        raise RuntimeError("no meta kernel")
    return size


def _unpicklable(size: int, fixed: int) -> object:
    return lambda: size  # a lambda cannot cross the pipe


def test_each_size_asked_is_traced_once_in_another_process() -> None:
    with TracedBeside(_square_with_pid, enabled=True, autograd=False) as beside:
        for size in (1, 2, 2, 9):
            beside.ask(size, 10)
        done = beside.collect()
    assert {key: value[0] for key, value in done.items()} == {(1, 10): 11, (2, 10): 14, (9, 10): 91}
    assert {pid for _, pid in done.values()} != {os.getpid()} and len({pid for _, pid in done.values()}) == 1
    assert beside._process is None  # the child stopped and was waited for


def test_a_size_the_child_cannot_trace_or_send_is_left_to_the_parent() -> None:
    with TracedBeside(_refuses_three, enabled=True, autograd=False) as beside:
        for size in (2, 3, 4):
            beside.ask(size, None)
        assert beside.collect() == {(2, None): 2, (4, None): 4}
    with TracedBeside(_unpicklable, enabled=True, autograd=False) as beside:
        beside.ask(5, None)
        assert beside.collect() == {}


def test_a_child_that_cannot_run_autograd_traces_nothing_and_the_parent_traces_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork of a process whose autograd started its device threads cannot run a backward (torch 2.12.1+cu130 without a
    GPU, after a board's step in the same process: the second ``lora --device`` answer said the step "could not be
    traced"). The child sees it first and traces nothing; the parent traces every size itself. A trace that needs no
    autograd is served all the same."""
    monkeypatch.setattr(traced_beside, "_autograd_runs_here", lambda: False)  # the forked child inherits it
    with TracedBeside(_square_with_pid, enabled=True) as beside:
        beside.ask(2, 1)
        beside.ask(3, 1)
        assert beside.collect() == {}
    with TracedBeside(_square_with_pid, enabled=True, autograd=False) as beside:
        beside.ask(2, 1)
        assert {key: value[0] for key, value in beside.collect().items()} == {(2, 1): 5}


@pytest.mark.slow  # 4.5 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_a_fresh_process_forks_a_child_that_runs_autograd() -> None:
    """In a process that never ran a backward on an accelerator's device type, a fork of it can."""
    from resacct.measurement.distributed import run_isolated

    assert run_isolated(_probe_in_a_fork, timeout_seconds=120) is True


def _probe_in_a_fork() -> bool:
    """In a fresh child: whether a fork of it can run autograd (the probe, run in that fork)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: its answer down the pipe, then gone
        os.write(write_end, b"1" if traced_beside._autograd_runs_here() else b"0")
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 1)
    os.close(read_end)
    os.waitpid(pid, 0)
    return answer == b"1"


def test_one_core_forks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traced_beside, "two_cores", lambda: False)
    beside = TracedBeside(_square_with_pid)
    beside.ask(1, 1)
    assert beside._process is None and beside.collect() == {}


def test_closing_early_stops_the_child() -> None:
    """Ctrl-C or --timeout in the search: the with block's exit stops the child without collecting."""
    beside = TracedBeside(_square_with_pid, enabled=True)
    process = beside._process
    beside.ask(1, 1)
    beside.close()
    assert not process.is_alive() and beside._process is None


def _fit(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    argv = ["fit", "--model", "tests.fixtures_hf_models:tiny_llama", "--seq", "32", "--max-batch", "256", "--device", "a100-sxm-40gb",
            "--reserve-gb", "39.96", "--json", *extra]  # 40 MB: the CPU kernels' step and the board's each have an answer inside the range
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow  # 5.9 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_fit_on_a_board_answers_the_same_with_the_board_traced_beside(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The same answer, CPU and board, with the board's steps traced in a child beside the CPU search and all in one
    process; beside, the child traced the sizes the board's search asked first (no second trace of them here)."""
    pytest.importorskip("transformers")
    asked: list[tuple[int, int]] = []
    real = traced_beside.TracedBeside.collect

    def spy(self: TracedBeside) -> dict:
        done = real(self)
        asked.extend(done)
        return done

    monkeypatch.setattr(traced_beside.TracedBeside, "collect", spy)
    from resacct.account.gpu.answers import device_answer

    made = device_answer.board_step_function
    in_this_process: list[int] = []  # the sizes whose board step this process traced (the child's own list stays in the child)

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        step_at = made(*args, **kwargs)

        def traced_here(size, fixed):  # type: ignore[no-untyped-def]
            in_this_process.append(size)
            return step_at(size, fixed)
        return traced_here

    monkeypatch.setattr(device_answer, "board_step_function", counting)
    beside = _fit(capsys)
    traced_in_parent = list(in_this_process)
    monkeypatch.setattr(traced_beside, "two_cores", lambda: False)
    alone = _fit(capsys)

    def answer(fields: dict) -> dict:
        gpu = {key: value for key, value in fields["gpu"].items() if key not in ("step_time_basis",)}
        return {"largest": fields["largest"], "probes": [(p["size"], p["predicted_peak_bytes"]) for p in fields["probes"]], "gpu": gpu}

    assert answer(beside) == answer(alone)
    board = alone["gpu"]["largest_batch_by_reserved"]
    assert board["exact"] and 1 < board["largest"] < alone["largest"] < 256  # the board's search went its own way down from the CPU's
    if traced_beside.two_cores():  # a machine with one core forks nothing: the same answer is the whole check there
        first = alone["gpu"]["largest_batch_by_reserved"]["traced"][0]["batch"]
        assert (first, 32) in asked and {size for size, _ in asked} == {p["size"] for p in alone["probes"]}
        # what the child traced is not traced again here: only the board's sizes the CPU search never probed
        board_sizes = [row["batch"] for row in board["traced"]]
        assert traced_in_parent == [size for size in board_sizes if (size, 32) not in asked] and len(traced_in_parent) < len(board_sizes)


@pytest.mark.slow  # 6.8 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_lora_on_a_board_answers_the_same_with_the_board_traced_beside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``lora --device``: the same --json with the board's steps traced in a child beside the CPU batch search and all in
    one process; beside, this process traces no board step the child did — the command's batch (timed) and the batches
    the CPU search probed, where the board's own search starts."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from resacct.account.gpu.answers import command_answers

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "tie_word_embeddings": False}))
    real = command_answers.lora_gpu_answer
    here: list[tuple[int, bool]] = []  # the board steps this process traced (the child's calls stay in the child)

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        here.append((kwargs["batch"], kwargs["timed"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(command_answers, "lora_gpu_answer", counting)
    argv = ["lora", "--hf-config", str(config), "--seq", "32", "--device", "h100", "--reserve-gb", "79.8", "--no-cache", "--json"]
    assert main(argv) == 0
    beside, traced_here = json.loads(capsys.readouterr().out), list(here)
    here.clear()
    monkeypatch.setattr(traced_beside, "two_cores", lambda: False)
    assert main(argv) == 0
    alone = json.loads(capsys.readouterr().out)
    assert beside == alone
    board = [row["batch"] for row in alone["gpu"]["largest_batch_by_reserved"]["traced"]]
    probed = {probe["batch"] for probe in alone["largest_batch_search"]["probes"]}
    assert here == [(1, True), *((batch, False) for batch in board)]  # alone: every board step here
    assert alone["gpu"]["largest_batch_by_reserved"]["largest"] < alone["largest_batch_search"]["largest"]
    if traced_beside.two_cores():
        assert board[0] in probed and traced_here == [(batch, False) for batch in board if batch not in probed]
