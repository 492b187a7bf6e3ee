"""``resacct account --hf-config``: the transformers model built on meta, traced and predicted, and its printed answer
read back from the trace cache (:mod:`resacct.account.trace.cache`) when the same question was printed before — the JSON
fields and the text, keyed by the config, every size and choice and what is printed (``--per-module``, ``--units``,
``--json``, ``--device``), so a question asked again answers without importing torch. ``--max-memory`` is checked against
the stored peak each time; ``--timeline`` and ``--profile`` (which need the account itself) trace or read the account as
before."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from resacct.cli._account_table import _render
from resacct.cli._cached_answer import cached_command_answer, hf_config_question
from resacct.cli._units import gigabytes_text
from resacct.cli.output import format_quantity
from resacct.errors import ResacctError

__all__ = ["check_max_memory", "predicted_peak", "rendered_hf_account", "run_hf_config"]


def rendered_hf_account(args: argparse.Namespace, answer: Callable[[], tuple[dict[str, Any], str, Any]]) -> tuple[dict[str, Any], str]:
    """``answer()``'s JSON fields and text (``answer`` returns them with the account), or those stored for the same question;
    ``--max-memory`` refused against the stored peak as against a traced one."""

    def printed() -> tuple[dict[str, Any], str, tuple[int, str]]:
        fields, text, account = answer()
        return fields, text, predicted_peak(account)

    question = hf_config_question(args, None, None, batch=args.batch, seq=args.seq, recipe=args.recipe, optimizer=args.optimizer,
                                  layers="all" if args.trace_all_layers else "auto", device=args.device, per_module=args.per_module,
                                  json=args.json, attention="sdpa")
    fields, text, peak = cached_command_answer("account", "rendered-account", question, printed, no_cache=args.no_cache)
    check_max_memory(args, peak, f"--hf-config {args.hf_config}")
    return fields, text


def run_hf_config(args: argparse.Namespace) -> tuple[Any, str, Any]:
    """``--hf-config``: the model built on meta, traced and predicted (the trace cache may hold it): the account, its title and
    a renderer of its table (with ``--device BOARD``'s lines)."""
    from resacct.account.answers.hf import account_hf_config
    from resacct.account.load.optimizers import optimizer_display_name
    from resacct.account.load.user_code import running_phase

    other = [flag for flag, used in (("--model", args.model != "gpt-tiny"), ("--model-arg", args.model_arg), ("--input-shape", args.input_shape),
                                     ("--input-dtype", args.input_dtype),
                                     ("--loss", args.loss != "auto"), ("--attention", args.attention != "math"),
                                     ("--checkpoint-segments", args.checkpoint_segments), ("--grad-accum", args.grad_accum != 1),
                                     ("--measure", args.measure), ("--device cuda", args.device == "cuda"), ("--accelerator", args.accelerator),
                                     ("--peak-tflops", args.peak_tflops), ("--train-tokens", args.train_tokens)) if used]
    if other:
        raise ResacctError(f"{', '.join(other)} do not apply to --hf-config (built on the meta device, its own loss); expected none of them")
    if args.device != "cpu":  # a board's name is checked before the account's seconds
        importlib.import_module("resacct.facts.hardware").get_accelerator(args.device)
    from resacct.account.trace.cache import cache_wanted, caching
    from resacct.account.trace.pass_profile import collector_off

    with running_phase(f"building {args.hf_config!r} on the meta device, tracing and predicting"), caching(cache_wanted(args.no_cache)), collector_off():
        account = account_hf_config(args.hf_config, batch=args.batch, seq=args.seq, recipe=args.recipe, optimizer=args.optimizer,
                                    layers="all" if args.trace_all_layers else "auto")
    check_max_memory(args, predicted_peak(account), f"--hf-config {args.hf_config}")
    with caching(cache_wanted(args.no_cache)), collector_off():
        gpu = "" if args.device == "cpu" else _board_text(args, account)
    title = (f"{account.name} ({account.model_class}): batch {account.batch} × seq {account.seq} = {account.tokens:,} tokens, "
             f"{account.parameters:,} parameters, {account.recipe} {optimizer_display_name(account.optimizer)}, on {account.device}")
    return account, title, lambda: _render(account, per_module=args.per_module, title=title, units=args.units) + gpu  # --device h100: CUDA peaks


def _board_text(args: argparse.Namespace, account: Any) -> str:
    """``--device BOARD``'s lines (its step traced as CUDA runs it) and the note they add — read back
    from the trace cache when it holds the same question (the same rebuild and trace otherwise)."""
    from resacct.account.load.hf_models import load_hf_config
    from resacct.account.trace.cache import cached

    ran: list[bool] = []

    def traced() -> tuple[str, list[str], Any]:
        before = len(account.notes)
        text = importlib.import_module("resacct.account.gpu.answers.device_answer").hf_gpu_text(
            account, args.hf_config, args.device, lambda value: gigabytes_text(value, args.units))
        ran.append(True)
        return text, account.notes[before:], account.gpu

    spec = load_hf_config(args.hf_config)
    question = {"config": spec.values, "name": spec.name, "source": spec.source, "batch": account.batch, "seq": account.seq,
                "recipe": account.recipe, "optimizer": account.optimizer, "board": args.device, "units": args.units, "attention": "sdpa"}
    text, notes, gpu = cached("hf-account-board", question, traced)
    if not ran:  # read back: the notes and the answer the trace adds
        account.notes.extend(notes)
        account.gpu = gpu
    return text


def predicted_peak(account: Any) -> tuple[int, str]:
    """The step's predicted peak in bytes and how it was found: the fake-tensor timeline of the whole
    step (:mod:`resacct.account.peak.step_peak`), else the training state at the step plus the saved activations."""
    step_peak = getattr(account, "step_peak", None)
    if step_peak is not None and step_peak.predicted is not None:
        return step_peak.predicted.peak_bytes, "the step's peak traced on fake tensors"
    return account.state.at_step_bytes + account.saved.activation_bytes, "training state at the step + saved activations, on meta"


def check_max_memory(args: argparse.Namespace, predicted: tuple[int, str], what: str) -> None:
    needed, how = predicted
    if args.max_memory is not None and needed > args.max_memory:
        raise ResacctError(f"{what}: the step is predicted to need {format_quantity(needed, 'bytes')} ({needed:,} bytes; {how}), more than "
                           f"--max-memory {format_quantity(args.max_memory, 'bytes')} ({args.max_memory:,} bytes): refused before anything runs for real; expected a smaller "
                           "--batch, --seq or model, or a larger --max-memory")
