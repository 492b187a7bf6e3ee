"""``resacct fit --hf-config NAME`` / ``--model module:factory``: the largest micro-batch — or
sequence length — of a real model whose training step fits a device, from the step's **predicted**
peak (:mod:`resacct.account.fit.search`: each probe a prediction on fake tensors of the model built
on the meta device; nothing allocated).

Without a model, ``resacct fit`` (:mod:`resacct.cli.compute`) answers the napkin question, the
largest model whose training state fits, from bytes per parameter alone; this module adds the
model's arguments to that one command and runs the model's form.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

from resacct.cli._cached_answer import add_no_cache_flag
from resacct.cli._model_args import device_memory_bytes
from resacct.cli._search_progress import add_progress_flag, probe_progress
from resacct.cli.arguments import positive_int, reserve_gigabytes, seconds
from resacct.cli.output import emit, user_output_to_stderr, with_caveat
from resacct.errors import ResacctError

__all__ = ["add_model_fit_arguments", "run_model_fit", "MODEL_FIT_EXAMPLES"]

MODEL_FIT_EXAMPLES = """a real model's micro-batch (--hf-config or --model; the step's peak predicted on fake tensors):
  resacct fit --hf-config llama-2-7b --recipe bf16 --seq 4096 --device h100
      the largest micro-batch of 4,096 tokens whose step (bf16 AdamW) fits an H100's 80 GB
  resacct fit --hf-config gpt2 --search seq --batch 32 --device a100-sxm-40gb --reserve-gb 2
      the longest sequence a micro-batch of 32 fits, 2 GB kept free
  resacct fit --model tests.fixtures_hf_models:tiny_llama --memory-gb 0.004 --seq 16 --grad-accum 2 --json
      any nn.Module factory; gradients accumulated over 2 micro-steps
"""

#: the napkin form's flags, which mean nothing for a model's step
NAPKIN_ONLY_FLAGS = (("--devices", "devices", 1), ("--bytes-per-param", "bytes_per_param", None), ("--zero", "zero", None),
                     ("--moment", "moment", "between-steps"))


def _bytes_text(value: float, units: str) -> str:
    """Bytes in the largest unit of ``units`` (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB) that keeps them ≥ 1."""
    base, names = (1e3, ("B", "kB", "MB", "GB", "TB")) if units == "decimal" else (1024.0, ("B", "KiB", "MiB", "GiB", "TiB"))
    scaled, index = float(value), 0
    while abs(scaled) >= base and index < len(names) - 1:
        scaled, index = scaled / base, index + 1
    return f"{scaled:.0f} B" if index == 0 else f"{scaled:.2f} {names[index]}"


def add_model_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the step and the search, added to ``resacct fit`` (whose ``--device``,
    ``--memory-gb``, ``--recipe``, ``--optimizer`` and ``--units`` serve both forms)."""
    from resacct.cli._model_args import add_model_source_arguments

    add_model_source_arguments(parser)
    parser.add_argument("--search", choices=("batch", "seq"), default="batch",
                        help="what to search: the micro-batch at --seq, or the sequence length at --batch (default: batch)")
    parser.add_argument("--batch", type=positive_int, default=1, metavar="N", help="sequences per micro-batch when searching seq (default: 1)")
    parser.add_argument("--seq", type=positive_int, default=None, metavar="N", help="tokens per sequence when searching batch (default: the context length)")
    parser.add_argument("--reserve-gb", type=reserve_gigabytes, default=0.0, help="with a model: GB to keep free (CUDA context, fragmentation; default: 0)")
    parser.add_argument("--grad-accum", type=positive_int, default=1, metavar="K", help="micro-steps whose gradients accumulate per step (default: 1)")
    parser.add_argument("--max-batch", type=positive_int, default=None, metavar="N", help="the largest micro-batch to try (default: 1,048,576)")
    add_progress_flag(parser)
    parser.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                        help="stop the search after SECONDS with one line naming the phase and your code's line, exit 2 (Ctrl-C: exit 130)")
    add_no_cache_flag(parser, "search afresh")
    parser.add_argument("--trace-all-layers", action="store_true",
                        help="with --hf-config: each probe traces every decoder layer (default: a stack of more than 16 identical layers "
                             "is traced at depths 3, 4 and 5 and extrapolated, each number checked on the third depth)")


