"""Real gloo process groups: the launcher never hangs, and the engines hold what resacct predicts.

Each launch runs in child processes (this pytest process never joins a process group); the
measurements are cached per world size and shared with ``specs/sharding.claims.yaml``.
"""

from __future__ import annotations

import math
import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

from resacct.checks.sharding import (
    PAPER_TENSOR_COUNT,
    PAPER_TENSOR_SHAPE,
    paper_scale_measurements,
    small_scale_measurements,
)
from resacct.checks.sharding_runs import (
    FSDP2_PIECES,
    LAUNCH_PARTS,
    MODEL_KINDS,
    PAPER_SCALE_CONFIGURATIONS,
    PIECES,
    TRAINING_STEPS,
    fsdp2_cpu_gap,
    launch_parts,
    paper_scale_configurations,
    paper_scale_state_on_fake_ranks,
    sharded_training_on_rank,
)
from resacct.measurement.distributed import (
    DistributedError,
    DistributedRankError,
    DistributedTimeoutError,
    all_reduce_rank_sum,
    raise_on_rank,
    run_isolated,
    run_on_ranks,
    sleep_on_rank,
)
from resacct.errors import ResacctError
from resacct.formulas.sharding import adam_state_bytes, fsdp_padded_shard_numel, fsdp_shard_rows, zero_redundancy_partition

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # spawns gloo ranks: the slow tier


def _no_children_left() -> bool:
    return not [child for child in multiprocessing.active_children() if child.name.startswith("resacct-rank-")]


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_on_local_gloo_ranks(world_size):
    assert run_on_ranks(all_reduce_rank_sum, world_size) == [float(sum(range(world_size)))] * world_size
    assert _no_children_left()


def test_process_group_teardown_never_deadlocks():
    """Before torch 2.8, destroying a gloo group held the GIL while joining its worker threads, and
    one rank of a 4-rank all-reduce hung in teardown in 11 of 40 launches on torch 2.4.1
    (resacct.measurement.distributed_group._cpu_backends_of_every_group). 12 launches with the old teardown would
    all pass with probability about 0.72 ** 12 ≈ 2 %; each is killed after 20 s, not 60."""
    for launch in range(12):
        assert run_on_ranks(all_reduce_rank_sum, 4, timeout_seconds=20) == [6.0] * 4, f"launch {launch}"
    assert _no_children_left()


def test_a_failing_rank_is_reported_at_once_and_the_others_are_killed():
    started = time.monotonic()
    with pytest.raises(DistributedRankError, match=r"rank 2 raised ValueError: rank 2 fails on purpose"):
        run_on_ranks(raise_on_rank, 4, 2, timeout_seconds=30, collective_timeout_seconds=30)
    assert time.monotonic() - started < 15, "the launcher waited for the collective timeout instead of killing"
    assert _no_children_left()


@pytest.mark.slow
def test_a_collective_times_out():
    """Rank 1 sleeps; rank 0 waits in a barrier that times out after 1 s."""
    started = time.monotonic()
    with pytest.raises(DistributedRankError, match="rank 0 raised"):
        run_on_ranks(sleep_on_rank, 2, 1, 60.0, timeout_seconds=30, collective_timeout_seconds=1)
    assert time.monotonic() - started < 15
    assert _no_children_left()


@pytest.mark.slow
def test_the_launcher_kills_ranks_that_overrun():
    started = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match=r"ranks \[0, 1\] did not finish within 1 s; they were killed"):
        run_on_ranks(sleep_on_rank, 2, 1, 60.0, timeout_seconds=1, collective_timeout_seconds=60)
    assert time.monotonic() - started < 15
    assert _no_children_left()


def test_run_isolated_returns_the_result_and_reports_errors():
    assert run_isolated(math.factorial, 5) == 120
    with pytest.raises(DistributedRankError, match="ValueError"):
        run_isolated(math.factorial, -1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"world_size": 0}, "world_size 0: expected a whole number from 1 to 16"),
        ({"world_size": 17}, "world_size 17"),
        ({"world_size": 2, "timeout_seconds": float("nan")}, "timeout_seconds nan"),
        ({"world_size": 2, "collective_timeout_seconds": -1}, "collective_timeout_seconds -1"),
    ],
)
def test_bad_launch_arguments(kwargs, fragment):
    world_size = kwargs.pop("world_size")
    with pytest.raises(DistributedError, match=fragment):
        run_on_ranks(all_reduce_rank_sum, world_size, **kwargs)


