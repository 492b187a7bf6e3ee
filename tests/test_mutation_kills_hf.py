"""Tests that kill the mutants ``tools/mutation/run.sh formulas/hf_formulas`` and
``tools/mutation/run.sh formulas/hf_activation_formulas`` found surviving (see docs/mutation.md).

Every number is compared with what transformers builds and torch measures, never with the
formula restated: parameters and tensors are the distinct storages of the model transformers
builds on the meta device, FLOPs are FlopCounterMode's counts per module (so each part of
``predict_step_flops`` is checked against the modules that run it), and an architecture's
fields are the values transformers' own config classes hold or derive.

Nothing here goes through the cached measurement helpers of ``resacct.checks.hf``: mutmut forks
each mutant from a process that already ran the claims once, so a cached measurement carries
an architecture read by the unmutated ``architecture_of``. Needs transformers (skipped without).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from resacct.account.load.hf_models import HfConfigSpec, build_hf_model  # noqa: E402
from resacct.errors import ResacctError  # noqa: E402
from resacct.formulas.hf_formulas import (  # noqa: E402
    HfArchitecture,
    architecture_of,
    predict_active_parameters,
    predict_parameter_tensors,
    predict_parameters,
    predict_step_flops,
)
from resacct.measurement.memory import distinct_storage_bytes  # noqa: E402

_LLAMA = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=32)

# Shapes the claims (resacct/specs/hf.claims.yaml) leave out: GPT-2's default MLP width (n_inner null: 4d) and an untied
# head; Llama with a tied head, attention and MLP biases, grouped-query attention and a head size that is not hidden/heads;
# Mixtral with transformers' derived head size (MixtralConfig keeps head_dim None), a tied head and 3 experts, 2 per token.
CONFIGS = {
    "gpt2-default-mlp-untied": dict(model_type="gpt2", vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False),
    "gpt2-default-mlp-tied": dict(model_type="gpt2", vocab_size=96, n_positions=32, n_embd=32, n_layer=3, n_head=2),
    "llama-biases-head-dim-tied": dict(model_type="llama", **_LLAMA, head_dim=12, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "llama-attention-bias-only": dict(model_type="llama", **{**_LLAMA, "num_key_value_heads": 1}, attention_bias=True),
    "llama-mlp-bias-only": dict(model_type="llama", **_LLAMA, mlp_bias=True),
    "mistral": dict(model_type="mistral", **_LLAMA, sliding_window=16),
    "mixtral-derived-head-dim-tied": dict(model_type="mixtral", **{**_LLAMA, "num_key_value_heads": 1, "intermediate_size": 24}, num_local_experts=3,
                                          num_experts_per_tok=2, tie_word_embeddings=True),
}


def _build(values: dict):
    return build_hf_model(HfConfigSpec(name="test", source="test", values=values), device="meta").train()


def _measured(values: dict, batch: int, seq: int):
    """The model transformers builds, its parameters (distinct storages) and tensors, and
    FlopCounterMode's forward counts per module and backward total over its own next-token loss."""
    model = _build(values)
    parameters = list(model.parameters())
    count = distinct_storage_bytes(parameters) // parameters[0].element_size()
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as forward:
        loss = model(input_ids=ids, labels=ids).loss
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    by_module = {name: sum(counts.values()) for name, counts in forward.get_flop_counts().items()}
    return model, count, len(parameters), by_module, forward.get_total_flops(), backward.get_total_flops()


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "c_proj")


def _measured_parts(by_module: dict[str, int]) -> dict[str, int]:
    """FlopCounterMode's forward counts grouped as the parts of ``predict_step_flops``: the
    attention modules' projections, what the attention module runs itself (q·kᵀ and
    weights·v), the MLP (or the router and the experts), the LM head."""
    def total(suffix: str) -> int:
        return sum(value for name, value in by_module.items() if name.endswith(suffix) and (".layers." in name or ".h." in name or suffix == ".lm_head"))

    attention = total(".self_attn") + total(".attn")
    projections = sum(total(f"{attn}.{p}") for attn in (".self_attn", ".attn") for p in _PROJECTIONS)
    parts = {"attention projections": projections}
    if total(".mlp.experts"):
        parts |= {"router": total(".mlp.gate"), "experts (k per token)": total(".mlp.experts")}
    else:
        parts["MLP"] = total(".mlp")
    return parts | {"attention scores and values": attention - projections, "LM head": total(".lm_head")}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("batch", "seq"), [(1, 5), (3, 2)])
