"""Hugging Face configs resacct ships (``resacct/hf_configs/known.yaml``: GPT-2 sizes, Llama-2,
Llama-3, Mistral-7B, Mixtral-8x7B — each the architecture fields of its model card's
config.json, with the source), config JSON files, and the models built from them on the meta
device (no weights, no hub). Needs ``transformers`` (``pip install 'resacct[hf]'``).

>>> sorted(known_hf_configs())[:3]
['gpt2', 'gpt2-large', 'gpt2-medium']
>>> load_hf_config("llama-2-7b").values["num_key_value_heads"]
32
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from resacct.errors import ResacctError, UnknownNameError

__all__ = ["HfConfigSpec", "REPEATING_MODEL_TYPES", "refuse_unusable_transformers", "StackShape", "layer_stack", "config_layer_stack", "PREFIX_FIELDS", "with_depth", "config_with_depth", "known_hf_configs", "load_hf_config", "check_sizes", "require_transformers", "transformers_config", "build_hf_model",
           "causal_lm_from_config", "import_before_device_modes", "MAX_CONFIG_BYTES", "MAX_LAYERS", "MAX_SIZE", "SIZE_KEYS"]

_KNOWN = Path(__file__).resolve().parents[2] / "hf_configs" / "known.yaml"


@dataclass(frozen=True)
class HfConfigSpec:
    """A config to build: its name, where its values come from, and the values (``model_type`` included)."""

    name: str
    source: str
    values: dict[str, Any]

    @property
    def model_type(self) -> str:
        return str(self.values["model_type"])


@lru_cache(maxsize=1)
def known_hf_configs() -> dict[str, HfConfigSpec]:
    """The configs that ship with resacct, by name."""
    from resacct.facts.yaml_text import safe_load_text

    table = safe_load_text(_KNOWN.read_text(encoding="utf-8"))
    return {name: HfConfigSpec(name=name, source=entry["source"], values=dict(entry["config"])) for name, entry in table.items()}


MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A config.json is a few kilobytes; anything over this is refused before it is read."""

MAX_LAYERS = 256
"""The most layers ``--hf-config`` builds: the largest published configs have ~130 (Llama-3-405B:
126), and building and tracing costs ~0.1 s a layer on a CPU, so 100,000 layers would run for hours."""

MAX_SIZE = 2**31 - 1
"""The largest size (hidden, vocabulary, heads …) accepted: larger ones overflow torch's sizes."""

#: The sizes resacct reads from a config (``architecture_of``, the default inputs) or that decide
#: the shapes transformers builds: when present and not null, each must be a whole number ≥ 1.
SIZE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "head_dim", "num_local_experts", "num_experts_per_tok", "sliding_window",
    "n_embd", "n_layer", "n_head", "n_positions", "n_ctx", "n_inner",
)
_LAYER_KEYS = ("num_hidden_layers", "n_layer")


def _label(spec: HfConfigSpec) -> str:
    """How messages name the config: its file, or its shipped name."""
    return f"config file {spec.source!r}" if not spec.source.startswith("https://") else f"config {spec.name!r}"


