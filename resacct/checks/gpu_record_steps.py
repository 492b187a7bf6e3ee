"""A board's record (``resacct-gpu-record/1``, ``tools/gpu_record.py``) replayed and predicted on any
machine (issue 31, part 5): evidence ``recorded``, area ``gpu_recorded``.

Per recorded step four kinds of claim, each reading its **measurement** from the committed record
(:mod:`resacct.account.gpu.records.board_record`) and making its **prediction** now:

- ``gpu_recorded.board_step_replay`` — the allocator trace the board recorded, run through resacct's
  model of the CUDA caching allocator (:func:`~resacct.account.gpu.records.record.replay_step`): its allocated or
  reserved peak over the measured step beside ``max_memory_allocated`` / ``max_memory_reserved``;
- ``gpu_recorded.board_step_peak`` — the step rebuilt on meta tensors from what the record says ran
  (:func:`~resacct.account.gpu.records.record_models.predict_record_step`): the predicted peak beside the board's;
- ``gpu_recorded.board_step_time`` — the step's aten ops (from the same pass) priced by the record's own
  ceilings (the most matmul FLOP/s of the step's format, the copy bandwidth; per op the launch overhead
  measured, or one calibrated on other steps named by ``calibrate_on``, never the judged one), beside the
  median step time the board measured;
- ``gpu_recorded.board_step_time_calibrated`` — the same ops priced by the model fitted on other recorded steps
  (``calibrate_on``, never the judged one; :mod:`resacct.account.gpu.timing.step_time_calibrated`): their profile's matmuls per
  class, their other kernels, their host's idle time per op.

Every outcome names the board, the date and the record file. A dry run's record is refused (a CPU made
it). ``replay=record_contents``: a stored measurement is keyed by the record file's sha256 too (resacct.harness.replay).
"""

from __future__ import annotations

from typing import Any

from resacct.account.gpu.records.board_record import board_record_step, read_board_record
from resacct.account.gpu.records.record import COMPARED_EVENTS
from resacct.account.gpu.records.recorded import record_contents, record_path, record_source
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.measurement.memo import shared_measurement

SOURCE = ("board", "recorded_on", "record_file")
PEAKS = {"allocated": "max_memory_allocated", "reserved": "max_memory_reserved"}


def peak_field(peak: str) -> str:
    if peak not in PEAKS:
        raise ResacctError(f"peak {peak!r}: expected one of {', '.join(PEAKS)}")
    return PEAKS[peak]


@check("gpu_recorded.board_step_replay", evidence="recorded",
       quantities=("replayed_bytes", "replay_exact", "first_mismatch", "segment_events", *SOURCE), replay=record_contents)
def board_step_replay(record: str, step: str, peak: str) -> Outcome:
    """The board's ``max_memory_<peak>`` over the recorded step, beside the same peak of the allocator
    model replaying the step's recorded allocations and frees; ``replay_exact``: every segment event and
    every block's place matched too (``first_mismatch`` says where not)."""
    field = peak_field(peak)
    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    result = _replayed_step(record, step, record_path(record).stat().st_mtime_ns)
    replayed = result.peak_allocated_bytes if peak == "allocated" else result.peak_reserved_bytes
    return Outcome(measured=entry[field], predicted=replayed, quantities={
        "replayed_bytes": replayed, "replay_exact": result.holds, "first_mismatch": result.first_segment_mismatch or result.first_misplaced_block,
        "segment_events": result.segment_events, **record_source(record, data)})


@shared_measurement
def _replayed_step(record: str, step: str, mtime_ns: int) -> Any:
    """The recorded step's trace replayed through the allocator model: its allocated and reserved claims replay it once."""
    from resacct.account.gpu.records.record import replay_step

    entry = board_record_step(record, read_board_record(record), step)
    return replay_step(entry, entry.get("allocator_settings"))


@shared_measurement
def _predicted_step(record: str, step: str, mtime_ns: int) -> tuple[int, int, tuple[Any, ...], str, tuple[tuple[str, int, str], ...]]:
    """The recorded step rebuilt on meta and predicted (allocated and reserved peaks, the aten ops with their
    FLOPs and bytes, the attention traced, the measured step's allocations and completed frees with the op of each): one
    pass serves the step's peak, time and event claims."""
    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    from resacct.account.gpu.records.record_models import predict_step_of_record

    ops: list[Any] = []
    window: list[tuple[str, int, str]] = []
    predicted = predict_step_of_record(data, entry, ops=ops, window=window)
    events = tuple(event for event in window if event[0] in COMPARED_EVENTS)
    return predicted.peak_allocated_bytes, predicted.peak_reserved_bytes, tuple(ops), predicted.attention, events  # frozen: shared uncopied


