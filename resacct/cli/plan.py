"""``resacct plan`` (does a TP × PP × DP × ZeRO layout fit, and the largest micro-batch) and
``resacct optimal`` (compute-optimal model size for a FLOP budget, and device-hours).

``plan``: training state (parameters split over TP × PP, sharded over DP by the ZeRO stage) plus
activations on the first pipeline stage (Korthikanti et al. 2022, Table 2 and eq. 5–6) per GPU;
beside them, not in the total, the ZeRO paper's whole-model estimate (Rajbhandari et al. 2020: §3.2
footnote 3's 12·h·b·s·L 16-bit values; with ``--recompute full`` §8's layer inputs, h·b·s·L) —
``activation_bytes_zero_paper`` in ``--json``, null for selective recomputation (the paper has none).
``optimal``: one of Chinchilla's approaches (Hoffmann et al. 2022: ``--approach 1`` through Table 3,
the default; ``2`` IsoFLOP profiles through Table A3; ``3`` eq. 4 with the printed constants) beside
the 20-tokens-per-parameter rule; with a device, the device-hours at an MFU and a goodput.
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._recipes import recipe_type
from resacct.cli._units import add_units_flag, unit_scale
from resacct.cli.arguments import count, fraction, non_negative_float, parameter_count, positive_int
from resacct.cli.output import add_json_flag, amount_text, count_text, days_text, emit, with_caveat
from resacct.errors import ResacctError
from resacct.facts.recipes import DEFAULT_ZERO_STAGE, parse_recipe
from resacct.formulas.sharding import get_sharding_recipe

__all__ = ["register"]

_PLAN_EXAMPLES = """examples:
  resacct plan --params 70B --layers 80 --hidden 8192 --heads 64 --seq 4096 --tp 8 --pp 4 --dp 16 --zero 1 --sp --recompute selective --device h100
  resacct plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 --tp 8 --pp 8 --device a100 --recompute full --json
      (no --params: 12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h)), Narayanan et al. 2021 eq. 2)
  resacct plan --hf-config llama-3-405b --seq 8192 --tp 8 --pp 16 --dp 64 --zero 1 --sp --recompute selective --device h100 --units binary
      (shape, GQA and parameters from the config: the count `resacct account --hf-config` predicts)
  resacct plan --layers 70 --hidden 8192 --heads 64 --kv-heads 8 --mlp 28672 --vocab 32000 --seq 4096 --tp 8 --pp 12 --memory-gb 80
      (an uneven split: 70 layers over 12 stages, the first ten with 6; or --first-stage-layers / --last-stage-layers)
"""

_OPTIMAL_EXAMPLES = """examples:
  resacct optimal --flops 5.76e23
      Gopher's budget: approach 1 (the default) and 20 tokens per parameter
  resacct optimal --flops 5.76e23 --approach 2
      approach 2, IsoFLOP profiles (through Table A3: N ∝ C^0.49, D ∝ C^0.51)
  resacct optimal --flops 3.8e25 --device h100 --devices 16384 --mfu 0.4 --goodput 0.9
