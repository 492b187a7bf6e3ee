"""tools/gpu_record.py's ``--claims FILE`` (issue 31, part 5): the recorded claims of a committed board record, as
YAML to append to ``resacct/specs/gpu_recorded.claims.yaml`` — per recorded step, its allocated and reserved peaks
replayed through the allocator model (exact), predicted on meta tensors (within 1 %), and its step time predicted
from the record's own ceilings and by the model calibrated on the record's other steps (each within 10 %); per served model the same peaks (as ``infer --device`` predicts them)
and its prefill's (by the record's own ceilings, and — where the record has its calibration file — as ``infer --device``
prints it, by the model calibrated on the record's training steps) and a generated token's time. The thresholds are issue 31's, set here before any comparison; the
outcomes are ``resacct verify``'s to decide (nothing measured is written into a claim); a step resacct cannot predict on
meta tensors gets its replay claims only, and a comment saying why. Review before committing:
a step whose prediction is refuted keeps its claim, with ``status: refuted`` and the truth the report gives.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: what each claim judges: (id suffix, check, given beyond record and step, law, tolerance, the sentence's predicate)
KINDS = (
    ("allocated-replays-exactly", "gpu_recorded.board_step_replay", {"peak": "allocated"}, "replayed_bytes", None,
     "max_memory_allocated over the step is what resacct's model of the CUDA caching allocator gives, replaying the step's recorded allocations and frees"),
    ("reserved-replays-exactly", "gpu_recorded.board_step_replay", {"peak": "reserved"}, "replayed_bytes", None,
     "max_memory_reserved over the step is what resacct's model of the CUDA caching allocator gives, replaying the step's recorded allocations and frees"),
    ("allocated-peak-predicted", "gpu_recorded.board_step_peak", {"peak": "allocated"}, "predicted_bytes", {"rel": 0.01},
     "max_memory_allocated over the step is within 1 % of resacct's prediction from the step rebuilt on meta tensors"),
    ("reserved-peak-predicted", "gpu_recorded.board_step_peak", {"peak": "reserved"}, "predicted_bytes", {"rel": 0.01},
     "max_memory_reserved over the step is within 1 % of resacct's prediction from the step rebuilt on meta tensors"),
    ("step-time-predicted", "gpu_recorded.board_step_time", {}, "predicted_step_sec", {"rel": 0.10},
     "the median step time is within 10 % of resacct's per-op roofline priced by the record's own ceilings (matmul, copy, launch)"),
    ("step-time-calibrated", "gpu_recorded.board_step_time_calibrated", {}, "predicted_step_sec", {"rel": 0.10},
     "the median step time is within 10 % of resacct's per-op model calibrated on other steps of the record (calibrate_on: their "
     "matmuls per class, their other kernels' bandwidth and per-kernel time, their host's idle time per op), never on this one"),
)

#: the same for each served model (tools/gpu_record_serve.py): the allocator's replay of the weights' load and first
#: prefill, infer --device's peaks of them (1 %), and its prefill and decode times (10 %: issue 31's for a step's time)
#: the recorded steps whose predicted peaks stay in the quick tier (every other prediction traces a recorded process on meta,
#: 0.3-2.4 s a step, and a calibrated time six of them: the slow tier and ``resacct verify`` judge those; the quick tier
#: keeps every replay): sdpa's math path with CUDA's composites (docs/gpu.md), one step of ~1.3 s
QUICK_PREDICTED_STEPS = ("gqa-llama/fp32/math",)
SLOW_WHY = "a recorded process traced on meta: the slow tier and verify judge it; the quick tier keeps the replays"

SERVING_KINDS = (
    ("allocated-replays-exactly", "gpu_recorded.board_step_replay", {"peak": "allocated"}, "replayed_bytes", None,
     "max_memory_allocated is what resacct's model of the CUDA caching allocator gives, replaying the recorded allocations and frees"),
    ("reserved-replays-exactly", "gpu_recorded.board_step_replay", {"peak": "reserved"}, "replayed_bytes", None,
     "max_memory_reserved is what resacct's model of the CUDA caching allocator gives, replaying the recorded allocations and frees"),
    ("allocated-peak-predicted", "gpu_recorded.board_prefill_peak", {"peak": "allocated"}, "predicted_bytes", {"rel": 0.01},
     "max_memory_allocated is within 1 % of what resacct infer --device predicts for it"),
    ("reserved-peak-predicted", "gpu_recorded.board_prefill_peak", {"peak": "reserved"}, "predicted_bytes", {"rel": 0.01},
     "max_memory_reserved is within 1 % of what resacct infer --device predicts for it"),
    ("prefill-time-predicted", "gpu_recorded.board_prefill_time", {}, "predicted_prefill_sec", {"rel": 0.10},
     "the median prefill time is within 10 % of resacct's per-op roofline priced by the record's own ceilings (matmul, copy, launch)"),
    ("prefill-time-calibrated", "gpu_recorded.board_prefill_time_calibrated", {}, "predicted_prefill_sec", {"rel": 0.10},
     "the median prefill time is within 10 % of the time resacct infer --device prints for the board: its ops priced by the per-op "
     "model calibrated on the record's training steps (never on a served model)"),
    ("decode-time-predicted", "gpu_recorded.board_decode_time", {}, "predicted_token_sec", {"rel": 0.10},
     "the median time of a generated token is within 10 % of resacct infer --device's decode prediction priced by the record's own ceilings"),
)


#: the torch a recorded step's prediction needs: CUDA's flash attention kernel traced on meta (a meta kernel from 2.8; 2.4 has
#: none) and transformers' models (5.x needs torch 2.6); the replays need no torch at all
PREDICTION_TORCH = ">=2.8"


def slug(text: str) -> str:
    """``gqa-llama/bf16/flash`` → ``gqa-llama-bf16-flash``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


