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
from typing import Any

from resacct.errors import ResacctError, UnknownNameError

__all__ = ["HfConfigSpec", "known_hf_configs", "load_hf_config", "require_transformers", "transformers_config", "build_hf_model"]

_KNOWN = Path(__file__).parent / "hf_configs" / "known.yaml"


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
    import yaml

    table = yaml.safe_load(_KNOWN.read_text(encoding="utf-8"))
    return {name: HfConfigSpec(name=name, source=entry["source"], values=dict(entry["config"])) for name, entry in table.items()}


def load_hf_config(name_or_path: str) -> HfConfigSpec:
    """A shipped config by name (``llama-2-7b``), or a config JSON file (a model card's config.json)."""
    known = known_hf_configs()
    if name_or_path in known:
        return known[name_or_path]
    if not name_or_path.endswith(".json") and not os.path.sep in name_or_path:
        raise UnknownNameError("hf config", name_or_path, list(known))
    path = Path(name_or_path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ResacctError(f"cannot read the config file {name_or_path!r}: {error.strerror}; expected a config.json or one of {', '.join(known)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResacctError(f"config file {name_or_path!r} is not JSON ({error}); expected a transformers config.json") from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ResacctError(f"config file {name_or_path!r} has no \"model_type\"; expected a transformers config.json (e.g. \"model_type\": \"llama\")")
    return HfConfigSpec(name=path.name, source=str(path), values=values)


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
    """The transformers config object (its class's defaults for every field the spec leaves out)."""
    transformers = require_transformers()
    values = dict(spec.values)
    model_type = values.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        values.pop(key, None)
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except (ValueError, KeyError, TypeError) as error:
        raise ResacctError(f"config {spec.name!r}: transformers refused it ({type(error).__name__}: {str(error).splitlines()[0]})") from None


def build_hf_model(spec: HfConfigSpec, *, device: str = "meta", attention: str = "sdpa") -> Any:
    """The causal LM of ``spec`` built on ``device`` (meta: shapes, no memory), attention by
    ``F.scaled_dot_product_attention`` (``attention="eager"``: transformers' own matmuls). A mixture of experts uses transformers' ``batched_mm``
    experts, which route without data-dependent shapes (the default loops over the experts a
    batch hits, which the meta device cannot tell); its FLOPs are the same k experts per token."""
    import torch

    transformers = require_transformers()
    config = transformers_config(spec)
    extra = {"experts_implementation": "batched_mm"} if getattr(config, "num_local_experts", None) else {}
    with torch.device(device):
        try:
            return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, **extra)
        except ValueError as error:
            raise ResacctError(f"config {spec.name!r}: transformers has no causal LM for it ({str(error).splitlines()[0]})") from None
