"""``resacct shard``: the peak of one training step on each rank of a ZeRO-1, ZeRO-2 or ZeRO-3
(FSDP2) run of a real model — predicted before it runs, with what is live at the peak.

The engine itself (DDP + ZeroRedundancyOptimizer, or ``fully_shard`` on every block and the root)
runs on fake tensors of the model built on the meta device, under torch's fake process group, one
rank after another in a child process (:mod:`resacct.account.answers.sharded`); nothing is sent and
the model is never allocated. The same prediction equals each gloo rank's CPU allocator to the byte
on 2 and 4 ranks (``resacct/specs/peak_sharded.claims.yaml``). Beside it: the ZeRO paper's per-rank
state (parameters, gradients, optimizer state — no activations, no buffers). With ``--device`` or
``--memory-gb``, whether the largest rank's peak fits; with ``--measure`` (a small model), the step
run for real on local gloo ranks too, each rank's CPU allocator peak beside its prediction.
A second ``--hf-config`` question asked the same way is answered from the trace cache
(:mod:`resacct.cli._cached_answer`; ``--no-cache`` predicts afresh; never with ``--measure``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from resacct.cli._cached_answer import add_no_cache_flag, cached_command_answer, hf_config_question
from resacct.cli._model_args import add_model_source_arguments, device_memory_bytes, model_source
from resacct.cli._units import add_units_flag
from resacct.cli.arguments import non_negative_float, positive_int, seconds
from resacct.cli.devices import board_argument
from resacct.cli.output import add_json_flag, emit, format_quantity, with_caveat
from resacct.errors import ResacctError

__all__ = ["register", "run_shard", "ENGINE_CHOICES"]

#: The engines (resacct.account.peak.sharded.ENGINES), listed here so that --help needs no torch.
ENGINE_CHOICES = ("zero1", "zero2", "fsdp2", "fsdp2-bf16")

_EXAMPLES = """engines:
  zero1       DistributedDataParallel + ZeroRedundancyOptimizer(AdamW): optimizer state sharded by whole tensors
  zero2       fully_shard(reshard_after_forward=False) (FSDP's SHARD_GRAD_OP): parameters gathered once in forward, kept to backward
  fsdp2       fully_shard on every block and the root (ZeRO-3): parameters gathered per block, gradients reduce-scattered
  fsdp2-bf16  fsdp2 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)

examples:
  resacct shard --hf-config llama-2-7b --engine fsdp2 --devices 8 --seq 4096 --device h100
      each rank's step peak of Llama-2-7B under FSDP2 on 8 GPUs, batch 1 × 4,096 tokens per rank; does it fit 80 GB?
  resacct shard --model resacct.account.answers.generic:mlp --model-arg dim=64 --model-arg hidden=256 --engine zero1 --devices 4 --batch 16
      ZeRO-1 on 4 ranks: ranks owning whole weights peak in the optimizer step, those with a bias in backward
  resacct shard --hf-config gpt2 --engine fsdp2-bf16 --devices 16 --rank 0 --rank 15 --json
      two ranks of 16, bf16 gathers, as JSON
  resacct shard --model tests.fixtures_hf_models:tiny_llama --batch 2 --seq 16 --devices 2 --measure
      a small model: the step run on 2 local gloo ranks too, each rank's allocator beside its prediction
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "shard", help="each rank's peak of one training step under ZeRO-1/2/3 (FSDP2), predicted on fake tensors",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES)
    add_model_source_arguments(parser)
    parser.add_argument("--engine", choices=ENGINE_CHOICES, default="fsdp2", help="the sharding engine (default: fsdp2; see below)")
    parser.add_argument("--devices", type=positive_int, default=8, metavar="N", help="ranks (data-parallel processes; default: 8)")
    parser.add_argument("--rank", type=int, action="append", default=None, metavar="R",
                        help="a rank to predict (repeatable; default: every rank up to 8, else ranks 0, 1 and the last)")
    parser.add_argument("--batch", type=positive_int, default=1, metavar="N", help="sequences (or samples) per rank (default: 1)")
    parser.add_argument("--seq", type=positive_int, default=None, metavar="N", help="tokens per sequence (default: the context length)")
    parser.add_argument("--device", default=None, metavar="NAME", type=board_argument,
                        help="accelerator whose memory each rank has (see 'resacct devices'); a CUDA board adds each rank's predicted "
                             "CUDA caching allocator peaks there")
    parser.add_argument("--memory-gb", type=non_negative_float, default=None, help="memory per rank in GB (10^9 bytes) instead of --device")
    parser.add_argument("--measure", action="store_true",
                        help="then run the step on --devices local gloo ranks (a small model: ≤ 8 ranks, ≤ 50M parameters) and show each "
                             "rank's CPU allocator peak beside its prediction")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress line on stderr once the prediction runs 2 s (default: on a terminal; elsewhere after 30 s)")
    parser.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                        help="stop after SECONDS with one line naming the phase, exit 2; the child processes are killed and their "
                             "folders removed (Ctrl-C: exit 130)")
    parser.add_argument("--trace-all-layers", action="store_true",
                        help="with --hf-config: trace every decoder layer (default: under an FSDP engine, a stack of more than 16 identical "
                             "layers is traced at depths 3, 4 and 5 and extrapolated, each number checked on the third depth)")
    add_no_cache_flag(parser, "predict afresh")
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=run_shard)


