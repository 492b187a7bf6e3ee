"""tools/gpu_record.py's ``--replay`` and ``--compare`` (issue 31), on any CPU: a record read back
(one line on stderr when it is not a whole record), each recorded step and served model replayed through the
allocator model, or predicted on meta tensors (:func:`~resacct.account.gpu.tracing.cuda_step.predict_cuda_step_memory`;
a served model as ``infer --device`` predicts it) beside what the board did.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpu_record_matrix import MATRIX


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path`` (.json or .json.gz, a dry run's too), read and layout-checked as the recorded claims read it
    (:func:`resacct.account.gpu.records.board_record.read_board_record`), or None after one line on stderr."""
    from resacct.account.gpu.records.board_record import read_board_record
    from resacct.errors import ResacctError

    try:
        return read_board_record(str(path.resolve()), allow_dry_run=True)
    except ResacctError as error:
        print(f"gpu_record.py: {error}", file=sys.stderr)
        return None


def predict_recorded_step(step: dict[str, Any], dry: bool, capability: str | None = None, env: dict[str, str] | None = None,
                          multiprocessors: int | None = None) -> Any:
    """:func:`~resacct.account.gpu.records.record_models.predict_record_step` of a recorded step; what ran taken from
    :data:`MATRIX` where the step does not say it itself (a step described by hand)."""
    from resacct.account.gpu.records.record_models import predict_record_step

    from resacct.account.gpu.records.record_models import built_config

    matrix = {}
    if "model_config" not in step and step.get("name") in MATRIX:
        family, model, recipe, attention, *_ = MATRIX[step["name"]]
        matrix = {"family": family, "model_config": built_config(family, model, tiny=dry), "recipe": recipe, "attention": attention}
    return predict_record_step({"extra": {}, **matrix, **step}, dry_run=dry, capability=capability, env=env, multiprocessors=multiprocessors)


def compare_record(path: Path) -> int:
    """Each recorded step predicted on a CPU beside the board's peaks: allocated, reserved, ratios."""
    from resacct.errors import ResacctError
    record = read_record(path)
    if record is None:
        return 2
    print(f"{record['board']} · torch {record['torch']} · {record['when']}{' · DRY RUN' if record.get('dry_run') else ''}")
    print(f"{'step':48} {'allocated: predicted':>21} {'recorded':>15} {'ratio':>6}  {'reserved: predicted':>20} {'recorded':>15} {'ratio':>6}")
    from resacct.account.gpu.records.record_models import library_env, predict_serving_of_record

    probe_env = library_env(record)
    served = {id(entry) for entry in record.get("serving", [])}
    for step in [*record["steps"], *record.get("serving", [])]:
        if "error" in step:
            continue
        try:
            if id(step) in served:  # infer's prediction: the weights loaded, the first prefill with its cache kept
                predicted = predict_serving_of_record(record, step)
            else:
                predicted = predict_recorded_step(step, bool(record.get("dry_run")), record.get("capability"), probe_env,
                                                  record.get("multi_processor_count"))
        except (ResacctError, RuntimeError, ImportError) as error:
            print(f"{step['name']:48} cannot predict: {str(error).splitlines()[0][:120]}")
            continue
        allocated, reserved = step["max_memory_allocated"], step["max_memory_reserved"]
        print(f"{step['name']:48} {predicted.peak_allocated_bytes:>21,} {allocated:>15,} {predicted.peak_allocated_bytes / allocated:>6.3f}  "
              f"{predicted.peak_reserved_bytes:>20,} {reserved:>15,} {predicted.peak_reserved_bytes / reserved:>6.3f}")
    return 0


def replay_record(path: Path) -> int:
    """Replay every step of the record at ``path`` through the allocator model; one line per step."""
    from resacct.account.gpu.records.record import replay_step
    from resacct.errors import ResacctError
    record = read_record(path)
    if record is None:
        return 2
    print(f"{record['board']} · torch {record['torch']} · {record['when']}{' · DRY RUN' if record.get('dry_run') else ''}")
    held = 0
    everything = [*record["steps"], *record.get("serving", [])]
    steps = [step for step in everything if "error" not in step]
    for step in steps:
        try:
            result = replay_step(step)
        except ResacctError as error:
            print(f"{step['name']:48} cannot replay: {error}")
            continue
        held += result.holds
        print(f"{step['name']:48} allocated {result.peak_allocated_bytes:>14,} (recorded {result.recorded_max_allocated_bytes:>14,})  "
              f"reserved {result.peak_reserved_bytes:>14,} (recorded {result.recorded_max_reserved_bytes:>14,})  "
              f"{'holds' if result.holds else 'DIFFERS: ' + (result.first_segment_mismatch or result.first_misplaced_block or 'the peaks')}")
    print(f"{held} of {len(steps)} recorded steps replay exactly ({len(everything) - len(steps)} not recorded)")
    return 0 if held == len(steps) else 1

