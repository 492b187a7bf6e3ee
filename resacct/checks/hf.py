"""Hugging Face decoders (transformers, built from configs on the meta device) measured with
torch — parameters and optimizer state by storage, FLOPs by FlopCounterMode — beside
resacct's closed forms (:mod:`resacct.formulas.hf_formulas`), and the fused-attention fill on a real CPU
step against the eager-attention twin. Every check is skipped (not measurable) when
transformers is not installed.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from resacct.checks._transformers import require_transformers
from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.memo import shared_measurement



def _small_spec(model_type: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, positions: int, experts: int,
                experts_per_token: int) -> object:
    from resacct.account.load.hf_models import HfConfigSpec

    if model_type == "gpt2":
        values = {"model_type": "gpt2", "vocab_size": vocab, "n_positions": positions, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                  "n_inner": mlp}
    elif model_type in ("llama", "mistral", "mixtral"):
        values = {"model_type": model_type, "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": mlp, "num_hidden_layers": layers,
                  "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": positions, "tie_word_embeddings": False}
        if model_type == "mixtral":
            values.update(num_local_experts=experts, num_experts_per_tok=experts_per_token)
    else:
        raise ResacctError(f"model_type {model_type!r}: expected gpt2, llama, mistral or mixtral")
    return HfConfigSpec(name=f"small {model_type}", source="claim inputs", values=values)


@functools.lru_cache(maxsize=16)
def _account(model_type: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, positions: int, experts: int,
             experts_per_token: int, batch: int, seq: int, recipe: str):  # type: ignore[no-untyped-def]
    from resacct.account.answers.hf import account_hf_config

    spec = _small_spec(model_type, hidden, layers, heads, kv_heads, mlp, vocab, positions, experts, experts_per_token)
    return account_hf_config(spec, batch=batch, seq=seq, recipe=recipe, peak=False)  # type: ignore[arg-type]  # no claim here reads the peak


_QUANTITIES = ("parameters", "parameter_tensors", "forward_flops", "step_flops", "state_at_step_bytes", "checkpoint_full_bytes")


@check("hf.small_model", evidence="measured", quantities=("head_dim", "tokens", "params", "tensors"))
def small_model(model_type: str, quantity: str, hidden: int, layers: int, heads: int, mlp: int, vocab: int, positions: int = 64, kv_heads: int = 0,
                experts: int = 0, experts_per_token: int = 0, batch: int = 2, seq: int = 16, recipe: str = "fp32") -> Outcome:
    """One quantity of a small transformers causal LM built on meta: ``parameters`` and
    ``parameter_tensors`` (distinct storages), ``forward_flops`` / ``step_flops`` (FlopCounterMode
    over its own loss on labels), ``state_at_step_bytes`` (a real torch.optim.AdamW under
    ``recipe``, by storage), ``checkpoint_full_bytes`` (that state less its gradients).
    Quantities: the measured ``params`` and ``tensors``, ``head_dim`` and ``tokens``."""
    require_transformers()
    if quantity not in _QUANTITIES:
        raise ResacctError(f"quantity {quantity!r}: expected one of {', '.join(_QUANTITIES)}")
    account = _account(model_type, hidden, layers, heads, kv_heads or heads, mlp, vocab, positions, experts, experts_per_token, batch, seq, recipe)
    rows = {row.quantity: row for row in account.rows()}
    state_label = next(name for name in rows if name.startswith("at optimizer step"))
    pairs = {
        "parameters": rows["total"], "parameter_tensors": rows["tensors"], "forward_flops": rows["forward"], "step_flops": rows["step"],
        "state_at_step_bytes": rows[state_label], "checkpoint_full_bytes": rows["weights + master + optimizer state"],
    }
    row = pairs[quantity]
    return Outcome(measured=row.measured, predicted=row.predicted, quantities={"head_dim": hidden // heads, "tokens": batch * seq,
                                                                            "params": account.parameters, "tensors": account.parameter_tensors})


@check("hf.shipped_parameters", evidence="measured", quantities=("active_parameters",))
def shipped_parameters(config: str) -> Outcome:
    """Parameters of a config shipped with resacct (resacct/hf_configs/known.yaml), built on
    the meta device: distinct parameter storages; resacct's closed form beside (and its active
    count for a mixture of experts as a quantity)."""
    require_transformers()
    return _shipped_parameters(config)


@functools.lru_cache(maxsize=8)
def meta_model_parameters(config: str) -> tuple[Any, int]:
    """A shipped config's model as transformers builds it on the meta device, and its parameter
    count (distinct storages: a tied head counts once). Shared by the hf and plan checks."""
    from resacct.account.load.hf_models import build_hf_model, load_hf_config
    from resacct.measurement.memory import distinct_storage_bytes

    model = build_hf_model(load_hf_config(config), device="meta")
    parameters = list(model.parameters())
    return model, distinct_storage_bytes(parameters) // parameters[0].element_size()


@functools.lru_cache(maxsize=8)
def _shipped_parameters(config: str) -> Outcome:
    from resacct.formulas.hf_formulas import architecture_of, predict_active_parameters, predict_parameters

    model, measured = meta_model_parameters(config)
    architecture = architecture_of(model.config)
    predicted = None if architecture is None else predict_parameters(architecture)
    active = None if architecture is None else predict_active_parameters(architecture)
    return Outcome(measured=measured, predicted=predicted, quantities={"active_parameters": active})


@check("hf.sdpa_over_eager_flops", evidence="measured", quantities=("eager_flops", "flop_counter_alone_flops", "gap_filled_flops", "attention_recompute_flops",
                                              "alone_warnings", "filled_warnings"))
def sdpa_over_eager_flops(layers: int = 2, batch: int = 2, seq: int = 16) -> Outcome:
    """A real CPU training step of a tiny LlamaForCausalLM (4 query heads, 2 key/value heads)
    with sdpa attention: resacct's count (FlopCounterMode + the fused-kernel fill) over
    FlopCounterMode's count on the same model with ``attn_implementation="eager"``. Quantities:
    both counts, what resacct filled, the recomputation it reports apart, and how many warnings
    FlopCounterMode alone and the filled trace raise (uncounted matmul-class ops)."""
    require_transformers()
    return _sdpa_over_eager_flops(layers, batch, seq)


@shared_measurement
def _sdpa_over_eager_flops(layers: int, batch: int, seq: int) -> Outcome:
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from resacct.account.trace.step_measurements import trace_step_flops

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    fused = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    filled = trace_step_flops(fused, lambda: fused(input_ids=ids, labels=ids).loss)
    alone = trace_step_flops(fused, lambda: fused(input_ids=ids, labels=ids).loss, fill_tracer_gaps=False)
    eager = LlamaForCausalLM._from_config(config, attn_implementation="eager")
    with FlopCounterMode(display=False) as counter:
        eager(input_ids=ids, labels=ids).loss.backward()
    eager_flops = int(counter.get_total_flops())
    return Outcome(measured=filled.step_flops / eager_flops, quantities={
        "eager_flops": eager_flops, "flop_counter_alone_flops": alone.step_flops, "gap_filled_flops": filled.gap_filled_flops,
        "attention_recompute_flops": filled.attention_recompute_flops, "alone_warnings": len(alone.warnings), "filled_warnings": len(filled.warnings)})


_SCOPES = ("all", "layer", "first_layer")


@check("hf.saved_activations", evidence="measured", quantities=("element_bytes", "head_dim", "tokens", "stats_bytes", "math_bytes"))
def saved_activations(model_type: str, attention: str, device: str, hidden: int, layers: int, heads: int, mlp: int, vocab: int, batch: int, seq: int,
                      kv_heads: int = 0, experts: int = 0, experts_per_token: int = 0, dtype: str = "float32", dropout: float = 0.0,
                      scope: str = "all") -> Outcome:
    """Bytes autograd saves for backward in one forward (with the model's own loss on labels) of
    a small transformers causal LM built on ``device`` (cpu: a real forward; meta: shapes only)
    with ``attention`` (eager or sdpa) in ``dtype``: ``saved_tensors_hooks``, one entry per
    storage (``record_saved_activations``) — the whole forward, the second layer (``layer``) or the
    first (``first_layer``, RoPE's shared cos/sin included). Predicted: resacct.formulas.hf_activation_formulas.
    Quantities: ``element_bytes``, ``head_dim``, ``tokens``, LayerNorm ``stats_bytes`` (E on CPU, 4
    on meta) and the math kernel's ``math_bytes`` (4)."""
    require_transformers()
    if scope not in _SCOPES:
        raise ResacctError(f"scope {scope!r}: expected one of {', '.join(_SCOPES)}")
    by_module, architecture = _saved_by_module(model_type, attention, device, hidden, layers, heads, kv_heads or heads, mlp, vocab, experts,
                                               experts_per_token, dtype, dropout, batch, seq)
    from resacct.formulas.hf_activation_formulas import hf_saved_terms

    terms = hf_saved_terms(architecture, batch, seq, dtype=dtype, attention=attention, device_type=device)
    layer = {"layer": 1, "first_layer": 0}.get(scope)

    def in_scope(module: str) -> bool:
        return layer is None or f".layers.{layer}." in f".{module}." or f".h.{layer}." in f".{module}."

    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return Outcome(measured=sum(value for module, value in by_module if in_scope(module)),
                   predicted=sum(term.bytes for term in terms if in_scope(term.module)),
                   quantities={"element_bytes": element, "head_dim": hidden // heads, "tokens": batch * seq,
                               "stats_bytes": element if device == "cpu" else 4, "math_bytes": 4})


@shared_measurement
def _saved_by_module(model_type: str, attention: str, device: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int,
                     experts: int, experts_per_token: int, dtype: str, dropout: float, batch: int, seq: int):  # type: ignore[no-untyped-def]
    from resacct.measurement.activations import record_saved_activations
    from resacct.measurement.meta_op_cache import meta_calls_cached
    from resacct.formulas.hf_formulas import architecture_of
    from resacct.account.load.hf_models import HfConfigSpec, build_hf_model

    spec = _small_spec(model_type, hidden, layers, heads, kv_heads, mlp, vocab, max(64, seq), experts, experts_per_token)
    values = dict(spec.values)  # type: ignore[attr-defined]
    values.update({"attn_pdrop": dropout, "resid_pdrop": dropout, "embd_pdrop": dropout} if model_type == "gpt2" else {"attention_dropout": dropout})
    model = build_hf_model(HfConfigSpec(name=spec.name, source=spec.source, values=values), device=device, attention=attention)  # type: ignore[attr-defined]
    model = model.to(getattr(torch, dtype)).train()
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    with torch.random.fork_rng(), meta_calls_cached(model), record_saved_activations(model) as saved:
        model(input_ids=ids, labels=ids)
    return tuple(saved.by_module().items()), architecture_of(model.config)


@check("hf.repeated_layers", evidence="measured", quantities=("extrapolated_peak_bytes", "whole_step_flops", "extrapolated_step_flops",
                                                              "whole_saved_bytes", "extrapolated_saved_bytes", "fields_differing"))
def repeated_layers(model_type: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, positions: int, batch: int, seq: int,
                    recipe: str = "fp32", measured: str = "peak_bytes") -> Outcome:
    """A small config's account traced at depths 3, 4 and 5 and extrapolated to ``layers``
    (:mod:`resacct.account.trace.repeated_layers`) beside the same account with every layer traced
    (FlopCounterMode, saved-tensor hooks, the tracker over fake tensors). Measured (``measured``):
    ``peak_bytes``, the whole trace's step peak, or ``fields_differing``, how many fields of the two
    ``--json`` documents differ (the notes left out); quantities: the extrapolated peak, both step FLOPs
    and saved bytes, and that count."""
    require_transformers()
    if measured not in ("peak_bytes", "fields_differing"):
        raise ResacctError(f"measured {measured!r}: expected peak_bytes or fields_differing")
    outcome = _repeated_layers(model_type, hidden, layers, heads, kv_heads, mlp, vocab, positions, batch, seq, recipe)
    return outcome if measured == "peak_bytes" else Outcome(measured=outcome.quantities["fields_differing"], quantities=outcome.quantities)


@shared_measurement
def _repeated_layers(model_type: str, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int, positions: int, batch: int, seq: int,
                     recipe: str) -> Outcome:
    from resacct.account.answers.hf import account_hf_config

    spec = _small_spec(model_type, hidden, layers, heads, kv_heads, mlp, vocab, positions, 0, 0)
    extrapolated = account_hf_config(spec, batch=batch, seq=seq, recipe=recipe, layers="sampled")  # type: ignore[arg-type]
    whole = account_hf_config(spec, batch=batch, seq=seq, recipe=recipe, layers="all")  # type: ignore[arg-type]
    if not any("traced at depths" in note for note in extrapolated.notes):
        raise NotMeasurable(f"the {layers}-layer {model_type} was not extrapolated: {extrapolated.notes[-1]}")
    a, b = extrapolated.to_dict(), whole.to_dict()
    return Outcome(measured=whole.step_peak.predicted.peak_bytes, quantities={
        "extrapolated_peak_bytes": extrapolated.step_peak.predicted.peak_bytes,
        "whole_step_flops": whole.flops.step_flops, "extrapolated_step_flops": extrapolated.flops.step_flops,
        "whole_saved_bytes": whole.saved.activation_bytes, "extrapolated_saved_bytes": extrapolated.saved.activation_bytes,
        "fields_differing": sum(a[key] != b.get(key) for key in a if key != "notes")})
