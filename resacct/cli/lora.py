"""``resacct lora``: does LoRA (or QLoRA: ``--base nf4``) fine-tuning of a model fit a device at
batch × sequence? The state of a step with AdamW, as peft keeps it — frozen base in its format,
float32 adapters, their gradients and AdamW state — plus the activations one step saves and its
FLOPs, and the largest batch that fits. The state, the saved activations and the FLOPs are each
checked to the byte / FLOP against a real peft step on the CPU (``resacct/specs/finetune.claims.yaml``).

Activations: what a peft LoRA forward saves (:func:`resacct.formulas.lora.lora_saved_terms`: frozen
layers keep no inputs, each adapter a float32 copy of its input; sdpa's flash kernel). With
``--gradient-checkpointing`` an **estimate**: every layer's input plus one layer's saved tensors
during its recomputation. NF4 (QLoRA) is predicted only: 4.127 bits per weight of the blocks'
linear layers (QLoRA §3, double quantisation), embeddings, norms and LM head in bf16; its
activations are a bf16 base's (bitsandbytes' 4-bit matmul is not measured here).
FLOPs: matmuls of one forward and backward (no weight gradients of the base: about 2/3 of full
fine-tuning's).

With ``--hf-config`` (any architecture transformers builds) and a bf16/fp16/fp32 base, the step is
also traced (:mod:`resacct.account.trace.lora_step`): peft on the model built on the meta device, the whole
step's peak on fake CPU tensors — temporaries included — is the total that decides "fits"; where
resacct has no LoRA closed form for the model, the traced step's state, FLOPs and saved bytes are shown.
The largest batch that fits is then searched as ``fit`` searches (:mod:`resacct.account.fit.lora_batch`):
the peaks at the command's own batch and at one trace's guess name it, and the step is traced at the answer
(it fits) and one more (it does not); ``--progress`` reports each batch traced.
A second ``--hf-config`` question asked the same way is answered from the trace cache
(:mod:`resacct.cli._cached_answer`; ``--no-cache`` traces afresh).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from resacct.cli._cached_answer import add_no_cache_flag, cached_command_answer, hf_config_question
from resacct.cli._lora_board import LoraBoardSteps
from resacct.cli._search_progress import add_progress_flag, probe_progress
from resacct.cli._model_args import add_device_arguments, add_model_arguments, device_memory_bytes, model_config, shape_flags_given
from resacct.cli._units import add_units_flag, gigabytes_text
from resacct.cli.arguments import positive_int
from resacct.cli.devices import parse_boards_at_the_edge, untraced_gpu_answer
from resacct.cli.output import add_json_flag, emit, with_caveat

__all__ = ["register"]

_EXAMPLES = """examples:
  resacct lora --hf-config llama-2-7b --rank 16 --batch 1 --seq 2048 --memory-gb 24 --gradient-checkpointing
  resacct lora --hf-config llama-2-7b --rank 16 --targets all-linear --base nf4 --batch 4 --seq 2048 --memory-gb 24 --gradient-checkpointing --units binary
  resacct lora --hf-config llama-3-70b --rank 64 --targets all-linear --base nf4 --seq 4096 --device h100 --units binary --json
  resacct lora --hf-config llama-2-7b --seq 2048 --device h100     also the CUDA allocated and reserved peaks and the step time on an H100