def _prediction(record: str, step: str) -> tuple[int, int, tuple[Any, ...], str, tuple[tuple[str, int, str], ...]]:
    return _predicted_step(record, step, record_path(record).stat().st_mtime_ns)


@check("gpu_recorded.board_step_events", evidence="recorded",
       quantities=("events_in_order", "board_events", "predicted_events", "first_difference", *SOURCE), replay=record_contents)
def board_step_events(record: str, step: str) -> Outcome:
    """The board's allocations and completed frees over the measured step (action and size, in order) beside the
    prediction's from the step rebuilt on meta: ``events_in_order`` is the board's count less the larger of the two
    sides' events the other lacks (difflib's alignment) — the board's count exactly where the sequences are the same;
    ``first_difference`` says where they part, with the predicted op."""
    from resacct.account.gpu.records.record import event_differences

    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    board = [(row[0], row[2]) for row in entry["trace"][entry["window_start"]:] if row[0] in COMPARED_EVENTS]
    ours = _prediction(record, step)[4]
    differences = event_differences(board, [(action, size) for action, size, _ in ours])
    first = None
    if differences.runs:
        board_from, board_to, ours_from, ours_to = differences.runs[0]
        first = (f"event {board_from}: board {board[board_from] if board_from < board_to else 'nothing'}, predicted "
                 f"{ours[ours_from] if ours_from < ours_to else 'nothing'}")
    in_order = len(board) - max(differences.board_only, differences.ours_only)
    return Outcome(measured=len(board), predicted=in_order, quantities={
        "events_in_order": in_order, "board_events": len(board), "predicted_events": len(ours), "first_difference": first,
        **record_source(record, data)})


@check("gpu_recorded.board_step_peak", evidence="recorded", quantities=("predicted_bytes", "attention", *SOURCE), replay=record_contents)
def board_step_peak(record: str, step: str, peak: str) -> Outcome:
    """The board's ``max_memory_<peak>`` over the recorded step, beside the peak predicted now: the step
    rebuilt on meta tensors from what the record says ran (model config, recipe, batch, attention kernel,
    allocator settings, the cuBLAS workspaces of the board's capability) through the allocator model."""
    field = peak_field(peak)
    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    allocated, reserved, _, attention, _ = _prediction(record, step)
    predicted = allocated if peak == "allocated" else reserved
    return Outcome(measured=entry[field], predicted=predicted,
                   quantities={"predicted_bytes": predicted, "attention": attention, **record_source(record, data)})


_TIME_QUANTITIES = ("predicted_step_sec", "gpu_sec", "host_sec", "ops", "matmul_format", "matmul_flops_per_sec", "bandwidth_bytes_per_sec",
                    "overhead_sec_per_op", "overhead_from", "predicted_mfu", "measured_mfu", *SOURCE)


def record_rates(record: str, data: dict[str, Any], fmt: str) -> tuple[float, float, float]:
    """(matmul FLOP/s of ``fmt``, copy bandwidth, one launch's seconds) the record measured."""
    from resacct.account.gpu.records.board_record import ceilings_in_brief

    brief = ceilings_in_brief(data["ceilings"])
    rate = brief["matmul_flops_per_sec"].get(fmt)
    if rate is None or brief["copy_bandwidth_bytes_per_sec"] is None or brief["launch_sec"] is None:
        raise ResacctError(f"GPU record {record}: its ceilings lack the {fmt} matmul rate, the copy bandwidth or the launch time "
                           f"(measured: {', '.join(brief['matmul_flops_per_sec']) or 'no matmul'}); expected the recorder's ceilings")
    return rate, brief["copy_bandwidth_bytes_per_sec"], brief["launch_sec"]


def _matmul_format(recipe: str) -> str:
    """The format a recipe's matmuls run in, as the ceilings name it (PyTorch's default keeps TF32 off: fp32 is fp32)."""
    from resacct.facts.hardware import peak_format
    from resacct.facts.recipes import parse_recipe

    return peak_format(parse_recipe(recipe).computes_in)


def predicted_step_ops(record: str, step: str) -> tuple[tuple[Any, ...], str]:
    """The recorded training step's aten ops as ``board_step_time`` prices them (traced on meta, each with its FLOPs
    and bytes) and the format its matmuls run in — for a per-op comparison with the record's profile
    (``benchmarks/board_op_times.py``)."""
    entry = board_record_step(record, read_board_record(record), step)
    return _prediction(record, step)[2], _matmul_format(entry["recipe"])