def test_counts_equal_what_transformers_builds_and_flop_counter_counts(name, batch, seq):
    model, parameters, tensors, by_module, forward, backward = _measured(CONFIGS[name], batch, seq)
    architecture = architecture_of(model.config)
    assert architecture is not None
    predicted = predict_step_flops(architecture, batch=batch, seq=seq)
    assert type(predict_parameters(architecture)) is int and predict_parameters(architecture) == parameters
    assert predict_parameter_tensors(architecture) == tensors
    assert predicted.forward_by_part == _measured_parts(by_module)
    assert (predicted.forward_flops, predicted.backward_flops, predicted.step_flops) == (forward, backward, forward + backward)
    if not architecture.experts:
        assert predict_active_parameters(architecture) == parameters


def test_active_parameters_are_the_total_less_the_idle_experts_as_built():
    """A mixture of experts runs k of its E experts per token: the active count is the total less
    (E − k) experts' parameters, measured as the storages of one expert bank's slices."""
    model = _build(CONFIGS["mixtral-derived-head-dim-tied"])
    architecture = architecture_of(model.config)
    experts = model.model.layers[0].mlp.experts
    per_expert = sum(p.numel() // p.shape[0] for p in experts.parameters())   # the banks are (E, …) tensors
    idle = architecture.experts - architecture.experts_per_token
    parameters = distinct_storage_bytes(list(model.parameters())) // next(model.parameters()).element_size()
    assert predict_active_parameters(architecture) == parameters - model.config.num_hidden_layers * idle * per_expert


def _without(config, *names: str) -> SimpleNamespace:
    """A config object as an older transformers would hand it over: ``names`` absent."""
    return SimpleNamespace(**{key: value for key, value in config.to_dict().items() if key not in names})


def test_derived_sizes_are_transformers_own_when_the_config_leaves_them_out():
    """Configs without head_dim, num_key_value_heads, hidden_act or tie_word_embeddings
    (transformers < 4.45 wrote no head_dim): resacct derives what transformers derives."""
    llama = transformers.LlamaConfig(**_LLAMA)
    bare = architecture_of(_without(llama, "head_dim", "num_key_value_heads", "hidden_act", "tie_word_embeddings", "attention_bias",
                                    "mlp_bias", "attention_dropout"))
    full = transformers.LlamaConfig(**{**_LLAMA, "num_key_value_heads": None})
    assert bare.head_dim == full.head_dim == 8 and bare.kv_heads == full.num_key_value_heads == 4
    assert bare.activation == full.hidden_act and bare.tied_head == full.tie_word_embeddings is False
    assert (bare.attention_bias, bare.mlp_bias, bare.attention_dropout) == (full.attention_bias, full.mlp_bias, full.attention_dropout)
    gpt2 = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    assert architecture_of(_without(gpt2, "tie_word_embeddings")).tied_head is gpt2.tie_word_embeddings is True
    assert architecture_of(SimpleNamespace(hidden_size=32)) is None   # no model_type at all: not a model resacct knows
    assert architecture_of(transformers.BertConfig()) is None


def test_every_field_is_the_value_the_transformers_config_holds():
    llama = transformers.LlamaConfig(**_LLAMA, head_dim=12, hidden_act="gelu", attention_dropout=0.25, attention_bias=True, mlp_bias=True,
                                     tie_word_embeddings=True)
    a = architecture_of(llama)
    assert (a.family, a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.mlp, a.positions) == (
        "llama", llama.vocab_size, llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads, llama.num_key_value_heads,
        llama.head_dim, llama.intermediate_size, llama.max_position_embeddings)
    assert (a.activation, a.attention_dropout, a.attention_bias, a.mlp_bias, a.tied_head, a.sliding_window) == ("gelu", 0.25, True, True, True, None)
    assert (a.experts, a.experts_per_token) == (0, 0)
    mistral = transformers.MistralConfig(**_LLAMA, sliding_window=16)
    assert architecture_of(mistral).sliding_window == mistral.sliding_window == 16 and architecture_of(mistral).family == "llama"
    mixtral = transformers.MixtralConfig(**_LLAMA, num_local_experts=5, num_experts_per_tok=3)
    m = architecture_of(mixtral)
    assert (m.family, m.experts, m.experts_per_token, m.head_dim) == ("mixtral", 5, 3, mixtral.hidden_size // mixtral.num_attention_heads)
    assert mixtral.head_dim is None and type(m.head_dim) is int
    gpt2 = transformers.GPT2Config(vocab_size=96, n_positions=48, n_embd=32, n_layer=2, n_head=4, activation_function="relu", attn_pdrop=0.2,
                                   resid_pdrop=0.3, embd_pdrop=0.4, n_inner=72)
    g = architecture_of(gpt2)
    assert (g.family, g.head_dim, g.mlp, g.positions, g.activation) == ("gpt2", 8, 72, 48, "relu")
    assert (g.attention_dropout, g.residual_dropout, g.embedding_dropout, g.tied_head) == (0.2, 0.3, 0.4, True)
    assert architecture_of(transformers.GPT2Config(n_embd=32, n_head=4)).mlp == 4 * 32   # n_inner None: GPT2MLP's own 4·d


def test_expert_keys_in_a_dense_config_make_no_experts():
    """transformers keeps keys its config class does not know as attributes, and LlamaForCausalLM
    ignores them: a Llama config.json carrying num_local_experts builds a dense model."""
    values = dict(model_type="llama", **_LLAMA, num_local_experts=4, num_experts_per_tok=2)
    model, parameters, tensors, by_module, forward, backward = _measured(values, 1, 3)
    assert model.config.num_local_experts == 4 and not any("expert" in name for name, _ in model.named_modules())
    architecture = architecture_of(model.config)
    assert (architecture.experts, architecture.experts_per_token) == (0, 0)
    assert predict_parameters(architecture) == predict_active_parameters(architecture) == parameters


def test_the_default_activation_is_the_one_each_family_runs():
    kwargs = dict(vocab=96, hidden=32, layers=1, heads=4, kv_heads=4, head_dim=8, mlp=64, positions=32)
    assert HfArchitecture(family="gpt2", **kwargs).activation == transformers.GPT2Config().activation_function == "gelu_new"
    assert HfArchitecture(family="llama", **kwargs).activation == transformers.LlamaConfig().hidden_act == "silu"
    assert HfArchitecture(family="mixtral", **kwargs).activation == transformers.MixtralConfig().hidden_act == "silu"
    assert HfArchitecture(family="llama", activation="gelu", **kwargs).activation == "gelu"


def test_refusals_say_what_is_wrong():
    kwargs = dict(vocab=96, hidden=32, layers=1, head_dim=8, mlp=64, positions=32)
    with pytest.raises(ResacctError) as error:
        HfArchitecture(family="bert", heads=4, kv_heads=4, **kwargs)
    assert str(error.value) == "architecture family 'bert': expected one of gpt2, llama, mixtral"
    with pytest.raises(ResacctError) as error:
        HfArchitecture(family="llama", heads=4, kv_heads=3, **kwargs)
    assert str(error.value) == "4 query heads are not a multiple of 3 key/value heads"
    config = transformers.LlamaConfig(**{**_LLAMA, "num_key_value_heads": 3}, head_dim=8)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    ids = torch.zeros(1, 4, dtype=torch.long, device="meta")
    with pytest.raises(RuntimeError, match="must match the size"):  # transformers' model cannot run it either
        model(input_ids=ids, labels=ids)
    tiny = HfArchitecture(family="llama", heads=4, kv_heads=2, **kwargs)
    for bad in (0, -1, True):  # bools pass the type check (bool is an int): the guard is live
        for label in ("batch", "seq"):
            with pytest.raises(ResacctError) as error:
                predict_step_flops(tiny, **{"batch": 1, "seq": 1, label: bad})
            assert str(error.value) == f"{label} {bad!r}: expected a whole number ≥ 1"
    assert predict_step_flops(tiny, batch=1, seq=1).forward_flops > 0


# ── resacct.formulas.hf_activation_formulas: every saved tensor, by module and dtype ─────────────────

from collections import defaultdict  # noqa: E402

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from resacct.formulas.hf_activation_formulas import (  # noqa: E402
    TRANSFORMERS_VERSION_DERIVED,
    attention_kernel,
    hf_layer_saved_terms,
    hf_saved_terms,
    predict_hf_layer_saved_bytes,
    predict_hf_saved_bytes,
)
from resacct.measurement.activations import record_saved_activations  # noqa: E402
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel  # noqa: E402

_GPT2 = dict(model_type="gpt2", vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=48)
_NO_DROPOUT = dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)

# (config, device, attention, dtype, batch, seq): the kernels, dtypes, batch-1 views and dropouts the claims leave out
ACTIVATION_CASES = {
    "llama-eager-bf16": (dict(model_type="llama", **_LLAMA), "cpu", "eager", "bfloat16", 2, 5),
    "llama-eager-fp16-dropout": (dict(model_type="llama", **_LLAMA, attention_dropout=0.2), "cpu", "eager", "float16", 2, 3),
    "llama-sdpa-cpu-dropout-math": (dict(model_type="llama", **_LLAMA, attention_dropout=0.2), "cpu", "sdpa", "bfloat16", 2, 4),
    "llama-sdpa-cpu-batch1-flash": (dict(model_type="llama", **{**_LLAMA, "num_hidden_layers": 3}), "cpu", "sdpa", "bfloat16", 1, 5),
    "llama-sdpa-meta-fp16": (dict(model_type="llama", **{**_LLAMA, "num_hidden_layers": 3}), "meta", "sdpa", "float16", 3, 2),
    "llama-head-dim-12-eager-bf16": (dict(model_type="llama", **_LLAMA, head_dim=12), "cpu", "eager", "bfloat16", 2, 3),
    "llama-head-dim-12-flash": (dict(model_type="llama", **_LLAMA, head_dim=12), "cpu", "sdpa", "float32", 2, 3),
    "llama-head-dim-12-meta-batch1": (dict(model_type="llama", **_LLAMA, head_dim=12), "meta", "sdpa", "bfloat16", 1, 3),
    "llama-eager-batch1-gqa": (dict(model_type="llama", **_LLAMA), "cpu", "eager", "float32", 1, 4),
    "llama-mha-sdpa-cpu-flash": (dict(model_type="llama", **{**_LLAMA, "num_key_value_heads": 4}), "cpu", "sdpa", "float32", 2, 3),
    "mistral-one-kv-head-meta-batch1": (dict(model_type="mistral", **{**_LLAMA, "num_key_value_heads": 1}, sliding_window=None), "meta", "sdpa", "bfloat16", 1, 3),
    "mistral-one-kv-head-eager-batch1": (dict(model_type="mistral", **{**_LLAMA, "num_key_value_heads": 1}, sliding_window=None), "cpu", "eager", "bfloat16", 1, 4),
    "mistral-one-kv-head-eager-batch2": (dict(model_type="mistral", **{**_LLAMA, "num_key_value_heads": 1}, sliding_window=None), "cpu", "eager", "float32", 2, 4),
    "mixtral-meta-bf16": (dict(model_type="mixtral", **{**_LLAMA, "intermediate_size": 24}, num_local_experts=3, num_experts_per_tok=2), "meta", "sdpa", "bfloat16", 2, 3),
    "mixtral-cpu-eager-fp32": (dict(model_type="mixtral", **{**_LLAMA, "intermediate_size": 24}, num_local_experts=3, num_experts_per_tok=2), "cpu", "eager", "float32", 1, 3),
    "gpt2-eager-batch1-bf16": (dict(**_GPT2), "cpu", "eager", "bfloat16", 1, 5),
    "gpt2-eager-no-dropout": (dict(**_GPT2, **_NO_DROPOUT), "cpu", "eager", "float32", 2, 4),
    "gpt2-sdpa-cpu-flash-bf16": (dict(**_GPT2, **_NO_DROPOUT), "cpu", "sdpa", "bfloat16", 2, 3),
    "gpt2-sdpa-cpu-dropout-math": (dict(**_GPT2), "cpu", "sdpa", "float32", 2, 3),
    "gpt2-sdpa-meta-bf16": (dict(**_GPT2), "meta", "sdpa", "bfloat16", 2, 3),
    "gpt2-sdpa-meta-attention-dropout-only": (dict(**_GPT2, **{**_NO_DROPOUT, "attn_pdrop": 0.1}), "meta", "sdpa", "float32", 1, 3),
}


# What each term says it is (hf_saved_terms' public ``what``): the labels of the cases above, every one of them
# (test_the_term_labels_are_the_ones_listed_and_all_are_used). A term that describes one tensor is checked against the storage
# torch saved (test_every_saved_tensor_is_predicted_in_its_module_and_dtype): its bytes, and the dtype it names.
TERM_LABELS = frozenset({
    "SiLU input (gate's output)", "SiLU output", "SiLU output and up's output (their product keeps both)", "SiLU · up (down's input)",
    "attention-dropout mask", "attention-dropout output (weights·v keeps it)", "down output (weighted by the routing weight)",
    "down weights gathered per pair (S·d·f)", "embedding-dropout mask", "gate-up output (SiLU's input and up are views)",
    "gate-up weights gathered per pair (S·2f·d)", "gelu_new: x, tanh(…), 0.5·x and 1 + tanh(…)", "input", "input (SiLU · up)",
    "input (heads merged: a copy)", "input (ln_1's output)", "input (ln_2's output)", "input (ln_f's output)", "input (the activation's output)",
    "input (weight · normalised x)", "input upcast to float32",
    "k and v: the KV cache's copies (2 heads: sdpa's own grouped-query attention)",
    "k and v: the KV cache's copies (4 heads: sdpa's own grouped-query attention)",
    "k laid out for matmul (1 heads)", "k laid out for matmul (4 heads)", "v laid out for matmul (1 heads)", "v laid out for matmul (4 heads)",
    "log-softmax of the float32 logits (T·V)", "logsumexp (b·h·s, float32)", "mean and rstd",
    "normalised x in the model's dtype (weight · x keeps it)", "output, laid out (b, s, h, e): the output projection's input is a view",
    "positions (int64, (1, s))", "q (b·h·s·e, after RoPE)", "q laid out for matmul", "qkv projection output (batch 1: q is a view of it)",
    "qkv projection output (q is a view of it)", "renormalised top-k weights (float32)", "residual-dropout mask",
    "rotary cos and sin ((1, s, e) each; shared by every layer, saved once)", "router softmax (float32, T·experts)",
    "routing weight per pair (float32)", "rsqrt of the mean square (float32)", "shifted labels (int64)",
    "softmax cast back to the model's dtype (weights·v keeps it)", "softmax output (b·h·s²)", "softmax output (b·h·s²), float32",
    "sum of the top-k probabilities (float32)", "token ids (int64)", "tokens repeated k times", "top-k indices (int64)",
    "total weight (0-dim float32)",
})


def test_the_term_labels_are_the_ones_listed_and_all_are_used():
    used = set()
    for values, device, attention, dtype, batch, seq in ACTIVATION_CASES.values():
        config = dict(values)
        config = getattr(transformers, {"gpt2": "GPT2Config", "llama": "LlamaConfig", "mistral": "MistralConfig", "mixtral": "MixtralConfig"}[
            config.pop("model_type")])(**config)
        used |= {t.what for t in hf_saved_terms(architecture_of(config), batch, seq, dtype=dtype, attention=attention, device_type=device)}
    # torch 2.8's CPU dispatcher runs grouped-query sdpa by the math kernel (the flash kernel wants equal heads): no case keeps
    # k and v on their own 2 heads there (test_the_attention_kernel_is_the_one_torch_runs checks that choice against the model)
    gqa_flash = cpu_sdpa_kernel(heads=4, kv_heads=2, head_dim=8, dtype="float32") == "flash"
    assert used == (TERM_LABELS if gqa_flash else TERM_LABELS - {"k and v: the KV cache's copies (2 heads: sdpa's own grouped-query attention)"})


def _recorded(values: dict, device: str, attention: str, dtype: str, batch: int, seq: int):
    """The model transformers builds and every storage its training forward (own loss on labels)
    saves for backward, parameters left out (saved_tensors_hooks, one entry per storage)."""
    model = build_hf_model(HfConfigSpec(name="test", source="test", values=values), device=device, attention=attention)
    model = model.to(getattr(torch, dtype)).train()
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    with torch.random.fork_rng(), record_saved_activations(model) as saved:
        model(input_ids=ids, labels=ids)
    return model, [entry for entry in saved.entries if not entry.is_parameter]


def _dtype_said(what: str, dtype: str) -> str:
    """The dtype a term's description names (float32 or int64), else the model's."""
    return next((said for said in ("float32", "int64") if said in what), dtype)


@pytest.mark.parametrize("case", list(ACTIVATION_CASES))
def test_every_saved_tensor_is_predicted_in_its_module_and_dtype(case):
    """Per module the predicted terms add up to what torch saved there; where the kernel keeps
    its tensors in the model's dtype (eager, flash), also per dtype: a term that says float32 or
    int64 is a tensor torch saved in that dtype, every other one is in the model's dtype. (The
    math kernel upcasts q, k, v and its dropout silently: there only the module sums count.)"""
    values, device, attention, dtype, batch, seq = ACTIVATION_CASES[case]
    model, entries = _recorded(values, device, attention, dtype, batch, seq)
    architecture = architecture_of(model.config)
    terms = hf_saved_terms(architecture, batch, seq, dtype=dtype, attention=attention, device_type=device)
    kernel = attention_kernel(architecture, attention, device, seq, dtype)
    measured, predicted = defaultdict(int), defaultdict(int)
    for entry in entries:
        measured[entry.module, entry.dtype if kernel != "math" else ""] += entry.bytes
    for term in terms:
        predicted[term.module, _dtype_said(term.what, dtype) if kernel != "math" else ""] += term.bytes
    assert dict(predicted) == dict(measured)
    for term in terms:
        assert term.what in TERM_LABELS, term
        if " and " not in term.what:  # one tensor: one storage of exactly its bytes, in the dtype it names
            # (the math kernel's q, k, v and dropout are upcast without saying so; its softmax says float32, and is)
            dtype_named = kernel != "math" or term.what.startswith("softmax output")
            assert any(e.module == term.module and e.bytes == term.bytes and (not dtype_named or e.dtype == _dtype_said(term.what, dtype))
                       for e in entries), term
    assert predict_hf_saved_bytes(architecture, batch, seq, dtype=dtype, attention=attention, device_type=device) == sum(e.bytes for e in entries)
    for layer in range(architecture.layers):
        inside = [e.bytes for e in entries if f".layers.{layer}." in f"{e.module}." or f".h.{layer}." in f"{e.module}."]
        assert sum(t.bytes for t in hf_layer_saved_terms(architecture, batch, seq, dtype=dtype, attention=attention, device_type=device,
                                                         layer=layer)) == sum(inside)
        if layer < 2:
            assert predict_hf_layer_saved_bytes(architecture, batch, seq, dtype=dtype, attention=attention, device_type=device,
                                                first=layer == 0) == sum(inside)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("model_type", "device", "attention", "dropout"), [
    ("llama", "cpu", "sdpa", 0.0), ("llama", "cpu", "sdpa", 0.2), ("llama", "meta", "sdpa", 0.0), ("llama", "cpu", "eager", 0.0),
    ("gpt2", "cpu", "sdpa", 0.0), ("gpt2", "cpu", "sdpa", 0.1), ("gpt2", "meta", "sdpa", 0.0), ("gpt2", "meta", "eager", 0.1)])
