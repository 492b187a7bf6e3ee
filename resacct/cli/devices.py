"""``resacct devices``: the accelerator table — dense and 2:4 sparse peaks per format, memory,
bandwidth, and each board's source (flagged where it is not the vendor's datasheet).
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._units import add_units_flag, unit_scale
from resacct.cli.compute import _add_command
from resacct.cli.output import emit
from resacct.errors import ResacctError

__all__ = ["register", "board_argument", "parse_boards_at_the_edge", "untraced_gpu_answer"]


def untraced_gpu_answer(board: Any, gap: str) -> tuple[dict[str, Any], str]:
    """``--device BOARD`` where no step is traced (a model given by its shape: the napkin path, which
    never imports torch): the ``gpu`` fields of ``--json`` (the keys of ``GpuStepAnswer.to_dict``) and the line."""
    fields = {"board": board.name, "predicted_allocated_peak_bytes": None, "predicted_reserved_peak_bytes": None, "attention": None,
              "calibration": None, "gap": gap, "predicted_step_sec": None, "step_time_basis": None}
    return fields, f"on {board.name} (CUDA caching allocator): no prediction — {gap}"


def board_argument(text: str) -> Any:
    """``--device NAME`` parsed once, at the command line's edge, into the datasheet table's
    :class:`~resacct.facts.hardware.Accelerator` (the typed object ``account`` and ``fit`` use); an
    unknown name is one line naming every board (argparse: exit 2, no traceback)."""
    from resacct.errors import UnknownNameError
    from resacct.facts.hardware import accelerators, get_accelerator

    try:
        return get_accelerator(text)
    except UnknownNameError as error:
        import difflib

        close = difflib.get_close_matches(text.strip().lower(), list(accelerators()), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not a board in resacct's table{hint}; expected one of {', '.join(accelerators())} "
                                         "(or an alias or CUDA name: resacct devices)") from None
    except ResacctError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_boards_at_the_edge(parser: argparse.ArgumentParser, adds: str | None = None) -> None:
    """Give ``parser``'s ``--device`` option :func:`board_argument` as its type: ``args.device`` is
    then an ``Accelerator`` (or None), parsed before anything is imported or traced. ``adds``: what
    a board adds to the command's answer, appended to the option's help."""
    action = parser._option_string_actions["--device"]
    action.type = board_argument
    if adds:
        action.help = f"{action.help}; {adds}"


def _device_fields(board: Any) -> dict[str, Any]:
    return {
        "name": board.name,
        "display_name": board.display_name,
        "family": board.family,
        "compute_capability": None if board.compute_capability is None else "{}.{}".format(*board.compute_capability),
        "memory_bytes": board.memory_bytes,
        "memory_bandwidth_bytes_per_sec": board.memory_bandwidth_bytes_per_sec,
        "peaks_flops_per_sec": {fmt: {"dense": peak.dense_flops_per_sec, "sparse": peak.sparse_flops_per_sec} for fmt, peak in board.peaks.items()},
        "peak_confidence": {fmt: board.peak_confidence(fmt) for fmt in board.peaks},
        "bf16_dense_intensity_flops_per_byte": board.peaks["bf16"].dense_flops_per_sec / board.memory_bandwidth_bytes_per_sec if "bf16" in board.peaks else None,
        "aliases": list(board.aliases),
        "cuda_names": list(board.cuda_names),
        "source": board.source,
        "confidence": board.confidence,
        "note": board.note,
        "tdp_watts": board.tdp_watts,
        "tdp_source": board.tdp_source or None,
        "multiprocessors": board.multiprocessors,
        "multiprocessors_source": board.multiprocessors_source or None,
    }


def _step_time_model(board: Any) -> str:
    """What prices a step's time on ``board`` in the ``--device`` answers (board_rates.step_seconds): a calibration (its own
    record's, or one of its compute capability moved to it), else the per-op roofline on its record's or datasheet's rates."""
    from resacct.account.gpu.records.record_calibration import calibration_for

    calibration = calibration_for(board)
    if calibration is not None:
        return calibration.source()
    return "the per-op roofline on the board's rates (no calibrated record of this board or of its compute capability is committed)"