"""


def _layout(args: argparse.Namespace) -> Any:
    from resacct.formulas.parallelism import ParallelLayout

    return ParallelLayout(tensor=args.tp, pipeline=args.pp, data=args.dp, context=args.cp, zero_stage=args.zero,
                          sequence_parallel=args.sp, interleaved_chunks=args.interleave)


def _device_memory_bytes(args: argparse.Namespace) -> tuple[Any, float]:
    """The board (None for --memory-gb) and its memory per GPU in bytes."""
    if (args.device is None) == (args.memory_gb is None):
        raise ResacctError("give exactly one of --device NAME (memory from the datasheet table) or --memory-gb GB (per GPU)")
    if args.device is not None:
        from resacct.facts.hardware import get_accelerator

        board = get_accelerator(args.device)
        return board, float(board.memory_bytes)
    return None, _gigabytes_in_bytes("--memory-gb", args.memory_gb)


def _gigabytes_in_bytes(option: str, gigabytes: float) -> float:
    """``gigabytes`` × 10^9, refused with one line when that overflows a float (``--memory-gb 1e300``)."""
    value = gigabytes * 1e9
    if value == float("inf"):
        raise ResacctError(f"{option} {gigabytes:g} is too large: {gigabytes:g} × 10^9 bytes overflows a float; expected at most 1e+299 GB")
    return value


def _column(value_bytes: float, scale: float) -> str:
    """A GB column: two decimals, in scientific notation from 10^7 GB on (never 300 digits)."""
    value = value_bytes / scale
    return f"{value:9.2f}" if abs(value) < 1e7 else f"{value:9.3g}"


def _shape(args: argparse.Namespace) -> tuple[float, Any]:
    """The parameter count and the architecture (None without --hf-config/--kv-heads/--mlp); fills
    --layers, --hidden, --heads, --kv-heads, --seq from a config."""
    from resacct.formulas.plan import megatron_parameter_count

    if args.hf_config is not None:
        from resacct.formulas.config_shapes import architecture_from_values
        from resacct.formulas.hf_formulas import predict_parameters
        from resacct.account.load.hf_models import load_hf_config

        given = [f"--{name.replace('_', '-')}" for name in ("layers", "hidden", "heads", "kv_heads", "mlp", "vocab") if getattr(args, name) is not None]
        if given:
            raise ResacctError(f"{', '.join(given)} and --hf-config {args.hf_config!r}: give the shape by one of them, not both")
        from resacct.account.load.meta_facts import meta_model_facts
        from resacct.formulas.hf_formulas import FAMILIES

        spec = load_hf_config(args.hf_config)
        facts = meta_model_facts(args.hf_config)  # the model built on meta: any model_type transformers builds
        architecture = architecture_from_values(spec.values) if spec.model_type in FAMILIES else None  # the closed form, where a family has one
        args.layers, args.hidden, args.heads, args.kv_heads = facts.layers, facts.hidden, facts.heads, facts.kv_heads
        args.seq = args.seq or facts.positions
        if not args.seq:
            raise ResacctError(f"--hf-config {args.hf_config}: its config has no context length (ALiBi positions); give --seq TOKENS")
        args.traced_model = facts.model_class
        args.formula_parameters = None if architecture is None else predict_parameters(architecture)  # the cross-check, in --json
        return (args.params if args.params is not None else float(facts.parameters)), architecture
    missing = [f"--{name}" for name in ("layers", "hidden", "heads", "seq") if getattr(args, name) is None]
    if missing:
        raise ResacctError(f"give --hf-config NAME, or {', '.join(missing)}")
    if args.hidden % args.heads:
        raise ResacctError(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}; expected heads that divide the hidden size "
                           f"(each head is hidden / heads wide)")
    if args.kv_heads is not None and (args.kv_heads > args.heads or args.heads % args.kv_heads):
        raise ResacctError(f"--kv-heads {args.kv_heads} does not divide --heads {args.heads}; expected a divisor of it (1 = MQA)")
    if args.params is not None:
        return args.params, None
    if args.vocab is None:
        raise ResacctError("give --params N, or --vocab V so resacct counts a GPT's parameters from its shape")
    if args.kv_heads is None and args.mlp is None:
        return megatron_parameter_count(args.layers, args.hidden, args.vocab, args.seq), None
    from resacct.formulas.hf_formulas import HfArchitecture, predict_parameters

    if args.mlp is None:
        raise ResacctError("--kv-heads counts a Llama-style model (GQA, SwiGLU, untied head): give its --mlp width too, or --params")
    architecture = HfArchitecture(family="llama", vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                                  kv_heads=args.kv_heads or args.heads, head_dim=args.hidden // args.heads, mlp=args.mlp, positions=args.seq)
    return float(predict_parameters(architecture)), architecture


def _run_plan(args: argparse.Namespace) -> int:
    from resacct.formulas.plan import parameter_breakdown, plan_memory

    parameters, architecture = _shape(args)
    mlp, gated = _mlp_shape(architecture)
    board, memory_bytes = _device_memory_bytes(args)
    device = board.name if board is not None else None
    layout = _layout(args)
    plan = plan_memory(parameters=parameters, layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
                       micro_batch=args.micro_batch, layout=layout, recipe=get_sharding_recipe(args.recipe), recompute=args.recompute,
                       device_memory_bytes=memory_bytes, reserved_bytes=_gigabytes_in_bytes("--reserve-gb", args.reserve_gb), kv_heads=args.kv_heads,
                       first_stage_layers=args.first_stage_layers, last_stage_layers=args.last_stage_layers, mlp=mlp, gated_mlp=gated)
    breakdown = None if architecture is None else parameter_breakdown(architecture)
    fields = {
        "parameters": parameters, "hf_config": args.hf_config,
        "parameters_basis": f"{args.traced_model} built on the meta device" if getattr(args, "traced_model", None) else "the shape flags",
        "formula_parameters": getattr(args, "formula_parameters", None),
        "parameter_breakdown": None if breakdown is None else breakdown.to_dict(),
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads or args.heads, "seq": args.seq,
        "micro_batch": args.micro_batch,
        "tensor_parallel": layout.tensor, "pipeline_parallel": layout.pipeline, "data_parallel": layout.data,
        "context_parallel": layout.context, "world_size": layout.world_size, "zero_stage": layout.zero_stage,
        "sequence_parallel": layout.sequence_parallel, "interleaved_chunks": layout.interleaved_chunks,
        "stage_layers": list(plan.stage_layers), "stage": plan.stage,
        "recompute": args.recompute, "recipe": plan.recipe.name, "device": device,
        "parameters_per_gpu": plan.parameters_per_gpu,
        "parameter_bytes": plan.state.parameters_bytes, "gradient_bytes": plan.state.gradients_bytes,
        "optimizer_state_bytes": plan.state.optimizer_state_bytes, "training_state_bytes": plan.state.total_bytes,
        "activation_bytes": plan.activation_bytes, "activation_bytes_per_sample": plan.activation_bytes_per_sample,
        "total_bytes": plan.total_bytes, "reserved_bytes": plan.reserved_bytes, "device_memory_bytes": plan.device_memory_bytes,
        "fits": plan.fits, "largest_micro_batch": plan.largest_micro_batch,
        "mlp": mlp, "mlp_kind": None if mlp is None else "swiglu" if gated else "gelu",
        "activation_bytes_zero_paper": _zero_paper_bytes(args, args.recompute),
    }
    scale, unit = unit_scale(args.units)
    where = device or f"{memory_bytes / scale:.4g} {unit}"
    sp = " + SP" if layout.sequence_parallel else ""
    gqa = f", {args.kv_heads} key/value heads (GQA)" if args.kv_heads and args.kv_heads != args.heads else ""
    uneven = len(set(plan.stage_layers)) > 1
    stage = (f"pipeline stage {plan.stage} of {layout.pipeline}, {plan.stage_layers[plan.stage]} layers; split {'/'.join(map(str, plan.stage_layers))}"
             if uneven else "first pipeline stage")
    lines = [
        f"{parameters:.4g} parameters on {layout.world_size} × {where}: TP {layout.tensor}{sp} × PP {layout.pipeline} × CP {layout.context} × DP {layout.data}, "
        f"ZeRO-{layout.zero_stage}, {plan.recipe.name} ({plan.recipe.total_bytes_per_parameter:g} bytes/param between steps), recompute {args.recompute}{gqa}",
        f"  per GPU ({stage}): {plan.parameters_per_gpu:.4g} parameters",
        f"    parameters {_column(plan.state.parameters_bytes, scale)} {unit}",
        f"    gradients  {_column(plan.state.gradients_bytes, scale)} {unit}",
        f"    optimizer  {_column(plan.state.optimizer_state_bytes, scale)} {unit}",
        f"    activations{_column(plan.activation_bytes, scale)} {unit}  (micro-batch {args.micro_batch} × {args.seq // layout.context} tokens; "
        f"{plan.activation_bytes_per_sample / scale:.3g} {unit} a sequence)",
        _zero_paper_line(args, fields["activation_bytes_zero_paper"], scale, unit),
        f"    total      {_column(plan.total_bytes, scale)} {unit} of {plan.device_memory_bytes / scale:.4g} {unit}"
        + (f" ({plan.reserved_bytes / scale:.4g} {unit} reserved)" if plan.reserved_bytes else "")
        + f" — {'fits' if plan.fits else 'does NOT fit'}",
        f"  largest micro-batch that fits{' every stage' if uneven else ''}: {plan.largest_micro_batch}"
        + ("" if plan.largest_micro_batch else " (the training state alone does not leave room for one sequence)"),
        "  not counted: LayerNorm statistics, embedding/output-layer activations, temporaries, communication buffers, fragmentation"
        + ("" if mlp is None else f"; the MLP's activations as a {'SwiGLU' if gated else 'GeLU'} {mlp} wide (Korthikanti's table: a 4h GeLU)"),
    ] + ([] if breakdown is None else _breakdown_lines(breakdown))
    return emit(args, fields, with_caveat(fields, "\n".join(lines), board))


def _zero_paper_bytes(args: argparse.Namespace, recompute: str) -> float | None:
    """The ZeRO paper's activation estimate for the whole model at this micro-batch and sequence (None: selective)."""
    from resacct.formulas.parallelism import zero_paper_activation_bytes

    return zero_paper_activation_bytes(args.layers, args.seq, args.micro_batch, args.hidden, recompute=recompute)


