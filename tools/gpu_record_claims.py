"""tools/gpu_record.py's ``--claims FILE`` (issue 31, part 5): the recorded claims of a committed board record, as
YAML to append to ``resacct/specs/gpu_recorded.claims.yaml`` — per recorded step, its allocated and reserved peaks
replayed through the allocator model (exact), predicted on meta tensors (within 1 %), and its step time predicted
from the record's own ceilings (within 10 %); per served model the same peaks (as ``infer --device`` predicts them)
and its prefill's and a generated token's time. The thresholds are issue 31's, set here before any comparison; the
outcomes are ``resacct verify``'s to decide (nothing measured is written into a claim). Review before committing:
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
)

#: the same for each served model (tools/gpu_record_serve.py): the allocator's replay of the weights' load and first
#: prefill, infer --device's peaks of them (1 %), and its prefill and decode times (10 %: issue 31's for a step's time)
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
    ("decode-time-predicted", "gpu_recorded.board_decode_time", {}, "predicted_token_sec", {"rel": 0.10},
     "the median time of a generated token is within 10 % of resacct infer --device's decode prediction priced by the record's own ceilings"),
)


def slug(text: str) -> str:
    """``gqa-llama/bf16/flash`` → ``gqa-llama-bf16-flash``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _flow(mapping: dict[str, Any]) -> str:
    """A YAML flow mapping of plain values (JSON's syntax is YAML's)."""
    return "{" + ", ".join(f"{key}: {json.dumps(value)}" for key, value in mapping.items()) + "}"


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
    for step, kinds, what in trained + served:
        for suffix, measure, given, law, tolerance, predicate in kinds:
            lines += [f"  - id: recorded-{tag}-{slug(step['name'])}-{suffix}",
                      f"    says: \"On an {record['board']} ({day}), {what}: {predicate}.\"",
                      f"    source: \"issue 31 — the GPU step recorded on a board; {record_name}\"",
                      f"    measure: {measure}",
                      f"    given: {_flow({'record': record_name, 'step': step['name'], **given})}",
                      f"    law: {law}"]
            if tolerance:
                lines.append(f"    tolerance: {_flow(tolerance)}")
            lines.append("    # threshold: issue 31's, set before the comparison" + (" (exact)" if tolerance is None else ""))
            lines.append("")
    return "\n".join(lines) + "\n"