def test_the_attention_kernel_is_the_one_torch_runs(model_type, device, attention, dropout):
    """'flash' exactly when torch runs its CPU flash kernel; otherwise no fused attention op runs."""
    values = dict(**_GPT2, **{**_NO_DROPOUT, "attn_pdrop": dropout}) if model_type == "gpt2" else dict(model_type="llama", **_LLAMA, attention_dropout=dropout)
    model = build_hf_model(HfConfigSpec(name="test", source="test", values=values), device=device, attention=attention).train()
    ids = torch.zeros(2, 3, dtype=torch.long, device=device)
    with torch.random.fork_rng(), _Ops() as ops:
        model(input_ids=ids, labels=ids)
    fused = {name for name in ops.names if name.startswith("_scaled_dot_product")}
    kernel = attention_kernel(architecture_of(model.config), attention, device, 3)
    assert kernel == ("eager" if attention == "eager" else "flash" if fused == {"_scaled_dot_product_flash_attention_for_cpu"} else "math")
    assert kernel == "flash" or not fused
    assert ("_softmax" in ops.names) == (kernel == "eager")   # transformers' eager softmax; the math kernel's is _safe_softmax


def test_the_sliding_window_reaches_the_flash_kernel_from_the_window_on():
    mistral = architecture_of(transformers.MistralConfig(**_LLAMA, sliding_window=2))
    below = cpu_sdpa_kernel(heads=mistral.heads, kv_heads=mistral.kv_heads, head_dim=mistral.head_dim, dtype="float32")  # flash, but math on torch 2.8 (grouped-query attention)
    assert attention_kernel(mistral, "sdpa", "cpu") == below == attention_kernel(mistral, "sdpa", "cpu", 1)   # one token: below the window
    with pytest.raises(ResacctError) as error:
        attention_kernel(mistral, "sdpa", "cpu", 2)
    assert str(error.value) == ("seq 2 is not shorter than the sliding window 2: resacct predicts the CPU flash kernel without a mask only; "
                                "expected seq < 2, attention 'eager', or the meta device")
    assert attention_kernel(mistral, "sdpa", "meta", 2) == "math" and attention_kernel(mistral, "eager", "cpu", 2) == "eager"


