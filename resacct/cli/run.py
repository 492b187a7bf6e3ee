"""``resacct run``: a whole training run from any ONE of its rates — MFU, HFU, tokens/s per device,
TFLOP/s per device, wall-clock days or device-hours — with every other one derived, the FLOP
convention named, the peak it is relative to, cost and goodput.

FLOPs follow the active parameters (``--active-params`` for a mixture of experts), memory the total
(``--params``). ``--convention attention`` adds PaLM's 12·L·h·s (needs ``--layers --attention-width
--seq``, or ``--hf-config NAME --seq``); ``--recompute full`` counts the recomputed forward for HFU
(Megatron's 8·N·D with the 6nd convention). Goodput is the share of the wall clock that trains;
device-hours (and cost) are billed on the wall clock.

Energy and emissions follow the device-hours: × the board's TDP ('resacct devices'; --power-watts
for a measured average) × PUE → MWh; × the grid's carbon intensity (location-based) → tCO2eq. The
defaults are LLaMA's convention (PUE 1.1, the US average 0.385 kg CO2eq/kWh; Touvron et al. 2023).

A run answers what its inputs allow: --device-hours (or --days with --devices) alone gives the wall
clock, cost, energy and emissions, without tokens, FLOPs or MFU.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from resacct.cli._energy import add_energy_arguments, energy_fields, energy_lines
from resacct.cli.arguments import count, fraction, non_negative_float, positive_float, positive_int
from resacct.cli.output import add_json_flag, amount_text, count_text, days_text, emit, ratio_text, with_caveat
from resacct.errors import ResacctError

__all__ = ["register"]

#: flag → (the quantity it gives, its scale to the formula's unit)
_RATE_FLAGS = {"mfu": ("mfu", 1.0), "hfu": ("hfu", 1.0), "tokens_per_sec_per_device": ("tokens_per_sec_per_device", 1.0),
               "tflops_per_device": (None, 1e12), "days": ("days", 1.0), "device_hours": ("device_hours", 1.0)}
#: formats whose peak a training MFU may be quoted against (the board's table lists some of them)
_TRAINING_FORMATS = ("tf32", "bf16", "fp16", "fp8", "fp4")


def _model(args: argparse.Namespace) -> tuple[float, float, int | None, int | None, str]:
    """(total parameters, active parameters, layers, attention width, where they came from)."""
    layers, width = args.layers, args.attention_width
    if args.hf_config is not None:
        if args.params is not None or args.active_params is not None:
            raise ResacctError("give --hf-config NAME or --params (with --active-params), not both")
        from resacct.account.load.meta_facts import meta_model_facts

        facts = meta_model_facts(args.hf_config)  # the model built on meta: any model_type transformers builds
        return (float(facts.parameters), float(facts.active_parameters), layers or facts.layers,
                width or facts.attention_width, f"--hf-config {args.hf_config} ({facts.source}; {facts.model_class} built on the meta device)")
    if args.trace_all_layers:
        raise ResacctError("--trace-all-layers applies to --hf-config (a stack of decoder layers); expected --hf-config NAME with it")
    if args.params is None:
        raise ResacctError("give --params N (total parameters; --active-params for a mixture of experts) or --hf-config NAME")
    active = args.active_params if args.active_params is not None else args.params
    if active > args.params:
        raise ResacctError(f"--active-params {active:g} is more than --params {args.params:g}; "
                           "expected the parameters one token runs through, at most the total")
    return args.params, active, layers, width, "--params"


def _given(args: argparse.Namespace) -> tuple[str, float]:
    chosen = [flag for flag in _RATE_FLAGS if getattr(args, flag) is not None]
    if len(chosen) != 1:
        flags = ", ".join("--" + flag.replace("_", "-") for flag in _RATE_FLAGS)
        said = f" (got {', '.join('--' + flag.replace('_', '-') for flag in chosen)})" if chosen else ""
        raise ResacctError(f"give exactly one of {flags}{said}")
    flag = chosen[0]
    quantity, scale = _RATE_FLAGS[flag]
    if quantity is None:
        quantity = f"{args.tflops_count}_flops_per_sec_per_device"
    return quantity, getattr(args, flag) * scale


def _peak(args: argparse.Namespace) -> tuple[float, Any, str]:
    if args.peak is not None:
        if args.device is not None:
            raise ResacctError("give --peak FLOP/S or --device NAME (with --dtype), not both")
        return args.peak, None, "custom"
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec, peak_format

    board = get_accelerator(args.device or "h100-sxm")
    return peak_flops_per_sec(board, args.dtype), board, peak_format(args.dtype)


def _flops(args: argparse.Namespace, active: float, layers: int | None, width: int | None) -> Any:
    from resacct.formulas.run_accounting import flops_per_token

    if args.convention == "6nd":
        if args.recompute == "selective":
            raise ResacctError("--recompute selective recomputes the attention core, which --convention 6nd does not count; "
                               "use --convention attention (with --layers --attention-width --seq)")
        return flops_per_token(active, recompute=args.recompute)
    missing = [flag for flag, value in (("--layers", layers), ("--attention-width", width), ("--seq", args.seq)) if value is None]
    if missing:
        raise ResacctError(f"--convention attention (6·N + 12·L·h·s) needs {', '.join(missing)} (or --hf-config NAME for L and h)")
    return flops_per_token(active, layers=layers, attention_width=width, seq=args.seq, recompute=args.recompute)


def _fields(args: argparse.Namespace, run: Any, total: float, source: str, board: Any, dtype: str, given: str) -> dict[str, Any]:
    from resacct.facts.hardware import peak_flops_per_sec

    recipe = args.recipe
    by_format = {}
    if board is not None:
        by_format = {fmt: float(run.mfu_against(peak_flops_per_sec(board, fmt))) for fmt in _TRAINING_FORMATS if fmt in board.peaks}
    cost = run.cost
    return {
        "model_source": source, "parameters_total": total, "parameters_active": float(run.flops.active_parameters),
        "flop_convention": run.flops.convention, "flop_formula": run.flops.formula, "recompute": run.flops.recompute,
        "attention_flops_per_token": float(run.flops.attention_flops), "model_flops_per_token": float(run.flops.model_flops),
        "hardware_flops_per_token": float(run.flops.hardware_flops), "tokens": float(run.tokens),
        "model_flops": float(run.model_flops), "hardware_flops": float(run.hardware_flops),
        "device": board.name if board is not None else None, "devices": run.devices, "peak_format": dtype,
        "peak_flops_per_sec": float(run.peak_flops_per_sec), "given": given,
        "mfu": float(run.mfu), "hfu": float(run.hfu), "above_peak": run.hfu > 1, "mfu_by_peak_format": by_format,
        "goodput": float(run.goodput), "mfu_over_wall_clock": float(run.mfu_over_wall_clock),
        "tokens_per_sec_per_device": float(run.tokens_per_sec_per_device),
        "model_flops_per_sec_per_device": float(run.model_flops_per_sec_per_device),
        "hardware_flops_per_sec_per_device": float(run.hardware_flops_per_sec_per_device),
        "training_seconds": float(run.training_seconds), "wall_clock_seconds": float(run.wall_clock_seconds),
        "days": float(run.days), "device_hours": float(run.device_hours),
        "cost_per_device_hour": None if run.cost_per_device_hour is None else float(run.cost_per_device_hour),
        "cost": None if cost is None else float(cost),
        "recipe": recipe.alias or recipe.name, "training_state_bytes": total * recipe.bytes_per_parameter(),
    }


def _text(fields: dict[str, Any]) -> str:
    where = f"{count_text(fields['devices'])} × {fields['device'] or 'custom'} ({fields['peak_format']} dense peak {fields['peak_flops_per_sec'] / 1e12:g} TFLOP/s)"
    moe = fields["parameters_active"] != fields["parameters_total"]
    params = (f"{fields['parameters_total']:.4g} parameters, {fields['parameters_active']:.4g} active per token" if moe
              else f"{fields['parameters_total']:.4g} parameters")
    lines = [
        f"{params}; {fields['tokens']:.4g} tokens on {where}; given: {fields['given']}",
        f"  FLOPs per token ({fields['flop_convention']}: {fields['flop_formula']}): model {fields['model_flops_per_token']:.4g}, "
        f"hardware {fields['hardware_flops_per_token']:.4g}",
        f"  training FLOPs: model {fields['model_flops']:.4g}, hardware {fields['hardware_flops']:.4g}",
        f"  MFU {ratio_text(fields['mfu'])} · HFU {ratio_text(fields['hfu'])} (vs the {fields['peak_format']} peak)"
        + (f" · over the wall clock (goodput {fields['goodput']:g}): {ratio_text(fields['mfu_over_wall_clock'])}" if fields["goodput"] < 1 else ""),
    ]
    others = {fmt: value for fmt, value in fields["mfu_by_peak_format"].items() if fmt != fields["peak_format"]}
    if others:
        lines.append("  the same run's MFU against the board's other peaks: " + ", ".join(f"{fmt} {ratio_text(v)}" for fmt, v in others.items()))
    lines += [
        f"  per device: {fields['tokens_per_sec_per_device']:.4g} tokens/s, {fields['model_flops_per_sec_per_device'] / 1e12:.4g} model TFLOP/s, "
        f"{fields['hardware_flops_per_sec_per_device'] / 1e12:.4g} hardware TFLOP/s",
        f"  wall clock: {_days_and_hours(fields['days'])}; {amount_text(fields['device_hours'], 'device-hours')}",
    ]
    if fields["cost"] is not None:
        lines.append(f"  cost: {amount_text(fields['cost'], '')} at {fields['cost_per_device_hour']:g} per device-hour".replace("  at", " at"))
    lines += energy_lines(fields, fields["device_hours"])
    lines.append(f"  training state ({fields['recipe']}, total parameters): {amount_text(fields['training_state_bytes'], 'bytes')}")
    if fields["above_peak"]:
        lines.append("  above the peak: an input is wrong (tokens? devices? the peak's format?)")
    return "\n".join(lines)


def _days_and_hours(days: float | None) -> str:
    """Days and hours to four significant digits (a figure quoted to three can be checked against it)."""
    if days is None:
        return "unknown without --devices"
    if not math.isfinite(days) or days <= 0:
        return days_text(days)
    return f"{days:.4g} days ({days * 24:.4g} hours)"


def _flag_of(given: str) -> str:
    return "--" + ("tflops_per_device" if given.endswith("_flops_per_sec_per_device") else given).replace("_", "-")


def _peak_caveat(fields: dict[str, Any], text: str, board: Any, dtype: str) -> str:
    """with_caveat, and a line where the one peak used is less certain than its board."""
    text = with_caveat(fields, text, board)
    if board is not None and board.confidence != "third-party" and board.peak_confidence(dtype) == "third-party":
        note = f"note: {board.name}'s {dtype} peak is from third-party pages, unconfirmed by the vendor (sources: resacct devices {board.name})"
        fields["source_caveat"] = note
        text = f"{text.rstrip()}\n  {note}"
    return text


def _run_device_time(args: argparse.Namespace, given: str, value: float) -> int:
    """``run`` without ``--tokens``: what device time alone answers (wall clock, cost, energy)."""
    from resacct.facts.hardware import get_accelerator
    from resacct.formulas.run_accounting import account_device_time

    if given not in ("days", "device_hours"):
        raise ResacctError(f"{_flag_of(given)} needs --tokens (a rate gives a time only for a number of tokens); "
                           "without tokens give --device-hours, or --days with --devices")
    if args.peak is not None and args.device is not None:
        raise ResacctError("give --peak FLOP/S or --device NAME (with --dtype), not both")
    board = None if args.peak is not None else get_accelerator(args.device or "h100-sxm")
    time = account_device_time(given=given, value=value, devices=args.devices, goodput=args.goodput,
                               cost_per_device_hour=args.cost_per_device_hour)
    flag = f"{_flag_of(given)} {value:g}"
    device_hours = _finite_float("device-hours", time.device_hours, flag)
    fields: dict[str, Any] = {
        "given": given, "tokens": None, "mfu": None, "device": board.name if board is not None else None, "devices": time.devices,
        "device_hours": device_hours, "days": None if time.days is None else _finite_float("wall clock", time.days, flag),
        "wall_clock_seconds": None if time.wall_clock_seconds is None else _finite_float("wall clock", time.wall_clock_seconds, flag),
        "goodput": float(time.goodput),
        "cost_per_device_hour": None if time.cost_per_device_hour is None else float(time.cost_per_device_hour),
        "cost": None if time.cost is None else _finite_float("cost", time.cost, flag),
    }
    fields.update(energy_fields(time.device_hours, board, args, flag))
    where = f"{count_text(time.devices)} × " if time.devices is not None else ""
    lines = [f"{amount_text(device_hours, 'device-hours')} on {where}{board.name if board is not None else 'a custom device'}; given: {given} "
             "(no --tokens: no FLOPs, no MFU)",
             f"  wall clock: {_days_and_hours(fields['days'])}"]
    if fields["cost"] is not None:
        lines.append(f"  cost: {amount_text(fields['cost'], '').rstrip()} at {fields['cost_per_device_hour']:g} per device-hour")
    lines += energy_lines(fields, device_hours)
    return emit(args, fields, with_caveat(fields, "\n".join(lines), board))


def _finite_float(name: str, value: Any, flag: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ResacctError(f"{flag} makes the run's {name} larger than a float holds (above 1.8e308); "
                           "expected a run a cluster could take") from None


def _run(args: argparse.Namespace) -> int:
    from resacct.formulas.run_accounting import account_run

    given, value = _given(args)
    if args.tokens is None:
        return _run_device_time(args, given, value)
    if args.devices is None:
        raise ResacctError("--tokens needs --devices (the number of devices the run trains on)")
    total, active, layers, width, source = _model(args)
    peak, board, dtype = _peak(args)
    flops = _flops(args, active, layers, width)
    run = account_run(flops, tokens=args.tokens, devices=args.devices, peak_flops_per_sec=peak, given=given, value=value,
                      goodput=args.goodput, cost_per_device_hour=args.cost_per_device_hour)
    flag = f"{_flag_of(given)} {value:g}"
    try:
        fields = _fields(args, run, total, source, board, dtype, given)
    except OverflowError:
        raise ResacctError(f"{flag} makes this run's rates larger than a float holds (above 1.8e308: an MFU, a FLOP rate, "
                           "the wall clock); expected a rate or a time a cluster could reach") from None
    fields.update(energy_fields(run.device_hours, board, args, flag))
    text = _text(fields)
    if args.hf_config is not None:
        fields["traced"] = _traced_model(args)
        text += "\n" + _traced_lines(fields["traced"], fields)
    return emit(args, fields, _peak_caveat(fields, text, board, dtype))


def _traced_model(args: argparse.Namespace) -> dict[str, Any]:
    """The --hf-config model as the meta trace counts it, beside resacct's closed forms for its family (None: no family formula)."""
    from resacct.account.load.meta_facts import meta_model_facts

    facts = meta_model_facts(args.hf_config)
    seq = args.seq or min(facts.positions or 2048, 2048)
    step_flops, layers_note = facts.step_flops(seq=seq, layers="all" if args.trace_all_layers else "auto")
    return {"model_class": facts.model_class, "parameters": facts.parameters, "active_parameters": facts.active_parameters,
            "formula_parameters": facts.formula_parameters, "formula_active_parameters": facts.formula_active_parameters,
            "seq": seq, "step_flops_per_token": step_flops / seq,
            "step_flops_per_token_basis": "FlopCounterMode over a forward and backward of one sequence on the meta device (matmuls, attention included)",
            "layers": layers_note}