def _zero_paper_line(args: argparse.Namespace, zero: float | None, scale: float, unit: str) -> str:
    """The ZeRO paper's estimate beside Korthikanti's: its basis, whole model, 16-bit values."""
    whole = "whole model, not split by TP/PP/CP; not in the total"
    if zero is None:
        plain = _zero_paper_bytes(args, "none")
        return (f"    ZeRO paper       —     (no selective-recomputation estimate in Rajbhandari et al. 2020; without recomputation "
                f"12·h·b·s·L 16-bit values = {plain / scale:.4g} {unit}, {whole})")
    basis = ("§8: each layer's input checkpointed, h·b·s 16-bit values × L" if args.recompute == "full"
             else "§3.2 fn. 3: about 12·h·b·s·L 16-bit values")
    return f"    ZeRO paper {_column(zero, scale)} {unit}  (Rajbhandari et al. 2020 {basis}; {whole})"


def _mlp_shape(architecture: Any) -> tuple[int | None, bool]:
    """The MLP width whose activations the plan counts (None: Korthikanti's 4h GeLU) and whether
    it is gated (SwiGLU); a mixture of experts as the k experts each token runs."""
    if architecture is None:
        return None, False
    if architecture.family == "mixtral":
        return architecture.mlp * architecture.experts_per_token, True
    return architecture.mlp, architecture.family != "gpt2"


