"""``resacct shard`` on a deep stack of identical layers: under an FSDP engine each rank's step is traced
at depths 3, 4 and 5 and extrapolated (resacct.account.peak.sharded_layers), and equals each rank with
every layer traced — the peak, its phase, op and module, what is live at it, each phase's peak; ZeRO-1
and a step that does not repeat are traced whole, and the answer says why."""

from __future__ import annotations

import json

import pytest

from resacct.account.answers.sharded import account_sharded_step
from resacct.account.fit.search import ModelSource
from resacct.cli import main
from tests.sharded_engines import assert_sampled_or_said_why, needs_every_sharded_engine

pytest.importorskip("transformers")

#: a 7-layer Llama (d 64, 4 query and 2 key/value heads)
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 160, "max_position_embeddings": 128, "num_hidden_layers": 7}


def _ranks(account) -> list[dict]:  # type: ignore[no-untyped-def]
    return [vars(rank) for rank in account.ranks]


@pytest.mark.slow  # the step at 3 depths (+ one warm-up) and whole, per rank, in child processes: 5-15 s loaded each
@needs_every_sharded_engine
@pytest.mark.parametrize("engine, world_size", [("fsdp2", 2), ("fsdp2", 4), ("fsdp2-bf16", 2)])
def test_each_rank_from_three_depths_equals_every_layer_traced(tmp_path, engine: str, world_size: int) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    sampled = account_sharded_step(ModelSource(hf_config=str(path), layers="sampled"), engine=engine, world_size=world_size, batch=2, seq=16)
    whole = account_sharded_step(ModelSource(hf_config=str(path), layers="all"), engine=engine, world_size=world_size, batch=2, seq=16)
    assert_sampled_or_said_why(sampled.notes, "its 7 layers are one layer repeated: each rank's step traced at depths 3, 4, 5", 7)
    assert not any("layers" in note for note in whole.notes)
    assert _ranks(sampled) == _ranks(whole) and len(sampled.ranks) == world_size


@pytest.mark.slow  # the step at 3 depths and whole, per rank
@needs_every_sharded_engine
@pytest.mark.parametrize("model_type, layers, said", [
    # DeepSeek-V3's first dense layers (2 of 9 here) stay in every sampled depth
    ("deepseek_v3", 9, "its 9 layers are 2 built apart, then one layer repeated: each rank's step traced at depths 5, 6, 7"),
    # Gemma-2's sliding and full layers alternate: 3, 4 and 5 units of two layers
    ("gemma2", 12, "its 12 layers are a unit of 2 layers repeated: each rank's step traced at depths 6, 8, 10"),
])
def test_a_prefix_or_a_unit_of_layers_is_sampled_and_equals_every_layer_traced(tmp_path, model_type: str, layers: int, said: str) -> None:  # type: ignore[no-untyped-def]
    from tests.test_repeated_layers import TINY

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY[model_type], "num_hidden_layers": layers}))
    sampled = account_sharded_step(ModelSource(hf_config=str(path), layers="sampled"), engine="fsdp2", world_size=2, batch=1, seq=16)
    whole = account_sharded_step(ModelSource(hf_config=str(path), layers="all"), engine="fsdp2", world_size=2, batch=1, seq=16)
    assert_sampled_or_said_why(sampled.notes, said, layers)
    assert _ranks(sampled) == _ranks(whole) and len(sampled.ranks) == 2


@pytest.mark.slow  # ZeRO-1 whole, one child
@needs_every_sharded_engine
def test_zero1_is_traced_whole_and_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    account = account_sharded_step(ModelSource(hf_config=str(path), layers="sampled"), engine="zero1", world_size=2, batch=2, seq=16)
    assert any(note.startswith("all 7 layers traced: zero1 hands out whole parameters") for note in account.notes)


def test_trace_all_layers_without_a_config_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shard", "--model", "resacct.account.answers.generic:mlp", "--trace-all-layers"]) == 2
    err = capsys.readouterr().err
    assert "--trace-all-layers applies to --hf-config" in err and err.count("\n") == 1


def test_the_shallow_copies_are_built_when_first_asked_for_and_not_under_zero1(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ZeRO-1 is traced whole: its answer builds none of the three copies (they are built on first use)."""
    from resacct.account.load.hf_models import HfConfigSpec
    from resacct.account.fit.sampled_layers import shallow_copies
    from resacct.account.peak.layer_segments import NotRepeating
    from resacct.account.peak.sharded_layers import sampled_rank_summaries

    copies = shallow_copies(HfConfigSpec(name="tiny llama", source="test", values=dict(TINY_LLAMA)), "sampled")
    assert copies is not None and copies.depth == 7 and copies._models is None
    with pytest.raises(NotRepeating, match="zero1 hands out whole parameters"):
        sampled_rank_summaries(copies, lambda batch, seq: None, None, "zero1", 2, (0, 1), 2, 16)
    assert copies._models is None
    assert [model.config.num_hidden_layers for model in copies.models] == [3, 4, 5]
    assert all(model.training for model in copies.models) and copies.models is copies.models  # built once