def _reason(error: BaseException) -> str:
    """transformers' reason in one line: the first line, and the second when the first only
    introduces it (``Validation error for field 'hidden_size':``)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    text = text if len(text) <= 300 else text[:299] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def load_hf_config(name_or_path: str | HfConfigSpec) -> HfConfigSpec:
    """A shipped config by name (``llama-2-7b``), or a config JSON file (a model card's config.json);
    an :class:`HfConfigSpec` already parsed is returned as it is.

    A file must be a regular file of at most :data:`MAX_CONFIG_BYTES` (a FIFO or a device is
    refused, not read), UTF-8 JSON (not nested past Python's limit, no integer of more than 4,300
    digits), an object with a ``"model_type"``, and its sizes (:data:`SIZE_KEYS`) whole numbers in
    1..:data:`MAX_SIZE` (layers at most :data:`MAX_LAYERS`); each refusal is one line naming the file."""
    from resacct.training.input_files import read_regular_file

    if isinstance(name_or_path, HfConfigSpec):
        return name_or_path
    known = known_hf_configs()
    if name_or_path in known:
        return known[name_or_path]
    if not name_or_path.endswith(".json") and not os.path.sep in name_or_path:
        raise UnknownNameError("hf config", name_or_path, list(known))
    path = Path(name_or_path)
    where = f"config file {name_or_path!r}"
    try:
        raw = read_regular_file(path, where, max_bytes=MAX_CONFIG_BYTES, directory_hint="; expected a config.json file")
    except ResacctError as error:
        if not path.exists() and not path.is_symlink():
            raise ResacctError(f"cannot read the config file {name_or_path!r}: No such file or directory; expected a config.json or one of {', '.join(known)}") from None
        raise error from None
    try:
        values = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResacctError(f"{where} is not JSON ({error}); expected a transformers config.json") from None
    except RecursionError:
        raise ResacctError(f"{where} is not a config: its JSON is nested deeper than Python's parser allows; expected a transformers config.json") from None
    except ValueError as error:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise ResacctError(f"{where} is not a config: {str(error).splitlines()[0]}; expected a transformers config.json") from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ResacctError(f"config file {name_or_path!r} has no \"model_type\"; expected a transformers config.json (e.g. \"model_type\": \"llama\")")
    spec = HfConfigSpec(name=path.name, source=str(path), values=values)
    check_sizes(spec)
    return spec


def _refuse_size(spec: HfConfigSpec, key: str, value: Any, expected: str) -> ResacctError:
    if isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) > 30:
        shown = f"a {len(str(abs(value)))}-digit integer"
    else:
        try:
            shown = json.dumps(value)  # as the file spells it: true, null, NaN, "32"
        except (TypeError, ValueError):
            shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ResacctError(f"{_label(spec)}: \"{key}\" is {shown}; expected {expected}")


def check_sizes(spec: HfConfigSpec) -> None:
    """Refuse, in one line naming the config and the key, a size in :data:`SIZE_KEYS` that is not
    a whole number in 1..:data:`MAX_SIZE` (a string, a float, NaN, a bool, 0, a negative number),
    more than :data:`MAX_LAYERS` layers, and sizes that cannot fit together: query heads that do
    not divide the hidden size (without an explicit ``head_dim``), key/value heads that do not
    divide the query heads, more experts per token than experts. Keys left out take transformers'
    defaults, checked again once the config is built."""
    values = spec.values
    for key in SIZE_KEYS:
        value = values.get(key)
        if value is None and key in ("num_key_value_heads", "head_dim", "n_inner", "sliding_window", "n_ctx"):
            continue  # null: transformers derives it (or, for sliding_window, there is none)
        if key not in values:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _refuse_size(spec, key, value, "a whole number ≥ 1 (a JSON integer)")
        if not 1 <= value <= MAX_SIZE:
            raise _refuse_size(spec, key, value, f"a whole number in 1..{MAX_SIZE}")
        if key in _LAYER_KEYS and value > MAX_LAYERS:
            raise _refuse_size(spec, key, value, f"at most {MAX_LAYERS} layers (the largest published models have ~130; each layer costs ~0.1 s to build and trace)")
    _check_fit(spec, values.get)


def _check_fit(spec: HfConfigSpec, get: Any) -> None:
    """Sizes that must fit together, read through ``get(key)`` (the JSON values, or the built config's attributes)."""
    hidden, heads = get("hidden_size") or get("n_embd"), get("num_attention_heads") or get("n_head")
    kv_heads, head_dim = get("num_key_value_heads"), get("head_dim")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and head_dim is None and hidden % heads:
        raise ResacctError(f"{_label(spec)}: {heads} attention heads do not divide the hidden size {hidden}; expected a divisor of {hidden} (or an explicit \"head_dim\")")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and heads % kv_heads:
        raise ResacctError(f"{_label(spec)}: {kv_heads} key/value heads do not divide the {heads} attention heads; expected a divisor of {heads}")
    experts, per_token = get("num_local_experts"), get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(per_token, int) and per_token > experts:
        raise ResacctError(f"{_label(spec)}: \"num_experts_per_tok\" {per_token} is more than the {experts} experts (\"num_local_experts\"); expected at most {experts}")


def require_transformers() -> Any:
    """``transformers``, imported offline (``HF_HUB_OFFLINE=1``: nothing is downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise ResacctError("--hf-config needs transformers; expected it installed: pip install 'resacct[hf]'") from None
    transformers.logging.set_verbosity_error()
    return transformers


def transformers_config(spec: HfConfigSpec) -> Any:
    """The transformers config object (its class's defaults for every field the spec leaves out).
    Anything transformers raises while parsing it is one line naming the config and the reason;
    the sizes are checked (:func:`check_sizes`) before, and again with the defaults filled in."""
    transformers = require_transformers()
    check_sizes(spec)
    values = dict(spec.values)
    model_type = values.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        values.pop(key, None)
    try:
        config = transformers.AutoConfig.for_model(model_type, **values)
    except Exception as error:  # transformers raises anything on a hostile config (ZeroDivisionError, KeyError, RecursionError …)
        raise ResacctError(f"{_label(spec)}: transformers refused it ({_reason(error)})") from None
    # Qwen2-MoE's config writes sliding_window 0 where use_sliding_window is false (Qwen1.5-MoE-A2.7B's card): no window, as null
    built = HfConfigSpec(name=spec.name, source=spec.source, values={key: getattr(config, key, None) for key in SIZE_KEYS if hasattr(config, key)
                                                                     and not (key == "sliding_window" and getattr(config, key) == 0)})
    check_sizes(built)
    _check_fit(spec, lambda key: getattr(config, key, None))
    return config


def refuse_unusable_transformers(spec: HfConfigSpec) -> None:
    """One line naming the versions where transformers' models do not work under this torch (its configs
    do), raised before transformers' models are imported: under an older torch that import prints warnings."""
    from resacct.measurement.torch_limits import transformers_unusable

    if problem := transformers_unusable():
        raise ResacctError(f"{_label(spec)}: {problem}")


def build_hf_model(spec: HfConfigSpec, *, device: str = "meta", attention: str = "sdpa") -> Any:
    """The causal LM of ``spec`` built on ``device`` (meta: shapes, no memory), attention by
    ``F.scaled_dot_product_attention`` (``attention="eager"``: transformers' own matmuls; an
    architecture transformers gives no sdpa — Gemma-2, BLOOM — gets eager). Mixtral uses transformers' ``batched_mm``
    experts, which route without data-dependent shapes (the default loops over the experts a
    batch hits, which the meta device cannot tell) and which resacct's Mixtral formulas model.
    Any other mixture of experts follows :mod:`resacct.account.load.moe_routing`'s dropless routing (a
    grouped matmul per expert over its tokens: no per-token copy of the expert weights).
    Anything transformers raises while building it is one line naming the config and the reason."""
    import torch

    refuse_unusable_transformers(spec)
    config = transformers_config(spec)
    import_before_device_modes()
    with torch.device(device):
        try:
            return causal_lm_from_config(config, attention=attention)
        except ValueError as error:
            raise ResacctError(f"{_label(spec)}: transformers has no causal LM for it ({str(error).splitlines()[0]})") from None
        except Exception as error:  # a hostile config can break model construction anywhere (a bogus rope type: KeyError)
            raise ResacctError(f"{_label(spec)}: transformers cannot build a model from it ({_reason(error)})") from None


def import_before_device_modes() -> None:
    """Import what transformers' lazy model import pulls in that must not be first imported under
    ``torch.device(...)`` (a TorchFunctionMode): on torch 2.8 ``torch._dynamo`` imported there fails
    as a circular import ("partially initialized module 'torch._dynamo' has no attribute 'disable'"),
    and a fresh ``resacct account --hf-config gpt2`` said transformers could not build the model."""
    import torch._dynamo  # noqa: F401


def causal_lm_from_config(config: Any, *, attention: str = "sdpa", **kwargs: Any) -> Any:
    """transformers' causal LM of ``config`` (on the current device): ``attention`` (sdpa falls back
    to eager where transformers has none: Gemma-2, BLOOM); Mixtral's experts ``batched_mm`` (resacct's
    closed forms model it), any other mixture of experts :mod:`resacct.account.load.moe_routing`'s dropless routing."""
    transformers = require_transformers()
    extra: dict[str, Any] = dict(kwargs)
    if config.model_type == "mixtral":
        extra["experts_implementation"] = "batched_mm"
    elif any(getattr(config, key, None) for key in ("num_local_experts", "num_experts", "n_routed_experts")):
        from resacct.account.load.moe_routing import register_dropless_experts

        extra["experts_implementation"] = register_dropless_experts()  # dropless routing, as training holds it
    try:
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, **extra)
    except ValueError as error:  # an architecture without sdpa: transformers' own matmuls
        if attention != "sdpa" or "scaled_dot_product_attention" not in str(error):
            raise
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", **extra)


#: Model types whose decoder layers are one layer repeated (no layer built differently by its index),
#: each checked by tests/test_repeated_layers.py against a whole trace: their accounts may be traced
#: at three small depths and extrapolated (:mod:`resacct.account.trace.repeated_layers`).
REPEATING_MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt2", "gpt_neox", "phi3", "olmo2", "falcon",
                                   "bloom", "deepseek_v3",
                                   # round four, session 13: each checked the same way at 7 layers (9 with a prefix)
                                   "gemma", "granite", "granitemoe", "starcoder2", "cohere", "stablelm", "qwen2_moe", "olmo", "olmoe", "gpt_bigcode",
                                   "gptj", "phimoe", "glm", "glm4", "glm4_moe", "ernie4_5", "helium", "deepseek_v2", "seed_oss", "apertus", "arcee",
                                   "hunyuan_v1_dense",
                                   # sliding and full attention alternating (layer_types): a unit of two layers repeated
                                   "gemma2", "gpt_oss"})