def _breakdown_lines(b: Any) -> list[str]:
    head = "tied to the token embedding: no parameters of its own" if b.tied_head else "untied"
    return [
        "  parameters by component (the config's model, as transformers builds it):",
        f"    embeddings        {b.embeddings:>17,}",
        f"    per layer × {b.layers:<4}  {b.per_layer:>17,}  (attention {b.attention_per_layer:,} · MLP {b.mlp_per_layer:,} · norms {b.norms_per_layer:,})",
        f"    final norm        {b.final_norm:>17,}",
        f"    LM head           {b.lm_head:>17,}  ({head})",
        f"    total             {b.total:>17,}",
    ]


def _approach(text: str) -> int:
    """``--approach``: 1, 2 or 3, refused otherwise with the value and what is allowed."""
    from resacct.formulas.scaling import CHINCHILLA_APPROACHES

    if text.strip() not in {str(k) for k in CHINCHILLA_APPROACHES}:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Chinchilla approach; choose 1 (Table 3, the default), "
                                         "2 (IsoFLOP profiles, Table A3) or 3 (parametric loss)")
    return int(text)


def _approach_label(approach: int) -> str:
    from resacct.formulas.scaling import chinchilla_approach1_fit, chinchilla_approach2_fit

    if approach == 1:
        return f"Chinchilla approach 1 (through Table 3's projections, N ∝ C^{chinchilla_approach1_fit()[0]:.3f})"
    if approach == 2:
        return (f"Chinchilla approach 2 (IsoFLOP profiles, through Table A3: N ∝ C^{chinchilla_approach2_fit()[0]:.3f}, "
                f"D ∝ C^{chinchilla_approach2_fit(tokens=True)[0]:.3f})")
    return "Chinchilla approach 3 (E=1.69, A=406.4, B=410.7, α=0.34, β=0.28)"


