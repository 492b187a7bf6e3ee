"""Ranks traced once for those holding shards of the same shapes (resacct/account/peak/rank_classes.py):
the rows each rank holds are torch.chunk's (FSDP2's ``_chunk_with_empty``), and a rank traced alone
gives exactly what its class's trace gave it — the CPU step and the CUDA allocator's peaks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resacct.account.peak.rank_classes import local_rows, representative_ranks, same_shards_note


@given(rows=st.integers(0, 5000), world_size=st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_each_rank_holds_the_rows_torch_chunk_gives_it(rows: int, world_size: int) -> None:
    chunks = [len(chunk) for chunk in torch.chunk(torch.empty(rows), world_size)] if rows else []
    chunks += [0] * (world_size - len(chunks))  # FSDP2's _chunk_with_empty: empty shards for the ranks torch.chunk leaves out
    assert [local_rows(rows, world_size, rank) for rank in range(world_size)] == chunks


def test_ranks_with_the_same_rows_share_a_trace_and_zero1_never() -> None:
    shapes = [(4096, 4096), (11008, 4096), (32000, 4096), (4096,)]  # llama-2-7b's: every dimension divides by 8
    assert representative_ranks(shapes, "fsdp2", 8, range(8)) == {rank: 0 for rank in range(8)}
    assert representative_ranks(shapes, "zero1", 8, range(8)) == {rank: rank for rank in range(8)}
    uneven = [(64, 64), (128, 64), (10,)]  # 10 rows on 3 ranks: 4, 4, 2
    assert representative_ranks(uneven, "fsdp2-bf16", 4, (0, 1, 2, 3)) == {0: 0, 1: 0, 2: 0, 3: 3}
    assert representative_ranks(uneven, "zero2", 4, (3, 2, 1)) == {3: 3, 2: 2, 1: 2}  # the first asked of a class leads it
    assert representative_ranks([(), (4,)], "fsdp2", 4, (0, 1, 2)) == {0: 0, 1: 1, 2: 1}  # a 0-dim parameter: rank 0 alone holds it
    assert same_shards_note({0: 0, 1: 0, 2: 2, 3: 0}) == ("ranks whose every parameter keeps the same rows run the same step: traced once "
                                                          "— ranks 1, 3 as rank 0 (resacct.account.peak.rank_classes)")
    assert same_shards_note({0: 0, 1: 1}) is None


_TINY = "tests.fixtures_hf_models:tiny_llama"  # 64, 128 and 32 rows on 5 ranks: 13/26/7 on ranks 0-3, 12/24/4 on rank 4


def _require_named_collectives() -> None:
    """A torch whose FSDP2 is not traced (2.6: it cannot step CPU tensors) refuses ``shard`` in one line: nothing to compare."""
    from resacct.account.peak.sharded import fsdp_gap

    if (gap := fsdp_gap()) is not None:
        pytest.skip(gap)


@pytest.mark.slow  # four child processes
def test_a_rank_traced_alone_gives_what_its_class_trace_gave() -> None:
    pytest.importorskip("transformers")
    _require_named_collectives()
    from resacct.account.answers.sharded import account_sharded_step
    from resacct.account.fit.search import ModelSource

    model = ModelSource(factory=_TINY)
    together = account_sharded_step(model, engine="fsdp2", world_size=5, batch=1, seq=16, ranks=(0, 1, 2, 3, 4))
    assert any("ranks 1, 2, 3 as rank 0" in note for note in together.notes)
    for rank in (2, 3, 4):  # each traced alone in its process
        assert account_sharded_step(model, engine="fsdp2", world_size=5, batch=1, seq=16, ranks=(rank,)).ranks[0] == together.ranks[rank]
    assert together.ranks[4].peak_bytes != together.ranks[1].peak_bytes  # the last rank's shorter shards: its own class


@pytest.mark.slow  # four child processes
def test_a_ranks_cuda_peaks_traced_alone_are_what_its_class_trace_gave() -> None:
    pytest.importorskip("transformers")
    _require_named_collectives()
    from resacct.account.fit.search import ModelSource
    from resacct.account.gpu.answers.sharded_cuda import predict_sharded_cuda_peaks
    from resacct.facts.hardware import get_accelerator

    model, board = ModelSource(factory=_TINY), get_accelerator("h100")
    together = predict_sharded_cuda_peaks(model, engine="fsdp2", world_size=5, ranks=(0, 1, 2, 3, 4), batch=1, seq=16, board=board)
    assert [answer["rank"] for answer in together] == [0, 1, 2, 3, 4]
    for rank in (2, 3, 4):  # each traced alone in its process
        assert predict_sharded_cuda_peaks(model, engine="fsdp2", world_size=5, ranks=(rank,), batch=1, seq=16, board=board)[0] == together[rank]


@pytest.mark.slow  # four child processes, each tracing HF GPT-2 (~10 s)
def test_the_rank_a_process_traces_first_gets_what_a_later_trace_gets() -> None:
    """DTensor's sharding propagation runs each op once on global-shape fake tensors, in the first step a
    process traces only (resacct/account/peak/dtensor_propagation.py): recorded, it gave HF GPT-2's rank 1
    traced first 2.74 GB reserved on an H100 and 1.68 GB traced after rank 3 (fsdp2, 4 ranks, seq 256).
    Ranks 1 and 3 hold different shards (vocabulary rows 12,565 and 12,562): rank 1 is traced second in its own class."""
    pytest.importorskip("transformers")
    _require_named_collectives()
    from resacct.account.answers.sharded import account_sharded_step
    from resacct.account.fit.search import ModelSource
    from resacct.account.gpu.answers.sharded_cuda import predict_sharded_cuda_peaks
    from resacct.facts.hardware import get_accelerator

    model, board = ModelSource(hf_config="gpt2"), get_accelerator("h100")
    first = predict_sharded_cuda_peaks(model, engine="fsdp2", world_size=4, ranks=(1,), batch=1, seq=64, board=board)[0]
    second = predict_sharded_cuda_peaks(model, engine="fsdp2", world_size=4, ranks=(3, 1), batch=1, seq=64, board=board)[1]
    assert (first["rank"], second["rank"]) == (1, 1)
    assert first == second
    first_cpu = account_sharded_step(model, engine="fsdp2", world_size=4, batch=1, seq=64, ranks=(1,)).ranks[0]
    second_cpu = next(each for each in account_sharded_step(model, engine="fsdp2", world_size=4, batch=1, seq=64, ranks=(3, 1)).ranks if each.rank == 1)
    assert first_cpu.rank == 1
    assert first_cpu == second_cpu
