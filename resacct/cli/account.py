"""``resacct account``: what one training step of a model costs — predicted beside measured.

Builds a GPT of ``--model`` (see resacct.training.gpt.GPT_CONFIGS), runs one step on random tokens and
lays out, for each quantity, resacct's formula, PyTorch's measurement and their ratio:
FLOPs (FlopCounterMode, beside the 6N and 6N + 12·L·d·s conventions), the training state of a
real torch.optim.AdamW under ``--recipe``, the activations autograd saves (beside Korthikanti et
al.'s per-layer formula), the allocator's peaks, activation checkpointing, gradient
accumulation, and the step's time.

Small models run for real on the CPU; large ones are built on the meta device, where shapes,
saved tensors and optimizer state are real but nothing is computed (``--measure`` forces a real
run, ``--no-measure`` forbids it).

Your own model: ``--model my_pkg.models:build`` imports ``build`` (the current directory is on the
path) and calls it with the ``--model-arg key=value`` pairs; it returns an nn.Module or
(nn.Module, example_input). The input is that example, else ``--input-shape``/``--input-dtype``,
else ``module.example_input(batch)``, else (batch, in_features) when the first module is a
Linear. The loss is ``--loss`` (mean of the output by default). Predictions appear where resacct
has a formula (training state always; FLOPs and activations for Linear/activation stacks such
as the Cruncher and MLPs; a transformers causal LM of gpt2, llama, mistral or mixtral as
``--hf-config`` predicts it), "—" elsewhere, with one line saying why.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time
from typing import Any, NoReturn

from resacct.cli._cached_answer import add_no_cache_flag
from resacct.cli._recipes import RECIPES_EPILOG, named_recipe_type
from resacct.cli.arguments import byte_size, count, non_negative_float, positive_int, seconds
from resacct.cli._units import add_units_flag
from resacct.cli.output import add_json_flag, emit, format_quantity, user_output_to_stderr
from resacct.cli._account_hf import check_max_memory as _check_max_memory, predicted_peak as _predicted_peak, rendered_hf_account, run_hf_config
from resacct.cli._account_table import DEFAULT_TABLE_COLUMNS, _render, render_account, table_width_columns  # noqa: F401 (the table, re-exported)
from resacct.errors import ResacctError
from resacct.facts.recipes import OPTIMIZER_CHOICES, parse_recipe

__all__ = ["register", "run_account", "format_quantity", "render_account"]

_EXAMPLES = """examples:
  resacct account
      gpt-tiny, batch 4 × 128 tokens, fp32 AdamW, measured on the CPU (a few seconds)
  resacct account --model gpt2-small --batch 1 --seq 1024
      GPT-2 small on the meta device: exact FLOPs, 16 B/param state, 1.43 GB of activations
  resacct account --model gpt2-small --batch 1 --seq 64 --measure
      the same model run for real on the CPU at a small size
  resacct account --checkpoint-segments 2 --grad-accum 2 --per-module
      checkpointing and accumulation measured; FLOPs and saved bytes per module
  resacct account --recipe bf16-fp32-master --attention sdpa --json
      mixed precision state (20 B/param at the step), fused attention, as JSON
  resacct account --train-tokens 1B --accelerator h100-sxm
      projects a run of 1B tokens at the measured speed; MFU against a named peak
  resacct account --model resacct.account.answers.generic:mlp --model-arg dim=64 --model-arg hidden=256 --batch 8
      any nn.Module from a factory (module:factory): traced FLOPs, real optimizer state, saved bytes
  resacct account --model resacct.training.models:Cruncher --model-arg dim=64 --model-arg num_layers=4 --optimizer sgd-momentum
      the lecture's deep linear model, state of torch.optim.SGD(momentum=0.9)
  resacct account --model my_pkg.models:build --input-shape 8,64 --input-dtype float32 --loss sum
      your own model on an input of that shape
  resacct account --model my_pkg.models:build --timeout 600 --max-memory 16GiB
      stopped after 10 minutes; refused before it runs when its predicted peak is above 16 GiB
  resacct account --hf-config llama-2-7b --recipe bf16-fp32-master
      Llama-2-7B from its config on meta: parameters, FLOPs, state, checkpoint predicted = measured
  resacct account --hf-config mixtral-8x7b --batch 1 --seq 4096
      a mixture of experts: total and active parameters, k experts' FLOPs per token
  resacct account --hf-config llama-2-7b --seq 4096 --json
      the step's peak predicted on fake CPU tensors (step_peak: bytes, what is live at it, when, attention kernel)
  resacct account --model tests.fixtures_hf_models:tiny_llama --batch 2 --seq 16 --timeline step.png
      predicted and measured memory over the step as a picture, phases marked, peak annotated
  resacct account --model my_pkg.hf:build_llama --batch 2 --seq 128
      a transformers causal LM (LlamaForCausalLM …): input_ids and labels of 2 × 128, its own loss

