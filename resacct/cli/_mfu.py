"""The ``resacct mfu`` command's arguments and run function: MFU (and HFU) as papers define them.

Model FLOPs per token are 6N, plus PaLM's attention term 12·L·H·Q·T when the shape is given
(``--layers --heads --head-dim --seq``). ``--recompute`` adds what recomputation executes (HFU):
selective recomputes the attention core's forward (4·L·H·Q·T a token), full the whole forward
(2N + 4·L·H·Q·T). The rate comes from a step time, tokens/s, or an achieved FLOP/s per device;
the peak from the datasheet table (``--device``, ``--dtype``, ``--sparse``) or ``--peak``.
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli.arguments import count, positive_float, positive_int
from resacct.cli.output import amount_text, emit, ratio_text, with_caveat
from resacct.errors import ResacctError

__all__ = ["add_mfu_arguments", "run_mfu"]

_SHAPE = ("layers", "heads", "head_dim", "seq")


def add_mfu_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=count, help="parameters N (required unless --achieved-tflops)")
    parser.add_argument("--tokens", type=count, help="tokens per step (with --step-time)")
    parser.add_argument("--step-time", type=positive_float, metavar="SECONDS", help="measured seconds per optimizer step")
    parser.add_argument("--tokens-per-sec", type=count, help="measured tokens per second, all devices together")
    parser.add_argument("--achieved-tflops", type=positive_float, metavar="TFLOP/S",
                        help="achieved TFLOP/s per device as a paper reports it (MFU = it ÷ the peak; it counts what its authors counted)")
    parser.add_argument("--devices", type=positive_int, default=1, help="number of devices (default: 1)")
    parser.add_argument("--device", default=None, metavar="NAME", help="accelerator name, alias or CUDA name (default: h100-sxm unless --peak)")
    parser.add_argument("--dtype", default="bf16", help="format of the peak: fp32, tf32, bf16, fp16, fp8, int8 (default: bf16)")
    parser.add_argument("--sparse", action="store_true", help="use the 2:4 structured-sparsity peak (dense training cannot)")
    parser.add_argument("--peak", type=count, default=None, metavar="FLOP/S", help="a custom peak per device (e.g. 275e12) instead of the table's")
    parser.add_argument("--layers", type=positive_int, help="layers L, for the attention term 12·L·H·Q·T (with --heads --head-dim --seq)")
    parser.add_argument("--heads", type=positive_int, help="attention heads H")
    parser.add_argument("--head-dim", type=positive_int, help="width of a head Q")
    parser.add_argument("--seq", type=positive_int, help="sequence length T")
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                        help="activation recomputation, for HFU (hardware FLOPs) beside MFU (default: none)")


def _peak(args: argparse.Namespace) -> tuple[float, Any, str | None]:
    """The peak per device, the board it is from (None for --peak) and its format."""
    if args.peak is not None:
        if args.device is not None or args.sparse:
            raise ResacctError("give --peak FLOP/S or --device NAME (with --dtype/--sparse), not both")
        return args.peak, None, None
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec, peak_format

    board = get_accelerator(args.device or "h100-sxm")
    return peak_flops_per_sec(board, args.dtype, sparse=args.sparse), board, peak_format(args.dtype)


def _attention_flops_per_token(args: argparse.Namespace) -> float:
    given = [name for name in _SHAPE if getattr(args, name) is not None]
    if not given:
        return 0.0
    if len(given) < len(_SHAPE):
        missing = ", ".join("--" + name.replace("_", "-") for name in _SHAPE if name not in given)
        raise ResacctError(f"the attention term 12·L·H·Q·T needs --layers, --heads, --head-dim and --seq; missing {missing}")
    return 12.0 * args.layers * args.heads * args.head_dim * args.seq


def _tokens_per_sec(args: argparse.Namespace) -> float:
    if args.tokens_per_sec is not None:
        if args.step_time is not None or args.tokens is not None:
            raise ResacctError("give either --tokens-per-sec, or --step-time with --tokens (per step), not both")
        return args.tokens_per_sec
    if args.step_time is None or args.tokens is None:
        raise ResacctError("give --tokens-per-sec, or --step-time SECONDS with --tokens (tokens per step), or --achieved-tflops")
    return args.tokens / args.step_time


def _from_achieved(args: argparse.Namespace, peak: float, board: Any) -> int:
    if any(getattr(args, name) is not None for name in ("tokens_per_sec", "step_time", "tokens")):
        raise ResacctError("--achieved-tflops is a rate already: give it without --tokens-per-sec, --step-time or --tokens")
    from resacct.formulas.utilization import mfu_from_achieved_flops_per_sec

    device = board.name if board is not None else None
    achieved = args.achieved_tflops * 1e12
    utilization = mfu_from_achieved_flops_per_sec(achieved, peak)
    fields = {"achieved_flops_per_sec_per_device": achieved, "devices": args.devices, "achieved_flops_per_sec": achieved * args.devices,
              "device": device, "peak_flops_per_sec": peak, "mfu": utilization, "above_peak": utilization > 1}
    text = f"{achieved:.4g} FLOP/s per device ÷ peak {peak:.4g} ({device or 'custom'})\n  utilization: {utilization:.3f}"
    if utilization > 1:
        text += (f"\n  warning: {utilization:.3g}× the datasheet peak is impossible — check --achieved-tflops (per device, "
                 "in TFLOP/s) and the peak's format (--dtype)")
    return emit(args, fields, with_caveat(fields, text, board))


def run_mfu(args: argparse.Namespace) -> int:
    from resacct.formulas.utilization import mfu_from_tokens_per_sec

    peak, board, dtype = _peak(args)
    if args.achieved_tflops is not None:
        return _from_achieved(args, peak, board)
    device = board.name if board is not None else None
    if args.params is None:
        raise ResacctError("give --params N (with a rate), or --achieved-tflops per device")
    attention = _attention_flops_per_token(args)
    if args.recompute == "selective" and not attention:
        raise ResacctError("--recompute selective recomputes the attention core: give --layers, --heads, --head-dim and --seq")
    model = 6.0 * args.params + attention
    extra = {"none": 0.0, "selective": attention / 3, "full": 2.0 * args.params + attention / 3}[args.recompute]
    hardware = model + extra
    tokens_per_sec = _tokens_per_sec(args)
    total_peak = peak * args.devices
    utilization = mfu_from_tokens_per_sec(tokens_per_sec, model, total_peak)
    hfu = mfu_from_tokens_per_sec(tokens_per_sec, hardware, total_peak)
    achieved = tokens_per_sec * model
    fields: dict[str, Any] = {
        "parameters": args.params, "tokens_per_sec": tokens_per_sec, "devices": args.devices, "device": device, "dtype": dtype,
        "sparse": args.sparse, "model_flops_per_token": model, "attention_flops_per_token": attention,
        "hardware_flops_per_token": hardware, "recompute": args.recompute,
        "achieved_flops_per_sec": achieved, "achieved_flops_per_sec_per_device": achieved / args.devices,
        "peak_flops_per_sec": peak, "mfu": utilization, "hfu": hfu, "above_peak": hfu > 1,
    }
    terms = "6 × N" + (" + 12·L·H·Q·T" if attention else "")
    text = (f"{tokens_per_sec:.4g} tokens/s × ({terms} = {model:.4g} FLOPs/token) = {amount_text(achieved, 'FLOP/s')} "
            f"({amount_text(achieved / args.devices, 'per device')}; {device + ' ' + (dtype or '') if device else 'custom'} peak {peak:.4g})"
            f"\n  MFU: {ratio_text(utilization)}")
    if args.recompute != "none":
        text += f"\n  HFU: {ratio_text(hfu)} (recompute {args.recompute}: {hardware:.4g} hardware FLOPs/token)"
    if hfu > 1:
        text += "  — above the peak: a wrong input (tokens per step? devices? dtype?) or the sparse peak is needed"
    return emit(args, fields, with_caveat(fields, text, board))
