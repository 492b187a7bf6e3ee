"""``resacct fit-model``: the largest micro-batch — or sequence length — of a real model whose
training step fits a device, from the step's **predicted** peak (:mod:`resacct.account.fit_search`:
each probe a prediction on fake tensors of the model built on the meta device; nothing allocated).

The napkin ``resacct fit`` (:mod:`resacct.cli.compute`) answers the other question, the largest
model whose training state fits, from bytes per parameter alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from resacct.cli._model_args import add_device_arguments, device_memory_bytes
from resacct.cli._recipes import RECIPES_EPILOG, named_recipe_type
from resacct.cli._units import add_units_flag
from resacct.cli.arguments import positive_int
from resacct.cli.output import add_json_flag, emit, with_caveat
from resacct.errors import ResacctError

__all__ = ["register", "add_model_fit_arguments", "run_model_fit"]

_EXAMPLES = """examples:
  resacct fit-model --hf-config llama-2-7b --recipe bf16 --seq 4096 --device h100
      the largest micro-batch of 4,096 tokens whose step (bf16 AdamW) fits an H100's 80 GB
  resacct fit-model --hf-config gpt2 --search seq --batch 32 --device a100-sxm-40gb --reserve-gb 2
      the longest sequence a batch of 8 fits, 2 GB kept free
  resacct fit-model --model tests.fixtures_hf_models:tiny_llama --memory-gb 0.004 --seq 16 --grad-accum 2 --json
      any nn.Module factory; gradients accumulated over 2 micro-steps
