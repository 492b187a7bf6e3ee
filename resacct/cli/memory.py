"""``resacct memory``: training-state memory per rank under a ZeRO stage, and what fits.

Parameters, gradients and optimizer state per rank for a model of ``--params`` parameters
trained with ``--recipe`` (bytes per parameter of each) over ``--devices`` data-parallel
ranks at ZeRO ``--zero`` stage 0–3. With ``--device`` or ``--device-memory-gb`` it also says
whether that fits and the largest model that would. Activations, temporary buffers,
communication buckets and fragmentation are not counted. The sharding arithmetic is checked
against torch's ZeroRedundancyOptimizer and FSDP in ``resacct/specs/sharding.claims.yaml``.
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._recipes import RECIPES_EPILOG, ChosenRecipe, add_recipe_arguments, chosen_recipe, parameters_in_words, zero_words
from resacct.cli._units import add_units_flag, unit_scale
from resacct.cli.arguments import count, gigabytes, positive_int
from resacct.cli.output import add_json_flag, emit
from resacct.errors import ResacctError
from resacct.formulas.sharding import SHARDED_PIECES, ZERO_STAGES, ShardingRecipe, fits_in_memory, get_sharding_recipe, largest_model_parameters, per_rank_bytes

__all__ = ["register", "run_memory", "memory_report"]

_EXAMPLES = """examples:
  resacct memory --params 7.5B --recipe mixed-adam --zero 1 --devices 64
      the ZeRO paper's example: 31.4 GB per GPU (120 GB without sharding)
  resacct memory --params 40B --zero 3 --devices 8 --device h100
      the lecture's 8 × H100 question: does a 40-billion-parameter model fit with all state sharded?
  resacct memory --recipe bf16-fp32-master --moment at-step --params 7B
      the state while optimizer.step() runs (20 bytes/parameter with AdamW: the master's fp32 gradients too)
  resacct memory --devices 8 --device-memory-gb 80 --json
      largest model plain data parallel (ZeRO stage 0, the default) fits (no --params needed)

""" + RECIPES_EPILOG


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "memory",
        help="training-state memory per rank under ZeRO stage 0–3, and the largest model that fits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES,
    )
    parser.add_argument("--params", type=count, default=None, metavar="N", help="parameters of the model, e.g. 7.5e9 or 7.5B")
    add_recipe_arguments(parser)
    parser.add_argument("--devices", type=positive_int, default=1, metavar="N", help="data-parallel ranks sharing the state (default: 1)")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--device-memory-gb", type=gigabytes, default=None, metavar="GB", help="memory of one device in GB (10^9 bytes)")
    memory.add_argument("--device", default=None, metavar="NAME", help="an accelerator whose memory to use, e.g. h100, a100-40gb")
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=run_memory)


def _device_memory(args: argparse.Namespace) -> tuple[str | None, float | None]:
    if args.device is not None:
        from resacct.facts.hardware import get_accelerator

        accelerator = get_accelerator(args.device)
        return accelerator.name, float(accelerator.memory_bytes)
    if args.device_memory_gb is not None:
        return None, args.device_memory_gb * 1e9
    return None, None


def memory_report(parameters: float | None, recipe: ShardingRecipe, zero_stage: int, devices: int,
                  device_memory_bytes: float | None = None, device: str | None = None) -> dict[str, Any]:
    """The fields ``resacct memory --json`` prints (units in the names).

    >>> memory_report(7.5e9, get_sharding_recipe("mixed-adam"), 1, 64)["total_bytes_per_rank"]
    31406250000.0
    """
    if parameters is None and device_memory_bytes is None:
        raise ResacctError("nothing to answer: give --params N (memory per rank) and/or --device/--device-memory-gb (largest model that fits)")
    report: dict[str, Any] = {
        "parameters": parameters,
        "recipe": recipe.name,
        "optimizer": recipe.optimizer,
        "moment": recipe.moment,
        "parameter_bytes_per_parameter": recipe.parameter_bytes_per_parameter,
        "gradient_bytes_per_parameter": recipe.gradient_bytes_per_parameter,
        "optimizer_state_bytes_per_parameter": recipe.optimizer_state_bytes_per_parameter,
        "zero_stage": zero_stage,
        "devices": devices,
        "sharded": list(SHARDED_PIECES[zero_stage]),
    }
    if parameters is not None:
        held = per_rank_bytes(parameters, recipe, zero_stage, devices)
        report.update(
            parameters_bytes_per_rank=held.parameters_bytes,
            gradients_bytes_per_rank=held.gradients_bytes,
            optimizer_state_bytes_per_rank=held.optimizer_state_bytes,
            total_bytes_per_rank=held.total_bytes,
            total_bytes_per_rank_by_stage={str(stage): per_rank_bytes(parameters, recipe, stage, devices).total_bytes for stage in ZERO_STAGES},
        )
    if device_memory_bytes is not None:
        report.update(device=device, device_memory_bytes=device_memory_bytes,
                      largest_model_parameters=largest_model_parameters(device_memory_bytes, devices, recipe, zero_stage))
        if parameters is not None:
            report.update(fits=fits_in_memory(parameters, device_memory_bytes, recipe, zero_stage, devices),
                          spare_bytes_per_rank=device_memory_bytes - report["total_bytes_per_rank"])
    return report


def _text(report: dict[str, Any], chosen: ChosenRecipe, units: str = "decimal") -> str:
    scale, unit = unit_scale(units)

    def _gb(value: float) -> str:
        return f"{value / scale:,.2f} {unit}"

    stage, devices = report["zero_stage"], report["devices"]
    setup = f"{zero_words(stage, chosen.zero_is_default)} over {devices} rank(s)\n  recipe: {chosen.recipe_words()}"
    lines = []
    if report["parameters"] is not None:
        lines.append(f"{parameters_in_words(report['parameters'])}, {setup}")
        for piece, key in (("parameters", "parameters_bytes_per_rank"), ("gradients", "gradients_bytes_per_rank"),
                           ("optimizer_state", "optimizer_state_bytes_per_rank")):
            how = f"sharded 1/{devices}" if piece in report["sharded"] else "replicated on every rank"
            lines.append(f"  {piece.replace('_', ' '):<16} {_gb(report[key]):>14} per rank  ({how})")
        lines.append(f"  {'total':<16} {_gb(report['total_bytes_per_rank']):>14} per rank")
        by_stage = "  ".join(f"{s}: {_gb(v)}" for s, v in report["total_bytes_per_rank_by_stage"].items())
        lines.append(f"  every stage      {by_stage}")
    else:
        lines.append(setup)
    if "device_memory_bytes" in report:
        name = report["device"] or "device"
        if "fits" in report:
            spare = report["spare_bytes_per_rank"]
            verdict = f"fits ({_gb(spare)} to spare per rank)" if report["fits"] else f"does NOT fit (short by {_gb(-spare)} per rank)"
            lines.append(f"{name} with {_gb(report['device_memory_bytes'])}: {verdict}")
        lines.append(f"largest model that fits {devices} × {_gb(report['device_memory_bytes'])} at ZeRO stage {stage}: "
                     f"{parameters_in_words(report['largest_model_parameters'])}")
    lines.append("(activations, temporary buffers and fragmentation are not counted)")
    return "\n".join(lines)


def run_memory(args: argparse.Namespace) -> int:
    device, device_memory_bytes = _device_memory(args)
    chosen = chosen_recipe(args)
    report = memory_report(args.params, chosen.sharding, chosen.zero_stage, args.devices, device_memory_bytes, device)
    report["zero_stage_is_default"] = chosen.zero_is_default
    report["total_bytes_per_parameter_by_moment"] = {chosen.sharding.moment: chosen.sharding.total_bytes_per_parameter,
                                                     ("at_step" if chosen.sharding.moment == "after_backward" else "after_backward"): chosen.other_moment_total_bytes}
    return emit(args, report, _text(report, chosen, args.units))
