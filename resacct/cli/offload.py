"""``resacct offload``: ZeRO-Offload / ZeRO-Infinity model-state memory per GPU and per host —
DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs``,
``estimate_zero3_model_states_mem_needs``) reproduced in :mod:`resacct.formulas.offload`, every
option in the order DeepSpeed's ``..._all_cold`` functions print them (16 bytes a parameter of
fp32 parameters, gradients, momentum and variance, 18 with the 16-bit parameters; a buffer
factor of 1.5 on the host figures). With ``--nvme`` (ZeRO-Infinity's ``offload_*: nvme``) the
per-host figure is what the node's NVMe holds instead of its CPU memory. Activations, buffers and
the CUDA context are not in these estimates. The claims: ``resacct/specs/offload.claims.yaml``;
``benchmarks/offload_deepspeed.py`` compares the two, figure by figure, where DeepSpeed is installed.
"""

from __future__ import annotations

import argparse
from typing import Any

from resacct.cli._units import add_units_flag, gigabytes_text
from resacct.cli.arguments import count, gigabytes, positive_int
from resacct.cli.output import add_json_flag, emit, with_caveat
from resacct.errors import ResacctError

__all__ = ["register"]

_EXAMPLES = """examples:
  resacct offload --params 2851M --largest-layer 32M --gpus-per-node 8 --units binary
      DeepSpeed's docs example (t5-3b on one node of 8 GPUs), in GiB as DeepSpeed prints them
  resacct offload --hf-config llama-2-70b --gpus-per-node 8 --nodes 4 --device h100 --host-memory-gb 2048
      parameters and the largest module from the config; which options fit an H100 and a 2 TB host
  resacct offload --params 175B --largest-layer 1.2B --gpus-per-node 8 --nodes 16 --stage 3 --nvme --json
"""

_ESTIMATORS = ("current", "docs")


def _estimator(text: str) -> str:
    if text not in _ESTIMATORS:
        raise argparse.ArgumentTypeError(f"{text!r} is not an estimator; choose current (DeepSpeed ≥ 0.14.3, the default) or docs "
                                         "(the table DeepSpeed's memory docs print: ZeRO-2 without offload as 4P + 16P/G)")
    return text