"""


def _bytes_text(value: float, units: str) -> str:
    """Bytes in the largest unit of ``units`` (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB) that keeps them ≥ 1."""
    base, names = (1e3, ("B", "kB", "MB", "GB", "TB")) if units == "decimal" else (1024.0, ("B", "KiB", "MiB", "GiB", "TiB"))
    scaled, index = float(value), 0
    while abs(scaled) >= base and index < len(names) - 1:
        scaled, index = scaled / base, index + 1
    return f"{scaled:.0f} B" if index == 0 else f"{scaled:.2f} {names[index]}"


def add_model_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the step and the search (the device arguments: :func:`resacct.cli._model_args.add_device_arguments`)."""
    from resacct.cli._model_args import shipped_hf_config_names

    parser.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                        help="a Hugging Face causal LM from its config, built on the meta device (needs resacct[hf]); shipped: "
                             + ", ".join(shipped_hf_config_names()))
    parser.add_argument("--model", default=None, metavar="MODULE:FACTORY", help="any nn.Module factory, built on the meta device")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="an argument of the factory (repeatable)")
    parser.add_argument("--input-shape", default=None, metavar="N,N,…", help="a --model's input, batch first (the batch is searched)")
    parser.add_argument("--input-dtype", default="float32", metavar="DTYPE", help="dtype of --input-shape's tensor (default: float32)")
    parser.add_argument("--loss", choices=("auto", "model", "mean", "sum", "mse", "cross-entropy"), default="auto",
                        help="a --model's loss (default auto: its own .loss when it has one, else the mean of its output)")
    parser.add_argument("--search", choices=("batch", "seq"), default="batch",
                        help="what to search: the micro-batch at --seq, or the sequence length at --batch (default: batch)")
    parser.add_argument("--batch", type=positive_int, default=1, metavar="N", help="sequences per micro-batch when searching seq (default: 1)")
    parser.add_argument("--seq", type=positive_int, default=None, metavar="N", help="tokens per sequence when searching batch (default: the context length)")
    parser.add_argument("--recipe", type=named_recipe_type, default=None, metavar="NAME", help="precision recipe (see below; default: fp32)")
    parser.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd-momentum", "adagrad", "rmsprop"), default=None,
                        help="the torch.optim optimizer (default: the one the recipe name pins, else adamw)")
    parser.add_argument("--grad-accum", type=positive_int, default=1, metavar="K", help="micro-steps whose gradients accumulate per step (default: 1)")
    parser.add_argument("--max-batch", type=positive_int, default=None, metavar="N", help="the largest micro-batch to try (default: 1,048,576)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="one line per probe on stderr (default: once the search has run 2 s); never on stdout")


def _target(args: argparse.Namespace) -> Any:
    import os

    from resacct.account.fit_search import hf_config_target, named_model_target
    from resacct.account.model_factory import parse_model_arg

    if (args.hf_config is None) == (args.model is None):
        raise ResacctError("give the model by exactly one of --hf-config NAME (or config.json) and --model module:factory")
    if args.hf_config is not None:
        extra = [flag for flag, used in (("--model-arg", args.model_arg), ("--input-shape", args.input_shape), ("--loss", args.loss != "auto")) if used]
        if extra:
            raise ResacctError(f"{', '.join(extra)} apply to --model module:factory; a --hf-config model takes input_ids and its own loss")
        return hf_config_target(args.hf_config)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: a module next to you is importable
    shape = None
    if args.input_shape is not None:
        try:
            shape = tuple(int(part) for part in args.input_shape.split(","))
        except ValueError:
            shape = ()
        if not shape or any(size < 1 for size in shape):
            raise ResacctError(f"--input-shape {args.input_shape!r}: expected sizes ≥ 1 separated by commas, batch first (e.g. 8,64)")
    return named_model_target(args.model, dict(parse_model_arg(text) for text in args.model_arg), input_shape=shape,
                              input_dtype=args.input_dtype, loss=args.loss)


def run_model_fit(args: argparse.Namespace) -> int:
    """Parse the device once, build the model on meta, search, print."""
    from resacct.facts.recipes import parse_recipe

    board, memory_bytes = device_memory_bytes(args)
    reserve_bytes = args.reserve_gb * 1e9
    if reserve_bytes >= memory_bytes:
        raise ResacctError(f"--reserve-gb {args.reserve_gb:g} keeps all of the {memory_bytes / 1e9:g} GB free; expected a reserve below the memory")
    recipe = args.recipe if args.recipe is not None else parse_recipe("fp32")
    optimizer = recipe.optimizer_for(args.optimizer)
    if args.search == "batch" and args.batch != 1:
        raise ResacctError(f"--batch {args.batch} is searched with --search batch; give --seq (the fixed length), or --search seq with --batch")
    if args.search == "seq" and args.seq is not None:
        raise ResacctError(f"--seq {args.seq} is searched with --search seq; give --batch (the fixed micro-batch), or --search batch with --seq")
    from resacct.account.fit_search import MAX_BATCH, fit_step

    started = time.perf_counter()
    target = _target(args)
    units = args.units

    def on_probe(probe: Any) -> None:
        if args.progress or (args.progress is None and time.perf_counter() - started > 2.0):
            verdict = "fits" if probe.fits else "does not fit"
            print(f"resacct fit-model: {args.search} {probe.size:,}: predicted {_bytes_text(probe.peak_bytes, units)} {verdict} "
                  f"({probe.seconds:.1f} s; {time.perf_counter() - started:.0f} s in all)", file=sys.stderr, flush=True)

    answer = fit_step(target, memory_bytes=memory_bytes, search=args.search, batch=args.batch, seq=args.seq, reserve_bytes=reserve_bytes,
                      device=board, recipe=recipe, optimizer=optimizer, micro_batches=args.grad_accum,
                      max_batch=args.max_batch or MAX_BATCH, on_probe=on_probe)
    fields = answer.to_dict()
    return emit(args, fields, with_caveat(fields, _text(answer, units), board))


def _text(answer: Any, units: str) -> str:
    what = "micro-batch" if answer.searched == "batch" else "sequence length"
    at = (f"seq {answer.fixed:,}" if answer.fixed is not None else "its input") if answer.searched == "batch" else f"micro-batch {answer.fixed:,}"
    where = answer.device.name if answer.device is not None else "the memory given"
    accumulation = f", {answer.micro_batches} accumulated micro-steps" if answer.micro_batches > 1 else ""
    lines = [f"{answer.model} at {at}, {answer.recipe} {answer.optimizer}{accumulation}, on {where}",
             f"  budget: {_bytes_text(answer.memory_bytes, units)} − {_bytes_text(answer.reserve_bytes, units)} reserved = "
             f"{_bytes_text(answer.budget_bytes, units)}"]
    if answer.largest is None:
        lines.append(f"  largest {what} that fits: none — {answer.searched} 1 is predicted at {_bytes_text(answer.next_peak_bytes, units)}, "
                     f"{_bytes_text(answer.next_peak_bytes - answer.budget_bytes, units)} over")
    else:
        share = answer.headroom_bytes / answer.budget_bytes
        lines.append(f"  largest {what} that fits: {answer.largest:,}" + (" (the limit searched)" if answer.next_peak_bytes is None else ""))
        lines.append(f"  predicted step peak there: {_bytes_text(answer.peak_bytes, units)} in {answer.peak_phase} ({answer.peak_op}); "
                     f"headroom {_bytes_text(answer.headroom_bytes, units)} ({share:.1%} of the budget)")
        if answer.next_peak_bytes is not None:
            lines.append(f"  {answer.searched} {answer.largest + 1:,} would need {_bytes_text(answer.next_peak_bytes, units)} "
                         f"({_bytes_text(answer.next_peak_bytes - answer.budget_bytes, units)} over)")
    sizes = " ".join(f"{p.size:,}{'✓' if p.fits else '✗'}" for p in answer.probes)
    lines.append(f"  probes: {sizes} — each the whole step (fwd, bwd, optimizer, zero_grad) on fake tensors, nothing allocated; "
                 f"{answer.seconds:.1f} s")
    lines.append(f"  attention: {answer.attention_kernel}. The peak is the CPU kernels' step as the allocator counts it; a GPU runs "
                 "other kernels and its caching allocator rounds blocks to 512 B and keeps freed segments: keep a reserve")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fit-model", help="the largest micro-batch or sequence of a real model whose predicted training step fits a device",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=_EXAMPLES + "\n" + RECIPES_EPILOG)
    add_model_fit_arguments(parser)
    add_device_arguments(parser, required=True)
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=run_model_fit)
