"""Will it fit on each rank (``resacct shard``): the peak of one training step on the ranks of a
ZeRO-1, ZeRO-2 or ZeRO-3 (FSDP2) run of any model resacct accounts — a shipped or given Hugging
Face config, or a ``module:factory`` — predicted before it runs.

The engine itself (:mod:`resacct.account.peak.sharded`) runs on fake tensors of the model built on
the meta device, under torch's fake process group, one rank after another in a child process (a
process group is never created here); gloo's buffers are modelled as the per-rank claims verify
(``resacct/specs/peak_sharded.claims.yaml``: exact to the byte on 2 and 4 gloo ranks). The answer
holds each rank's peak, when it occurs and what is live at it, beside the ZeRO paper's per-rank state
(:mod:`resacct.formulas.sharding`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from resacct.account.fit.search import ModelSource
from resacct.errors import ResacctError

__all__ = ["RankPeak", "ShardedAccount", "ENGINE_STAGES", "ENGINE_RECIPES", "default_ranks", "account_sharded_step"]

#: The ZeRO stage each engine is, and the ZeRO paper's recipe its state compares with.
ENGINE_STAGES = {"zero1": 1, "zero2": 2, "fsdp2": 3, "fsdp2-bf16": 3}
ENGINE_RECIPES = {"zero1": "fp32-adamw", "zero2": "fp32-adamw", "fsdp2": "fp32-adamw", "fsdp2-bf16": "mixed-adam"}
#: Ranks predicted by default: every rank up to this many, else the first two and the last.
ALL_RANKS_UP_TO = 8
#: ``measure``: at most this many local gloo ranks, each holding the whole model, of at most this many parameters.
MAX_MEASURED_RANKS = 8
MAX_MEASURED_PARAMETERS = 50_000_000
_CHILD_TIMEOUT_SECONDS = 3600.0


@dataclass(frozen=True)
class RankPeak:
    """One rank's predicted step peak: bytes, phase, the op and where it ran, what is live at it,
    each phase's peak, and what the rank holds when the step starts; ``measured``: that rank's CPU
    allocator on a real gloo rank (peak, phase, each phase's peak), None when not measured."""

    rank: int
    peak_bytes: int
    phase: str
    op: str
    where: str
    bytes_by_kind: dict[str, int]
    phase_peak_bytes: dict[str, int]
    start_bytes: int
    measured: dict[str, Any] | None = None


@dataclass
class ShardedAccount:
    model: str
    engine: str
    engine_text: str
    world_size: int
    batch: int
    seq: int | None
    parameters: int
    units: int
    ranks: list[RankPeak]
    formula_state_bytes: float
    formula_text: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def largest(self) -> RankPeak:
        return max(self.ranks, key=lambda rank: rank.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "engine": self.engine, "engine_description": self.engine_text, "world_size": self.world_size,
                "batch_per_rank": self.batch, "seq": self.seq, "parameters": self.parameters, "fsdp_units": self.units,
                "ranks": [{"rank": r.rank, "predicted_peak_bytes": r.peak_bytes, "peak_phase": r.phase, "peak_op": r.op, "peak_where": r.where,
                           "live_at_peak_bytes": r.bytes_by_kind, "phase_peak_bytes": r.phase_peak_bytes, "start_bytes": r.start_bytes,
                           "measured_peak_bytes": None if r.measured is None else r.measured["peak_bytes"],
                           "measured_peak_phase": None if r.measured is None else r.measured["phase"],
                           "measured_phase_peak_bytes": None if r.measured is None else r.measured["phase_peak_bytes"]}
                          for r in self.ranks],
                "largest_predicted_peak_bytes": self.largest.peak_bytes, "zero_formula_state_bytes": self.formula_state_bytes,
                "zero_formula": self.formula_text, "seconds": self.seconds, "notes": self.notes,
                "predicted_by": "the engine on fake tensors under torch's fake process group (resacct.account.peak.sharded); the model never allocated"}


def default_ranks(world_size: int) -> tuple[int, ...]:
    """Every rank up to :data:`ALL_RANKS_UP_TO` ranks; beyond, ranks 0, 1 and the last (FSDP pads the
    last shards; ZeroRedundancyOptimizer fills ranks in order — ``--rank`` asks for others)."""
    if world_size <= ALL_RANKS_UP_TO:
        return tuple(range(world_size))
    return (0, 1, world_size - 1)


def account_sharded_step(model: ModelSource, *, engine: str, world_size: int, batch: int, seq: int | None = None,
                         ranks: tuple[int, ...] | None = None, measure: bool = False) -> ShardedAccount:
    """Each of ``ranks`` (default :func:`default_ranks`) of ``world_size`` predicted in one child process,
    ``batch`` sequences of ``seq`` tokens (default: the context length) on each rank; ``measure``:
    then the same step on ``world_size`` local gloo ranks, each rank's CPU allocator beside its
    prediction (a small model: :data:`MAX_MEASURED_RANKS`, :data:`MAX_MEASURED_PARAMETERS`)."""
    from resacct.measurement.distributed import preload_in_ranks, run_isolated

    preload_in_ranks(__name__, "resacct.account.peak.sharded", "resacct.account.peak.sharded_measure")  # what the children run
    if engine not in ENGINE_STAGES:
        raise ResacctError(f"engine {engine!r}: expected one of {', '.join(ENGINE_STAGES)}")
    if world_size < 2:
        raise ResacctError(f"{world_size} rank(s): expected 2 or more (one rank is `resacct account`)")
    chosen = default_ranks(world_size) if ranks is None else tuple(sorted(set(ranks)))
    outside = [rank for rank in chosen if not 0 <= rank < world_size]
    if outside:
        raise ResacctError(f"rank(s) {outside}: expected 0 to {world_size - 1}")
    if measure and world_size > MAX_MEASURED_RANKS:
        raise ResacctError(f"--measure runs {world_size} processes here, each holding the whole model: expected at most {MAX_MEASURED_RANKS} ranks; "
                           "drop --measure for the prediction")
    started = time.perf_counter()
    answer = run_isolated(_predict_in_child, model, engine, world_size, chosen, batch, seq, timeout_seconds=_CHILD_TIMEOUT_SECONDS)
    if isinstance(answer, str):
        raise ResacctError(answer)
    measured = _measured(model, engine, world_size, batch, answer) if measure else None
    from resacct.formulas.sharding import per_rank_bytes

    formula = per_rank_bytes(answer["parameters"], ENGINE_RECIPES[engine], ENGINE_STAGES[engine], world_size)
    ranks_out = [RankPeak(rank=rank, peak_bytes=s["peak_bytes"], phase=s["phase"], op=s["op"], where=s["where"], bytes_by_kind=s["bytes_by_kind"],
                          phase_peak_bytes=s["phase_peak_bytes"], start_bytes=s["start_bytes"], measured=None if measured is None else measured[rank])
                 for rank, s in zip(chosen, answer["summaries"])]
    notes = []
    unprobed = max(summary.get("unprobed_matmuls", 0) for summary in answer["summaries"])
    if unprobed:
        from resacct.account.peak.step_peak import onednn_note

        notes.append(onednn_note("bfloat16", unprobed))
    if answer.get("layers_note"):
        notes.append(answer["layers_note"])
    from resacct.account.peak.rank_classes import same_shards_note

    if (same := same_shards_note(answer["representatives"])) is not None:
        notes.append(same)
    if ranks is None and len(chosen) < world_size:
        notes.append(f"ranks {', '.join(map(str, chosen))} of {world_size} predicted (--rank R asks for others): FSDP pads the last rank's "
                     "shards; ZeroRedundancyOptimizer gives whole tensors to ranks in order")
    return ShardedAccount(model=answer["name"], engine=engine, engine_text=_engine_text(engine), world_size=world_size, batch=batch,
                          seq=answer["seq"], parameters=answer["parameters"], units=answer["units"], ranks=ranks_out,
                          formula_state_bytes=formula.total_bytes, formula_text=_formula_text(engine), seconds=time.perf_counter() - started,
                          notes=notes)


def _measured(model: ModelSource, engine: str, world_size: int, batch: int, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The step on ``world_size`` local gloo ranks (the model made real on each), each rank's allocator summary."""
    from resacct.account.peak.sharded_measure import measure_source_on_rank
    from resacct.measurement.distributed import DistributedUnavailableError, run_on_ranks

    if answer["parameters"] > MAX_MEASURED_PARAMETERS:
        raise ResacctError(f"--measure runs {world_size} processes here, each holding the whole model ({answer['parameters']:,} parameters): "
                           f"expected at most {MAX_MEASURED_PARAMETERS:,} parameters; drop --measure for the prediction")
    try:
        return run_on_ranks(measure_source_on_rank, world_size, model, engine, batch, answer["seq"], timeout_seconds=_CHILD_TIMEOUT_SECONDS)
    except DistributedUnavailableError as error:
        raise ResacctError(f"--measure: {error}") from None


def _engine_text(engine: str) -> str:
    from resacct.account.peak.sharded import ENGINES

    return ENGINES[engine]


def _formula_text(engine: str) -> str:
    return {1: "ZeRO-1: 4Ψ + 4Ψ + 8Ψ/N (fp32 AdamW)", 2: "ZeRO-2: 4Ψ + 12Ψ/N (fp32 AdamW)",
            3: "ZeRO-3 mixed precision: (2 + 2 + 12)Ψ/N" if engine == "fsdp2-bf16" else "ZeRO-3: 16Ψ/N (fp32 AdamW)"}[ENGINE_STAGES[engine]]


def _predict_in_child(model: ModelSource, engine: str, world_size: int, ranks: tuple[int, ...], batch: int, seq: int | None) -> Any:
    """In the child: build the model on meta, then each rank's step on fake tensors. A
    :class:`ResacctError` comes back as its message (one line for the user)."""
    from resacct.account.peak.layer_segments import NotRepeating
    from resacct.account.peak.rank_classes import representative_ranks
    from resacct.account.peak.sharded import fsdp_units, predict_rank_summaries
    from resacct.account.peak.sharded_layers import sampled_rank_summaries
    from resacct.account.trace.repeated_layers import sampled_note

    try:
        target = model.target()
        representatives = representative_ranks([tuple(p.shape) for p in target.model.parameters()], engine, world_size, ranks)
        asked, ranks = ranks, tuple(dict.fromkeys(representatives.values()))  # one rank traced for those holding the same shards
        fixed_seq = seq if seq is not None else target.seq_limit
        if seq is not None and target.seq_limit is not None and seq > target.seq_limit:
            raise ResacctError(f"seq {seq} is longer than {target.name}'s context length {target.seq_limit}; expected seq ≤ {target.seq_limit}")
        summaries, layers_note = None, None
        if target.shallow is not None:  # a deep stack of identical layers: each rank from depths 3, 4 and 5
            depth = target.shallow.depth
            try:
                summaries = sampled_rank_summaries(target.shallow, target.make_inputs, target.loss_fn(), engine, world_size, ranks, batch, fixed_seq)
                layers_note = sampled_note(depth, "each rank's step", prefix=target.shallow.prefix, period=target.shallow.period)
            except NotRepeating as error:
                layers_note = f"all {depth} layers traced: {error}"
        if summaries is None:
            summaries = predict_rank_summaries(target.model, target.make_inputs(batch, fixed_seq), target.loss_fn(), engine, world_size, ranks)
    except ResacctError as error:
        return str(error)
    traced = dict(zip(ranks, (summary["allocator"] for summary in summaries)))
    return {"name": target.name, "seq": fixed_seq, "parameters": sum(p.numel() for p in target.model.parameters()),
            "units": len(fsdp_units(target.model)) if engine != "zero1" else 0,
            "summaries": [copy.deepcopy(traced[representatives[rank]]) for rank in asked], "layers_note": layers_note,
            "representatives": representatives}
