"""A board's record of models served as ``resacct infer --device`` predicts them (``tools/gpu_record_serve.py``),
replayed and predicted on any machine (issue 31): evidence ``recorded``, area ``gpu_recorded``.

A served entry of a record holds what one process did on the board: the model's weights loaded (in the module's
order, as the prediction loads them), the first prefill of batch × context tokens with its KV cache kept — the
CUDA caching allocator's trace and peaks over all of it — then the prefill's median time and the median time of a
token generated one at a time from the cache. Its allocator trace is replayed by ``gpu_recorded.board_step_replay``
(the training steps' check: the same fields); here, each reading its **measurement** from the committed record and
making its **prediction** now with ``infer --device``'s own functions
(:func:`~resacct.account.gpu.records.record_models.predict_record_serving`):

- ``gpu_recorded.board_prefill_peak`` — the weights and the prefill traced on meta tensors through the allocator model;
- ``gpu_recorded.board_prefill_time`` — the prefill's aten ops priced by the record's own ceilings (per op the longer of
  FLOPs ÷ the most matmul FLOP/s in the weights' format and bytes ÷ the copy bandwidth; the ops × the launch time the
  other bound);
- ``gpu_recorded.board_prefill_time_calibrated`` — the same ops priced as ``infer --device`` prices them on a board whose
  record carries a calibration: the per-op model fitted on the record's **training** steps
  (:mod:`~resacct.account.gpu.records.record_calibration`; never on a served model, so every served entry is held out);
- ``gpu_recorded.board_decode_time`` — one generated token: the longest of the weights and the KV cache read once ÷
  the bandwidth, the FLOPs of the next token's forward (traced on meta) ÷ the matmul rate, its ops × the launch time
  (:func:`~resacct.account.gpu.timing.step_time.predict_decode_seconds`).

Every outcome names the board, the date and the record file; a dry run's record is refused.
"""

from __future__ import annotations

from typing import Any

from resacct.account.gpu.records.board_record import board_record_step, read_board_record
from resacct.account.gpu.records.recorded import record_contents, record_path, record_source
from resacct.checks.gpu_record_steps import SOURCE, peak_field, record_rates
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.measurement.memo import shared_measurement

__all__ = ["board_prefill_peak", "board_prefill_time", "board_prefill_time_calibrated", "board_decode_time"]


@shared_measurement
def _predicted_serving(record: str, step: str, mtime_ns: int) -> Any:
    """The served entry rebuilt on meta and predicted once: its peaks, the prefill's ops, the bytes a decode step reads."""
    from resacct.account.gpu.records.record_models import predict_serving_of_record

    data = read_board_record(record)
    return predict_serving_of_record(data, board_record_step(record, data, step))


def _served(record: str, step: str) -> tuple[dict[str, Any], dict[str, Any], Any]:
    data = read_board_record(record)
    return data, board_record_step(record, data, step), _predicted_serving(record, step, record_path(record).stat().st_mtime_ns)


@check("gpu_recorded.board_prefill_peak", evidence="recorded", quantities=("predicted_bytes", "attention", *SOURCE), replay=record_contents)
def board_prefill_peak(record: str, step: str, peak: str) -> Outcome:
    """The board's ``max_memory_<peak>`` over the weights' load and the first prefill (its cache kept), beside the peak
    ``infer --device`` predicts for the same model, weights, batch, context and sdpa kernel on the board's capability."""
    field = peak_field(peak)
    data, entry, predicted = _served(record, step)
    value = predicted.peak_allocated_bytes if peak == "allocated" else predicted.peak_reserved_bytes
    return Outcome(measured=entry[field], predicted=value, quantities={"predicted_bytes": value, "attention": predicted.attention,
                                                                        **record_source(record, data)})


def _rates(record: str, data: dict[str, Any], weights: str) -> Any:
    from resacct.account.gpu.timing.step_time import BoardRates
    from resacct.facts.hardware import peak_format

    matmul, bandwidth, launch = record_rates(record, data, peak_format(weights))
    return BoardRates(matmul, bandwidth, launch, "the record's own ceilings (matmul, copy, launch)")


@check("gpu_recorded.board_prefill_time", evidence="recorded",
       quantities=("predicted_prefill_sec", "gpu_sec", "host_sec", "ops", "matmul_flops_per_sec", "bandwidth_bytes_per_sec", "overhead_sec_per_op",
                   *SOURCE), replay=record_contents)