def _traced_lines(traced: dict[str, Any], fields: dict[str, Any]) -> str:
    formula = ("" if traced["formula_parameters"] is None else
               f"; closed form {traced['formula_parameters']:.6g} total, {traced['formula_active_parameters']:.6g} active")
    return (f"  traced ({traced['model_class']} on meta): {traced['parameters']:.6g} parameters, {traced['active_parameters']:.6g} active per token"
            f"{formula}\n  traced FLOPs per token (forward + backward, one sequence of {traced['seq']}): {traced['step_flops_per_token']:.4g} "
            f"({traced['step_flops_per_token'] / fields['model_flops_per_token']:.3f}× the {fields['flop_convention']} figure)"
            f"\n  layers: {traced['layers']}")


def register(subparsers: argparse._SubParsersAction) -> None:
    from resacct.cli._recipes import recipe_type
    from resacct.facts.recipes import parse_recipe

    parser = subparsers.add_parser(
        "run", help="a whole training run from any one rate: MFU/HFU, tokens/s or TFLOP/s per device, days, device-hours; cost",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  resacct run --params 671B --active-params 37B --tokens 14.8T --devices 2048 --device h800 --dtype fp8 --device-hours 2.664M --cost-per-device-hour 2\n"
               "  resacct run --params 540.35B --tokens 780B --devices 6144 --device tpu-v4 --convention attention --layers 118 --attention-width 12288 --seq 2048 --mfu 0.462\n"
               "  resacct run --hf-config mixtral-8x7b --tokens 1T --devices 512 --tokens-per-sec-per-device 3000 --goodput 0.9\n"
               "  resacct run --device-hours 30.84M --device h100 --pue 1.1 --carbon-intensity 0.385   (energy and emissions, no tokens)")
    add_json_flag(parser)
    model = parser.add_argument_group("model")
    model.add_argument("--params", type=count, help="total parameters N (memory follows these)")
    model.add_argument("--active-params", type=count, help="parameters one token runs through (a mixture of experts; default: --params)")
    model.add_argument("--hf-config", metavar="NAME", help="total and active parameters, layers and attention width from a shipped config or a config.json")
    model.add_argument("--convention", choices=("6nd", "attention"), default="6nd",
                       help="FLOPs per token: 6nd = 6·N_active; attention = 6·N + 12·L·h·s, PaLM App. B (default: 6nd)")
    model.add_argument("--layers", type=positive_int, help="layers L (for --convention attention)")
    model.add_argument("--attention-width", type=positive_int, help="h = attention heads × head width (for --convention attention)")
    model.add_argument("--seq", type=positive_int, help="sequence length s (for --convention attention)")
    model.add_argument("--trace-all-layers", action="store_true",
                       help="with --hf-config: trace every decoder layer for the traced FLOPs per token (default: a stack of more than "
                            "16 identical layers is traced at depths 3, 4 and 5 and extrapolated, checked on the third depth)")
    model.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                       help="what recomputation executes again, for HFU: selective = 4·L·h·s, full = 2·N (+ 4·L·h·s) (default: none)")
    model.add_argument("--recipe", type=recipe_type, default=parse_recipe("mixed-adam"), metavar="NAME",
                       help="precision recipe (or w+g+k bytes) for the training-state bytes of the total parameters (default: mixed-adam)")
    hardware = parser.add_argument_group("hardware")
    hardware.add_argument("--tokens", type=count, help="training tokens D (without them: wall clock, cost and energy from --device-hours or --days)")
    hardware.add_argument("--devices", type=positive_int, help="number of devices (needed with --tokens, and for days from device-hours)")
    hardware.add_argument("--device", default=None, metavar="NAME", help="accelerator (see 'resacct devices'; default: h100-sxm unless --peak)")
    hardware.add_argument("--dtype", default="bf16", help="format whose dense peak MFU is relative to: tf32, bf16, fp16, fp8, fp4 (default: bf16)")
    hardware.add_argument("--peak", type=count, metavar="FLOP/S", help="a custom dense peak per device instead of the table's")
    rate = parser.add_argument_group("the one rate given (exactly one)")
    rate.add_argument("--mfu", type=fraction, help="model FLOPs utilization in (0, 1]")
    rate.add_argument("--hfu", type=fraction, help="hardware FLOPs utilization in (0, 1] (recomputation counted)")
    rate.add_argument("--tokens-per-sec-per-device", type=count, help="training throughput per device")
    rate.add_argument("--tflops-per-device", type=positive_float, help="achieved TFLOP/s per device (what it counts: --tflops-count)")
    rate.add_argument("--tflops-count", choices=("model", "hardware"), default="model",
                      help="whether --tflops-per-device counts model FLOPs or hardware FLOPs (with recomputation, as Megatron's X) (default: model)")
    rate.add_argument("--days", type=positive_float, help="wall-clock days")
    rate.add_argument("--device-hours", type=count, help="device-hours billed (devices × wall-clock hours)")
    money = parser.add_argument_group("wall clock and cost")
    money.add_argument("--goodput", type=fraction, default=1.0, help="share of the wall clock that trains, in (0, 1] (default: 1)")
    money.add_argument("--cost-per-device-hour", type=non_negative_float, metavar="PRICE", help="price of one device-hour (e.g. 2 for $2)")
    add_energy_arguments(parser)
    parser.set_defaults(run=_run)