optimizers: adamw (default), adam, sgd, sgd-momentum, adagrad, rmsprop (torch.optim)
""" + RECIPES_EPILOG


def _whole(minimum: int) -> Any:
    def parse(text: str) -> int:
        value = non_negative_float(text)
        if value != int(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be a whole number ≥ {minimum}")
        return int(value)

    return parse


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise argparse.ArgumentTypeError(f"{text!r} must be sizes ≥ 1 separated by commas, e.g. 8,64")
    return shape


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "account",
        help="one training step of a model: FLOPs, state, activations, peak, time — predicted beside measured",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES,
    )
    parser.add_argument("--model", default="gpt-tiny", metavar="NAME",
                        help="a resacct.training.gpt config (gpt-nano, gpt-tiny, gpt-small-cpu, gpt2-small …; default: gpt-tiny) or module:factory for any nn.Module")
    parser.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                        help="a Hugging Face causal LM from its config, on the meta device: predicted (resacct's formulas) beside measured. "
                             "Shipped: " + ", ".join(_hf_config_names()) + "; or a model card's config.json (needs resacct[hf])")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="an argument of the module:factory (repeatable)")
    parser.add_argument("--input-shape", type=_shape, default=None, metavar="N,N,…", help="input of a module:factory model, batch first (e.g. 8,64)")
    parser.add_argument("--input-dtype", default=None, metavar="DTYPE",
                        help="dtype of --input-shape's tensor (default: float32); only with --input-shape — a factory's example input, "
                             "input_ids and example_input() keep their own dtype")
    parser.add_argument("--loss", choices=("auto", "model", "mean", "sum", "mse", "cross-entropy"), default="auto",
                        help="loss of a module:factory model's output (default auto: the model's own .loss when it has one, e.g. a "
                             "transformers causal LM given labels, else mean; mse against zeros; cross-entropy against class 0)")
    parser.add_argument("--optimizer", choices=OPTIMIZER_CHOICES, default=None,
                        help="the torch.optim optimizer whose state is measured (default: the one the recipe name pins, else adamw)")
    parser.add_argument("--batch", type=positive_int, default=4, metavar="N", help="sequences per step (default: 4)")
    parser.add_argument("--seq", type=positive_int, default=None, metavar="N",
                        help="tokens per sequence (default: the model's context length); with module:factory, the input_ids' length "
                             "of a token model or the middle axis of a Linear's input")
    parser.add_argument("--recipe", type=named_recipe_type, default=parse_recipe("fp32"), metavar="NAME",
                        help="precision recipe of the training state, a name or alias of resacct.facts.recipes (default: fp32)")
    parser.add_argument("--attention", choices=("math", "sdpa"), default="math", help="attention as matmuls, or F.scaled_dot_product_attention (default: math)")
    parser.add_argument("--checkpoint-segments", type=_whole(0), default=0, metavar="K", help="checkpoint the layers in K segments (default: 0, none)")
    parser.add_argument("--grad-accum", type=positive_int, default=1, metavar="N", help="split the batch into N accumulated micro-batches (default: 1)")
    parser.add_argument("--measure", action=argparse.BooleanOptionalAction, default=None,
                        help="run for real on --device (default: only when a step is ≤ 2e10 FLOPs; otherwise the meta device)")
    parser.add_argument("--device", default="cpu", metavar="NAME", help="where a measured step runs, cpu or cuda (default: cpu); with --hf-config "
                        "also a board (h100, a100-sxm-40gb …): its CUDA allocator's predicted allocated and reserved peaks")
    parser.add_argument("--no-time", action="store_true", help="skip timing the step")
    parser.add_argument("--accelerator", default=None, metavar="NAME", help="peak FLOP/s for MFU from the accelerator table, e.g. h100-sxm")
    parser.add_argument("--peak-tflops", type=count, default=None, metavar="X", help="peak for MFU in TFLOP/s (instead of --accelerator)")
    parser.add_argument("--train-tokens", type=count, default=None, metavar="N", help="project a run of N tokens (e.g. 15T) at the measured speed")
    parser.add_argument("--devices", type=positive_int, default=1, metavar="N", help="devices sharing the projected run (default: 1)")
    parser.add_argument("--per-module", action="store_true", help="also show FLOPs and saved bytes per module")
    parser.add_argument("--timeline", default=None, metavar="PATH.png",
                        help="draw the step's memory over forward, backward, optimizer step and zero_grad: predicted (fake tensors) "
                             "and, on a CPU run, measured (allocator); the peak annotated with what is live")
    parser.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                        help="stop the run after SECONDS, exit 2, with one line naming the phase (loading, tracing and measuring, "
                             "predicting) and your code's line; on POSIX an alarm stops Python code at once, one long C call when it returns "
                             "(or, 10 s later, the process)")
    parser.add_argument("--max-memory", type=byte_size, default=None, metavar="SIZE",
                        help="refuse (exit 2) a step whose predicted peak — traced on the meta device before anything is allocated: "
                             "parameters, gradients, optimizer state, activations, temporaries — is above SIZE (8GiB, 16GB, 512MiB). "
                             "A check of the prediction, not an OS cap (an address-space limit counts torch's mappings, not memory; use a cgroup for that)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress line on stderr (phase, seconds) once a phase runs 2 s (default: on a terminal; elsewhere "
                             "once a phase runs 30 s); never on stdout")
    parser.add_argument("--profile", action="store_true",
                        help="where the time goes: CPU and wall seconds per pass (import, load/build, trace, state, activations, peak, "
                             "time, render) on stderr; with --json under profile_seconds")
    add_no_cache_flag(parser)
    parser.add_argument("--trace-all-layers", action="store_true",
                        help="with --hf-config: trace every decoder layer (default: a stack of more than 16 identical layers is traced "
                             "at depths 3, 4 and 5 and extrapolated, each number checked on the third depth)")
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=run_account)

    def one_line_error(message: str) -> NoReturn:
        print(f"resacct account: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    parser.error = one_line_error  # type: ignore[method-assign]


def _hf_config_names() -> list[str]:
    """The shipped config names for ``--help``, read without importing ``resacct.account`` (torch)."""
    from resacct.cli._model_args import shipped_hf_config_names

    return shipped_hf_config_names()


def _timeline(args: argparse.Namespace, account: Any, title: str) -> None:
    """Write ``--timeline``'s PNG from the account's step peak (one line, exit 2, when there is none)."""
    if args.timeline is None:
        return
    from resacct.account.render.timeline_plot import write_timeline_png

    step_peak = account.step_peak
    if step_peak is None or (step_peak.predicted is None and step_peak.measured is None):
        raise ResacctError(f"--timeline {args.timeline}: no step timeline for this account ({getattr(step_peak, 'gap', None) or 'no step peak'}); "
                           "expected a step resacct can predict or run")
    write_timeline_png(args.timeline, step_peak.predicted, step_peak.measured, title=title)
    if not args.json:
        print(f"timeline: {args.timeline}", file=sys.stderr)


def _peak(args: argparse.Namespace) -> tuple[float | None, str | None]:
    if args.peak_tflops is not None and args.accelerator is not None:
        raise ResacctError("give --accelerator or --peak-tflops, not both")
    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12, f"given peak {args.peak_tflops:g} TFLOP/s"
    if args.accelerator is None:
        return None, None
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec, peak_format, peak_source_text

    board = get_accelerator(args.accelerator)
    dtype = peak_format(args.recipe.computes_in)  # the matmuls' format: fp16 for fp16-autocast-scaled, not bf16
    return peak_flops_per_sec(board, dtype), peak_source_text(board, dtype)


def _run_generic(args: argparse.Namespace) -> tuple[Any, str, Any]:
    import os

    from resacct.account.answers.generic import account_named_model
    from resacct.account.load.model_factory import parse_model_arg

    gpt_only = [flag for flag, used in (("--attention", args.attention != "math"),
                                        ("--checkpoint-segments", args.checkpoint_segments), ("--grad-accum", args.grad_accum != 1),
                                        ("--device cuda", args.device != "cpu"), ("--accelerator", args.accelerator), ("--peak-tflops", args.peak_tflops),
                                        ("--train-tokens", args.train_tokens)) if used]
    if gpt_only:
        raise ResacctError(f"{', '.join(gpt_only)} apply to the resacct.training.gpt models; expected none of them with --model {args.model}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: a module next to you is importable
    model_args = dict(parse_model_arg(text) for text in args.model_arg)

    def account(measure: bool | None) -> Any:
        return account_named_model(args.model, model_args=model_args, batch=args.batch, seq=args.seq, input_shape=args.input_shape,
                                   input_dtype=args.input_dtype or "float32", loss=args.loss, recipe=args.recipe, optimizer=args.optimizer,
                                   measure=measure)

    predicted = None
    if args.max_memory is not None:
        from resacct.account.load.model_factory import predict_named_model_peak

        predicted = predict_named_model_peak(args.model, model_args, batch=args.batch, seq=args.seq, input_shape=args.input_shape,
                                             input_dtype=args.input_dtype or "float32", loss=args.loss, recipe=args.recipe, optimizer=args.optimizer)
    result = _within_max_memory(args, account, f"--model {args.model}", predicted)
    title = f"{result.model}: input {tuple(result.input_shape)} {result.input_dtype}, {result.recipe} {result.optimizer}"
    return result, title, lambda: render_account(result, per_module=args.per_module, units=args.units)


def run_account(args: argparse.Namespace) -> int:
    """The account under the guards (``--timeout``, the progress line), then its table or JSON and
    ``--timeline``'s picture outside them. Arguments refused here are refused before torch is
    imported (resacct.account pulls it in: ~1.4 s)."""
    started = (time.process_time(), time.perf_counter())  # --profile: the import is the time until the account begins
    args.optimizer = args.recipe.optimizer_for(args.optimizer)  # a recipe alias such as mixed-adam pins its optimizer
    if args.input_dtype is not None and args.input_shape is None and args.hf_config is None and ":" in args.model:
        raise ResacctError(f"--input-dtype {args.input_dtype} applies to --input-shape's tensor; expected --input-shape N,N,… with it "
                           "(a factory's example input, input_ids and example_input() keep their own dtype)")
    if args.trace_all_layers and args.hf_config is None:
        raise ResacctError("--trace-all-layers applies to --hf-config (a stack of decoder layers); expected --hf-config NAME with it")
    if args.device not in ("cpu", "cuda") and args.hf_config is None:
        raise ResacctError(f"--device {args.device}: a board (no GPU here) answers for --hf-config only; expected cpu or cuda")
    if args.timeline is not None:
        from resacct.account.render.timeline_plot import check_timeline_path

        check_timeline_path(args.timeline)  # a path that cannot be written: one line before any work
    if args.hf_config is not None and args.timeline is None and not args.profile:  # the printed answer itself, read back without torch
        fields, text = rendered_hf_account(args, lambda: _answer(args, started))
    else:
        fields, text, _ = _answer(args, started)
    return emit(args, fields, text)


def _answer(args: argparse.Namespace, started: tuple[float, float]) -> tuple[dict[str, Any], str, Any]:
    """The account under the guards, its JSON fields and text, and the account itself."""
    from resacct.account.load.user_code import running_phase, showing_progress, stopping_after

    live = sys.stderr.isatty()
    progress = contextlib.nullcontext() if args.progress is False else showing_progress(
        sys.stderr, command="resacct account", after_s=2.0 if live or args.progress else 30.0, every_s=10.0 if args.progress else 60.0, live=live)
    with stopping_after(args.timeout, command="resacct account", hint="expected a run within the limit: raise --timeout, or a smaller "
                        "--batch, --seq or model"), progress, user_output_to_stderr(args.json):
        with running_phase("importing torch and resacct's accounting"):
            importlib.import_module("resacct.account.answers.gpt_step")  # torch and the account API: seconds on a busy machine
        profile = importlib.import_module("resacct.account.trace.pass_profile").pass_profile(args.profile, started)
        with running_phase("predicting and comparing (resacct's own work)"), profile.installed():  # the user's code and the builds name their own phases
            account, title, render = run_hf_config(args) if args.hf_config is not None else _run_generic(args) if ":" in args.model else _run_gpt(args)
    with profile.timing("render"):
        fields = account.to_dict()
        if not args.per_module:
            fields.pop("per_module")
        _timeline(args, account, title)
        text = "" if args.json else render()
    profile.publish(started, fields if args.json else None)  # --profile: seconds per pass on stderr, or as --json's profile_seconds
    return fields, text, account


def _run_gpt(args: argparse.Namespace) -> tuple[Any, str, Any]:
    from resacct.account import account_gpt
    from resacct.account.load.user_code import running_phase
    from resacct.training.gpt import get_gpt_config

    generic_only = [flag for flag, used in (("--model-arg", args.model_arg), ("--input-shape", args.input_shape),
                                            ("--input-dtype", args.input_dtype), ("--loss", args.loss != "auto")) if used]
    if generic_only:
        raise ResacctError(f"{', '.join(generic_only)} apply to --model module:factory; expected none of them with the GPT config {args.model!r}")
    get_gpt_config(args.model)  # unknown names: one line with close matches
    peak, source = _peak(args)

    def account(measure: bool | None) -> Any:
        return account_gpt(
            args.model, batch=args.batch, seq=args.seq, recipe=args.recipe, attention=args.attention,
            checkpoint_segments=args.checkpoint_segments, grad_accum=args.grad_accum, measure=measure, device=args.device,
            time_step=not args.no_time, peak_flops_per_sec=peak, peak_source=source, train_tokens=args.train_tokens,
            devices=args.devices, optimizer=args.optimizer)

    with running_phase(f"building, tracing, measuring and timing {args.model}"):
        result = _within_max_memory(args, account, f"--model {args.model}")
    title = f"{result.model}: batch {result.batch} × seq {result.seq}, {result.recipe}, {result.attention} attention"
    return result, title, lambda: render_account(result, per_module=args.per_module, units=args.units)


def _within_max_memory(args: argparse.Namespace, account: Any, what: str, predicted: tuple[int | None, str] | None = None) -> Any:
    """``account(args.measure)``; with ``--max-memory``, refused first when the step's peak is above
    the limit: ``predicted`` (bytes, how) when given, else the account on the meta device."""
    from resacct.account.load.user_code import running_phase

    if args.max_memory is None:
        return account(args.measure)
    if predicted is not None and predicted[0] is not None:
        _check_max_memory(args, (predicted[0], predicted[1]), what)
        return account(args.measure)
    with running_phase("predicting the step's memory on the meta device (--max-memory)"):
        on_meta = account(False)
    _check_max_memory(args, _predicted_peak(on_meta), what)
    return on_meta if args.measure is False else account(args.measure)