def _target(args: argparse.Namespace) -> Any:
    from resacct.cli._model_args import model_source

    return model_source(args).target()


def run_model_fit(args: argparse.Namespace) -> int:
    """Parse the device once, build the model on meta, search, print."""
    from resacct.facts.recipes import RECIPES, parse_recipe

    used = [flag for flag, name, default in NAPKIN_ONLY_FLAGS if getattr(args, name) != default]
    if used:
        raise ResacctError(f"{', '.join(used)} belong to the napkin fit (the largest model); with --hf-config or --model, resacct fit searches "
                           "one device's micro-batch — drop them")
    if args.recipe is not None and args.recipe.name not in RECIPES:
        raise ResacctError(f"--recipe {args.recipe.name!r} is a byte count; a model's step runs a named recipe ({', '.join(RECIPES)})")
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
    from resacct.account.load.user_code import running_phase, stopping_after

    with stopping_after(args.timeout, command="resacct fit", hint="expected a search within the limit: raise --timeout, or a smaller "
                        "--max-batch, --seq or model"):
        with running_phase("importing torch and resacct's accounting"):
            from resacct.account.fit.search import MAX_BATCH, fit_step
            from resacct.account.trace.cache import cache_wanted, cached, caching, last_outcome
            from resacct.account.trace.pass_profile import collector_off
        gpu = importlib.import_module("resacct.account.gpu.answers.device_answer") if board is not None else None  # a board: its CUDA reserved peak

        def searched() -> tuple[Any, Any]:
            started = time.perf_counter()
            target = _target(args)
            if gpu is None:
                return _search(args, target, started, memory_bytes, reserve_bytes, board, recipe, optimizer, fit_step, MAX_BATCH), None
            from resacct.account.gpu.answers.traced_beside import TracedBeside

            # the board's step traced on the second core at each size the CPU search probes (its search starts there)
            step_at = gpu.board_step_function(target, searched=args.search, board=board, recipe=recipe, optimizer=optimizer)
            with TracedBeside(step_at) as beside:
                answer = _search(args, target, started, memory_bytes, reserve_bytes, board, recipe, optimizer, fit_step, MAX_BATCH,
                                 on_probe_start=beside.ask)
                traced = beside.collect()
            return answer, gpu.fit_gpu_answer(answer, target, board=board, recipe=recipe, optimizer=optimizer, step_at=step_at, traced=traced)

        # --hf-config: the same question's answer read back from the trace cache (a factory's code may change: searched afresh)
        with user_output_to_stderr(getattr(args, "json", False)), caching(args.hf_config is not None and cache_wanted(args.no_cache)), collector_off():
            answer, found = cached("hf-fit", _question(args, memory_bytes, reserve_bytes, board, recipe, optimizer), searched)
        if last_outcome() == "hit":
            print(f"resacct fit: answered from the trace cache ({answer.traces} traces, {answer.seconds:.1f} s when first searched; "
                  "--no-cache searches afresh)", file=sys.stderr)
    fields = dict(answer.to_dict(), gpu=gpu.fit_gpu_fields(found) if gpu else None)
    text = _text(answer, args.units, on_board=gpu is not None) + ("".join("\n" + line for line in gpu.fit_gpu_lines(found, answer, lambda b: _bytes_text(b, args.units))) if gpu else "")
    if gpu is not None and (headline := gpu.fit_gpu_headline(found, board.name, lambda b: _bytes_text(b, args.units))) is not None:
        first, _, rest = text.partition("\n")
        text = f"{first}\n{headline}\n{rest}"  # the board's answer first: what a GPU runs out of is its reserved peak
    return emit(args, fields, with_caveat(fields, text, board))


def _question(args: argparse.Namespace, memory_bytes: float, reserve_bytes: float, board: Any, recipe: Any, optimizer: str) -> dict[str, Any]:
    """What a fit of ``--hf-config`` answers, for the trace cache's key: the config's values and every size, budget and choice
    (a --model factory's fit is never cached: no question is built for it)."""
    if args.hf_config is None:
        return {}
    from resacct.account.load.hf_models import load_hf_config

    spec = load_hf_config(args.hf_config)
    return {"config": spec.values, "name": spec.name, "source": spec.source, "search": args.search, "batch": args.batch, "seq": args.seq,
            "memory_bytes": memory_bytes, "reserve_bytes": reserve_bytes, "board": None if board is None else board.name, "recipe": recipe,
            "optimizer": optimizer, "micro_batches": args.grad_accum, "max_batch": args.max_batch, "attention": "sdpa",
            **({"layers": "all"} if args.trace_all_layers else {})}