def _tera(board: Any, fmt: str, sparse: bool = False) -> str:
    peak = board.peaks.get(fmt)
    value = None if peak is None else (peak.sparse_flops_per_sec if sparse else peak.dense_flops_per_sec)
    if value is None:
        return "—"
    # a peak less certain than its board's entry is marked: * third-party, † derived
    mark = {"third-party": "*", "derived": "†"}.get(board.peak_confidence(fmt), "") if peak.confidence else ""
    return f"{value / 1e12:g}{mark}"


def _other_peaks(board: Any) -> str:
    """Formats the columns leave out (int8, fp4, fp64), with their dense peaks."""
    shown = [f"{fmt} {_tera(board, fmt)}" for fmt in ("int8", "fp4", "fp64") if fmt in board.peaks]
    return ", ".join(shown) if shown else "—"


def _short_source(source: str) -> str:
    """The datasheet's name, without the column and footnotes that follow it."""
    cut = min((index for index in (source.find(mark) for mark in (",", "(", ":")) if index > 0), default=len(source))
    return source[:cut].strip()


def _run_devices(args: argparse.Namespace) -> int:
    from resacct.facts.hardware import accelerators, get_accelerator

    if args.name is not None and not args.name.strip():
        raise ResacctError(f"accelerator name {args.name!r} is empty; give a name such as h100, or none to list every board")
    boards = [get_accelerator(args.name)] if args.name else list(accelerators().values())
    fields: dict[str, Any] = {"devices": [_device_fields(board) for board in boards]}
    if args.name:  # one board: what its --device answers price a step's time by (its record's calibration, one moved to it, or none)
        fields["devices"][0]["step_time_model"] = _step_time_model(boards[0])
    scale, unit = unit_scale(args.units)
    header = (f"{'name':<15}{'memory ' + unit:>10}{'TB/s':>7}{'fp32':>7}{'tf32':>8}{'bf16':>8}{'bf16 2:4':>9}{'fp16':>7}{'fp8':>7}{'fp8 2:4':>8}"
              f"{'FLOP/B':>8}{'TDP W':>7}  {'int8, fp4, fp64':<26}  source")
    lines = ["peaks in TFLOP/s (dense; 2:4 = structured sparsity; * a third-party figure in an entry otherwise better sourced); "
             "FLOP/B = bf16 dense peak ÷ bandwidth (fp16 where a board has no bf16); TDP W = board power, the default power of run/time energy", header]
    for board in boards:
        matrix_16 = board.peaks.get("bf16") or board.peaks.get("fp16")
        intensity = f"{matrix_16.dense_flops_per_sec / board.memory_bandwidth_bytes_per_sec:.0f}" if matrix_16 else "—"
        flag = f" {board.flag}" if board.flag else ""
        lines.append(f"{board.name:<15}{board.memory_bytes / scale:>10.6g}{board.memory_bandwidth_bytes_per_sec / 1e12:>7g}{_tera(board, 'fp32'):>7}"
                     f"{_tera(board, 'tf32'):>8}{_tera(board, 'bf16'):>8}{_tera(board, 'bf16', True):>9}{_tera(board, 'fp16'):>7}{_tera(board, 'fp8'):>7}"
                     f"{_tera(board, 'fp8', True):>8}{intensity:>8}{'—' if board.tdp_watts is None else f'{board.tdp_watts:g}':>7}  "
                     f"{_other_peaks(board):<26}  {_short_source(board.source)}{flag}")
    if args.name:
        lines += [f"  {key}: {value}" for key, value in _device_fields(boards[0]).items()
                  if key in ("display_name", "compute_capability", "multiprocessors", "multiprocessors_source", "cuda_names", "source", "note",
                             "tdp_source") and value]
        lines.append(f"  step_time_model: {fields['devices'][0]['step_time_model']}")
    return emit(args, fields, "\n".join(lines))


def register(subparsers: argparse._SubParsersAction) -> None:
    devices = _add_command(subparsers, "devices", "the accelerator table: peaks per format (dense and 2:4 sparse), memory, bandwidth, sources",
                           "resacct devices   |   resacct devices h100 --json")
    devices.add_argument("name", nargs="?", help="show one accelerator (name, alias or CUDA name)")
    add_units_flag(devices)
    devices.set_defaults(run=_run_devices)
