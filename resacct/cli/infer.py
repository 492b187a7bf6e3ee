"""``resacct infer``: serving memory — the weights in their format plus the KV cache of a batch at a
context length (2 × batch × context × layers × kv_heads × head_dim × bytes; GQA and MQA through
the key/value heads) — and, on a device, whether it fits, the largest batch at that context and
the largest context at that batch.

The cache term is checked against a real transformers ``generate`` loop's cache on the CPU
(``resacct/specs/inference.claims.yaml``); NF4 is QLoRA's 4.127 bits (double quantisation). A second
``--hf-config`` question asked the same way is answered from the trace cache (:mod:`resacct.cli._cached_answer`).
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._cached_answer import add_no_cache_flag, cached_command_answer, hf_config_question
from resacct.cli._model_args import (add_device_arguments, add_model_arguments, device_memory_bytes, model_architecture,
                                     refuse_shape_flags_with_hf_config, shape_flags_given)
from resacct.cli._units import add_units_flag, gigabytes_text
from resacct.cli.arguments import positive_int
from resacct.cli.devices import parse_boards_at_the_edge, untraced_gpu_answer
from resacct.cli.output import add_json_flag, emit, with_caveat

__all__ = ["register"]

_EXAMPLES = """examples:
  resacct infer --hf-config llama-3-8b --batch 8 --context 8192 --device h100
  resacct infer --hf-config llama-2-70b --weights int4 --kv-format fp8 --batch 32 --context 4096 --device a100 --units binary
  resacct infer --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --mlp 14336 --vocab 128256 --context 32768 --memory-gb 24 --json
"""

_NOT_COUNTED = "not counted: the forward's activations and logits, temporaries, quantisation scales of int8/int4, the CUDA context, fragmentation"


def _choice(table: dict[str, Any], what: str) -> Any:
    def parse(text: str) -> str:
        key = text.strip().lower()
        if key not in table:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}; choose one of {', '.join(table)}")
        return key

    return parse


def _row(label: str, value_bytes: float, units: str) -> str:
    return f"  {label:<32}{gigabytes_text(value_bytes, units):>12}"


def _run_infer(args: argparse.Namespace) -> int:
    """The answer (:func:`_answer`), read back from the trace cache where ``--hf-config`` asked the same before."""
    fields, text = cached_command_answer("infer", "hf-infer", _question(args), lambda: _answer(args), no_cache=args.no_cache)
    return emit(args, fields, text)


def _question(args: argparse.Namespace) -> dict[str, Any] | None:
    """What a ``--hf-config`` answer depends on, for the trace cache's key (None: the shape flags, answered by the
    formulas in milliseconds, or flags the answer refuses — never cached)."""
    if args.hf_config is None or shape_flags_given(args):
        return None
    board, memory_bytes = device_memory_bytes(args)  # a board and --memory-gb together: refused here
    return hf_config_question(args, board, memory_bytes, batch=args.batch, context=args.context, weights=args.weights,
                              kv_format=args.kv_format, reserve_gb=args.reserve_gb)


def _answer(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The command's JSON fields and its text."""
    from resacct.formulas.kv_cache import KV_FORMAT_BYTES, WEIGHT_FORMAT_BITS, inference_memory
    from resacct.formulas.hf_formulas import predict_parameters

    name, architecture, facts = _model(args)
    shape = facts if facts is not None else architecture
    context = args.context or shape.positions
    if not context:
        from resacct.errors import ResacctError

        raise ResacctError("give --context TOKENS (" + ("a custom model has no max_position_embeddings to default to)" if facts is None else
                                                       f"--hf-config {args.hf_config}: its config has no context length, ALiBi positions)"))
    board, memory_bytes = device_memory_bytes(args)
    parameters = facts.parameters if facts is not None else predict_parameters(architecture)
    traced_elements = None if facts is None else facts.kv_cache_elements_per_token(context)  # the model's own cache, one sequence of `context`
    memory = inference_memory(parameters=parameters, layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                              batch=args.batch, context=context, weight_format=args.weights, kv_format=args.kv_format,
                              device_memory_bytes=memory_bytes if memory_bytes is not None else float("inf"),
                              reserved_bytes=args.reserve_gb * 1e9, kv_cache_elements_per_token=traced_elements)
    formula_per_token = None if architecture is None else 2 * architecture.layers * architecture.kv_heads * architecture.head_dim * KV_FORMAT_BYTES[memory.kv_format]
    formula_parameters = None if architecture is None else predict_parameters(architecture)
    fields: dict[str, Any] = {
        "model": name, "parameters": parameters, "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "max_position_embeddings": shape.positions or None, "batch": args.batch, "context": context,
        "basis": "the model built on the meta device (parameters; its own KV cache after a meta forward of the context)" if facts is not None
                 else "resacct's closed forms (the shape flags)",
        "formula_parameters": formula_parameters, "formula_kv_cache_bytes_per_token": formula_per_token,
        "weight_format": memory.weight_format, "weight_bits_per_parameter": WEIGHT_FORMAT_BITS[memory.weight_format],
        "kv_format": memory.kv_format, "kv_element_bytes": KV_FORMAT_BYTES[memory.kv_format],
        "weight_bytes": memory.weight_bytes, "kv_cache_bytes_per_token": memory.kv_cache_bytes_per_token, "kv_cache_bytes": memory.kv_cache_bytes,
        "total_bytes": memory.total_bytes, "device": board.name if board is not None else None, "device_memory_bytes": memory_bytes,
        "reserved_bytes": memory.reserved_bytes,
        "fits": memory.fits if memory_bytes is not None else None,
        "largest_batch": memory.largest_batch if memory_bytes is not None else None,
        "largest_context": memory.largest_context if memory_bytes is not None else None,
    }
    units = args.units
    where = f" on {board.name if board is not None else gigabytes_text(memory_bytes, units) + ' per device'}" if memory_bytes is not None else ""
    if facts is None:
        cache_how = (f"{memory.kv_cache_bytes_per_token:,} bytes a token: 2 × {shape.layers} layers × {shape.kv_heads} kv heads × "
                     f"{shape.head_dim} × {KV_FORMAT_BYTES[memory.kv_format]} bytes")
    else:
        cache_how = (f"{memory.kv_cache_bytes_per_token:,.6g} bytes a token: {facts.model_class}'s own cache after a meta forward of {context} tokens"
                     + ("" if formula_per_token is None else f"; formula 2·L·g·e·b = {formula_per_token:,}"))
    lines = [
        f"{name}: {parameters:.4g} parameters" + ("" if facts is None else f" ({facts.model_class} built on meta"
                                                  + ("" if formula_parameters is None else f"; formula {formula_parameters:.4g}") + ")")
        + f", {shape.layers} layers, {shape.kv_heads} key/value heads × {shape.head_dim} "
        f"({shape.heads} query heads) — batch {args.batch} × context {context}{where}",
        _row(f"weights ({memory.weight_format}, {WEIGHT_FORMAT_BITS[memory.weight_format]:.4g} bits/param)", memory.weight_bytes, units),
        _row(f"KV cache ({memory.kv_format})", memory.kv_cache_bytes, units) + f"  ({cache_how})",
    ]
    total = _row("total", memory.total_bytes, units)
    if memory_bytes is None:
        lines.append(total)
    else:
        reserved = f" ({gigabytes_text(memory.reserved_bytes, units)} reserved)" if memory.reserved_bytes else ""
        lines.append(f"{total} of {gigabytes_text(memory_bytes, units)}{reserved} — {'fits' if memory.fits else 'does NOT fit'}")
        beyond = (f" (beyond the config's {shape.positions} positions)"
                  if shape.positions and memory.largest_context > shape.positions else "")
        lines += [f"  largest batch at context {context}: {memory.largest_batch}"
                  + ("" if memory.room_bytes > 0 else " (the weights alone do not fit)"),
                  f"  largest context at batch {args.batch}: {memory.largest_context} tokens{beyond}"]
    lines.append(f"  {_NOT_COUNTED}")
    if board is not None and args.hf_config is None:  # the shape flags (no torch): no prefill to trace
        fields["gpu"], line = untraced_gpu_answer(board, "the model is given by its shape: give --hf-config NAME to trace its prefill")
        lines.append("  " + line)
    elif board is not None:  # --device BOARD: the CUDA caching allocator's peaks of the prefill there
        from resacct.account.gpu.answers.command_answers import infer_gpu_answer

        gpu = infer_gpu_answer(args.hf_config, batch=args.batch, context=context, weights=args.weights, kv_format=args.kv_format, board=board,
                               kv_cache_bytes=int(memory.kv_cache_bytes))
        fields["gpu"] = gpu.to_dict()
        lines += ["  " + line for line in gpu.lines(lambda value: gigabytes_text(value, units))]
    return fields, with_caveat(fields, "\n".join(lines), board)


