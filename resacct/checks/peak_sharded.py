"""Checks of the sharded step peak: each rank's peak of one steady AdamW step under ZeRO-1 (DDP +
``ZeroRedundancyOptimizer``) and ZeRO-3 (FSDP2 ``fully_shard``) — predicted by resacct on fake
tensors under torch's fake process group (:mod:`resacct.account.peak.sharded`), measured on real
gloo ranks by the CPU allocator (``torch.profiler``, ``profile_memory=True``) and, for what is live
at the peak, by the same tracker over the real tensors (the census) — against the ZeRO paper's
per-rank state (:mod:`resacct.formulas.sharding`).

One child process (the fake process group) predicts every engine and rank while one gloo launch per
world size measures them, beside it; both are cached, so the claims of a world size share them.

Each gloo rank keeps the first *complete* record, every rank in step (they share collectives):

- allocator: a steady step ends holding what it started with. A gloo worker thread sometimes
  drops the last reference to a collective's buffer after the caller has (it releases its work
  after marking it done); that free happens outside the profiler's thread-local state and is never
  recorded, so the record would keep the buffer to its end (``lost_free_bytes``);
- census: no storage freed on another thread during the step — over real tensors such a free
  waits for the gloo worker to get the GIL, so the census would count it late (``late_free_bytes``).

``attempts`` says how many records it took, ``lost_free_bytes`` / ``late_free_bytes`` the most
that an incomplete one was off.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from resacct.account.peak.sharded_measure import MAX_ATTEMPTS, allocator_summary, first_complete
from resacct.account.answers.sharded import ENGINE_RECIPES, ENGINE_STAGES
from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.distributed import preload_in_ranks
from resacct.measurement.memo import shared_measurement
from resacct.measurement.rank_jobs import PlannedLaunch, plans_rank_jobs, shared_rank_launch, shared_started_isolated

preload_in_ranks(__name__, "resacct.account.peak.sharded", "resacct.account.peak.models",  # what the ranks and the prediction's child run,
                 "resacct.account.answers.generic", "resacct.measurement.native_stderr")  # and import when they run (the mlp's factory, the census)

__all__ = ["ENGINE_STAGES", "ENGINE_RECIPES", "BREAKDOWN_KINDS", "MAX_ATTEMPTS", "measured_on_rank", "sharded_peak_measurements"]

#: The kinds a breakdown claim lists, in order (a tuple of kinds is summed).
BREAKDOWN_KINDS = {
    "zero1": (("parameters",), ("gradient buckets (DDP)",), ("optimizer state shard",)),
    "fsdp2": (("parameter shards",), ("optimizer state shard",), ("all-gather buffers", "all-gathered parameters")),
}
BREAKDOWN_KINDS["zero2"] = BREAKDOWN_KINDS["fsdp2-bf16"] = BREAKDOWN_KINDS["fsdp2"]
assert set(BREAKDOWN_KINDS) == set(ENGINE_STAGES) == set(ENGINE_RECIPES)
#: The engines one launch measures, per world size: every engine on 2 ranks; on 4, the engines of the
#: 4-rank claims (ZeRO-1's whole-tensor shards, FSDP2's even rows) — each engine more costs a launch seconds.
LAUNCH_ENGINES = {2: tuple(ENGINE_STAGES), 4: ("zero1", "fsdp2")}
#: The engines whose census (what is live at the peak, :func:`peak_breakdown`) one launch takes, per world size:
#: the breakdown claims' (2 ranks). Elsewhere the step peak claims read the engine's state only, which a step
#: without the tracker gives (the same storages: the tracker only names them). A breakdown claim adds its engine.
LAUNCH_CENSUS = {2: tuple(ENGINE_STAGES), 4: ()}
_LAUNCH_TIMEOUT_SECONDS = 180.0


# --- what each gloo rank runs -------------------------------------------------------------


def _engine_state(wrapped: Any, optimizer: Any, work: Any, work_inputs: Any, loss_fn: Any, model: Any) -> dict[str, int]:
    """The storages of the engine's own state on this rank after one more forward and backward:
    parameters, gradients (DDP's bucket, FSDP's shards), optimizer state; and, counted on the
    unsharded model, the largest FSDP unit's full parameters and the whole model's."""
    from resacct.account.peak.sharded import fsdp_units, local_optimizer_state, local_tensor
    from resacct.measurement.memory import distinct_storage_bytes

    loss_fn(wrapped, work_inputs).backward()
    parameters = list(work.parameters())
    return {"parameter_bytes": distinct_storage_bytes([local_tensor(p) for p in parameters]),
            "gradient_bytes": distinct_storage_bytes([local_tensor(p.grad) for p in parameters if p.grad is not None]),
            "optimizer_state_bytes": distinct_storage_bytes(local_optimizer_state(optimizer)),
            "largest_unit_bytes": max(distinct_storage_bytes(list(unit.parameters())) for unit in fsdp_units(model)),
            "model_parameter_bytes": distinct_storage_bytes(list(model.parameters()))}


def _census(engine: str, model: Any, inputs: Any, loss_fn: Any, world_size: int, mesh: Any) -> tuple[Any, int]:
    """What the tracker over the real tensors finds (the peak and what is live at it), the engine's
    state, and the bytes freed on another thread."""
    from resacct.account.peak.sharded import ShardedStorageTracker, sharded_step, step_copies, step_summary
    from resacct.measurement.memory_timeline import gc_paused

    tracker = ShardedStorageTracker()
    with gc_paused():
        work, work_inputs = step_copies(model, inputs, fake=False)
        with tracker:
            wrapped, optimizer = sharded_step(engine, work, work_inputs, loss_fn, world_size, tracker, mesh, fake=False)
        summary, late = step_summary(tracker), tracker.bytes_freed_elsewhere  # during the step (the state's backward frees more)
        state = _engine_state(wrapped, optimizer, work, work_inputs, loss_fn, model)
    return (summary, state), late


def _state(engine: str, model: Any, inputs: Any, loss_fn: Any, world_size: int, mesh: Any) -> dict[str, int]:
    """The engine's state (:func:`_engine_state`) after one step without the tracker (no census)."""
    from resacct.account.peak.sharded import sharded_step, step_copies
    from resacct.measurement.memory_timeline import gc_paused

    with gc_paused():
        work, work_inputs = step_copies(model, inputs, fake=False)
        wrapped, optimizer = sharded_step(engine, work, work_inputs, loss_fn, world_size, None, mesh, fake=False, mark=lambda phase: None)
        return _engine_state(wrapped, optimizer, work, work_inputs, loss_fn, model)