def run_shard(args: argparse.Namespace) -> int:
    """Parse everything first (bad input: one line, before torch), predict in a child, print."""
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise ResacctError(f"--memory-gb {args.memory_gb:g}: expected a memory above 0 GB")
    if args.devices < 2:
        raise ResacctError(f"--devices {args.devices}: expected 2 or more ranks (one process is `resacct account` or `resacct fit`)")
    outside = [rank for rank in args.rank or [] if not 0 <= rank < args.devices]
    if outside:
        raise ResacctError(f"--rank {', '.join(map(str, outside))}: expected ranks 0 to {args.devices - 1} of --devices {args.devices}")
    board, memory_bytes = device_memory_bytes(args)
    fields, text = cached_command_answer("shard", "hf-shard", _question(args, board, memory_bytes),
                                         lambda: _answer(args, board, memory_bytes), no_cache=args.no_cache)
    return emit(args, fields, text)


def _question(args: argparse.Namespace, board: Any, memory_bytes: float | None) -> dict[str, Any] | None:
    """What a ``--hf-config`` prediction depends on, for the trace cache's key (None: a ``--model`` factory, whose
    code may change, ``--measure``, a measurement, or flags the answer refuses — never cached)."""
    model = model_source(args)  # a bad combination of model flags: refused here, one line
    if args.hf_config is None or args.measure:
        return None
    return hf_config_question(args, board, memory_bytes, layers=model.layers, engine=args.engine, devices=args.devices, ranks=args.rank,
                              batch=args.batch, seq=args.seq)


def _answer(args: argparse.Namespace, board: Any, memory_bytes: float | None) -> tuple[dict[str, Any], str]:
    """Each rank predicted in a child (and its CUDA peaks with a board): the JSON fields and the text."""
    from resacct.account.load.user_code import stopping_after

    with stopping_after(args.timeout, command="resacct shard", hint="expected a run within the limit: raise --timeout, or fewer --devices "
                        "or --rank, a smaller --batch, --seq or model"):
        account = _predict(args)
        gpu = None if board is None else _cuda_ranks(args, account, board)
    fields = account.to_dict()
    fields["memory_bytes"] = memory_bytes
    fields["fits"] = None if memory_bytes is None else account.largest.peak_bytes <= memory_bytes
    text = _text(account, memory_bytes, board, args.units)
    if gpu is not None:  # --device BOARD: each rank's CUDA caching allocator peaks there
        fields["gpu"] = gpu
        text += _gpu_text(gpu, memory_bytes, args.units)
    return fields, with_caveat(fields, text, board)


def _cuda_ranks(args: argparse.Namespace, account: Any, board: Any) -> dict[str, Any]:
    """``--device BOARD``: :func:`resacct.account.gpu.answers.sharded_cuda.predict_sharded_cuda_peaks` for the
    ranks predicted above (a second child process), with what calibrates it, or why there is no number."""
    from resacct.account.gpu.answers.command_answers import cuda_board_gap
    from resacct.account.gpu.answers.device_answer import calibration_text, reductions_text
    from resacct.account.load.user_code import running_phase

    answer: dict[str, Any] = {"board": board.name, "calibration": calibration_text(board), "gap": cuda_board_gap(board), "ranks": None,
                              "reductions": reductions_text(board)}
    if answer["gap"] is not None:
        return answer
    from resacct.account.gpu.answers.sharded_cuda import STREAMS_NOTE, predict_sharded_cuda_peaks

    with running_phase(f"predicting {args.engine}'s CUDA allocator peaks on {board.name} (a child process, each rank on fake tensors)"):
        answer["ranks"] = predict_sharded_cuda_peaks(model_source(args), engine=args.engine, world_size=args.devices,
                                                     ranks=tuple(rank.rank for rank in account.ranks), batch=args.batch, seq=args.seq, board=board)
    answer["note"] = STREAMS_NOTE if args.engine != "zero1" else None
    return answer