"""


def _targets(text: str) -> tuple[str, ...]:
    from resacct.formulas.lora import LORA_TARGETS

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names or any(not (t.isidentifier() or t == "all-linear") for t in names) or ("all-linear" in names and len(names) > 1):
        raise argparse.ArgumentTypeError(f"{text!r}: LoRA targets are a comma-separated list of module names ({', '.join(LORA_TARGETS)} "
                                         "in a Llama; query_key_value in Falcon …), or all-linear")
    return names


def _dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a dropout probability; expected a number in [0, 1) such as 0.05")
    return value


def _base(text: str) -> str:
    from resacct.formulas.lora import BASE_FORMAT_BITS

    if text not in BASE_FORMAT_BITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a base format; choose one of {', '.join(BASE_FORMAT_BITS)} (nf4 = QLoRA)")
    return text


def _over_layers(architecture: Any, compute: Any) -> int:
    """``compute(architecture)``, from models of at most three layers: every layer after the first
    saves and costs the same (the first differs: no gradient flows into it), so the answer is
    linear in the layers from two on — exact to the byte and FLOP at any depth, and ``--layers
    9e15`` is answered at once instead of looping over every layer."""
    import dataclasses

    if architecture.layers <= 3:
        return compute(architecture)
    two, three = (compute(dataclasses.replace(architecture, layers=layers)) for layers in (2, 3))
    return two + (architecture.layers - 2) * (three - two)


def _activation_bytes(architecture: Any, args: argparse.Namespace, batch: int, dtype: str) -> int:
    """What one forward saves (predicted), or with gradient checkpointing an estimate: the layers'
    inputs, everything outside the layers, and the busiest layer's saved tensors once."""
    import dataclasses

    if architecture.sliding_window is not None:  # a GPU's flash kernel keeps no mask for the window: counted as without one
        architecture = dataclasses.replace(architecture, sliding_window=None)
    return _over_layers(architecture, lambda shallow: _activation_bytes_looped(shallow, args, batch, dtype))


def _activation_bytes_looped(architecture: Any, args: argparse.Namespace, batch: int, dtype: str) -> int:
    from resacct.formulas.lora import lora_saved_terms

    terms = lora_saved_terms(architecture, rank=args.rank, targets=args.targets, batch=batch, seq=args.seq, dtype=dtype, dropout=args.dropout)
    if not args.gradient_checkpointing:
        return sum(term.bytes for term in terms)
    per_layer: dict[str, int] = {}
    for term in terms:
        if term.module.startswith("model.layers."):
            layer = term.module.split(".")[2]
            per_layer[layer] = per_layer.get(layer, 0) + term.bytes
    outside = sum(term.bytes for term in terms if not term.module.startswith("model.layers."))
    element = 4 if dtype == "float32" else 2
    return outside + architecture.layers * element * batch * args.seq * architecture.hidden + max(per_layer.values(), default=0)


def _run_lora(args: argparse.Namespace) -> int:
    """The answer (:func:`_answer`), read back from the trace cache where ``--hf-config`` asked the same before."""
    fields, text = cached_command_answer("lora", "hf-lora", _question(args), lambda: _answer(args), no_cache=args.no_cache)
    return emit(args, fields, text)


def _question(args: argparse.Namespace) -> dict[str, Any] | None:
    """What a ``--hf-config`` answer depends on, for the trace cache's key (None: the shape flags, answered by
    the formulas in milliseconds, or flags the answer refuses — never cached)."""
    if args.hf_config is None or shape_flags_given(args):
        return None
    board, memory_bytes = device_memory_bytes(args)  # a board and --memory-gb together: refused here, before the config is read
    return hf_config_question(args, board, memory_bytes, rank=args.rank, targets=None if args.targets is None else list(args.targets),
                              base=args.base, dropout=args.dropout, batch=args.batch, seq=args.seq,
                              gradient_checkpointing=args.gradient_checkpointing, trace_all_layers=args.trace_all_layers,
                              reserve_gb=args.reserve_gb)