def _run_optimal(args: argparse.Namespace) -> int:
    from resacct.formulas.scaling import (chinchilla_budget_warning, chinchilla_loss, chinchilla_optimum, check_whole_optimum, gpu_hours,
                                          tokens_per_parameter_optimum)

    n, d = chinchilla_optimum(args.flops, args.approach)
    n20, d20 = tokens_per_parameter_optimum(args.flops, args.tokens_per_param)
    check_whole_optimum(args.flops, n, d, f"approach {args.approach}")
    check_whole_optimum(args.flops, n20, d20, f"{args.tokens_per_param:g} tokens per parameter",
                        remedy="a budget" if args.tokens_per_param == 20 else f"--tokens-per-param near 20 (given {args.tokens_per_param:g}) and a budget")
    warning = chinchilla_budget_warning(args.flops)
    fields: dict[str, Any] = {
        "training_flops": args.flops, "approach": args.approach,
        "parameters": n, "tokens": d, "loss": chinchilla_loss(n, d),
        "tokens_per_parameter": args.tokens_per_param,
        "rule_parameters": n20, "rule_tokens": d20, "rule_loss": chinchilla_loss(n20, d20), "warning": warning,
    }
    lines = [
        f"compute budget {args.flops:.4g} FLOPs (C = 6·N·D)",
        f"  {_approach_label(args.approach)}: {n:.4g} parameters × {d:.4g} tokens ({d / n:.1f} tokens/parameter),"
        f" fitted loss {fields['loss']:.3f}",
        f"  {args.tokens_per_param:g} tokens per parameter: {n20:.4g} parameters × {d20:.4g} tokens, fitted loss {fields['rule_loss']:.3f}",
    ] + ([f"  warning: {warning}"] if warning else [])
    if args.device is not None or args.peak is not None:
        if args.device is not None and args.peak is not None:
            raise ResacctError("give --device NAME or --peak FLOP/s, not both")
        peak, board = _peak(args)
        device = board.name if board is not None else None
        hours = gpu_hours(args.flops, peak_flops_per_sec=peak, mfu=args.mfu, goodput=args.goodput)
        fields.update({"device": device, "peak_flops_per_sec": peak, "mfu": args.mfu, "goodput": args.goodput, "device_hours": hours,
                       "devices": args.devices, "wall_clock_days": hours / args.devices / 24})
        lines.append(f"  on {device or 'a custom peak'} ({peak:.4g} FLOP/s) at MFU {args.mfu:g} and goodput {args.goodput:g}: "
                     f"{amount_text(hours, 'device-hours')} = {days_text(hours / args.devices / 24)} on {count_text(args.devices)} devices")
        from resacct.cli._energy import energy_fields, energy_lines

        fields.update(energy_fields(hours, board, args, "the inputs"))
        lines += energy_lines(fields, hours)
        return emit(args, fields, with_caveat(fields, "\n".join(lines), board))
    return emit(args, fields, "\n".join(lines))


def _peak(args: argparse.Namespace) -> tuple[float, Any]:
    """The peak per device and the board it is from (None for --peak)."""
    if args.peak is not None:
        return args.peak, None
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec

    board = get_accelerator(args.device)
    return peak_flops_per_sec(board, args.dtype), board


