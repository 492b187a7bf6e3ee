"""``resacct plan``'s parameter count for a Hugging Face config (grouped-query attention
included), run as a user runs it — ``resacct plan --hf-config NAME --json`` in-process — against
the parameters of the model transformers builds from the same config on the meta device (distinct
storages). Skipped (not measurable) when transformers is not installed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json

from resacct.checks._transformers import require_transformers
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check



@check("plan.hf_config_parameters", evidence="measured", quantities=("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab", "plan_parameters"))
def hf_config_parameters(config: str) -> Outcome:
    """Parameters of a shipped config's model built by transformers on meta (distinct storages);
    predicted: the ``parameters`` field of ``resacct plan --hf-config CONFIG --json``. Quantities:
    the config's shape (layers, hidden, heads, kv_heads, head_dim, mlp, vocab) and plan's count."""
    require_transformers()
    return _hf_config_parameters(config)


@functools.lru_cache(maxsize=8)
def _hf_config_parameters(config: str) -> Outcome:
    from resacct.checks.hf import meta_model_parameters
    from resacct.formulas.hf_formulas import architecture_of

    model, measured = meta_model_parameters(config)
    planned = _plan_json(config)["parameters"]
    a = architecture_of(model.config)
    shape = {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "mlp": a.mlp,
             "vocab": a.vocab, "plan_parameters": planned}
    return Outcome(measured=measured, predicted=planned, quantities=shape)


_COMPONENTS = ("embeddings", "attention", "mlp", "norms", "final_norm", "lm_head", "total")


def _component(name: str) -> str:
    """Which component a transformers parameter belongs to, by its name (GPT-2, Llama, Mistral,
    Mixtral layouts); refused when the name fits none, so a new layout is noticed."""
    parts = name.split(".")
    if any(p in ("embed_tokens", "wte", "wpe") for p in parts):
        return "embeddings"
    if parts[0] == "lm_head":
        return "lm_head"
    if "layers" in parts or "h" in parts[:2]:
        inner = parts[parts.index("layers" if "layers" in parts else "h") + 2]
        if "attn" in inner:
            return "attention"
        if "norm" in inner or inner.startswith("ln_"):
            return "norms"
        if inner in ("mlp", "block_sparse_moe"):
            return "mlp"
    elif any(p in ("norm", "ln_f") for p in parts):
        return "final_norm"
    raise ResacctError(f"parameter {name!r}: no component of embeddings, attention, mlp, norms, final_norm, lm_head fits it")


@check("plan.parameter_breakdown", evidence="measured", quantities=("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab", "positions"))
def parameter_breakdown(config: str, component: str) -> Outcome:
    """Parameters of one ``component`` (embeddings, attention, mlp, norms — over all layers —,
    final_norm, lm_head, or the total) of a shipped config's model built by transformers on
    meta, each parameter tensor counted once (a tied head belongs to the embeddings), classified
    by its module path; predicted: ``parameter_breakdown`` of ``resacct plan --hf-config CONFIG
    --json`` (per-layer components times the layers). Quantities: the config's shape."""
    if component not in _COMPONENTS:
        raise ResacctError(f"component {component!r}: expected one of {', '.join(_COMPONENTS)}")
    require_transformers()
    measured, planned, shape = _parameter_breakdown(config)
    return Outcome(measured=measured[component], predicted=planned[component], quantities=shape)


@functools.lru_cache(maxsize=4)
def _parameter_breakdown(config: str) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.formulas.hf_formulas import architecture_of

    model = build_hf_model(load_hf_config(config), device="meta")
    measured = dict.fromkeys(_COMPONENTS, 0)
    for name, parameter in model.named_parameters():  # a tied head's weight is the embedding's: named once
        measured[_component(name)] += parameter.numel()
    measured["total"] = sum(measured[c] for c in _COMPONENTS[:-1])
    b = _plan_json(config)["parameter_breakdown"]
    planned = {"embeddings": b["embeddings"], "attention": b["layers"] * b["attention_per_layer"], "mlp": b["layers"] * b["mlp_per_layer"],
               "norms": b["layers"] * b["norms_per_layer"], "final_norm": b["final_norm"], "lm_head": b["lm_head"], "total": b["total"]}
    a = architecture_of(model.config)
    shape = {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "mlp": a.mlp,
             "vocab": a.vocab, "positions": a.positions}
    return measured, planned, shape


def _plan_json(config: str) -> dict:  # type: ignore[type-arg]
    from resacct.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["plan", "--hf-config", config, "--seq", "4096", "--memory-gb", "80", "--json"])
    if status != 0:
        raise RuntimeError(f"resacct plan --hf-config {config} exited {status}")
    return json.loads(printed.getvalue())


@check("plan.llama_mlp_saved_bytes", evidence="measured", quantities=("tokens", "element_bytes"))
def llama_mlp_saved_bytes(batch: int, seq: int, dtype: str = "bfloat16", hidden: int = 64, mlp: int = 176, heads: int = 4, kv_heads: int = 2,
                          layers: int = 2, vocab: int = 96) -> Outcome:
    """Bytes a transformers Llama layer's MLP (SwiGLU) keeps for backward in a real CPU training
    forward (``saved_tensors_hooks``, by storage, everything saved inside the second layer's
    ``mlp`` module: gate's and up's shared input, SiLU's input and output, up's output, down's
    input); predicted: what ``resacct plan`` counts for that MLP
    (:func:`resacct.formulas.plan.mlp_activation_bytes_per_layer`, gated, one rank)."""
    require_transformers()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from resacct.formulas.plan import mlp_activation_bytes_per_layer
    from resacct.measurement.activation_recording import record_saved_activations
    from resacct.training.seeding import seed_torch

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ResacctError(f"dtype {dtype!r}: expected bfloat16, float16 or float32")
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=64)
    seed_torch(0)
    model = LlamaForCausalLM._from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with record_saved_activations(model) as saved:
        model(input_ids=ids, labels=ids)
    measured = sum(e.bytes for e in saved.entries if not e.is_parameter and e.module.startswith(f"model.layers.{layers - 1}.mlp"))
    element = torch_dtype.itemsize
    predicted = mlp_activation_bytes_per_layer(seq, batch, hidden, mlp, gated=True, element_bytes=element)
    return Outcome(measured=measured, predicted=predicted, quantities={"tokens": batch * seq, "element_bytes": element})
