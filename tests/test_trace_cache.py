"""The trace cache (:mod:`resacct.account.trace.cache`): where it lives, what it keys on, that a
second ``account``/``fit --hf-config`` of the same question reads the first one's answer (the
tracing is made to fail the second time: the answer must come from the file), and that a corrupt or
truncated file is ignored and written again. Every test points ``RESACCT_CACHE_DIR`` at ``tmp_path``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resacct.account.trace import cache as trace_cache  # noqa: E402
from resacct.account.trace.cache import cache_dir, cache_key, cache_wanted, cached, caching, last_outcome  # noqa: E402
from resacct.cli import main  # noqa: E402

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 64}


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "traces"
    monkeypatch.setenv("RESACCT_CACHE_DIR", str(folder))
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)  # tests/conftest.py turns the commands' cache off
    return folder


def _counting(answer: object):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    def compute() -> object:
        calls.append(1)
        return answer

    return compute, calls


def test_where_the_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESACCT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RESACCT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "resacct" / "traces"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "resacct" / "traces"
    with caching(True, folder=tmp_path / "given"):
        assert cache_dir() == tmp_path / "given"


def test_commands_cache_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESACCT_NO_CACHE", raising=False)
    assert cache_wanted(False) and not cache_wanted(True)
    monkeypatch.setenv("RESACCT_NO_CACHE", "1")
    assert not cache_wanted(False)
    monkeypatch.setenv("RESACCT_NO_CACHE", "0")
    assert cache_wanted(False)


def test_off_by_default_computes_every_time_and_writes_nothing(cache_folder: Path) -> None:
    compute, calls = _counting([1, 2])
    assert cached("demo", {"n": 1}, compute) == [1, 2] and cached("demo", {"n": 1}, compute) == [1, 2]
    assert len(calls) == 2 and last_outcome() == "off" and not cache_folder.exists()


def test_the_same_question_is_read_back_and_another_is_computed(cache_folder: Path) -> None:
    compute, calls = _counting({"peak_bytes": 123})
    with caching(True):
        assert cached("demo", {"n": 1}, compute) == {"peak_bytes": 123} and last_outcome() == "stored"
        assert cached("demo", {"n": 1}, compute) == {"peak_bytes": 123} and last_outcome() == "hit"
        assert cached("demo", {"n": 2}, compute) == {"peak_bytes": 123} and last_outcome() == "stored"
        assert cached("other", {"n": 1}, compute) == {"peak_bytes": 123} and last_outcome() == "stored"
    assert len(calls) == 3
    assert len(list(cache_folder.glob("*.pickle"))) == 3 and not list(cache_folder.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "another key"])
def test_a_damaged_file_is_ignored_and_written_again(cache_folder: Path, damage: str) -> None:
    compute, calls = _counting(list(range(1000)))
    with caching(True):
        cached("demo", {"n": 1}, compute)
        (path,) = cache_folder.glob("demo-*.pickle")
        whole = path.read_bytes()
        if damage == "another key":  # a file whose key is not the question's (a hash collision, a renamed file)
            with caching(True, folder=cache_folder / "elsewhere"):
                cached("demo", {"n": 2}, compute)
            (other,) = (cache_folder / "elsewhere").glob("demo-*.pickle")
            path.write_bytes(other.read_bytes())
        else:
            path.write_bytes({"truncated": whole[: len(whole) // 2], "garbage": b"not a pickle at all", "empty": b""}[damage])
        assert cached("demo", {"n": 1}, compute) == list(range(1000)) and last_outcome() == "stored"
        assert path.read_bytes() == whole  # rewritten whole
        assert cached("demo", {"n": 1}, compute) == list(range(1000)) and last_outcome() == "hit"
    assert len(calls) == 2 + (damage == "another key")  # traced first, again after the damage, then read


def test_an_unwritable_folder_still_answers(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    compute, calls = _counting(7)
    with caching(True, folder=blocked):
        assert cached("demo", {}, compute) == 7 and last_outcome() == "unwritable"
        assert cached("demo", {}, compute) == 7
    assert len(calls) == 2 and blocked.read_text() == "not a folder"


def test_the_key_names_versions_and_source(monkeypatch: pytest.MonkeyPatch) -> None:
    key = json.loads(cache_key("demo", {"batch": 2}))
    assert key["question"] == {"batch": 2} and key["versions"]["torch"] and key["versions"]["resacct_source"]
    assert cache_key("demo", {"batch": 2}) != cache_key("demo", {"batch": 3}) != cache_key("other", {"batch": 3})
    monkeypatch.setattr(trace_cache, "source_fingerprint", lambda: "an edited resacct")
    assert json.loads(cache_key("demo", {"batch": 2}))["versions"]["resacct_source"] == "an edited resacct"


def _config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def _tracing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from resacct.account.fit import search as fit_search
    from resacct.account.load import hf_models

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced again: the answer should have come from the cache")

    monkeypatch.setattr(hf_models, "build_hf_model", refuse)
    monkeypatch.setattr(fit_search, "fit_step", refuse)


@pytest.mark.slow  # 0.73 CPU s on 2026-11-29 (tools/slow_audit.py: over the 0.7 s line)
def test_account_hf_config_answers_the_second_time_from_the_cache(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    argv = ["account", "--hf-config", _config(tmp_path), "--batch", "2", "--seq", "16", "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert len(list(cache_folder.glob("hf-account-*.pickle"))) == 1
    with monkeypatch.context() as patched:
        _tracing_fails(patched)
        assert main(argv) == 0
        assert capsys.readouterr().out == first  # the same answer, byte for byte
        with pytest.raises(AssertionError, match="traced again"):
            main([*argv, "--no-cache"])
    assert json.loads(first)["parameters"] > 0


@pytest.mark.slow  # one tiny account traced, then read back
def test_account_reads_its_printed_answer_back_and_still_refuses_past_max_memory(cache_folder: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The printed answer (fields and text) is read back without building or even loading the account (the account step
    made to fail); ``--max-memory`` is judged on the stored peak; what is printed (``--per-module``) is part of the question."""
    pytest.importorskip("transformers")
    from resacct.cli import account as account_command

    argv = ["account", "--hf-config", _config(tmp_path), "--batch", "2", "--seq", "16"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert len(list(cache_folder.glob("rendered-account-*.pickle"))) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("accounted again: the printed answer should have come from the cache")

    with monkeypatch.context() as patched:
        patched.setattr(account_command, "run_hf_config", refuse)
        assert main(argv) == 0
        second = capsys.readouterr()
        assert second.out == first and "resacct account: answered from the trace cache" in second.err
        assert main([*argv, "--max-memory", "1000"]) == 2
        assert "more than --max-memory" in capsys.readouterr().err
        with pytest.raises(AssertionError, match="accounted again"):
            main([*argv, "--per-module"])


@pytest.mark.slow  # 2.76 s idle on 2026-11-28
def test_fit_hf_config_answers_the_second_time_from_the_cache(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    argv = ["fit", "--hf-config", _config(tmp_path), "--seq", "16", "--memory-gb", "0.002", "--no-progress"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "trace cache" not in first.err and len(list(cache_folder.glob("hf-fit-*.pickle"))) == 1
    with monkeypatch.context() as patched:
        _tracing_fails(patched)
        assert main(argv) == 0
        second = capsys.readouterr()
        assert second.out == first.out and "answered from the trace cache" in second.err
        with pytest.raises(AssertionError, match="traced again"):
            main([*argv, "--no-cache"])
        patched.setenv("RESACCT_NO_CACHE", "1")
        with pytest.raises(AssertionError, match="traced again"):
            main(argv)
    assert main([*argv[:-3], "--memory-gb", "0.003", "--no-progress"]) == 0  # another budget: another question, searched
    assert len(list(cache_folder.glob("hf-fit-*.pickle"))) == 2


@pytest.mark.slow  # 1.17 CPU s on 2026-11-29 (tools/slow_audit.py: over the 0.7 s line)
def test_account_device_board_lines_are_read_back_with_their_answer(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``account --hf-config X --device h100``: the board's lines and the answer they add to ``--json`` (``gpu``) come back
    from the cache (the rebuild and the CUDA trace made to fail the second time)."""
    pytest.importorskip("transformers")
    argv = ["account", "--hf-config", _config(tmp_path), "--batch", "1", "--seq", "16", "--device", "h100"]
    assert main([*argv, "--json"]) == 0
    first_json = capsys.readouterr().out
    assert main(argv) == 0
    first_text = capsys.readouterr().out
    assert "on h100-sxm (CUDA caching allocator, predicted)" in first_text and json.loads(first_json)["gpu"]["board"] == "h100-sxm"
    with monkeypatch.context() as patched:
        _tracing_fails(patched)
        assert main([*argv, "--json"]) == 0
        assert capsys.readouterr().out == first_json
        assert main(argv) == 0
        assert capsys.readouterr().out == first_text


def test_the_folder_keeps_the_answers_used_last(cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(trace_cache, "MAX_ANSWERS", 3)
    compute, calls = _counting("answer")
    cache_folder.mkdir(parents=True)
    (cache_folder / "the-users-own.pickle").write_bytes(b"not an answer")  # a folder shared with other files: never pruned
    with caching(True):
        for n in range(3):
            cached("demo", {"n": n}, compute)
            time.sleep(0.02)  # distinct modification times
        cached("demo", {"n": 0}, compute)  # a hit: 0 is now the one used last
        assert last_outcome() == "hit"
        time.sleep(0.02)
        cached("demo", {"n": 3}, compute)  # a fourth answer: the least recently used (1) goes
        assert len(list(cache_folder.glob("demo-*.pickle"))) == 3
        cached("demo", {"n": 0}, compute)
        assert last_outcome() == "hit"
        cached("demo", {"n": 1}, compute)
        assert last_outcome() == "stored"  # pruned, traced again
    assert len(calls) == 5
    assert (cache_folder / "the-users-own.pickle").read_bytes() == b"not an answer"


def test_a_gpu_record_edited_or_added_gives_new_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--device BOARD`` answer is calibrated by the committed GPU records: editing one, or adding
    another, must not leave an answer from the older records in the cache."""
    records = tmp_path / "gpu"
    records.mkdir()
    (records / "board.json").write_text('{"board": "B", "when": "2026-11-26"}')
    monkeypatch.setattr(trace_cache, "_RECORDS", (records,))
    trace_cache.source_fingerprint.cache_clear()
    try:
        first = trace_cache.source_fingerprint()
        trace_cache.source_fingerprint.cache_clear()
        (records / "board.json").write_text('{"board": "B", "when": "2026-11-27"}')
        edited = trace_cache.source_fingerprint()
        trace_cache.source_fingerprint.cache_clear()
        (records / "another.json").write_text('{"board": "C", "when": "2026-11-28"}')
        added = trace_cache.source_fingerprint()
        trace_cache.source_fingerprint.cache_clear()
        (records / "notes.txt").write_text("not a record")
        assert len({first, edited, added}) == 3 and trace_cache.source_fingerprint() == added
    finally:
        trace_cache.source_fingerprint.cache_clear()


def test_the_shipped_and_committed_gpu_records_are_in_the_fingerprint() -> None:
    """The folders named are the ones resacct.account.gpu.records.recorded reads."""
    from resacct.account.gpu.records.recorded import PACKAGED_RECORDS, REPOSITORY, record_path

    assert PACKAGED_RECORDS in trace_cache._RECORDS and REPOSITORY / "docs" / "gpu" in trace_cache._RECORDS
    assert record_path("docs/gpu/x.json").parent in trace_cache._RECORDS


def test_a_lora_question_names_what_its_answer_depends_on(tmp_path: Path) -> None:
    """The shape flags (the formulas: no trace, no torch) are never cached; with --hf-config every
    size, choice and budget is in the key, and a board and --memory-gb together are refused first."""
    from resacct.cli import lora
    from resacct.cli.app import build_parser, subparsers_of
    from resacct.errors import ResacctError

    parser = build_parser()
    lora.register(subparsers_of(parser))
    assert lora._question(parser.parse_args(["lora", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128"])) is None
    config = _config(tmp_path)
    base = ["lora", "--hf-config", config, "--seq", "16"]
    question = lora._question(parser.parse_args(base))
    assert question is not None and question["config"] == TINY_LLAMA and question["targets"] is None and question["board"] is None
    others = [["--rank", "4"], ["--targets", "q_proj"], ["--base", "fp32"], ["--dropout", "0.1"], ["--batch", "2"], ["--seq", "32"],
              ["--gradient-checkpointing"], ["--trace-all-layers"], ["--device", "h100"], ["--memory-gb", "1"], ["--reserve-gb", "1"],
              ["--units", "binary"]]
    keys = {json.dumps(lora._question(parser.parse_args([*base, *flags])), sort_keys=True) for flags in others}
    assert len(keys) == len(others) and json.dumps(question, sort_keys=True) not in keys
    assert lora._question(parser.parse_args([*base, "--json"])) == question  # the same answer, printed as JSON
    assert lora._question(parser.parse_args([*base, "--hidden", "64"])) is None  # refused by the answer, never cached
    with pytest.raises(ResacctError, match="not both"):
        lora._question(parser.parse_args([*base, "--device", "h100", "--memory-gb", "1"]))


@pytest.mark.slow  # a tiny LoRA step traced three times, then read back
def test_lora_hf_config_answers_the_second_time_from_the_cache(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from resacct.account.fit import lora_batch
    from resacct.account.trace import lora_step

    argv = ["lora", "--hf-config", _config(tmp_path), "--seq", "16", "--base", "fp32", "--memory-gb", "0.002"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "trace cache" not in first.err and len(list(cache_folder.glob("hf-lora-*.pickle"))) == 1
    assert "largest batch at seq 16:" in first.out and "traced" in first.out
    assert main([*argv, "--json"]) == 0  # the same question printed as JSON: read back, not traced
    first_json = capsys.readouterr().out
    assert json.loads(first_json)["largest_batch"] > 1
    traced: list[str] = []
    with monkeypatch.context() as patched:
        def refuse(*args: object, **kwargs: object) -> None:  # the command answers an untraced step by its formulas: counted
            traced.append("traced again")
            raise AssertionError("traced again: the answer should have come from the cache")

        patched.setattr(lora_step, "trace_lora_step", refuse)
        patched.setattr(lora_batch, "largest_lora_batch", refuse)
        assert main(argv) == 0
        second = capsys.readouterr()
        assert second.out == first.out and "resacct lora: answered from the trace cache" in second.err
        assert main([*argv, "--json"]) == 0 and capsys.readouterr().out == first_json
        assert traced == []
        main([*argv, "--no-cache"])
        assert traced == ["traced again"] and "trace cache" not in capsys.readouterr().err
        patched.setenv("RESACCT_NO_CACHE", "1")
        main(argv)
        assert traced == ["traced again"] * 2
    assert main([*argv[:-1], "0.003"]) == 0  # another budget: another question, traced
    assert len(list(cache_folder.glob("hf-lora-*.pickle"))) == 2


def test_shard_hf_config_answers_the_second_time_from_the_cache(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``shard --hf-config``'s whole answer (each rank's peak, the board's CUDA peaks) is read back for the same
    question; ``--no-cache`` predicts afresh, ``--measure`` (gloo ranks run the step) and ``--model`` factories never
    cache. The prediction (child processes, seconds) is replaced by a counted stand-in: the wiring is under test."""
    from resacct.cli import shard

    answered: list[tuple[Any, ...]] = []

    def answer(args: Any, board: Any, memory_bytes: Any) -> tuple[dict[str, Any], str]:
        answered.append((args.devices, None if board is None else board.name, memory_bytes))
        return {"devices": args.devices, "board": None if board is None else board.name}, f"{args.devices} ranks\n"

    monkeypatch.setattr(shard, "_answer", answer)
    argv = ["shard", "--hf-config", _config(tmp_path), "--devices", "2", "--seq", "16", "--device", "h100"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert main(argv) == 0
    second = capsys.readouterr()
    assert first.out == second.out == "2 ranks\n" and first.err == "" and "resacct shard: answered from the trace cache" in second.err
    assert len(answered) == 1 and len(list(cache_folder.glob("hf-shard-*.pickle"))) == 1
    assert main([*argv, "--json"]) == 0 and json.loads(capsys.readouterr().out) == {"devices": 2, "board": "h100-sxm"}
    assert len(answered) == 1
    main([*argv, "--no-cache"])
    main([*argv, "--measure"])
    main([*argv, "--measure"])
    assert len(answered) == 4
    main([*argv[:4], "4", *argv[5:]])  # four ranks: another question
    assert len(answered) == 5 and len(list(cache_folder.glob("hf-shard-*.pickle"))) == 2


def test_a_shard_question_is_none_for_a_factory_and_a_measurement(tmp_path: Path) -> None:
    from resacct.cli import shard
    from resacct.cli.app import build_parser, subparsers_of
    from resacct.errors import ResacctError

    parser = build_parser()
    shard.register(subparsers_of(parser))
    factory = parser.parse_args(["shard", "--model", "resacct.account.answers.generic:mlp", "--devices", "2"])
    assert shard._question(factory, None, None) is None
    config = _config(tmp_path)
    assert shard._question(parser.parse_args(["shard", "--hf-config", config, "--measure"]), None, None) is None
    question = shard._question(parser.parse_args(["shard", "--hf-config", config, "--rank", "1", "--engine", "zero2"]), None, 8e10)
    assert question is not None and question["config"] == TINY_LLAMA and question["ranks"] == [1] and question["engine"] == "zero2"
    assert question["memory_bytes"] == 8e10 and question["layers"] == "auto"
    with pytest.raises(ResacctError, match="--loss apply to --model"):
        shard._question(parser.parse_args(["shard", "--hf-config", config, "--loss", "mse"]), None, None)


def test_infer_hf_config_answers_the_second_time_from_the_cache(cache_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``infer --hf-config``'s answer (the model built on meta, its own KV cache after a meta forward, a board's
    CUDA peaks) is read back for the same question; the shape flags never cache (the formulas, no torch). The
    build and trace are replaced by a counted stand-in: the wiring is under test (the real answer: one-off in docs/account.md)."""
    from resacct.cli import infer

    answered: list[int] = []

    def answer(args: Any) -> tuple[dict[str, Any], str]:
        answered.append(args.batch)
        return {"batch": args.batch}, f"batch {args.batch}\n"

    monkeypatch.setattr(infer, "_answer", answer)
    argv = ["infer", "--hf-config", _config(tmp_path), "--batch", "2", "--device", "h100"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert main(argv) == 0
    second = capsys.readouterr()
    assert first.out == second.out == "batch 2\n" and first.err == "" and "resacct infer: answered from the trace cache" in second.err
    assert main([*argv, "--json"]) == 0 and json.loads(capsys.readouterr().out) == {"batch": 2} and answered == [2]
    main([*argv, "--no-cache"])
    main(["infer", "--hf-config", _config(tmp_path), "--batch", "3"])
    shape = ["infer", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--mlp", "128", "--vocab", "256", "--context", "64"]
    main(shape)
    main(shape)
    assert answered == [2, 2, 3, 1, 1] and len(list(cache_folder.glob("hf-infer-*.pickle"))) == 2
    capsys.readouterr()
    assert main([*argv, "--memory-gb", "1"]) == 2  # a board and a memory: one line, exit 2, nothing answered
    assert "not both" in capsys.readouterr().err and len(answered) == 5