def register(subparsers: argparse._SubParsersAction) -> None:
    from resacct.formulas.utilization import RECOMPUTE_MODES

    plan_summary = ("Does a TP × PP × CP × DP × ZeRO layout fit? Training state (parameters split over TP × PP, sharded over DP by the\n"
                    "ZeRO stage) plus activations on the first pipeline stage (Korthikanti et al. 2022, Table 2, eq. 5-6), per GPU,\n"
                    "and the largest micro-batch that fits; beside the activations, the ZeRO paper's estimate (Rajbhandari et al.\n"
                    "2020 §3.2 footnote 3: 12·h·b·s·L 16-bit values; §8 with full recomputation: the layer inputs).")
    plan = subparsers.add_parser("plan", help="does a TP × PP × DP × ZeRO layout fit per GPU (state + activations), and the largest micro-batch",
                                 description=plan_summary, epilog=_PLAN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--params", type=parameter_count, default=None, metavar="N", help="parameters (70e9, 70B); or give --vocab to count them")
    plan.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                      help="layers, hidden, heads, key/value heads and parameters from a config (shipped: see 'resacct account --help')")
    plan.add_argument("--layers", type=positive_int, default=None, help="transformer layers L")
    plan.add_argument("--hidden", type=positive_int, default=None, help="hidden size h")
    plan.add_argument("--heads", type=positive_int, default=None, help="attention (query) heads a")
    plan.add_argument("--kv-heads", type=positive_int, default=None,
                      help="key/value heads g (grouped-query attention): smaller K, V activations; with --vocab and --mlp, a Llama-style count")
    plan.add_argument("--mlp", type=positive_int, default=None, help="MLP width of a SwiGLU block (with --vocab: counts a Llama-style model)")
    plan.add_argument("--seq", type=positive_int, default=None, help="sequence length s (default with --hf-config: its positions)")
    plan.add_argument("--vocab", type=positive_int, default=None, help="vocabulary V (only to count parameters when --params is absent)")
    plan.add_argument("--micro-batch", type=positive_int, default=1, help="sequences per micro-batch b (default: 1)")
    plan.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size t (default: 1)")
    plan.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size p (default: 1)")
    plan.add_argument("--dp", type=positive_int, default=1, help="data-parallel size d (default: 1)")
    plan.add_argument("--cp", type=positive_int, default=1, help="context-parallel size: the sequence is split over it (default: 1)")
    plan.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=DEFAULT_ZERO_STAGE,
                      help=f"ZeRO stage over the data-parallel ranks (default: {DEFAULT_ZERO_STAGE}, as in every command)")
    plan.add_argument("--sp", action="store_true", help="sequence parallelism within the tensor-parallel group (needs --tp > 1)")
    plan.add_argument("--first-stage-layers", type=positive_int, default=None,
                      help="layers on the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers); default: as even as possible")
    plan.add_argument("--last-stage-layers", type=positive_int, default=None,
                      help="layers on the last pipeline stage (Megatron's --decoder-last-pipeline-num-layers)")
    plan.add_argument("--interleave", type=positive_int, default=1, help="model chunks per pipeline stage (interleaved schedule; default: 1)")
    plan.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none", help="activation recomputation (default: none)")
    plan.add_argument("--recipe", type=recipe_type, default=parse_recipe("mixed-adam"), metavar="NAME",
                      help="a recipe of resacct.facts.recipes (see 'resacct memory --help'): mixed-adam (2+2+12 between steps, default), "
                           "fp32-adamw, bf16-adamw, … or w+g+k")
    plan.add_argument("--device", default=None, metavar="NAME", help="accelerator whose memory to use (see 'resacct devices')")
    plan.add_argument("--memory-gb", type=count, default=None, help="memory per GPU in GB instead of --device")
    plan.add_argument("--reserve-gb", type=non_negative_float, default=0.0, help="GB per GPU to keep free (buffers, fragmentation; default: 0)")
    add_units_flag(plan)
    add_json_flag(plan)
    plan.set_defaults(run=_run_plan)

    optimal_summary = ("Compute-optimal parameters and tokens for a FLOP budget: one of Chinchilla's approaches (1 through Table 3,\n"
                       "2 IsoFLOP profiles through Table A3, 3 eq. 4 with the printed E, A, B, α, β) and 20 tokens per parameter;\n"
                       "with a device, the device-hours at an MFU and a goodput.")
    optimal = subparsers.add_parser("optimal", help="compute-optimal parameters and tokens for a FLOP budget (Chinchilla), and device-hours",
                                    description=optimal_summary, epilog=_OPTIMAL_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    optimal.add_argument("--flops", type=count, required=True, help="training compute budget C in FLOPs (5.76e23)")
    optimal.add_argument("--approach", type=_approach, default=1, metavar="1|2|3",
                         help="Chinchilla approach: 1 through Table 3 (default: the paper's headline projection, on which Chinchilla "
                              "itself sits), 2 IsoFLOP profiles through Table A3, 3 the parametric loss with the printed constants "
                              "(32B, not the paper's 40B, at Gopher's budget)")
    optimal.add_argument("--tokens-per-param", type=count, default=20.0, help="the rule of thumb's tokens per parameter (default: 20)")
    optimal.add_argument("--device", default=None, metavar="NAME", help="accelerator for device-hours (see 'resacct devices')")
    optimal.add_argument("--dtype", default="bf16", help="format of the peak (default: bf16)")
    optimal.add_argument("--peak", type=count, default=None, metavar="FLOP/S", help="a custom peak per device instead of --device (275e12)")
    optimal.add_argument("--mfu", type=fraction, default=0.4, help="model FLOPs utilization in (0, 1] (default: 0.4)")
    optimal.add_argument("--goodput", type=fraction, default=1.0, help="fraction of reserved time that makes progress (default: 1)")
    optimal.add_argument("--devices", type=positive_int, default=1, help="devices, for the wall-clock days (default: 1)")
    from resacct.cli._energy import add_energy_arguments

    add_energy_arguments(optimal)
    add_json_flag(optimal)
    optimal.set_defaults(run=_run_optimal)