# --- what the engines hold, against resacct's exact predictions -------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_partition_and_state_are_predicted_exactly(world_size):
    measurement = small_scale_measurements(world_size, "uneven", {"zero1": 1})
    numels = [math.prod(shape) for shape in measurement["shapes"]]
    predicted = zero_redundancy_partition(numels, world_size)
    for rank, report in enumerate(measurement["ranks"]):
        assert sorted(report["zero1"]["owned_parameter_indices"]) == sorted(predicted[rank])
        assert report["zero1"]["optimizer_state_bytes"] == adam_state_bytes([numels[i] for i in predicted[rank]])
        assert report["zero1"]["parameters_bytes"] == report["zero1"]["gradients_bytes"] == 4 * sum(numels)


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_shards_and_padding_are_predicted_exactly(world_size):
    measurement = small_scale_measurements(world_size, "uneven", {"fsdp2": 1})
    shapes = measurement["shapes"]
    padded = sum(fsdp_padded_shard_numel(shape, world_size) for shape in shapes)
    for rank, report in enumerate(measurement["ranks"]):
        local = [fsdp_shard_rows(shape[0], world_size)[rank] * math.prod(shape[1:]) for shape in shapes]
        assert report["fsdp2"]["local_parameter_numels"] == local
        assert report["fsdp2"]["parameters_bytes"] == report["fsdp2"]["gradients_bytes"] == 4 * padded
        assert report["fsdp2"]["optimizer_state_bytes"] == adam_state_bytes(local)


_TORCH_MINOR = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


# Before 2.6 there is no public FSDP2: small_scale_measurements raises NotMeasurable and says so.
@pytest.mark.skipif((2, 6) <= _TORCH_MINOR < (2, 13),
                    reason=f"torch {torch.__version__}: gloo's reduce_scatter_tensor sums where FSDP2 asks for ReduceOp.AVG "
                           "(seen on 2.8: FSDP2 gradients are world_size times the single-process ones, so parameters end "
                           "1.2e-3 away after 3 steps); averaged correctly on 2.13")
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kind", ["balanced", "uneven"])
def test_sharded_training_matches_one_process(world_size, kind):
    # Adam divides by √v, so reduction-order noise in tiny gradients can move a parameter by
    # a few 1e-6 at lr 1e-2 (seen on the 8-layer model); real divergence would be ~lr.
    for report in small_scale_measurements(world_size, kind, {"zero1": TRAINING_STEPS, "fsdp2": TRAINING_STEPS})["ranks"]:
        assert report["zero1"]["training_steps"] == report["fsdp2"]["training_steps"] == TRAINING_STEPS
        assert report["zero1"]["max_abs_difference"] < 1e-4
        assert report["fsdp2"]["max_abs_difference"] < 1e-4


@pytest.mark.parametrize("world_size", [2, 4])
def test_stage_3_parameters_are_freed_after_forward_and_stage_2_style_keeps_them(world_size):
    measurement = small_scale_measurements(world_size, "balanced", {"after_forward": 0, "fsdp2": 1})
    parameters = sum(math.prod(shape) for shape in measurement["shapes"])
    for report in measurement["ranks"]:
        assert report["parameters_bytes_after_forward_kept"] == 4 * parameters
        assert report["parameters_bytes_after_forward_resharded"] == 4 * parameters // world_size


def test_the_state_after_one_step_is_the_state_after_every_step():
    """LAUNCH_PARTS measures the state claims' engines one step: what each rank holds is allocated by the
    first step and held, byte for byte, after TRAINING_STEPS (measured here, both after the one and the three)."""
    engines = ("zero1",) if fsdp2_cpu_gap() else ("zero1", "fsdp2", "fsdp2_bf16")  # torch 2.6's FSDP2 cannot train CPU tensors
    parts = tuple(("balanced", engine, steps) for engine in engines for steps in (1, TRAINING_STEPS))
    pieces = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "local_parameter_numels", "owned_parameter_indices", "dtypes")
    for results in run_on_ranks(sharded_training_on_rank, 2, parts, timeout_seconds=90):
        for one, every in zip(results[::2], results[1::2]):
            assert (one.get("training_steps"), every.get("training_steps")) in ((1, TRAINING_STEPS), (None, None))  # None: bf16 unavailable
            assert {key: one[key] for key in pieces if key in one} == {key: every[key] for key in pieces if key in every}
            assert "parameters_bytes" in one or "unavailable" in one


def test_a_piece_not_in_the_launch_is_added_to_it():
    def launched(parts: tuple) -> tuple:  # where FSDP2 cannot train CPU tensors (torch 2.6), its pieces leave the launch
        return tuple(part for part in parts if not (fsdp2_cpu_gap() and part[1] in FSDP2_PIECES))

    assert launch_parts(4) == launched(LAUNCH_PARTS[4])
    assert launch_parts(4, "uneven", {"zero1": 1, "fsdp2": TRAINING_STEPS}) == launched(LAUNCH_PARTS[4]), "served by the 3-step parts"
    assert launch_parts(2, "balanced", {"zero1": TRAINING_STEPS})[-1] == ("balanced", "zero1", TRAINING_STEPS)
    assert launch_parts(3) == launched(tuple((kind, piece, 0 if piece == "after_forward" else TRAINING_STEPS) for kind in MODEL_KINDS for piece in PIECES))
    with pytest.raises(ResacctError, match=r"part \('balanced', 'zero3', 1\): expected"):
        launch_parts(2, "balanced", {"zero3": 1})