def test_activation_refusals_say_everything():
    llama = architecture_of(transformers.LlamaConfig(**_LLAMA))
    cases = [
        (lambda: attention_kernel(llama, "flash", "cpu"), "attention 'flash': expected one of eager, sdpa"),
        (lambda: attention_kernel(llama, "sdpa", "cuda"),
         "device 'cuda': resacct predicts Hugging Face activations on cpu and meta; expected one of them (CUDA kernels save other tensors)"),
        (lambda: hf_saved_terms(llama, 0, 2), "batch 0: expected a whole number ≥ 1"),
        (lambda: hf_saved_terms(llama, 2, True), "seq True: expected a whole number ≥ 1"),
        (lambda: hf_saved_terms(llama, True, 2), "batch True: expected a whole number ≥ 1"),
        (lambda: hf_saved_terms(llama, 2, -3), "seq -3: expected a whole number ≥ 1"),
        (lambda: hf_saved_terms(llama, 2, 2, dtype="float64"), "dtype 'float64': expected one of float32, bfloat16, float16"),
        (lambda: hf_saved_terms(architecture_of(transformers.LlamaConfig(**_LLAMA, hidden_act="gelu")), 1, 2),
         "activation 'gelu': resacct's llama activation formula knows silu"),
        (lambda: hf_saved_terms(architecture_of(transformers.GPT2Config(n_embd=32, n_head=4, activation_function="relu")), 1, 2),
         "activation 'relu': resacct's gpt2 activation formula knows gelu_new"),
        (lambda: hf_saved_terms(HfArchitecture(family="gpt2", vocab=96, hidden=32, layers=1, heads=4, kv_heads=4, head_dim=16, mlp=64, positions=32), 1, 2),
         "GPT-2 with 4 heads of 16 ≠ hidden 32: expected heads · head size = hidden"),
    ]
    for call, message in cases:
        with pytest.raises(ResacctError) as error:
            call()
        assert str(error.value) == message
    assert hf_saved_terms(llama, 1, 1)   # one token of one sequence is a step