#: Config fields that say how many of the first layers are built apart from the rest (DeepSeek-V3: its first
#: ``first_k_dense_replace`` layers have a dense MLP, the others a mixture of experts): a **prefix** kept whole
#: in every sampled depth (:mod:`resacct.account.trace.repeated_layers`).
PREFIX_FIELDS = ("first_k_dense_replace",)

#: Config fields by which a repeating type builds a layer from its index, and the values under which every
#: layer is built alike (Qwen3-MoE: a layer is dense where its index is in ``mlp_only_layers`` or
#: (index + 1) is not a multiple of ``decoder_sparse_step``).
LAYERS_ALIKE_WHEN = {"mlp_only_layers": ([], ()), "decoder_sparse_step": (1, None)}


class StackShape(NamedTuple):
    """How a config's decoder layers repeat: ``depth`` layers, the first ``prefix`` built apart (0: none), then units of
    ``period`` layers alike (1: one layer repeated; more where ``layer_types`` alternate); ``why_not``: why they may not
    be sampled as such (None: they may)."""

    depth: int
    prefix: int
    period: int
    why_not: str | None


def layer_stack(spec: HfConfigSpec) -> StackShape:
    """The :class:`StackShape` of the config's decoder layers: not sampled where its model type is not in
    :data:`REPEATING_MODEL_TYPES`, it builds a layer by its index, sets a per-layer list among its values, or has
    layers of several kinds that do not alternate with a period."""
    refuse_unusable_transformers(spec)
    return config_layer_stack(transformers_config(spec), spec.values)


