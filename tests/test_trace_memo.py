"""tests/trace_memo.py: the same LoRA question is traced once in a process, a different one afresh,
and the command answers the same from memory as from a fresh trace."""

from __future__ import annotations

import json

import pytest

from tests import trace_memo
from tests.trace_memo import memoized_lora_trace  # noqa: F401  (a fixture)


class _Config:
    def __init__(self, **values: int) -> None:
        self.values = values

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps(self.values, sort_keys=True)


def test_a_question_is_traced_once_and_every_other_question_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_memo, "_TRACED", {})
    traced: list[tuple[object, dict[str, object]]] = []

    def trace(config: _Config | str, **keywords: object) -> object:
        traced.append((config if isinstance(config, str) else config.values, keywords))
        return object()

    calls: list[tuple[object, ...]] = []
    memoized = trace_memo._memoized(trace, calls)
    small, large = _Config(hidden=64), _Config(hidden=128)
    first = memoized(small, rank=16, batch=1)
    assert memoized(_Config(hidden=64), rank=16, batch=1) is first   # an equal config, the same keywords: from memory
    assert memoized(small, batch=1, rank=16) is first                # keyword order does not matter
    assert memoized(small, rank=16, batch=2) is not first            # another batch
    assert memoized(small, rank=8, batch=1) is not first             # another rank
    assert memoized(large, rank=16, batch=1) is not first            # another config
    assert memoized(small, rank=16, batch=1, gradient_checkpointing=True) is not first
    assert [values for values, _ in traced] == [{"hidden": 64}] * 3 + [{"hidden": 128}, {"hidden": 64}]
    assert len(calls) == 7 and len(set(calls)) == 5
    named = memoized("llama-3-8b", batch=8, board="h100")                # a shipped config by its name (infer's prefill)
    assert memoized("llama-3-8b", board="h100", batch=8) is named and memoized("llama-3-70b", batch=8, board="h100") is not named
    assert memoized("llama-3-8b", batch=8, board="a100") is not named
    assert [config for config, _ in traced[5:]] == ["llama-3-8b", "llama-3-70b", "llama-3-8b"]


@pytest.mark.slow  # 1.54 s idle on 2026-11-28: three LoRA traces
def test_the_lora_command_answers_the_same_from_memory(memoized_lora_trace: list, capsys: pytest.CaptureFixture[str],  # type: ignore[type-arg]
                                                       tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A tiny Llama through the real command: the second, memoized answer is the fresh one, field by field."""
    pytest.importorskip("peft")
    from resacct.cli import main

    monkeypatch.setattr(trace_memo, "_TRACED", {})
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    argv = ["lora", "--hf-config", str(path), "--rank", "4", "--batch", "2", "--seq", "16", "--memory-gb", "1", "--json"]
    assert main(argv) == 0
    fresh = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    remembered = json.loads(capsys.readouterr().out)
    assert remembered == fresh and fresh["traced"] is not None and fresh["step_peak_bytes"] > 0
    assert len(memoized_lora_trace) == 2 and len(set(memoized_lora_trace)) == 1 and len(trace_memo._TRACED) == 1
    assert main([*argv[:-1], "--batch", "3", "--json"]) == 0                         # another batch: traced afresh
    assert json.loads(capsys.readouterr().out)["step_peak_bytes"] > fresh["step_peak_bytes"] and len(trace_memo._TRACED) == 2