def test_the_derived_release_is_a_transformers_release_no_newer_than_the_installed_one():
    from packaging.version import Version

    assert Version(TRANSFORMERS_VERSION_DERIVED) <= Version(transformers.__version__)
    assert Version(TRANSFORMERS_VERSION_DERIVED).release[0] == Version(transformers.__version__).release[0]


def test_the_defaults_are_a_float32_step_with_sdpa_on_meta_and_the_first_layer():
    """Called with its defaults, each function predicts what ``resacct account --hf-config`` runs:
    float32, sdpa, the meta device; the layer functions the first layer (RoPE's cos/sin in it)."""
    values = dict(model_type="llama", **{**_LLAMA, "num_hidden_layers": 3})
    model, entries = _recorded(values, "meta", "sdpa", "float32", 2, 3)
    architecture = architecture_of(model.config)
    first = sum(e.bytes for e in entries if ".layers.0." in f"{e.module}.")
    assert predict_hf_saved_bytes(architecture, 2, 3) == sum(e.bytes for e in entries)
    assert sum(t.bytes for t in hf_saved_terms(architecture, 2, 3)) == sum(e.bytes for e in entries)
    assert predict_hf_layer_saved_bytes(architecture, 2, 3) == first == sum(t.bytes for t in hf_layer_saved_terms(architecture, 2, 3))
    assert predict_hf_layer_saved_bytes(architecture, 2, 3, first=False) == sum(e.bytes for e in entries if ".layers.2." in f"{e.module}.")