#: a claim id's longest (resacct/harness/schema.py: ``Claim.id``)
MAX_ID_LENGTH = 80


def claim_id(tag: str, step: str, suffix: str) -> str:
    """``recorded-<board>-<step>-<suffix>``, at most :data:`MAX_ID_LENGTH` long: a step name too long for it is cut and
    given 6 hex digits of its whole name's hash (two long names that share their start stay two ids).

    >>> claim_id("h100-pcie", "mixtral-small/bf16-autocast/batched_mm-experts", "allocated-replays-exactly")
    'recorded-h100-pcie-mixtral-small-bf16-autocast-754600-allocated-replays-exactly'
    """
    import hashlib

    whole = f"recorded-{tag}-{slug(step)}-{suffix}"
    if len(whole) <= MAX_ID_LENGTH:
        return whole
    digest = hashlib.sha1(step.encode()).hexdigest()[:6]
    room = MAX_ID_LENGTH - len(f"recorded-{tag}--{digest}-{suffix}")
    return f"recorded-{tag}-{slug(step)[:room].rstrip('-')}-{digest}-{suffix}"


def _flow(mapping: dict[str, Any]) -> str:
    """A YAML flow mapping of plain values (JSON's syntax is YAML's)."""
    return "{" + ", ".join(f"{key}: {json.dumps(value)}" for key, value in mapping.items()) + "}"


def unpredictable(record: dict[str, Any], step: dict[str, Any], *, serving: bool) -> str | None:
    """Why resacct cannot predict ``step`` of ``record`` on meta tensors (its prediction tried, as the claims would), or None."""
    from resacct.account.gpu.records.record_models import predict_serving_of_record, predict_step_of_record

    try:
        if serving:
            predict_serving_of_record(record, step)
        else:
            predict_step_of_record(record, step)
    except Exception as error:  # noqa: BLE001 — whatever stops the prediction is the reason given
        return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:120]}"
    return None