def measured_on_rank(rank: int, world_size: int, engines: tuple[str, ...], model_name: str, batch: int, seq: int,
                     census: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What each gloo rank runs (:func:`resacct.measurement.distributed.run_on_ranks`), per engine:
    the allocator's first complete record and the engine's state, with the census's for the engines of
    ``census`` (default: every engine)."""
    from resacct.account.peak.sharded import build_peak_model, engine_mesh

    model, inputs, loss_fn = build_peak_model(model_name, batch, seq)
    report = {}
    for engine in engines:
        allocator = allocator_summary(engine, model, inputs, loss_fn, world_size)
        mesh = engine_mesh(engine, world_size)
        if census is not None and engine not in census:
            report[engine] = {"allocator": allocator, "state": _state(engine, model, inputs, loss_fn, world_size, mesh)}
            continue
        (summary, state), census_attempts, late = first_complete(lambda: _census(engine, model, inputs, loss_fn, world_size, mesh),
                                                                 f"census of the {engine} step")
        report[engine] = {"allocator": allocator, "census": {**summary, "attempts": census_attempts, "late_free_bytes": late}, "state": state}
    return report


# --- launches, cached -----------------------------------------------------------------------


def _require_engines(engines: tuple[str, ...]) -> None:
    """Skip (never fake) where this torch lacks what runs here: FSDP2, ZeRO, the fake process
    group, and what tracing each of ``engines`` needs (:func:`~resacct.account.peak.sharded.engine_gap`: torch 2.6's FSDP2
    cannot step CPU tensors and its DDP has no ``init_sync``)."""
    from resacct.account.peak.sharded_gaps import engine_gap

    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except ImportError as error:
        raise NotMeasurable(f"torch {torch.__version__} lacks what the sharded step peak runs (FSDP2, ZeRO, the fake process group): {error}") from None
    for engine in engines:
        if (gap := engine_gap(engine)) is not None:
            raise NotMeasurable(gap)


def sharded_peak_measurements(world_size: int, model: str, batch: int, seq: int, engines: tuple[str, ...] = tuple(ENGINE_STAGES),
                              census: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Per engine of ``engines``: ``predicted`` (per rank, from the fake process group) and
    ``measured`` (per gloo rank; its ``census`` for the engines of ``census``, default those of
    :data:`LAUNCH_CENSUS`). One child process and one gloo launch serve them all (cached)."""
    unknown = [engine for engine in (*engines, *(census or ())) if engine not in ENGINE_STAGES]
    if unknown or not engines:
        given = f"engines {list(engines)}" + ("" if census is None else f", census {list(census)}")
        raise ResacctError(f"{given}: expected some of {', '.join(ENGINE_STAGES)}")
    wanted = LAUNCH_CENSUS.get(world_size, tuple(ENGINE_STAGES)) if census is None else census
    engines = tuple(engine for engine in ENGINE_STAGES if engine in engines)
    return _launched(world_size, model, batch, seq, engines, tuple(engine for engine in engines if engine in wanted))


def _launch_census(engine: str, world_size: int, census: bool) -> tuple[str, ...]:
    """The engines whose census the launch that measures ``engine`` takes (:data:`LAUNCH_CENSUS`, and ``engine`` when ``census``)."""
    engines, wanted = _launch_engines(engine, world_size), LAUNCH_CENSUS.get(world_size, tuple(ENGINE_STAGES))
    return tuple(name for name in engines if name in wanted or (census and name == engine))


def _launch_engines(engine: str, world_size: int) -> tuple[str, ...]:
    """The engines the launch that measures ``engine`` on ``world_size`` ranks runs (:data:`LAUNCH_ENGINES`, and ``engine``)."""
    if engine not in ENGINE_STAGES:
        raise ResacctError(f"engine {engine!r}: expected one of {', '.join(ENGINE_STAGES)}")
    from resacct.account.peak.sharded_gaps import engine_gap

    # the engines this torch traces (every one from torch 2.7, none on 2.6: sharded_gaps); the one asked for stays
    engines = tuple(name for name in LAUNCH_ENGINES.get(world_size, tuple(ENGINE_STAGES)) if engine_gap(name) is None)
    wanted = engines if engine in engines else (*engines, engine)
    return tuple(name for name in ENGINE_STAGES if name in wanted)


@shared_measurement(switchable=False)  # one child and one launch per world size and step, whatever RESACCT_MEMO says
def _launched(world_size: int, model: str, batch: int, seq: int, engines: tuple[str, ...], census: tuple[str, ...]) -> dict[str, Any]:
    from resacct.account.peak.sharded import predict_sharded_step_peaks_in_process
    from resacct.measurement.distributed import DistributedUnavailableError

    _require_engines(engines)
    try:  # the prediction's child runs beside the ranks that measure (on 2 cores, the third process fills their waits)
        with shared_started_isolated(predict_sharded_step_peaks_in_process, engines, model, batch, seq, world_size, tuple(range(world_size)),
                                     census, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS) as prediction:
            ranks = shared_rank_launch(measured_on_rank, world_size, engines, model, batch, seq, census, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS)
            predicted = prediction()
    except DistributedUnavailableError as error:
        raise NotMeasurable(str(error)) from None
    return {engine: {"predicted": predicted[engine], "measured": [rank[engine] for rank in ranks]} for engine in engines}


def _planned_launch(census: bool, engine: str, world_size: int, model: str, batch: int, seq: int = 1, **_: Any) -> list[PlannedLaunch]:
    """The gloo launch a claim asks :func:`_launched` for (``census``: a breakdown claim's) and its prediction's
    child (none where this torch lacks its engines)."""
    from resacct.account.peak.sharded import predict_sharded_step_peaks_in_process

    engines, census_engines = _launch_engines(engine, world_size), _launch_census(engine, world_size, census)
    try:
        _require_engines(engines)
    except NotMeasurable:
        return []
    return [PlannedLaunch(world_size, measured_on_rank, (engines, model, batch, seq, census_engines), _LAUNCH_TIMEOUT_SECONDS),
            PlannedLaunch(world_size, predict_sharded_step_peaks_in_process, (engines, model, batch, seq, world_size, tuple(range(world_size)),
                                                                              census_engines), _LAUNCH_TIMEOUT_SECONDS, isolated=True)]


plans_rank_jobs("peak_sharded.step_peak_per_rank")(functools.partial(_planned_launch, False))
plans_rank_jobs("peak_sharded.peak_breakdown")(functools.partial(_planned_launch, True))


def _sides(engine: str, world_size: int, model: str, batch: int, seq: int, census: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    runs = sharded_peak_measurements(world_size, model, batch, seq, _launch_engines(engine, world_size), _launch_census(engine, world_size, census))[engine]
    return runs["predicted"], runs["measured"]


def _breakdown_text(bytes_by_kind: dict[str, int]) -> str:
    return "; ".join(f"{kind} {value:,d}" for kind, value in sorted(bytes_by_kind.items(), key=lambda item: -item[1]) if value)


# --- checks ---------------------------------------------------------------------------------


@check("peak_sharded.step_peak_per_rank", evidence="measured",
       quantities=("params", "formula_state_bytes", "state_bytes", "excess_bytes", "peak_phase", "breakdown", "attempts"))
def step_peak_per_rank(engine: str, world_size: int, model: str, batch: int, seq: int = 1) -> Outcome:
    """Each gloo rank's CPU-allocator peak over one steady AdamW step of ``engine`` (``zero1``: DDP +
    ZeroRedundancyOptimizer; ``fsdp2``: fully_shard), ``batch`` × ``seq`` per rank, a list in rank
    order; predicted: resacct on fake tensors under the fake process group, per rank.
    ``formula_state_bytes``: the ZeRO paper's per-rank AdamW state (resacct.formulas.sharding;
    :data:`ENGINE_RECIPES`: fp32, or mixed precision for ``fsdp2-bf16``);
    ``state_bytes``, ``excess_bytes``, ``peak_phase``, ``breakdown`` (resacct's, at the predicted
    peak): rank 0's; ``attempts``: the most records a rank took to get a complete one."""
    from resacct.account.peak.sharded import build_peak_model
    from resacct.formulas.sharding import per_rank_bytes

    predicted, measured = _sides(engine, world_size, model, batch, seq, census=False)
    net = build_peak_model(model, batch, seq)[0]
    params = sum(parameter.numel() for parameter in net.parameters())
    formula = per_rank_bytes(params, ENGINE_RECIPES[engine], ENGINE_STAGES[engine], world_size).total_bytes
    state = measured[0]["state"]
    return Outcome(
        measured=[rank["allocator"]["peak_bytes"] for rank in measured],
        predicted=[rank["allocator"]["peak_bytes"] for rank in predicted],
        quantities={"params": params, "formula_state_bytes": formula,
                    "state_bytes": state["parameter_bytes"] + state["gradient_bytes"] + state["optimizer_state_bytes"],
                    "excess_bytes": measured[0]["allocator"]["peak_bytes"] - formula, "peak_phase": measured[0]["allocator"]["phase"],
                    "predicted_peak_phase": predicted[0]["allocator"]["phase"], "breakdown": _breakdown_text(predicted[0]["allocator"]["bytes_by_kind"]),
                    "attempts": max(rank["allocator"]["attempts"] for rank in measured),
                    "lost_free_bytes": max(rank["allocator"]["lost_free_bytes"] for rank in measured)},
    )


@check("peak_sharded.peak_breakdown", evidence="measured",
       quantities=("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "largest_unit_bytes", "model_parameter_bytes", "peak_bytes",
                   "rest_bytes", "peak_phase", "rest"))
def peak_breakdown(engine: str, world_size: int, model: str, batch: int, rank: int, seq: int = 1) -> Outcome:
    """What is live at the peak of one steady AdamW step of ``engine`` on gloo rank ``rank``: the
    bytes of each kind of :data:`BREAKDOWN_KINDS` in order, found by resacct's tracker over the real
    tensors (the census); predicted: the same tracker on fake tensors under the fake process group.
    The quantities are the engine's own storages on that rank (parameters, gradients, optimizer
    state), the largest FSDP unit's and the whole model's full parameters, the census peak and what
    the listed kinds leave."""
    predicted, measured = _sides(engine, world_size, model, batch, seq, census=True)
    if not 0 <= rank < world_size:
        raise ResacctError(f"rank {rank}: expected 0 to {world_size - 1}")

    def listed(summary: dict[str, Any]) -> list[int]:
        return [sum(summary["bytes_by_kind"].get(kind, 0) for kind in kinds) for kinds in BREAKDOWN_KINDS[engine]]

    census = measured[rank]["census"]
    return Outcome(measured=listed(census), predicted=listed(predicted[rank]["census"]),
                   quantities={**measured[rank]["state"], "peak_bytes": census["peak_bytes"], "rest_bytes": census["peak_bytes"] - sum(listed(census)),
                               "peak_phase": census["phase"], "rest": _breakdown_text({kind: value for kind, value in census["bytes_by_kind"].items()
                                                                                      if not any(kind in kinds for kinds in BREAKDOWN_KINDS[engine])})})
