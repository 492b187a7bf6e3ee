"""Compute commands: ``flops``, ``time``, ``fit``, ``mfu``, ``roofline`` (``devices``: :mod:`resacct.cli.devices`).

Each prints text, or with ``--json`` one object whose field names carry their units.
Bad sizes (zero, negative, NaN), an MFU outside (0, 1] and unknown devices are refused with one
line ``resacct <command>: error: …`` and exit status 2.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from resacct.cli._energy import add_energy_arguments, energy_fields, energy_lines
from resacct.cli.arguments import at_least_one, count, fraction, gigabytes, positive_float, positive_int
from resacct.cli.output import add_json_flag, amount_text, count_text, days_text, emit, with_caveat
from resacct.errors import ResacctError

__all__ = ["register"]

_FORMATTER = argparse.RawDescriptionHelpFormatter


def _add_command(subparsers: argparse._SubParsersAction, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=summary, epilog=f"example:\n  {example}", formatter_class=_FORMATTER)
    add_json_flag(parser)
    return parser


def _add_device_arguments(parser: argparse.ArgumentParser, *, default_device: str | None = "h100-sxm") -> None:
    parser.add_argument("--device", default=default_device, metavar="NAME",
                        help=f"accelerator name, alias or CUDA name (see 'resacct devices'; default: {default_device})")
    parser.add_argument("--dtype", default="bf16", help="format of the peak: fp64, fp32, tf32, bf16, fp16, fp8, int8 (default: bf16)")
    parser.add_argument("--sparse", action="store_true", help="use the 2:4 structured-sparsity peak (dense training cannot)")


def _g(value: float) -> str:
    return f"{value:.4g}"


# ---------------------------------------------------------------------------------------------
# flops


def _run_flops(args: argparse.Namespace) -> int:
    from resacct.formulas.napkin import compare_to_thresholds, training_flops

    total = training_flops(args.params, args.tokens, args.flops_per_token_per_param)
    comparisons = compare_to_thresholds(total)
    fields = {
        "parameters": args.params,
        "tokens": args.tokens,
        "flops_per_token_per_parameter": args.flops_per_token_per_param,
        "training_flops": total,
        "thresholds": [
            {"name": c.threshold.name, "threshold_flops": c.threshold.threshold_flops, "ratio": c.ratio,
             "above": c.above, "in_force": c.threshold.in_force}
            for c in comparisons
        ],
    }
    lines = [f"training FLOPs = {_g(args.flops_per_token_per_param)} × {_g(args.params)} parameters × {_g(args.tokens)} tokens = {total:.4g} FLOPs"]
    for c in comparisons:
        state = "in force" if c.threshold.in_force else "revoked"
        lines.append(f"  {c.threshold.name} ({c.threshold.threshold_flops:.0e} FLOPs, {state}): {c.ratio:.3g}× — {'at or above' if c.above else 'below'}")
    return emit(args, fields, "\n".join(lines))


# ---------------------------------------------------------------------------------------------
# time


def _total_flops(args: argparse.Namespace) -> float:
    from resacct.formulas.napkin import training_flops

    if args.flops is not None:
        if args.params is not None or args.tokens is not None:
            raise ResacctError("give either --flops, or --params and --tokens, not both")
        return args.flops
    if args.params is None or args.tokens is None:
        raise ResacctError("give --params and --tokens (training FLOPs = 6 × params × tokens), or --flops")
    return training_flops(args.params, args.tokens)


def _run_time(args: argparse.Namespace) -> int:
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec, peak_format
    from resacct.formulas.napkin import training_time

    board = get_accelerator(args.device)
    peak = peak_flops_per_sec(board, args.dtype, sparse=args.sparse)
    estimate = training_time(_total_flops(args), args.devices, peak, args.mfu)
    fields = {
        "training_flops": estimate.total_flops,
        "devices": estimate.devices,
        "device": board.name,
        "dtype": peak_format(args.dtype),
        "sparse": args.sparse,
        "peak_flops_per_sec": peak,
        "mfu": estimate.mfu,
        "flops_per_day": estimate.flops_per_day,
        "training_days": estimate.training_days,
        "wall_clock_hours": estimate.training_days * 24,
        "device_hours": estimate.device_hours,
    }
    fields.update(energy_fields(estimate.device_hours, board, args, "the inputs"))
    mode = "sparse" if args.sparse else "dense"
    text = (
        f"{estimate.total_flops:.4g} FLOPs on {count_text(estimate.devices)} × {board.name} ({args.dtype} {mode} peak {peak / 1e12:g} TFLOP/s) at MFU {estimate.mfu:g}\n"
        f"  FLOPs per day: {amount_text(estimate.flops_per_day, '').rstrip()}\n"
        f"  training time: {days_text(estimate.training_days)} ({amount_text(estimate.device_hours, 'device-hours')})\n"
        + "\n".join(energy_lines(fields, estimate.device_hours))
    )
    return emit(args, fields, with_caveat(fields, text, board))


# ---------------------------------------------------------------------------------------------
# fit


def _run_fit(args: argparse.Namespace) -> int:
    if args.hf_config is not None or args.model is not None:
        from resacct.cli._model_fit import run_model_fit

        return run_model_fit(args)
    model_flags = [flag for flag, used in (("--search", args.search != "batch"), ("--batch", args.batch != 1), ("--seq", args.seq is not None),
                                           ("--grad-accum", args.grad_accum != 1), ("--reserve-gb", args.reserve_gb != 0.0),
                                           ("--input-shape", args.input_shape is not None), ("--model-arg", bool(args.model_arg)),
                                           ("--max-batch", args.max_batch is not None), ("--timeout", args.timeout is not None),
                                           ("--no-cache", args.no_cache), ("--trace-all-layers", args.trace_all_layers)) if used]
    if model_flags:
        raise ResacctError(f"{', '.join(model_flags)} search a real model's step: give --hf-config NAME or --model module:factory "
                           "(without one, resacct fit answers the largest model from bytes per parameter)")
    from resacct.cli._recipes import chosen_recipe, parameters_in_words, zero_words
    from resacct.facts.hardware import get_accelerator
    from resacct.facts.recipes import DEFAULT_ZERO_STAGE
    from resacct.formulas.sharding import largest_model_parameters

    if (args.memory_gb is None) == (args.device is None):
        raise ResacctError("give exactly one of --memory-gb (per device) or --device NAME")
    if args.recipe is not None and args.bytes_per_param is not None:
        raise ResacctError("give either --recipe or --bytes-per-param, not both")
    board = get_accelerator(args.device) if args.device else None
    memory_bytes = board.memory_bytes if board else args.memory_gb * 1e9
    zero_is_default = args.zero is None
    zero = DEFAULT_ZERO_STAGE if zero_is_default else args.zero
    if args.recipe is not None:
        chosen = chosen_recipe(args)
        bytes_per_param = chosen.sharding.total_bytes_per_parameter
        largest = largest_model_parameters(memory_bytes, args.devices, chosen.sharding, zero)
        recipe_name, moment, recipe_text = chosen.sharding.name, chosen.sharding.moment, chosen.recipe_words()
    else:
        bytes_per_param = args.bytes_per_param if args.bytes_per_param is not None else 16.0
        if zero in (1, 2):
            raise ResacctError(f"--zero {zero} shards only part of the state: give --recipe (e.g. fp32-adamw, mixed-adam, or '4+4+8') "
                               "so resacct knows the parameter, gradient and optimizer-state bytes")
        largest = (args.devices if zero == 3 else 1) * memory_bytes / bytes_per_param
        recipe_name, moment, recipe_text = None, None, f"{_g(bytes_per_param)} bytes/parameter"
    fields = {
        "devices": args.devices,
        "device": board.name if board else None,
        "memory_bytes_per_device": memory_bytes,
        "total_memory_bytes": args.devices * memory_bytes,
        "bytes_per_parameter": bytes_per_param,
        "recipe": recipe_name,
        "moment": moment,
        "zero_stage": zero,
        "zero_stage_is_default": zero_is_default,
        "max_parameters": largest,
    }
    from resacct.cli._units import gigabytes_text

    memory_text = gigabytes_text(memory_bytes, args.units)
    where = memory_text if not board else board.name if args.units == "decimal" else f"{board.name} ({memory_text})"
    text = (f"{count_text(args.devices)} × {where}, {zero_words(zero, zero_is_default)}\n  recipe: {recipe_text}\n"
            f"  largest model: {parameters_in_words(largest)} ({amount_text(largest, 'parameters')}), before activations")
    return emit(args, fields, with_caveat(fields, text, board))


# ---------------------------------------------------------------------------------------------
# mfu


def _run_mfu(args: argparse.Namespace) -> int:
    from resacct.cli._mfu import run_mfu

    return run_mfu(args)


# ---------------------------------------------------------------------------------------------
# roofline

# Element-wise operations touch at least as many bytes as the copy that measured the memory roof
# (out of the last-level cache by default); caches are a higher roof that small sizes would hit.
_MEASURED_OPERATIONS = {
    False: [("copy", 2**24), ("add", 2**24), ("relu", 2**24), ("gelu", 2**24), ("matvec", 4096), ("matmul", 128), ("matmul", 512), ("matmul", 1024)],
    True: [("copy", 2**22), ("add", 2**22), ("relu", 2**22), ("gelu", 2**20), ("matvec", 2048), ("matmul", 64), ("matmul", 256)],
}
# On a GPU the element-wise sizes must exceed the L2 cache (50 MB on an H100).
_MEASURED_CUDA_OPERATIONS = {
    False: [("copy", 2**28), ("add", 2**28), ("relu", 2**28), ("gelu", 2**28), ("matvec", 16384), ("matmul", 512), ("matmul", 2048), ("matmul", 8192)],
    True: [("copy", 2**26), ("add", 2**26), ("relu", 2**26), ("gelu", 2**26), ("matvec", 8192), ("matmul", 256), ("matmul", 1024), ("matmul", 4096)],
}
_DATASHEET_OPERATIONS = [("add", 2**24), ("relu", 2**24), ("gelu", 2**24), ("matvec", 8192), ("matmul", 256), ("matmul", 1024), ("matmul", 8192)]


def _operation_flops_and_bytes(name: str, size: int, bytes_per_element: float) -> tuple[float, float]:
    from resacct.measurement.perf import ELEMENTWISE_OPERATIONS, matmul_bytes, matmul_flops

    if name in ("matmul", "matvec"):
        n = 1 if name == "matvec" else size
        return float(matmul_flops(size, size, n)), matmul_bytes(size, size, n, bytes_per_element)
    cost = ELEMENTWISE_OPERATIONS[name]
    return cost.flops_per_element * size, cost.tensors_moved * size * bytes_per_element


def _operation_row(name: str, size: int, flops: float, bytes_moved: float, roofline: Any, median_sec: float | None) -> dict[str, Any]:
    intensity = flops / bytes_moved
    return {
        "name": name,
        "size": size,
        "flops": flops,
        "bytes": bytes_moved,
        "intensity_flops_per_byte": intensity,
        "attainable_flops_per_sec": roofline.attainable_flops_per_sec(intensity) if intensity > 0 else 0.0,
        "achieved_flops_per_sec": flops / median_sec if median_sec else None,
        "achieved_bytes_per_sec": bytes_moved / median_sec if median_sec else None,
        "median_sec": median_sec,
        "bound": roofline.bound(intensity) if intensity > 0 else "memory",
    }


def _measured_roofline(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    from resacct.measurement.perf import measure_ceilings, measure_operation

    device, dtype = ("cuda", "bfloat16") if args.cuda else ("cpu", "float32")
    matmul_size, copy_bytes = (256, 16 * 2**20) if args.quick else (512, 64 * 2**20)
    operations = _MEASURED_OPERATIONS[args.quick]
    if args.cuda:
        matmul_size, copy_bytes = (4096, 2**28) if args.quick else (8192, 2**30)
        operations = _MEASURED_CUDA_OPERATIONS[args.quick]
    thread_count = args.threads or 1
    ceilings = measure_ceilings(device=device, dtype=dtype, matmul_size=matmul_size, copy_bytes=copy_bytes, thread_count=thread_count)
    roofline = ceilings.roofline
    rows = []
    for name, size in operations:
        measured = measure_operation(name, size, dtype=dtype, device=device, thread_count=thread_count)
        rows.append(_operation_row(name, size, measured.flops, measured.bytes_moved, roofline, measured.timing.median_sec))
    about = {"measured": True, "device": device, "threads": ceilings.threads, "matmul_size": ceilings.matmul_size, "copy_bytes": ceilings.copy_bytes}
    return roofline, rows, about


def _datasheet_roofline(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    from resacct.facts.hardware import format_bytes, get_accelerator
    from resacct.measurement.perf import Roofline

    board = get_accelerator(args.device)
    roofline = Roofline.of_accelerator(board, args.dtype, sparse=args.sparse)
    element = format_bytes(args.dtype)
    rows = [_operation_row(name, size, *_operation_flops_and_bytes(name, size, element), roofline, None) for name, size in _DATASHEET_OPERATIONS]
    return roofline, rows, {"measured": False, "device": board.name, "bytes_per_element": element, "board": board}


def _run_roofline(args: argparse.Namespace) -> int:
    if args.device is not None and (args.threads is not None or args.cuda):
        raise ResacctError("--device shows a datasheet roofline; --threads and --cuda are for measuring this machine")
    if args.device is None and args.sparse:
        raise ResacctError("--sparse applies to a datasheet roofline (--device NAME)")
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            raise ResacctError(f"--cuda: torch {torch.__version__} sees no CUDA GPU")
    if args.threads is not None and args.threads > (os.cpu_count() or 1):
        raise ResacctError(f"--threads {args.threads}: this machine has {os.cpu_count()} CPUs; expected 1 to {os.cpu_count()}")
    if args.png is not None:
        _check_png_target(args.png)  # before measuring, not after
    roofline, rows, about = _datasheet_roofline(args) if args.device else _measured_roofline(args)
    board = about.pop("board", None)
    if args.png:
        from resacct.measurement.perf import save_roofline_png

        points = [(f"{row['name']} {row['size']}", row["intensity_flops_per_byte"], row["achieved_flops_per_sec"] or row["attainable_flops_per_sec"])
                  for row in rows if row["intensity_flops_per_byte"] > 0]
        try:
            save_roofline_png(args.png, roofline, points)
        except OSError as error:
            raise ResacctError(f"--png {args.png!r} cannot be written: {error.strerror or error}") from None
    fields = {
        "roofline": {"name": roofline.name, "peak_flops_per_sec": roofline.peak_flops_per_sec,
                     "bandwidth_bytes_per_sec": roofline.bandwidth_bytes_per_sec,
                     "ridge_point_flops_per_byte": roofline.ridge_point_flops_per_byte, **about},
        "operations": rows,
        "png": args.png,
    }
    return emit(args, fields, with_caveat(fields, _roofline_text(roofline, rows, args.png), board))


_IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".eps", ".ps")
"""What matplotlib's Agg backend writes, by the file name's ending."""


def _check_png_target(path: str) -> None:
    from pathlib import Path

    if not path.strip():
        raise ResacctError(f"--png {path!r} is empty; give a file name such as 'roofline.png'")
    target = Path(path)
    folder = target.parent
    if not target.is_dir() and target.suffix.lower() not in _IMAGE_SUFFIXES:
        raise ResacctError(f"--png {path!r} does not end in an image format matplotlib writes ({', '.join(_IMAGE_SUFFIXES)}); "
                           f"give a file name such as {str(target.with_suffix('.png'))!r}")
    if target.is_dir():
        raise ResacctError(f"--png {path!r} is a directory; give a file name such as {str(target / 'roofline.png')!r}")
    if not folder.is_dir():
        raise ResacctError(f"--png {path!r}: folder {str(folder)!r} does not exist; create it first or give another path")


def _roofline_text(roofline: Any, rows: list[dict[str, Any]], png: str | None) -> str:
    lines = [
        f"roofline: {roofline.name}",
        f"  compute ceiling {roofline.peak_flops_per_sec:.4g} FLOP/s, memory ceiling {roofline.bandwidth_bytes_per_sec:.4g} bytes/s, "
        f"ridge point {roofline.ridge_point_flops_per_byte:.3g} FLOP/byte",
        "",
        f"  {'operation':<14}{'FLOP/byte':>11}{'attainable':>13}{'achieved':>13}{'bytes/s':>12}  bound",
    ]
    for row in rows:
        achieved = f"{row['achieved_flops_per_sec']:.3g}" if row["achieved_flops_per_sec"] else "—"
        bandwidth = f"{row['achieved_bytes_per_sec']:.3g}" if row["achieved_bytes_per_sec"] else "—"
        lines.append(f"  {row['name'] + ' ' + str(row['size']):<14}{row['intensity_flops_per_byte']:>11.3g}"
                     f"{row['attainable_flops_per_sec']:>13.3g}{achieved:>13}{bandwidth:>12}  {row['bound']}")
    if png:
        lines.append(f"\nwrote {png}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the compute commands to the ``resacct`` parser."""
    flops = _add_command(subparsers, "flops", "training FLOPs (6 × params × tokens) and how they compare with regulatory thresholds",
                         "resacct flops --params 70e9 --tokens 15T")
    flops.add_argument("--params", type=at_least_one, required=True, help="parameters N (70e9, 70B)")
    flops.add_argument("--tokens", type=at_least_one, required=True, help="training tokens D (15e12, 15T)")
    flops.add_argument("--flops-per-token-per-param", type=positive_float, default=6.0, help="6 for training (2 forward + 4 backward); 2 for inference")
    flops.set_defaults(run=_run_flops)

    time = _add_command(subparsers, "time", "training days and device-hours on a cluster at a given MFU",
                        "resacct time --params 70B --tokens 15T --devices 1024 --device h100 --dtype bf16 --mfu 0.5")
    time.add_argument("--params", type=at_least_one, help="parameters N")
    time.add_argument("--tokens", type=at_least_one, help="training tokens D")
    time.add_argument("--flops", type=count, help="total training FLOPs instead of --params/--tokens")
    time.add_argument("--devices", type=positive_int, required=True, help="number of devices")
    _add_device_arguments(time)
    time.add_argument("--mfu", type=fraction, default=0.5, help="model FLOPs utilisation in (0, 1] (default: 0.5)")
    add_energy_arguments(time)
    time.set_defaults(run=_run_time)

    fit = _add_command(subparsers, "fit", "the largest model whose training state fits — or, with --hf-config/--model, a real model's largest micro-batch",
                       "resacct fit --devices 8 --device h100 --bytes-per-param 16 --zero 3   |   resacct fit --devices 8 --device h100 --recipe mixed-adam --zero 1")
    fit.add_argument("--devices", type=positive_int, default=1, help="number of devices (default: 1)")
    fit.add_argument("--memory-gb", type=gigabytes, help="memory per device in GB (10^9 bytes)")
    fit.add_argument("--device", metavar="NAME", help="take the memory per device from the datasheet table")
    fit.add_argument("--bytes-per-param", type=positive_float, default=None, help="bytes per parameter of the training state (default 16: AdamW with fp32 state)")
    from resacct.cli._recipes import RECIPES_EPILOG, add_recipe_arguments

    add_recipe_arguments(fit, recipe_default=None)
    from resacct.cli._units import add_units_flag

    add_units_flag(fit)
    from resacct.cli._model_fit import MODEL_FIT_EXAMPLES, add_model_fit_arguments

    add_model_fit_arguments(fit.add_argument_group("a real model (--hf-config or --model): its largest micro-batch or sequence, "
                                                   "from the step's predicted peak"))
    fit.epilog = (fit.epilog or "") + "\n\n" + MODEL_FIT_EXAMPLES + "\n" + RECIPES_EPILOG
    fit.set_defaults(run=_run_fit, device_required=True)

    mfu = _add_command(subparsers, "mfu", "MFU (and HFU) of a training run from its step time, throughput or achieved FLOP/s per device",
                       "resacct mfu --params 7B --tokens 4M --step-time 12.5 --devices 64 --device h100\n"
                       "  resacct mfu --params 540.35B --tokens-per-sec 238.3k --devices 6144 --peak 275e12 --layers 118 --heads 48 --head-dim 256 --seq 2048\n"
                       "  resacct mfu --achieved-tflops 400 --device h100")
    from resacct.cli._mfu import add_mfu_arguments

    add_mfu_arguments(mfu)
    mfu.set_defaults(run=_run_mfu)

    roofline = _add_command(subparsers, "roofline", "this machine's measured roofline (or a datasheet's) and where common operations sit on it",
                            "resacct roofline --png roofline.png   |   resacct roofline --device h100 --dtype bf16")
    roofline.add_argument("--device", default=None, metavar="NAME", help="show a datasheet roofline instead of measuring this machine")
    roofline.add_argument("--dtype", default="bf16", help="with --device: the format of the peak (default: bf16)")
    roofline.add_argument("--sparse", action="store_true", help="with --device: the 2:4 structured-sparsity peak")
    roofline.add_argument("--threads", type=positive_int, default=None,
                          help="torch threads while measuring (default: 1 — steady numbers on a shared machine)")
    roofline.add_argument("--cuda", action="store_true", help="measure CUDA device 0 instead of the CPU")
    roofline.add_argument("--quick", action="store_true", help="smaller sizes: about a quarter of a second")
    roofline.add_argument("--png", metavar="PATH", help="also draw the roofline to PATH (matplotlib, Agg)")
    roofline.set_defaults(run=_run_roofline)