@check("gpu_recorded.board_step_time", evidence="recorded", quantities=_TIME_QUANTITIES, replay=record_contents)
def board_step_time(record: str, step: str, calibrate_on: list[str] | None = None) -> Outcome:
    """The board's median step time for the recorded step, beside the time predicted now: per aten op of the
    step (traced on meta, CUDA's choices) the longer of FLOPs ÷ the record's most matmul FLOP/s in the step's
    format and bytes ÷ its copy bandwidth, summed; the host's ops × a per-op overhead the other bound (the
    record's launch time, or calibrated on the host-bound steps ``calibrate_on`` — never the judged one)."""
    from resacct.account.gpu.timing.step_time import BoardRates, calibrate_overhead, predict_step_seconds
    from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec

    calibration = list(calibrate_on or [])
    if step in calibration:
        raise ResacctError(f"calibrate_on names {step!r}, the step judged; expected other recorded steps")
    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    fmt = _matmul_format(entry["recipe"])
    matmul, bandwidth, launch = record_rates(record, data, fmt)
    overhead, source = launch, "the record's launch time"
    if calibration:
        overheads = []
        for name in calibration:
            other = board_record_step(record, data, name)
            other_rate = record_rates(record, data, _matmul_format(other["recipe"]))[0]
            overheads.append(calibrate_overhead(_prediction(record, name)[2], other["step_time_sec"]["median"], other_rate, bandwidth))
        overhead, source = sum(overheads) / len(overheads), f"calibrated on {', '.join(calibration)}"
    predicted = predict_step_seconds(_prediction(record, step)[2], BoardRates(matmul, bandwidth, overhead, source))
    measured = entry["step_time_sec"]["median"]
    board = accelerator_for_cuda_name(data["board"])
    peak = peak_flops_per_sec(board, fmt) if board is not None else None
    return Outcome(measured=measured, quantities={
        "predicted_step_sec": predicted.step_sec, "gpu_sec": predicted.gpu_sec, "host_sec": predicted.host_sec, "ops": predicted.ops,
        "matmul_format": fmt, "matmul_flops_per_sec": matmul, "bandwidth_bytes_per_sec": bandwidth, "overhead_sec_per_op": overhead,
        "overhead_from": source, "predicted_mfu": None if peak is None else predicted.flops / predicted.step_sec / peak,
        "measured_mfu": None if peak is None else predicted.flops / measured / peak, **record_source(record, data)})


_CALIBRATED_QUANTITIES = ("predicted_step_sec", "gpu_sec", "idle_sec_per_op", "ops", "matmul_fits", "memory_factor", "sec_per_kernel",
                          "calibrated_on", *SOURCE)


@check("gpu_recorded.board_step_time_calibrated", evidence="recorded", quantities=_CALIBRATED_QUANTITIES, replay=record_contents)
def board_step_time_calibrated(record: str, step: str, calibrate_on: list[str]) -> Outcome:
    """The board's median step time for the recorded step, beside the time of the model calibrated on the record's
    steps ``calibrate_on`` (never the judged one; :mod:`resacct.account.gpu.timing.step_time_calibrated`): their profile's matmuls
    per class, their other kernels' bandwidth and per-kernel time, their host's idle time per op — priced on the judged
    step's ops traced on meta."""
    from resacct.account.gpu.timing.step_time_calibrated import calibrate_step_times, predict_calibrated_seconds

    calibration = list(calibrate_on or [])
    if step in calibration:
        raise ResacctError(f"calibrate_on names {step!r}, the step judged; expected other recorded steps")
    data = read_board_record(record)
    entry = board_record_step(record, data, step)
    _, bandwidth, _ = record_rates(record, data, _matmul_format(entry["recipe"]))
    steps = []
    for name in calibration:
        other = board_record_step(record, data, name)
        steps.append((name, other, _prediction(record, name)[2], record_rates(record, data, _matmul_format(other["recipe"]))[0]))
    times = calibrate_step_times(steps, bandwidth_bytes_per_sec=bandwidth)
    ops = _prediction(record, step)[2]
    gpu, predicted = predict_calibrated_seconds(ops, times, fallback_flops_per_sec=record_rates(record, data, _matmul_format(entry["recipe"]))[0])
    return Outcome(measured=entry["step_time_sec"]["median"], quantities={
        "predicted_step_sec": predicted, "gpu_sec": gpu, "idle_sec_per_op": times.idle_sec_per_op, "ops": len(ops),
        "matmul_fits": {name: f"{fit.flops_per_sec / 1e12:.0f} TFLOP/s + {fit.sec_per_call * 1e6:.1f} µs a call" for name, fit in sorted(times.matmul.items())},
        "memory_factor": times.memory_factor, "sec_per_kernel": times.sec_per_kernel, "calibrated_on": ", ".join(times.calibrated_on),
        **record_source(record, data)})