def config_layer_stack(config: Any, values: dict[str, Any] | None = None) -> StackShape:
    """:func:`layer_stack` of a transformers config object; ``values``: the fields the user gave (a per-layer list
    among them is looked for; default: every field of the config)."""
    depth = int(config.num_hidden_layers)
    model_type = getattr(config, "model_type", "")
    if model_type not in REPEATING_MODEL_TYPES:
        return StackShape(depth, 0, 1, f"model_type {model_type!r} is not among those checked to repeat ({', '.join(sorted(REPEATING_MODEL_TYPES))})")
    by_index = [f"{key}={getattr(config, key)!r}" for key, alike in LAYERS_ALIKE_WHEN.items()
                if hasattr(config, key) and getattr(config, key) not in alike]
    if by_index:
        return StackShape(depth, 0, 1, f"it builds a layer by its index ({', '.join(by_index)})")
    given = config.to_dict() if values is None else values
    listed = [key for key, value in given.items() if isinstance(value, (list, tuple)) and len(value) == depth and key != "layer_types"]
    if listed:
        return StackShape(depth, 0, 1, f"it sets {', '.join(listed)} per layer")
    prefix = max((int(getattr(config, key) or 0) for key in PREFIX_FIELDS if hasattr(config, key)), default=0)
    prefix = prefix if 0 < prefix < depth else 0
    kinds = [str(kind) for kind in getattr(config, "layer_types", None) or ()][prefix:]
    period = _period(kinds)
    if period is None:
        return StackShape(depth, 0, 1, f"its layers are of {len(set(kinds))} kinds ({', '.join(sorted(set(kinds)))}), in no repeating pattern")
    return StackShape(depth, prefix, period, None)


def _period(kinds: list[str]) -> int | None:
    """The shortest period of ``kinds`` (the layers' ``layer_types`` after the prefix; 1: one kind, or none given)
    that the stack holds whole units of; None: none. (Whether sampling units of it pays is the plan's to say:
    Gemma-3's 6 would trace 72 layers of its 48.)"""
    for period in range(1, max(1, len(kinds) // 2) + 1):
        if len(kinds) % period == 0 and all(kind == kinds[index % period] for index, kind in enumerate(kinds)):
            return period
    return None if kinds else 1


def config_with_depth(config: Any, depth: int) -> Any:
    """A copy of a transformers config object with ``depth`` decoder layers (``layer_types`` cut to it)."""
    import copy

    made = copy.deepcopy(config)
    made.num_hidden_layers = depth  # GPT-2's n_layer through its attribute_map
    if isinstance(getattr(made, "layer_types", None), (list, tuple)):
        made.layer_types = list(made.layer_types)[:depth]
    return made


def with_depth(spec: HfConfigSpec, depth: int) -> HfConfigSpec:
    """``spec`` with ``depth`` decoder layers (``num_hidden_layers``, or its alias such as GPT-2's ``n_layer``)."""
    config = transformers_config(spec)
    key = next((name for name in ("num_hidden_layers", config.attribute_map.get("num_hidden_layers")) if name and name in spec.values),
               "num_hidden_layers")
    values = {**spec.values, key: depth}
    if isinstance(values.get("layer_types"), (list, tuple)):
        values["layer_types"] = list(values["layer_types"])[:depth]
    return HfConfigSpec(name=spec.name, source=spec.source, values=values)
