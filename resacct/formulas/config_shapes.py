"""An :class:`~resacct.formulas.hf_formulas.HfArchitecture` from a config's values alone — a shipped config
(``resacct/hf_configs/known.yaml``) or a config.json read as JSON — without transformers: what
``plan``, ``infer`` and ``lora`` need to count parameters, key/value heads and adapter shapes.
transformers' defaults are filled in where a GPT-2 config leaves a key out.

>>> from resacct.account.load.hf_models import load_hf_config
>>> a = architecture_from_values(load_hf_config("llama-3-8b").values)
>>> a.layers, a.heads, a.kv_heads, a.head_dim
(32, 32, 8, 128)
>>> architecture_from_values({"model_type": "bert"})
Traceback (most recent call last):
resacct.errors.ResacctError: model_type 'bert': resacct counts gpt2, llama, mistral, mixtral
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import FAMILIES, HfArchitecture, architecture_of

__all__ = ["architecture_from_values"]

_GPT2_DEFAULTS = {"n_inner": None, "activation_function": "gelu_new", "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
                  "n_positions": 1024, "tie_word_embeddings": True}


def architecture_from_values(values: dict[str, Any]) -> HfArchitecture:
    """The architecture of a config given as its values (``model_type`` included)."""
    model_type = values.get("model_type")
    if model_type not in FAMILIES:
        raise ResacctError(f"model_type {model_type!r}: resacct counts {', '.join(FAMILIES)}")
    filled = {**(_GPT2_DEFAULTS if model_type == "gpt2" else {}), **values}
    try:
        architecture = architecture_of(SimpleNamespace(**filled))
    except AttributeError as error:
        raise ResacctError(f"the {model_type} config has no {getattr(error, 'name', None) or error!s}; give it in the config") from None
    assert architecture is not None  # model_type is one of FAMILIES
    return architecture