def test_the_paper_scale_child_measures_the_stages_the_claims_read():
    """On one rank the claims read stage 0 (the state per parameter): the child measures only that there;
    a stage no configuration reads gets its own child, every stage."""
    assert paper_scale_configurations(1, "fp32-adamw", (0,)) == PAPER_SCALE_CONFIGURATIONS
    assert paper_scale_configurations(8, "fp32-adamw", (2,)) == PAPER_SCALE_CONFIGURATIONS
    assert paper_scale_configurations(1, "fp32-adamw", (2,)) == ((1, "fp32-adamw", (0, 1, 2, 3)),)
    with pytest.raises(ResacctError, match=r"stages \(4,\): expected ZeRO stages among \(0, 1, 2, 3\)"):
        paper_scale_configurations(8, "fp32-adamw", (4,))
    try:
        alone, every = run_isolated(paper_scale_state_on_fake_ranks, ((1, 0, "mixed-adam", (0,)), (1, 0, "mixed-adam", (0, 1, 2, 3))), timeout_seconds=90)
    except DistributedRankError as error:
        if "with Meta tensors" not in str(error):
            raise
        pytest.skip(f"torch {torch.__version__}'s fake process group cannot run collectives on meta tensors (the claims skip alike)")
    assert list(alone) == [0] and alone[0] == every[0] and sorted(every) == [0, 1, 2, 3]


def test_the_broadcast_stood_in_for_gives_torchs_own_figures():
    """torch <= 2.10 cannot dispatch a meta broadcast under the fake group (ZeroRedundancyOptimizer's step makes one): the
    stand-in returns as the fake group does. Where torch runs it (2.11 on), both paths give the same bytes at every stage;
    where it cannot, torch's path fails with that error and the stand-in's figures are the paper's state all the same."""
    runs = ((8, 0, "fp32-adamw", (0, 1, 2, 3)), (64, 63, "mixed-adam", (1, 2)))
    stood_in = run_isolated(paper_scale_state_on_fake_ranks, runs, True, timeout_seconds=120)
    params = PAPER_TENSOR_COUNT * math.prod(PAPER_TENSOR_SHAPE)
    assert stood_in[0][0] == [4 * params, 4 * params, 8 * params + 4 * PAPER_TENSOR_COUNT]  # fp32 AdamW: 16 bytes a parameter, unsharded
    assert stood_in[0][1][2] == 8 * params // 8 + 4 * PAPER_TENSOR_COUNT // 8  # ZeRO-1 on 8 ranks: rank 0's 8 whole tensors' moments and steps
    try:
        torchs = run_isolated(paper_scale_state_on_fake_ranks, runs, timeout_seconds=120)
    except DistributedRankError as error:
        assert "c10d::broadcast_" in str(error) and "with Meta tensors" in str(error)
        assert torch.__version__ < (2, 11)
        return
    assert torchs == stood_in


def test_paper_scale_stage_3_is_fsdp_padding_exactly():
    params = PAPER_TENSOR_COUNT * math.prod(PAPER_TENSOR_SHAPE)
    stage = paper_scale_measurements(64, "mixed-adam")
    padded = PAPER_TENSOR_COUNT * fsdp_padded_shard_numel(PAPER_TENSOR_SHAPE, 64)
    assert stage[0] == [2 * params, 2 * params, 12 * params + 4 * PAPER_TENSOR_COUNT]
    assert stage[3][:2] == [2 * padded, 2 * padded]
    assert stage[1][2] == stage[2][2] == 12 * params // 64 + 4  # one whole tensor per rank, plus its step


def test_this_process_never_joined_a_process_group():
    assert not (dist.is_available() and dist.is_initialized())


def _sharding_claims():
    from pathlib import Path

    from resacct.harness.loader import load_claims_file

    path = Path(__file__).resolve().parents[1] / "resacct" / "specs" / "sharding.claims.yaml"
    return load_claims_file(path, display_path="specs/sharding.claims.yaml").claims


@pytest.mark.parametrize("claim", _sharding_claims(), ids=lambda claim: claim.id)
def test_every_sharding_claim_fails_when_its_statement_is_changed(claim):
    """The harness's mutation test skips distributed claims; the cached measurements make it cheap here."""
    from resacct.harness.evaluate import ClaimFailure, evaluate_claim
    from tests.harness.test_real_claims_can_fail import mutated, skip_unless_for_this_torch

    skip_unless_for_this_torch(claim)
    inputs = dict(claim.claim.given)
    if claim.claim.status == "refuted":
        evaluate_claim(claim, inputs)  # the statement is false, and the claim says so
        return
    evaluate_claim(claim, inputs)
    with pytest.raises(ClaimFailure):
        evaluate_claim(mutated(claim), inputs)