def _gpu_text(gpu: dict[str, Any], memory_bytes: float | None, units: str) -> str:
    def size(value: float) -> str:
        return format_quantity(value, "bytes", units)

    if gpu["gap"] is not None:
        return f"  on {gpu['board']} (CUDA caching allocator): no prediction — {gpu['gap']}\n"
    lines = [f"  on {gpu['board']} (CUDA caching allocator, predicted; max_memory_allocated / max_memory_reserved of the step):"]
    for rank in gpu["ranks"]:
        verdict = "" if memory_bytes is None else (" — fits" if rank["peak_reserved_bytes"] <= memory_bytes else " — does NOT fit")
        lines.append(f"    rank {rank['rank']}: allocated peak {size(rank['peak_allocated_bytes'])}, reserved peak {size(rank['peak_reserved_bytes'])}"
                     f"{verdict} (attention: {rank['attention'] or 'no sdpa call'})")
        if rank.get("compute_step_sec") is not None and rank.get("compute_step_detail"):
            lines.append(f"      its compute alone (predicted): {rank['compute_step_sec'] * 1e3:.4g} ms")
            lines.extend(f"        {line}" for line in rank["compute_step_detail"])
        elif rank.get("compute_step_sec") is not None:
            lines.append(f"      its compute alone (predicted): {rank['compute_step_sec'] * 1e3:.4g} ms ({rank['compute_step_basis']})")
        elif rank.get("compute_step_basis"):
            lines.append(f"      its compute alone: none ({rank['compute_step_basis']})")
    from resacct.account.gpu.answers.sharded_cuda import workspaces_lines

    if gpu["ranks"]:
        lines.extend("  " + line for line in workspaces_lines(gpu["ranks"][0]))
    if gpu.get("reductions"):
        lines.append(f"    reduction kernels' staging: {gpu['reductions']}")
    lines.append(f"    calibrated by: {gpu['calibration']}")
    if gpu.get("note"):
        lines.append(f"    note: {gpu['note']}")
    return "\n".join(lines) + "\n"


def _predict(args: argparse.Namespace) -> Any:
    """The model parsed, then each rank predicted in a child process (and measured, with --measure)."""
    from resacct.account.load.user_code import running_phase, showing_progress

    with running_phase("importing torch and resacct's accounting"):
        from resacct.account.answers.sharded import account_sharded_step

    model = model_source(args)
    live = sys.stderr.isatty()
    progress = contextlib.nullcontext() if args.progress is False else showing_progress(
        sys.stderr, command="resacct shard", after_s=2.0 if live or args.progress else 30.0, every_s=10.0 if args.progress else 60.0, live=live)
    phase = f"predicting {args.engine} on {args.devices} ranks (a child process: the model on meta, each rank on fake tensors)"
    if args.measure:
        phase += f", then measuring it on {args.devices} gloo ranks"
    with progress, running_phase(phase):
        return account_sharded_step(model, engine=args.engine, world_size=args.devices, batch=args.batch, seq=args.seq,
                                    ranks=None if args.rank is None else tuple(args.rank), measure=args.measure)


def _text(account: Any, memory_bytes: float | None, board: Any, units: str) -> str:
    def size(value: float) -> str:
        return format_quantity(value, "bytes", units)

    tokens = f"batch {account.batch}" + (f" × seq {account.seq:,}" if account.seq is not None else "")
    units_text = f", {account.units} FSDP units and the root" if account.units else ""
    lines = [f"{account.model} ({account.parameters:,} parameters) on {account.world_size} ranks, {account.engine}{units_text}; {tokens} per rank",
             f"  engine: {account.engine_text}"]
    for rank in account.ranks:
        where = f", {rank.where}" if rank.where else ""
        measured = ""
        if rank.measured is not None:
            measured = (f"; measured {size(rank.measured['peak_bytes'])} in {rank.measured['phase']} (gloo rank, CPU allocator; "
                        f"ratio {rank.peak_bytes / rank.measured['peak_bytes']:.4f})")
        lines.append(f"  rank {rank.rank}: predicted step peak {size(rank.peak_bytes)} in {rank.phase} ({rank.op}{where}){measured}")
    largest = account.largest
    live = "; ".join(f"{kind} {size(value)}" for kind, value in sorted(largest.bytes_by_kind.items(), key=lambda item: -item[1]) if value)
    lines.append(f"  at rank {largest.rank}'s peak: {live}")
    lines.append(f"  the ZeRO paper's state per rank ({account.formula_text}): {size(account.formula_state_bytes)} — the step's peak is "
                 f"{largest.peak_bytes / account.formula_state_bytes:.2f}× it (activations, gathered parameters, communication buffers, temporaries)")
    if memory_bytes is not None:
        name = board.name if board is not None else "the given memory"
        verdict = "fits" if largest.peak_bytes <= memory_bytes else "does not fit"
        lines.append(f"  on {name} ({size(memory_bytes)} per rank): the largest rank {verdict}, "
                     f"{size(abs(memory_bytes - largest.peak_bytes))} {'spare' if largest.peak_bytes <= memory_bytes else 'over'}")
    measured = " (then measured on local gloo ranks)" if any(rank.measured is not None for rank in account.ranks) else ""
    lines.append(f"  predicted on fake CPU tensors (the CPU kernels' step) under torch's fake process group{measured} in {account.seconds:.1f} s; "
                 "gloo's buffers modelled (exact against 2 and 4 gloo ranks); a GPU adds NCCL's buffers and the caching allocator's rounding: keep a reserve")
    lines += [f"  note: {note}" for note in account.notes]
    return "\n".join(lines) + "\n"
