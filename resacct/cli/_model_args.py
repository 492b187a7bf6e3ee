"""Arguments ``infer`` and ``lora`` share: the model (``--hf-config`` or its shape) and the device
(``--device`` from the datasheet table, or ``--memory-gb``), read into resacct's objects."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
from typing import Any

from resacct.cli.arguments import gigabytes, positive_int, reserve_gigabytes
from resacct.errors import ResacctError

__all__ = ["shipped_hf_config_names", "add_model_arguments", "add_model_source_arguments", "model_source", "parse_input_shape", "add_device_arguments",
           "model_architecture", "model_config", "device_memory_bytes",
           "SHAPE_FLAGS", "shape_flags_given", "refuse_shape_flags_with_hf_config"]


def shipped_hf_config_names() -> list[str]:
    """The names in ``resacct/hf_configs/known.yaml``, read without ``resacct.account`` (whose
    package imports torch: ``--help`` of a napkin command must not wait for it). Every parser asks
    (three times a command, also for a napkin command): the names are the file's unindented keys,
    read once a process without parsing the YAML (a full parse 29 ms, the names 0.2: ``python benchmarks/parse_costs.py``;
    tests/test_cli_startup.py checks the names against the parse)."""
    return list(_shipped_hf_config_names())


@functools.lru_cache(maxsize=1)
def _shipped_hf_config_names() -> tuple[str, ...]:
    from pathlib import Path

    known = Path(__file__).resolve().parents[1] / "hf_configs" / "known.yaml"
    return tuple(match.group(1) for match in _TOP_LEVEL_KEY.finditer(known.read_text(encoding="utf-8")))


_TOP_LEVEL_KEY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*):[ \t]*$", re.MULTILINE)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                        help="the model's shape from a config: shipped " + ", ".join(shipped_hf_config_names()) + "; or a model card's config.json")
    parser.add_argument("--layers", type=positive_int, default=None, help="transformer layers L (without --hf-config)")
    parser.add_argument("--hidden", type=positive_int, default=None, help="hidden size d (without --hf-config)")
    parser.add_argument("--heads", type=positive_int, default=None, help="query heads h (without --hf-config)")
    parser.add_argument("--kv-heads", type=positive_int, default=None, help="key/value heads g (GQA; 1 = MQA; default: --heads)")
    parser.add_argument("--head-dim", type=positive_int, default=None, help="head size e (default: hidden / heads)")
    parser.add_argument("--mlp", type=positive_int, default=None, help="MLP width f of a SwiGLU (Llama-style) block (without --hf-config)")
    parser.add_argument("--vocab", type=positive_int, default=None, help="vocabulary V (without --hf-config; untied LM head)")


def add_model_source_arguments(parser: argparse.ArgumentParser) -> None:
    """A real model to build on the meta device (``fit``, ``shard``): ``--hf-config`` or ``--model
    module:factory`` with its arguments, input and loss."""
    parser.add_argument("--hf-config", default=None, metavar="NAME|config.json",
                        help="a Hugging Face causal LM from its config, built on the meta device (needs resacct[hf]); shipped: "
                             + ", ".join(shipped_hf_config_names()))
    parser.add_argument("--model", default=None, metavar="MODULE:FACTORY", help="any nn.Module factory, built on the meta device")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="an argument of the factory (repeatable)")
    parser.add_argument("--input-shape", default=None, metavar="N,N,…", help="a --model's input, batch first (fit searches its batch; shard uses it as given)")
    parser.add_argument("--input-dtype", default="float32", metavar="DTYPE", help="dtype of --input-shape's tensor (default: float32)")
    parser.add_argument("--loss", choices=("auto", "model", "mean", "sum", "mse", "cross-entropy"), default="auto",
                        help="a --model's loss (default auto: its own .loss when it has one, else the mean of its output)")


def model_source(args: argparse.Namespace) -> Any:
    """``--hf-config`` or ``--model`` with its arguments as one
    :class:`~resacct.account.fit.search.ModelSource` (one line for a bad combination)."""
    from resacct.account.fit.search import ModelSource

    if (args.hf_config is None) == (args.model is None):
        raise ResacctError("give the model by exactly one of --hf-config NAME (or config.json) and --model module:factory")
    if args.hf_config is None and getattr(args, "trace_all_layers", False):
        raise ResacctError("--trace-all-layers applies to --hf-config (a stack of decoder layers); expected --hf-config NAME with it")
    if args.hf_config is not None:
        extra = [flag for flag, used in (("--model-arg", args.model_arg), ("--input-shape", args.input_shape), ("--loss", args.loss != "auto")) if used]
        if extra:
            raise ResacctError(f"{', '.join(extra)} apply to --model module:factory; a --hf-config model takes input_ids and its own loss")
        return ModelSource(hf_config=args.hf_config, layers="all" if getattr(args, "trace_all_layers", False) else "auto")
    from resacct.account.load.model_factory import parse_model_arg  # torch: only a --model factory needs it here

    return ModelSource(factory=args.model, model_args=tuple(parse_model_arg(text) for text in args.model_arg),
                       input_shape=parse_input_shape(args.input_shape), input_dtype=args.input_dtype, loss=args.loss)


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """``--input-shape 8,64`` as a shape (None when not given); one line naming the value otherwise."""
    if text is None:
        return None
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise ResacctError(f"--input-shape {text!r}: expected sizes ≥ 1 separated by commas, batch first (e.g. 8,64)")
    return shape


def add_device_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--device", default=None, metavar="NAME", help="accelerator whose memory to use (see 'resacct devices')")
    parser.add_argument("--memory-gb", type=gigabytes, default=None, help="memory per device in GB (10^9 bytes) instead of --device")
    parser.add_argument("--reserve-gb", type=reserve_gigabytes, default=0.0, help="GB to keep free (CUDA context, fragmentation; default: 0)")
    parser.set_defaults(device_required=required)


def model_architecture(args: argparse.Namespace) -> tuple[str, Any]:
    """The model's name (a config's, or "a custom model") and its :class:`HfArchitecture` (llama
    family when given by shape)."""
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.hf_formulas import HfArchitecture

    shape = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
             "mlp": args.mlp, "vocab": args.vocab}
    if args.hf_config is not None:
        given = [f"--{name.replace('_', '-')}" for name, value in shape.items() if value is not None]
        if given:
            raise ResacctError(f"{', '.join(given)} and --hf-config {args.hf_config!r}: give the model by one of them, not both")
        from resacct.account.load.hf_models import load_hf_config

        spec = load_hf_config(args.hf_config)
        return spec.name, architecture_from_values(spec.values)
    missing = [f"--{name}" for name in ("layers", "hidden", "heads", "mlp", "vocab") if shape[name] is None]
    if missing:
        raise ResacctError(f"give --hf-config NAME, or the model's shape: {', '.join(missing)} missing")
    heads = args.heads
    head_dim = args.head_dim or args.hidden // heads
    if args.head_dim is None and args.hidden % heads:
        raise ResacctError(f"--hidden {args.hidden} is not divisible by --heads {heads}; give --head-dim")
    return "a custom model", HfArchitecture(family="llama", vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=heads,
                                            kv_heads=args.kv_heads or heads, head_dim=head_dim, mlp=args.mlp, positions=0)


#: The flags that give a model by its shape (``add_model_arguments``), refused beside ``--hf-config``.
SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab")


def shape_flags_given(args: argparse.Namespace) -> list[str]:
    """The shape flags given, as typed (``--kv-heads``)."""
    return [f"--{name.replace('_', '-')}" for name in SHAPE_FLAGS if getattr(args, name, None) is not None]


def refuse_shape_flags_with_hf_config(args: argparse.Namespace) -> None:
    """One line where ``--hf-config`` and a shape flag are both given."""
    if args.hf_config is not None and (given := shape_flags_given(args)):
        raise ResacctError(f"{', '.join(given)} and --hf-config {args.hf_config!r}: give the model by one of them, not both")


def model_config(args: argparse.Namespace) -> tuple[str, Any, Any]:
    """The model's name, its :class:`HfArchitecture` where resacct has a family formula for it (None
    otherwise: any other transformers ``model_type``), and its transformers config to build it from
    (None for the shape flags — a napkin path that never imports torch — or without transformers)."""
    if args.hf_config is None:  # the shape flags: the napkin path, formulas only (torch is never imported)
        name, architecture = model_architecture(args)
        return name, architecture, None
    refuse_shape_flags_with_hf_config(args)
    from resacct.account.load.hf_models import load_hf_config, transformers_config
    from resacct.formulas.config_shapes import architecture_from_values
    from resacct.formulas.hf_formulas import FAMILIES

    spec = load_hf_config(args.hf_config)
    architecture = architecture_from_values(spec.values) if spec.model_type in FAMILIES else None
    if architecture is not None and importlib.util.find_spec("transformers") is None:
        return spec.name, architecture, None  # transformers missing: the family's formulas answer alone
    config = transformers_config(spec)  # a config transformers refuses is refused here, never answered by the closed form
    return spec.name, architecture, config


def device_memory_bytes(args: argparse.Namespace) -> tuple[Any, float | None]:
    """The board (None for --memory-gb or no device) and its memory in bytes (None: no device given)."""
    if args.device is not None and args.memory_gb is not None:
        raise ResacctError("give --device NAME (memory from the datasheet table) or --memory-gb GB, not both")
    if args.device is not None:
        from resacct.facts.hardware import get_accelerator

        board = get_accelerator(args.device)
        return board, float(board.memory_bytes)
    if args.memory_gb is not None:
        return None, args.memory_gb * 1e9
    if getattr(args, "device_required", False):
        raise ResacctError("give --device NAME (see 'resacct devices') or --memory-gb GB")
    return None, None