def calibration_sets(steps: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per recorded training step, the steps its calibrated time claim is calibrated on: the dense steps (no ``experts``:
    a mixture of experts' uneven tokens per expert make its profile's shapes mislead the matmul classes) in two folds —
    every other one in the record's order — each judged on the other fold; a mixture of experts on every dense step.
    Empty where the record has fewer than four dense steps (a fold needs two)."""
    dense = [step["name"] for step in steps if "error" not in step and not (step.get("extra") or {}).get("experts")]
    if len(dense) < 4:
        return {}
    folds = (dense[0::2], dense[1::2])
    sets = {name: folds[1] if name in folds[0] else folds[0] for name in dense}
    sets.update({step["name"]: dense for step in steps if "error" not in step and step["name"] not in sets})
    return sets


def _has_calibration(record_name: str) -> bool:
    """Whether the record has its calibration file beside it (or shipped), which its served models' calibrated prefill
    claims price by (``tools/gpu_record.py --calibrate`` writes it)."""
    from resacct.account.gpu.records.record_calibration import calibration_file

    return calibration_file(record_name).is_file()


def claims_yaml(record_name: str, record: dict[str, Any]) -> str:
    """The YAML claims (list items, indented for the spec's ``claims:``) of every recorded step of ``record``."""
    from resacct.facts.hardware import accelerator_for_cuda_name

    board = accelerator_for_cuda_name(record["board"])
    if board is None:
        raise SystemExit(f"gpu_record.py: board {record['board']!r} is not in resacct's datasheet table; add it before claiming on its record")
    if record.get("dry_run"):
        raise SystemExit("gpu_record.py: a dry run's record is a layout check; expected a record made on a board")
    tag, day = slug(board.name.removesuffix("-sxm")), record["when"][:10]
    lines = [f"  # --- {record['board']}, {day}: record {record_name} (tools/gpu_record.py --claims) ---"]
    served = [(step, SERVING_KINDS, f"{step['name']} ({step['weights']} weights, {step['attention']} attention), its weights loaded and its "
               f"first prefill of batch {step['batch']} × {step['context']} tokens with the KV cache kept") for step in record.get("serving", []) if "error" not in step]
    trained = [(step, KINDS, f"a steady training step of {step['name']} ({step['recipe']}, {step['attention']} attention, batch {step['batch']} × "
                f"{step['seq']})") for step in record["steps"] if "error" not in step]
    lines += [f"  # {step['name']}: not recorded ({step['error']}): no claims" for step in [*record["steps"], *record.get("serving", [])] if "error" in step]
    calibration = calibration_sets(record["steps"])
    calibrated = _has_calibration(record_name)
    for step, kinds, what in trained + served:
        why = unpredictable(record, step, serving=kinds is SERVING_KINDS)
        if why is not None:  # the replays only: a prediction that cannot be made is no claim's outcome
            lines.append(f"  # {step['name']}: resacct cannot predict it on meta tensors ({why}): its replay claims only")
            kinds = tuple(kind for kind in kinds if kind[1] == "gpu_recorded.board_step_replay")
        for suffix, measure, given, law, tolerance, predicate in kinds:
            if measure == "gpu_recorded.board_step_time_calibrated":
                if step["name"] not in calibration:
                    continue
                given = {"calibrate_on": calibration[step["name"]]}
            if measure == "gpu_recorded.board_prefill_time_calibrated" and not calibrated:
                continue  # priced by the record's calibration file: tools/gpu_record.py --calibrate first
            lines += [f"  - id: {claim_id(tag, step['name'], suffix)}",
                      f"    says: \"On an {record['board']} ({day}), {what}: {predicate}.\"",
                      f"    source: \"issue 31 — the GPU step recorded on a board; {record_name}\"",
                      f"    measure: {measure}",
                      f"    given: {_flow({'record': record_name, 'step': step['name'], **given})}",
                      f"    law: {law}"]
            if tolerance:
                lines.append(f"    tolerance: {_flow(tolerance)}")
            if measure != "gpu_recorded.board_step_replay":  # rebuilt on meta: CUDA's flash kernel has a meta kernel from torch 2.8
                lines.append(f"    requires_torch: \"{PREDICTION_TORCH}\"")
                if not (measure == "gpu_recorded.board_step_peak" and step["name"] in QUICK_PREDICTED_STEPS):
                    lines.append(f"    marks: [slow]  # {SLOW_WHY}")
            lines.append("    # threshold: issue 31's, set before the comparison" + (" (exact)" if tolerance is None else ""))
            lines.append("")
    return "\n".join(lines) + "\n"