def _answer(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The command's JSON fields and its text."""
    started = time.perf_counter()
    from resacct.formulas.hf_formulas import predict_step_flops
    from resacct.formulas.lora import BASE_FORMAT_BITS, LORA_TARGETS, lora_step_flops, lora_training_memory

    from resacct.errors import ResacctError

    if args.trace_all_layers and args.hf_config is None:
        raise ResacctError("--trace-all-layers applies to --hf-config (a stack of decoder layers); expected --hf-config NAME with it")
    name, architecture, config = model_config(args)
    board, memory_bytes = device_memory_bytes(args)
    if args.targets is None and config is None:  # the shape flags: the napkin path never imports torch (resacct.account does)
        args.targets = ("q_proj", "v_proj")
    elif args.targets is None:  # peft's default for the model type (q_proj, v_proj for Llama)
        from resacct.account.trace.lora_step import default_lora_targets

        args.targets = default_lora_targets(config)
    formula = architecture is not None and architecture.family == "llama" and all(t in (*LORA_TARGETS, "all-linear") for t in args.targets)
    if config is not None and "all-linear" not in args.targets and not set(args.targets) <= set(LORA_TARGETS):
        names = _linear_names(config)
        _refuse_missing_targets(args.targets, names, names, name)  # before the trace: a 7B one costs ~10 CPU s
    traced, untraced = _trace(args, config)
    if traced is None and config is not None:  # a config transformers cannot build a model from is refused, never answered by the formulas
        from resacct.account.load.hf_models import build_hf_model, load_hf_config

        build_hf_model(load_hf_config(args.hf_config), device="meta")
    if not formula and traced is None:
        from resacct.errors import ResacctError

        raise ResacctError(f"{name}: resacct's LoRA formulas cover Llama-shaped models with targets among {', '.join(LORA_TARGETS)}, "
                           f"and the traced step is not available ({untraced}); expected one of them")
    if traced is not None and "all-linear" not in args.targets and set(args.targets) - set(traced.targets):
        _refuse_missing_targets(args.targets, traced.targets, _linear_names(config), name)
    dtype = {"fp32": "float32", "fp16": "float16"}.get(args.base, "bfloat16")
    if formula:
        state: Any = lora_training_memory(architecture, rank=args.rank, targets=args.targets, base_format=args.base)
        activations = _activation_bytes(architecture, args, args.batch, dtype)
        per_sample = _activation_bytes(architecture, args, 1, dtype)

        def step_flops(shallow: Any, part: str) -> int:
            return getattr(lora_step_flops(shallow, rank=args.rank, targets=args.targets, batch=args.batch, seq=args.seq), part)

        flops = argparse.Namespace(**{part: _over_layers(architecture, lambda shallow, part=part: step_flops(shallow, part))
                                      for part in ("forward_flops", "backward_flops")})
        flops.step_flops = flops.forward_flops + flops.backward_flops
        full_flops: int | None = predict_step_flops(architecture, batch=args.batch, seq=args.seq).step_flops
    else:  # any other model: the traced step's own figures
        state, flops, full_flops = traced, traced, None
        activations = traced.saved_activation_bytes
        if activations is None:  # not recorded on meta: what the peak holds from the forward
            activations = int(traced.peak.peak.bytes_by_kind.get("activations held from forward", 0))
        per_sample = activations // args.batch
    reserved = args.reserve_gb * 1e9
    peak = None if traced is None else traced.peak_bytes
    board_steps = None if board is None or config is None else LoraBoardSteps(config, args, board)
    total = state.state_bytes + activations if peak is None else peak
    fits = None if memory_bytes is None else total + reserved <= memory_bytes
    room = None if memory_bytes is None else memory_bytes - reserved - state.state_bytes
    search = None
    if peak is None:
        largest = None if room is None else _largest_batch(architecture, args, dtype, room, per_sample)
    elif memory_bytes is not None:  # fit's search over the traced step: lines through two batches' peaks, the answer and one more traced
        from resacct.account.fit.lora_batch import largest_lora_batch

        with contextlib.nullcontext() if board_steps is None else board_steps.beside_search():  # the board's steps on the other core
            search = largest_lora_batch(config, rank=args.rank, targets=tuple(args.targets), base=args.base, seq=args.seq,
                                        budget_bytes=memory_bytes - reserved, dropout=args.dropout,
                                        gradient_checkpointing=args.gradient_checkpointing, known={args.batch: traced.peak}, model=traced.model,
                                        on_probe=probe_progress("lora", "batch", args.progress, started,
                                                                lambda value: gigabytes_text(value, args.units)),
                                        on_probe_start=None if board_steps is None else board_steps.ask)
        largest = search.largest
    else:
        largest = None
    targets = ", ".join(args.targets)
    fields: dict[str, Any] = {
        "model": name, "base_parameters": state.base_parameters, "base_format": args.base, "base_bits_per_parameter": BASE_FORMAT_BITS[args.base],
        "rank": args.rank, "targets": list(args.targets), "batch": args.batch, "seq": args.seq, "gradient_checkpointing": args.gradient_checkpointing,
        "adapter_parameters": state.adapter_parameters, "adapter_tensors": state.adapter_tensors,
        "base_bytes": state.base_bytes, "adapter_bytes": state.adapter_bytes, "gradient_bytes": state.gradient_bytes,
        "optimizer_state_bytes": state.optimizer_state_bytes, "training_state_bytes": state.state_bytes,
        "dropout": args.dropout, "activation_bytes": activations, "activation_bytes_per_sample": per_sample,
        "activation_basis": "estimate" if args.gradient_checkpointing and formula else ("predicted" if formula else
                            "held from the forward at the traced peak" if traced.saved_activation_bytes is None else "traced on meta"),
        "forward_flops": flops.forward_flops, "backward_flops": flops.backward_flops, "step_flops": flops.step_flops,
        "full_finetuning_step_flops": full_flops, "state_and_activation_bytes": state.state_bytes + activations,
        "step_peak_bytes": peak, "step_peak_basis": "traced on fake CPU tensors (forward, backward, AdamW step, zero_grad)" if peak is not None else untraced,
        "traced": None if traced is None else {"training_state_bytes": traced.state_bytes, "step_flops": traced.step_flops,
                                                "adapter_parameters": traced.adapter_parameters, "adapted_modules": list(traced.targets),
                                                "layers_note": traced.layers_note},
        "total_bytes": total, "total_basis": "step peak" if peak is not None else "training state + activations",
        "device": board.name if board is not None else None, "device_memory_bytes": memory_bytes, "reserved_bytes": reserved,
        "headroom_bytes": None if memory_bytes is None else memory_bytes - reserved - total, "fits": fits, "largest_batch": largest,
        "largest_batch_basis": None if largest is None else "training state + activations" if peak is None else "traced at the answer and one more",
        "largest_batch_search": None if search is None else search.to_dict(),
    }
    units = args.units
    where = "" if memory_bytes is None else f" on {board.name if board is not None else gigabytes_text(memory_bytes, units) + ' per device'}"
    kind = "QLoRA" if args.base == "nf4" else "LoRA"
    lines = [
        f"{kind} r={args.rank} on {targets} of {name} ({state.base_parameters:.4g} parameters), {args.base} base, AdamW — "
        f"batch {args.batch} × seq {args.seq}{where}",
        _row(f"frozen base ({args.base})", state.base_bytes, units),
        _row(f"adapters ({state.adapter_parameters:,} parameters, fp32)", state.adapter_bytes, units),
        _row("adapter gradients (fp32)", state.gradient_bytes, units),
        _row("AdamW state (2 moments + step counters)", state.optimizer_state_bytes, units),
        _row("training state", state.state_bytes, units) + ("" if traced is None or not formula else
                                                            f"  (traced model: {gigabytes_text(traced.state_bytes, units)})"),
        _row("activations (estimate)" if args.gradient_checkpointing and formula else
             ("activations (saved for backward)" if formula else "activations (held at the traced peak)" if traced.saved_activation_bytes is None
              else "activations (saved, traced on meta)"), activations, units)
        + ("  (gradient checkpointing: layer inputs + one layer)" if args.gradient_checkpointing and formula
           else f"  ({gigabytes_text(per_sample, units)} a sequence)"),
    ]
    if peak is not None:
        lines.append(_row("step peak (predicted: the traced step)", peak, units) + "  (forward, backward, AdamW step: temporaries included)")
    if memory_bytes is None:
        lines.append(_row("total" if peak is None else "total (the step peak)", total, units))
    else:
        headroom = memory_bytes - reserved - total
        lines += [_row("total" if peak is None else "total (the step peak)", total, units) + f" of {gigabytes_text(memory_bytes, units)}"
                  + (f" ({gigabytes_text(reserved, units)} reserved)" if reserved else "")
                  + (f" — fits, {gigabytes_text(headroom, units)} to spare" if fits else f" — does NOT fit: {gigabytes_text(-headroom, units)} over"),
                  f"  largest batch at seq {args.seq}: {largest}" + _largest_batch_note(search, largest, room, per_sample, units, args.gradient_checkpointing)]
    lines.append(f"  FLOPs a step: {flops.step_flops:.4g} (forward {flops.forward_flops:.4g}, backward {flops.backward_flops:.4g}"
                 + ("" if full_flops is None else f": {flops.step_flops / full_flops:.2f}× full fine-tuning's {full_flops:.4g}") + ")"
                 + ("" if formula else ": FlopCounterMode on the traced step")
                 + ("; checkpointing runs the layers' forward once more" if args.gradient_checkpointing else ""))
    lines.append("  not counted: " + ("temporaries (the step is not traced: " + str(untraced) + "), " if peak is None else "")
                 + "the allocator's fragmentation, the CUDA context"
                 + ("; activations are a bf16 base's (bitsandbytes' 4-bit matmul is not measured)" if args.base == "nf4" else ""))
    for note in (None if traced is None else traced.layers_note, None if search is None else search.layers_note):
        if note:
            lines.append(f"  layers: {note}")
    if board is not None and config is None:  # the shape flags (no torch): no traced step to predict
        fields["gpu"], line = untraced_gpu_answer(board, "the step is not traced (" + (
            "the model is given by its shape: give --hf-config NAME" if args.hf_config is None else "transformers is not installed") + ")")
        lines.append("  " + line)
    elif board_steps is not None:  # --device BOARD: the CUDA caching allocator's peaks and the step time there
        gpu = board_steps(args.batch)
        fields["gpu"] = gpu.to_dict()
        lines += ["  " + line for line in gpu.lines(lambda value: gigabytes_text(value, units))]
        if search is not None and largest is not None and memory_bytes is not None and gpu.reserved_bytes is not None:
            from resacct.account.gpu.answers.reserved_search import largest_by_reserved  # the CPU search's answer judged as the board holds it

            found = largest_by_reserved(lambda batch: board_steps(batch, timed=False).reserved_bytes, largest, memory_bytes - reserved)
            fields["gpu"]["largest_batch_by_reserved"] = None if found is None else found.to_dict()
            lines += [] if found is None else ["  " + found.line(lambda value: gigabytes_text(value, units))]
            if found is not None and (headline := found.headline(board.name, lambda value: gigabytes_text(value, units), at=f" at seq {args.seq}")):
                lines.insert(1, headline)  # the board's answer first: what a GPU runs out of is its reserved peak
    return fields, with_caveat(fields, "\n".join(lines), board)


def _refuse_missing_targets(targets: tuple[str, ...], adaptable: Any, linear_names: list[str], name: str) -> None:
    """One line naming the ``targets`` that are not among ``adaptable`` (none missing: nothing)."""
    missing = ", ".join(sorted(set(targets) - set(adaptable)))
    if missing:
        from resacct.errors import ResacctError

        raise ResacctError(f"--targets {','.join(targets)}: {missing} is not a linear layer of {name}; LoRA targets are a comma-separated "
                           f"list of its linear layers' names ({', '.join(linear_names)}), or all-linear")


def _linear_names(config: Any) -> list[str]:
    """The names of the linear layers of ``config``'s model (built on meta), the LM head left out."""
    import torch

    from resacct.account.trace.lora_step import build_lora_model

    model = build_lora_model(config, rank=1, targets=("all-linear",), base="bf16")
    return sorted({name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")} - {"lm_head"}
                  or {name.split(".")[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)})


def _trace(args: argparse.Namespace, config: Any) -> tuple[Any, str | None]:
    """The LoRA step traced (:func:`resacct.account.trace.lora_step.trace_lora_step`), or None and why not."""
    from resacct.errors import ResacctError

    if config is None:  # before importing resacct.account (torch): the shape flags are the napkin path
        return None, ("the model is given by its shape: give --hf-config NAME or a config.json to trace the step" if args.hf_config is None
                      else "transformers is not installed")
    from resacct.account.trace.lora_step import TRACED_BASES, trace_lora_step

    if args.base not in TRACED_BASES:
        return None, "NF4's bitsandbytes kernels do not run on fake tensors"
    try:
        return trace_lora_step(config, rank=args.rank, targets=tuple(args.targets), base=args.base, batch=args.batch, seq=args.seq,
                               dropout=args.dropout, gradient_checkpointing=args.gradient_checkpointing,
                               layers="all" if args.trace_all_layers else "auto"), None
    except ResacctError as error:
        return None, str(error)
    except Exception as error:  # peft refuses targets the model has not, or the model cannot run on fake tensors
        first = (str(error).strip().splitlines() or [""])[0][:200]
        return None, f"the step could not be traced ({type(error).__name__}: {first})"


def _largest_batch(architecture: Any, args: argparse.Namespace, dtype: str, room: float, per_sample: int) -> int:
    """The most sequences whose activations fit in ``room``: activations grow with the batch, but
    not quite linearly (the labels at batch 1 are a view), so the guess from one sequence is
    checked and stepped down."""
    if room < per_sample:
        return 0
    batch = int(room // per_sample)
    while batch > 1 and _activation_bytes(architecture, args, batch, dtype) > room:
        batch -= 1
    return batch


def _largest_batch_note(search: Any, largest: int | None, room: float | None, per_sample: int, units: str, checkpointing: bool) -> str:
    """One parenthesis after the largest batch (with its leading space; "" for none): how the search
    found it, and why nothing fits where nothing does."""
    why_none = "" if largest else _no_room(room, per_sample, units, checkpointing)
    if search is not None:
        return " " + search.text(why_none)
    return f" ({why_none})" if why_none else ""


def _no_room(room: float | None, per_sample: int, units: str, checkpointing: bool) -> str:
    if room is None or room <= 0:
        return "the state alone leaves no room for one sequence"
    return (f"one sequence's activations need {gigabytes_text(per_sample, units)}, the state leaves {gigabytes_text(room, units)}"
            + ("" if checkpointing else "; try --gradient-checkpointing"))


def _row(label: str, value_bytes: float | int, units: str) -> str:
    return f"  {label:<44}{gigabytes_text(value_bytes, units):>12}"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lora", help="LoRA / QLoRA fine-tuning memory (frozen base, adapters, AdamW) at batch × seq: does it fit",
                                   description=__doc__, epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank r (default: 16)")
    parser.add_argument("--targets", type=_targets, default=None, metavar="NAMES",
                        help="comma-separated linear layers to adapt, or all-linear (default: peft's for the model type: q_proj,v_proj for "
                             "Llama, query_key_value for Falcon/BLOOM/GPT-NeoX; all-linear where peft has none)")
    parser.add_argument("--base", type=_base, default="bf16", metavar="FORMAT", help="frozen base format: bf16 (default), fp16, fp32, nf4 (QLoRA)")
    parser.add_argument("--dropout", type=_dropout, default=0.0, metavar="P",
                        help="LoRA dropout (peft's lora_dropout; default: 0): a mask and a copy per adapter input")
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences per step (default: 1)")
    parser.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence (default: 2048)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="estimate activations with every layer recomputed")
    parser.add_argument("--trace-all-layers", action="store_true",
                        help="with --hf-config: trace every decoder layer (default: a stack of more than 16 identical layers is traced "
                             "at depths 3, 4 and 5 and extrapolated, each number checked on the third depth)")
    add_device_arguments(parser, required=False)
    parse_boards_at_the_edge(parser, "a CUDA board adds the step's predicted CUDA allocated and reserved peaks and its step time there")
    add_progress_flag(parser, "with --hf-config and a budget: one line per batch the search traces")
    add_no_cache_flag(parser)
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=_run_lora)
