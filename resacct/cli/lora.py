"""``resacct lora``: does LoRA (or QLoRA: ``--base nf4``) fine-tuning of a model fit a device at
batch × sequence? The state of a step with AdamW, as peft keeps it — frozen base in its format,
float32 adapters, their gradients and AdamW state (checked to the byte against a real peft step
on the CPU: ``resacct/specs/finetune.claims.yaml``) — plus an activation estimate, and the
largest batch that fits.

Activations are an **estimate**, not a LoRA prediction: what full fine-tuning of the model saves
(``resacct.formulas.hf_activation_formulas``, sdpa's flash kernel, 16-bit compute), or with
``--gradient-checkpointing`` every layer's input plus one layer's saved tensors during its
recomputation. On a measured tiny model LoRA saved 0.85× (q, v) to 1.39× (all linear layers,
bf16: peft's float32 input copies) of full fine-tuning's bytes.
NF4 (QLoRA) is predicted only: 4.127 bits per weight of the blocks' linear layers (QLoRA §3,
double quantisation), embeddings, norms and LM head in bf16.
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._model_args import add_device_arguments, add_model_arguments, device_memory_bytes, model_architecture
from resacct.cli._units import add_units_flag, gigabytes_text
from resacct.cli.arguments import positive_int
from resacct.cli.output import add_json_flag, emit, with_caveat

__all__ = ["register"]

_EXAMPLES = """examples:
  resacct lora --hf-config llama-2-7b --rank 16 --batch 1 --seq 2048 --memory-gb 24 --gradient-checkpointing
  resacct lora --hf-config llama-2-7b --rank 16 --targets all-linear --base nf4 --batch 4 --seq 2048 --memory-gb 24 --gradient-checkpointing --units binary
  resacct lora --hf-config llama-3-70b --rank 64 --targets all-linear --base nf4 --seq 4096 --device h100 --units binary --json
"""


def _targets(text: str) -> tuple[str, ...]:
    from resacct.formulas.lora import LORA_TARGETS

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names or any(t not in (*LORA_TARGETS, "all-linear") for t in names):
        raise argparse.ArgumentTypeError(f"{text!r}: LoRA targets are a comma-separated list of {', '.join(LORA_TARGETS)}, or all-linear")
    return names


def _base(text: str) -> str:
    from resacct.formulas.lora import BASE_FORMAT_BITS

    if text not in BASE_FORMAT_BITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a base format; choose one of {', '.join(BASE_FORMAT_BITS)} (nf4 = QLoRA)")
    return text


def _activation_bytes(architecture: Any, batch: int, seq: int, dtype: str, checkpointing: bool) -> int:
    from resacct.formulas.hf_activation_formulas import predict_hf_layer_saved_bytes, predict_hf_saved_bytes

    common = dict(dtype=dtype, attention="sdpa", device_type="cpu")
    total = predict_hf_saved_bytes(architecture, batch, seq, **common)
    if not checkpointing:
        return total
    layer = predict_hf_layer_saved_bytes(architecture, batch, seq, first=False, **common)
    element = 4 if dtype == "float32" else 2
    return total - (architecture.layers - 1) * layer + architecture.layers * element * batch * seq * architecture.hidden


def _run_lora(args: argparse.Namespace) -> int:
    from resacct.formulas.lora import BASE_FORMAT_BITS, lora_training_memory

    name, architecture = model_architecture(args)
    board, memory_bytes = device_memory_bytes(args)
    state = lora_training_memory(architecture, rank=args.rank, targets=args.targets, base_format=args.base)
    dtype = "float32" if args.base == "fp32" else "bfloat16"
    activations = _activation_bytes(architecture, args.batch, args.seq, dtype, args.gradient_checkpointing)
    per_sample = _activation_bytes(architecture, 1, args.seq, dtype, args.gradient_checkpointing)
    total = state.state_bytes + activations
    reserved = args.reserve_gb * 1e9
    fits = None if memory_bytes is None else total + reserved <= memory_bytes
    room = None if memory_bytes is None else memory_bytes - reserved - state.state_bytes
    largest = None if room is None else max(0, int(room // per_sample)) if room > 0 else 0
    targets = ", ".join(args.targets)
    fields: dict[str, Any] = {
        "model": name, "base_parameters": state.base_parameters, "base_format": args.base, "base_bits_per_parameter": BASE_FORMAT_BITS[args.base],
        "rank": args.rank, "targets": list(args.targets), "batch": args.batch, "seq": args.seq, "gradient_checkpointing": args.gradient_checkpointing,
        "adapter_parameters": state.adapter_parameters, "adapter_tensors": state.adapter_tensors,
        "base_bytes": state.base_bytes, "adapter_bytes": state.adapter_bytes, "gradient_bytes": state.gradient_bytes,
        "optimizer_state_bytes": state.optimizer_state_bytes, "training_state_bytes": state.state_bytes,
        "activation_bytes_estimate": activations, "activation_bytes_estimate_per_sample": per_sample, "total_bytes": total,
        "device": board.name if board is not None else None, "device_memory_bytes": memory_bytes, "reserved_bytes": reserved,
        "fits": fits, "largest_batch": largest,
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
        _row("training state", state.state_bytes, units),
        _row("activations (estimate)", activations, units) + ("  (gradient checkpointing: layer inputs + one layer)"
                                                              if args.gradient_checkpointing else "  (full fine-tuning's saved bytes)"),
    ]
    if memory_bytes is None:
        lines.append(_row("total", total, units))
    else:
        lines += [_row("total", total, units) + f" of {gigabytes_text(memory_bytes, units)}"
                  + (f" ({gigabytes_text(reserved, units)} reserved)" if reserved else "") + f" — {'fits' if fits else 'does NOT fit'}",
                  f"  largest batch at seq {args.seq}: {largest}" + ("" if largest else " (the state alone leaves no room for one sequence)")]
    lines.append("  not counted: temporaries, the allocator's fragmentation, the CUDA context; activations are full fine-tuning's, "
                 "not a LoRA prediction (see --help)")
    return emit(args, fields, with_caveat(fields, "\n".join(lines), board))


def _row(label: str, value_bytes: float, units: str) -> str:
    return f"  {label:<44}{gigabytes_text(value_bytes, units):>12}"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lora", help="LoRA / QLoRA fine-tuning memory (frozen base, adapters, AdamW) at batch × seq: does it fit",
                                   description=__doc__, epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank r (default: 16)")
    parser.add_argument("--targets", type=_targets, default=("q_proj", "v_proj"), metavar="NAMES",
                        help="comma-separated linear layers to adapt (default: q_proj,v_proj, peft's default for Llama), or all-linear")
    parser.add_argument("--base", type=_base, default="bf16", metavar="FORMAT", help="frozen base format: bf16 (default), fp16, fp32, nf4 (QLoRA)")
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences per step (default: 1)")
    parser.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence (default: 2048)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="estimate activations with every layer recomputed")
    add_device_arguments(parser, required=False)
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=_run_lora)