def test_the_modules_docstring_examples_run():
    """Their numbers are the measured ones (tests.test_hf_config measures the same eager Llama: 83012)."""
    import doctest

    import resacct.formulas.hf_activation_formulas
    import resacct.formulas.hf_formulas

    for module in (resacct.formulas.hf_formulas, resacct.formulas.hf_activation_formulas):
        result = doctest.testmod(module)
        assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize(("model_type", "key"), [("mistral", "mlp_bias"), ("mistral", "attention_bias"), ("mixtral", "attention_bias"),
                                                 ("llama", "mlp_bias"), ("llama", "attention_bias")])
def test_a_bias_key_counts_only_where_transformers_builds_the_bias(model_type, key):
    """A Mistral or Mixtral config.json may carry Llama's bias keys (transformers keeps them), but
    its model has no biases; Llama builds them. Predicted = the storages of the model built on meta
    (found by mutation testing: resacct counted Mistral's phantom biases, 20,352 against 20,128)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from resacct.formulas.hf_formulas import architecture_of, predict_parameter_tensors, predict_parameters

    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 64}
    if model_type == "mixtral":
        sizes.update(num_local_experts=2, num_experts_per_tok=1)
    config = AutoConfig.for_model(model_type, **sizes, **{key: True})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = list(model.parameters())
    architecture = architecture_of(config)
    assert predict_parameters(architecture) == sum(t.numel() for t in tensors)
    assert predict_parameter_tensors(architecture) == len(tensors)