def _check_transformers_builds(spec: Any) -> None:
    """Refuse, in one line, a config transformers refuses or cannot build a model from (a bogus
    rope type, a padding id past the vocabulary …), as ``infer`` and ``plan`` do: the model is
    built on the meta device. Without transformers (resacct[hf] not installed) the closed form
    answers alone."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return
    from resacct.account.load.hf_models import build_hf_model

    build_hf_model(spec, device="meta")


def _model(args: argparse.Namespace) -> tuple[str | None, float, float]:
    """The config's name (None without --hf-config), the parameters and the largest module's."""
    if args.hf_config is not None:
        if args.params is not None or args.largest_layer is not None:
            raise ResacctError(f"--params/--largest-layer and --hf-config {args.hf_config!r}: give the model by one of them, not both")
        from resacct.account.load.hf_models import load_hf_config
        from resacct.formulas.config_shapes import architecture_from_values
        from resacct.formulas.hf_formulas import predict_parameters
        from resacct.formulas.offload import largest_module_parameters

        spec = load_hf_config(args.hf_config)
        from resacct.formulas.hf_formulas import FAMILIES

        if spec.model_type not in FAMILIES:  # any other architecture: the model built on meta (resacct.account.load.meta_facts)
            from resacct.account.load.meta_facts import meta_model_facts

            facts = meta_model_facts(args.hf_config)
            return spec.name, float(facts.parameters), float(facts.largest_module_parameters)
        _check_transformers_builds(spec)
        architecture = architecture_from_values(spec.values)
        return spec.name, float(predict_parameters(architecture)), float(largest_module_parameters(architecture))
    if args.params is None:
        raise ResacctError("give --params N (and --largest-layer N for ZeRO-3), or --hf-config NAME")
    if args.largest_layer is None and args.stage != 2:
        raise ResacctError("ZeRO-3's estimates need the largest layer's parameters: give --largest-layer N (DeepSpeed's largest_layer_params), "
                           "or --stage 2")
    return None, args.params, args.largest_layer if args.largest_layer is not None else args.params


def _memory(args: argparse.Namespace) -> tuple[Any, float | None]:
    if args.device is not None and args.gpu_memory_gb is not None:
        raise ResacctError("give --device NAME (memory from the datasheet table) or --gpu-memory-gb GB, not both")
    if args.device is not None:
        from resacct.facts.hardware import get_accelerator

        board = get_accelerator(args.device)
        return board, float(board.memory_bytes)
    return None, None if args.gpu_memory_gb is None else args.gpu_memory_gb * 1e9


def _option_words(row: Any) -> str:
    words = f"ZeRO-{row.stage}  offload_optimizer={'cpu' if row.offload_optimizer else 'none'}"
    if row.stage == 3:
        words += f", offload_param={'cpu' if row.offload_param else 'none'}, zero_init={int(bool(row.zero_init))}"
    return words


def _run_offload(args: argparse.Namespace) -> int:
    from resacct.formulas.offload import DEEPSPEED_BUFFER_FACTOR, deepspeed_options

    name, parameters, largest = _model(args)
    board, gpu_memory = _memory(args)
    host_memory = None if args.host_memory_gb is None else args.host_memory_gb * 1e9
    rows = [row for row in deepspeed_options(parameters, largest, gpus_per_node=args.gpus_per_node, nodes=args.nodes, estimator=args.estimator)
            if args.stage is None or row.stage == args.stage]
    host = "NVMe" if args.nvme else "CPU"
    options = []
    for row in rows:
        fits_gpu = None if gpu_memory is None else row.gpu_bytes <= gpu_memory
        fits_host = None if host_memory is None else row.host_bytes <= host_memory
        options.append({"stage": row.stage, "offload_optimizer": "cpu" if row.offload_optimizer else "none",
                        "offload_param": "cpu" if row.offload_param else "none", "zero_init": row.zero_init,
                        "host_bytes": row.host_bytes, "gpu_bytes": row.gpu_bytes, "fits_gpu": fits_gpu, "fits_host": fits_host})
    fields: dict[str, Any] = {
        "model": name, "parameters": parameters, "largest_layer_parameters": largest, "gpus_per_node": args.gpus_per_node, "nodes": args.nodes,
        "host_memory_kind": host.lower(), "estimator": args.estimator, "buffer_factor": DEEPSPEED_BUFFER_FACTOR,
        "device": board.name if board is not None else None, "device_memory_bytes": gpu_memory, "host_memory_bytes": host_memory,
        "options": options,
    }
    units = args.units
    lines = [f"{name + ': ' if name else ''}{parameters:.4g} parameters (largest layer {largest:.4g}) on {args.nodes} node(s) × "
             f"{args.gpus_per_node} GPU(s) — model states as DeepSpeed estimates them ({args.estimator} estimator)",
             f"  {'per ' + host + ' (host)':>16} {'per GPU':>12}   options"]
    for row, option in zip(rows, options):
        marks = "".join(f"  {what} {'fits' if fit else 'does NOT fit'}" for what, fit in (("GPU", option["fits_gpu"]), ("host", option["fits_host"]))
                        if fit is not None)
        lines.append(f"  {gigabytes_text(row.host_bytes, units):>16} {gigabytes_text(row.gpu_bytes, units):>12}   {_option_words(row)}{marks}")
    memory = [f"GPU {gigabytes_text(gpu_memory, units)}" + (f" ({board.name})" if board is not None else "")] if gpu_memory is not None else []
    memory += [f"host {gigabytes_text(host_memory, units)}"] if host_memory is not None else []
    if memory:
        lines.append("  memory: " + ", ".join(memory))
    lines.append(f"  host figures × {DEEPSPEED_BUFFER_FACTOR:g} (DeepSpeed's buffer factor); not counted: activations, communication buffers, "
                 "the CUDA context" + ("; with NVMe the CPU still holds pinned buffers" if args.nvme else ""))
    return emit(args, fields, with_caveat(fields, "\n".join(lines), board))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("offload", help="ZeRO-Offload / ZeRO-Infinity: model-state bytes per GPU and per host, as DeepSpeed estimates them",
                                   description=__doc__, epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=count, default=None, metavar="N", help="parameters of the model (2851M, 70B)")
    parser.add_argument("--largest-layer", type=count, default=None, metavar="N",
                        help="parameters of the largest module (DeepSpeed's largest_layer_params; ZeRO-3 gathers one at a time)")
    parser.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                        help="parameters and the largest module from a config (shipped: see 'resacct account --help')")
    parser.add_argument("--gpus-per-node", type=positive_int, default=1, help="GPUs per node (default: 1)")
    parser.add_argument("--nodes", type=positive_int, default=1, help="nodes (default: 1)")
    parser.add_argument("--stage", type=int, choices=(2, 3), default=None, help="only this ZeRO stage's options (default: both)")
    parser.add_argument("--nvme", action="store_true", help="ZeRO-Infinity: the offloaded state on the node's NVMe instead of CPU memory")
    parser.add_argument("--estimator", type=_estimator, default="current", metavar="current|docs",
                        help="DeepSpeed's estimator: current (≥ 0.14.3, default) or docs (the table its memory docs print)")
    parser.add_argument("--device", default=None, metavar="NAME", help="accelerator whose memory each GPU has (see 'resacct devices')")
    parser.add_argument("--gpu-memory-gb", type=gigabytes, default=None, metavar="GB", help="memory per GPU in GB (10^9 bytes) instead of --device")
    parser.add_argument("--host-memory-gb", type=gigabytes, default=None, metavar="GB", help="CPU (or NVMe) memory per node in GB, to say what fits")
    add_units_flag(parser)
    add_json_flag(parser)
    parser.set_defaults(run=_run_offload)