def _search(args: argparse.Namespace, target: Any, started: float, memory_bytes: float, reserve_bytes: float, board: Any, recipe: Any,
            optimizer: str, fit_step: Any, max_batch: int, on_probe_start: Any = None) -> Any:
    """The search over ``target`` (the model built on meta, from ``started``), each probe a prediction (``fit_search.fit_step``)."""
    from resacct.account.load.user_code import running_phase

    units = args.units

    on_probe = probe_progress("fit", args.search, args.progress, started, lambda value: _bytes_text(value, units))

    with running_phase(f"searching the largest {args.search} that fits (each probe the step on fake tensors)"):
        return fit_step(target, memory_bytes=memory_bytes, search=args.search, batch=args.batch, seq=args.seq, reserve_bytes=reserve_bytes,
                        device=board, recipe=recipe, optimizer=optimizer, micro_batches=args.grad_accum,
                        max_batch=args.max_batch or max_batch, on_probe=on_probe, on_probe_start=on_probe_start)


def _text(answer: Any, units: str, on_board: bool = False) -> str:
    """The search's lines; ``on_board``: a board's own answer follows (``--device BOARD``), so the search's is the CPU kernels' step."""
    what = "micro-batch" if answer.searched == "batch" else "sequence length"
    whose = " (the CPU kernels' step; the board's step below)" if on_board else ""
    at = (f"seq {answer.fixed:,}" if answer.fixed is not None else "its input") if answer.searched == "batch" else f"micro-batch {answer.fixed:,}"
    where = answer.device.name if answer.device is not None else "the memory given"
    accumulation = f", {answer.micro_batches} accumulated micro-steps" if answer.micro_batches > 1 else ""
    lines = [f"{answer.model} at {at}, {answer.recipe} {answer.optimizer}{accumulation}, on {where}",
             f"  budget: {_bytes_text(answer.memory_bytes, units)} − {_bytes_text(answer.reserve_bytes, units)} reserved = "
             f"{_bytes_text(answer.budget_bytes, units)}"]
    if answer.largest is None:
        lines.append(f"  largest {what} that fits: none — {answer.searched} 1 is predicted at {_bytes_text(answer.next_peak_bytes, units)}, "
                     f"{_bytes_text(answer.next_peak_bytes - answer.budget_bytes, units)} over{whose}")
    else:
        share = answer.headroom_bytes / answer.budget_bytes
        lines.append(f"  largest {what} that fits: {answer.largest:,}" + (" (the limit searched)" if answer.next_peak_bytes is None else "") + whose)
        lines.append(f"  predicted step peak there: {_bytes_text(answer.peak_bytes, units)} in {answer.peak_phase} ({answer.peak_op}); "
                     f"headroom {_bytes_text(answer.headroom_bytes, units)} ({share:.1%} of the budget)")
        if answer.next_peak_bytes is not None:
            lines.append(f"  {answer.searched} {answer.largest + 1:,} would need {_bytes_text(answer.next_peak_bytes, units)} "
                         f"({_bytes_text(answer.next_peak_bytes - answer.budget_bytes, units)} over)")
    sizes = " ".join(f"{p.size:,}{'✓' if p.fits else '✗'}" for p in answer.probes)
    each = "each the whole step" if answer.sampled is None or answer.sampled.startswith("every layer") else "each the step"
    lines.append(f"  probes: {sizes} — {answer.traces} traces, {each} (fwd, bwd, optimizer, zero_grad) on fake tensors, the model never allocated; "
                 f"{answer.seconds:.1f} s" + ("" if answer.sampled is None else f" ({answer.sampled})"))
    lines.append(f"  attention: {answer.attention_kernel}. The peak is the CPU kernels' step as the allocator counts it; a GPU runs "
                 "other kernels and its caching allocator rounds blocks to 512 B and keeps freed segments: keep a reserve")
    return "\n".join(lines)