def board_prefill_time(record: str, step: str) -> Outcome:
    """The board's median prefill time, beside the prefill's per-op roofline priced by the record's own ceilings."""
    from resacct.account.gpu.timing.step_time import predict_step_seconds

    data, entry, predicted = _served(record, step)
    rates = _rates(record, data, entry["weights"])
    time = predict_step_seconds(predicted.ops, rates)
    return Outcome(measured=entry["prefill_sec"]["median"], quantities={
        "predicted_prefill_sec": time.step_sec, "gpu_sec": time.gpu_sec, "host_sec": time.host_sec, "ops": time.ops,
        "matmul_flops_per_sec": rates.matmul_flops_per_sec, "bandwidth_bytes_per_sec": rates.bandwidth_bytes_per_sec,
        "overhead_sec_per_op": rates.overhead_sec_per_op, **record_source(record, data)})


def _calibration_contents(inputs: dict[str, Any]) -> dict[str, Any]:
    """A stored measurement's key: the record's sha256 and its calibration file's (a calibration fitted again is measured again)."""
    from resacct.account.gpu.records.record_calibration import calibration_file

    return {**record_contents(inputs), "calibration_sha256": record_contents({"record": str(calibration_file(str(inputs.get("record", ""))))})["record_sha256"]}


@check("gpu_recorded.board_prefill_time_calibrated", evidence="recorded",
       quantities=("predicted_prefill_sec", "kernels_sec", "idle_sec_per_op", "ops", "calibrated_on", *SOURCE), replay=_calibration_contents)
def board_prefill_time_calibrated(record: str, step: str) -> Outcome:
    """The board's median prefill time, beside the prefill's ops priced by the model calibrated on the record's training
    steps (the calibration file beside the record, ``tools/gpu_record.py --calibrate``) — the time ``infer --device``
    prints for that board: the kernels by the fitted rates, plus the host's idle time per op."""
    from resacct.account.gpu.records.record_calibration import calibration_file, read_record_calibration
    from resacct.account.gpu.timing.step_time_calibrated import predict_calibrated_seconds
    from resacct.facts.hardware import peak_format

    path = calibration_file(record)
    if not path.is_file():
        raise ResacctError(f"record {record!r} has no calibration beside it ({path.name}); expected tools/gpu_record.py --calibrate's file")
    calibration = read_record_calibration(path)
    data, entry, predicted = _served(record, step)
    fmt = peak_format(entry["weights"])
    fallback = calibration.matmul_flops_per_sec.get(fmt) or _rates(record, data, entry["weights"]).matmul_flops_per_sec
    kernels, total = predict_calibrated_seconds(predicted.ops, calibration.times, fallback_flops_per_sec=fallback)
    return Outcome(measured=entry["prefill_sec"]["median"], quantities={
        "predicted_prefill_sec": total, "kernels_sec": kernels, "idle_sec_per_op": calibration.times.idle_sec_per_op, "ops": len(predicted.ops),
        "calibrated_on": ", ".join(calibration.times.calibrated_on), **record_source(record, data)})


@check("gpu_recorded.board_decode_time", evidence="recorded",
       quantities=("predicted_token_sec", "bound", "memory_sec", "compute_sec", "host_sec", "ops", "read_bytes", "tokens_timed", *SOURCE),
       replay=record_contents)
def board_decode_time(record: str, step: str) -> Outcome:
    """The board's median seconds per generated token (one at a time, from the prefill's cache), beside ``infer
    --device``'s decode prediction priced by the record's own ceilings."""
    from resacct.account.gpu.timing.step_time import predict_decode_seconds

    data, entry, predicted = _served(record, step)
    decode = predict_decode_seconds(predicted.decode_ops, _rates(record, data, entry["weights"]), read_bytes=predicted.weight_bytes + predicted.kv_cache_bytes)
    return Outcome(measured=entry["decode_sec_per_token"]["median"], quantities={
        "predicted_token_sec": decode.token_sec, "bound": decode.bound, "memory_sec": decode.memory_sec, "compute_sec": decode.compute_sec,
        "host_sec": decode.host_sec, "ops": decode.ops, "read_bytes": decode.read_bytes, "tokens_timed": len(entry["decode_sec_per_token"]["all"]),
        **record_source(record, data)})