def _model(args: argparse.Namespace) -> tuple[str, Any, Any]:
    """The name, resacct's family architecture (None: no closed form) and, with --hf-config, the model built on meta."""
    if args.hf_config is None:
        name, architecture = model_architecture(args)
        return name, architecture, None
    from resacct.account.load.meta_facts import meta_model_facts
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.hf_formulas import FAMILIES

    from resacct.account.load.hf_models import load_hf_config

    refuse_shape_flags_with_hf_config(args)
    facts = meta_model_facts(args.hf_config)

    spec = load_hf_config(args.hf_config)
    return facts.name, (architecture_from_values(spec.values) if spec.model_type in FAMILIES else None), facts


def register(subparsers: argparse._SubParsersAction) -> None:
    from resacct.formulas.kv_cache import KV_FORMAT_BYTES, WEIGHT_FORMAT_BITS

    parser = subparsers.add_parser("infer", help="serving memory: weights by format + KV cache (GQA/MQA); the largest batch and context that fit",
                                   description=__doc__, epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences decoded together (default: 1)")
    parser.add_argument("--context", type=positive_int, default=None, help="tokens per sequence, prompt + generated (default: the config's positions)")
    parser.add_argument("--weights", type=_choice(WEIGHT_FORMAT_BITS, "weight format"), default="bf16", metavar="FORMAT",
                        help=f"weight format: {', '.join(WEIGHT_FORMAT_BITS)} (default: bf16; nf4 = QLoRA's 4.127 bits)")
    parser.add_argument("--kv-format", type=_choice(KV_FORMAT_BYTES, "KV-cache format"), default="bf16", metavar="FORMAT",
                        help=f"KV-cache element format: {', '.join(KV_FORMAT_BYTES)} (default: bf16)")
    add_device_arguments(parser, required=False)
    parse_boards_at_the_edge(parser, "a CUDA board adds the prefill's predicted CUDA allocated and reserved peaks there")
    add_no_cache_flag(parser, "build and trace afresh")
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=_run_infer)
