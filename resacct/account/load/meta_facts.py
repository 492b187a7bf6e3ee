"""What ``run``, ``plan``, ``infer`` and ``lora`` need to know about a model, read off the model
itself: the transformers causal LM of a config built on the meta device (no memory, no weights),
for **any** ``model_type`` transformers builds — not only the families resacct has closed forms
for (:mod:`resacct.formulas.hf_formulas`, kept beside as the cross-check).

- **parameters**: the built model's distinct parameters (a tied head once);
- **active parameters** (a mixture of experts): every parameter, less the routed experts a token
  does not run — a parameter of a module named ``experts`` whose first axis is the config's
  expert count E keeps k/E of itself (k: ``num_experts_per_tok``); shared experts, routers and
  attention count whole;
- **KV cache**: the elements the model's own cache holds after a meta forward of ``tokens``
  tokens with ``use_cache`` (``past_key_values``): GQA/MQA, sliding-window layers (which keep at
  most their window) and DeepSeek's compressed latent cache come out as transformers keeps them;
- **step FLOPs**: FlopCounterMode over a meta forward and backward of one sequence
  (:func:`resacct.account.trace.step_measurements.trace_step_flops`; sdpa's fused kernel counted from its shapes);
  a deep stack of repeated layers traced at three shallow depths and extrapolated, checked, as the account does.

>>> facts = meta_model_facts("falcon-7b")                                             # doctest: +SKIP
>>> facts.parameters, facts.kv_heads, facts.kv_cache_elements_per_token(2048)       # doctest: +SKIP
(6921720704, 1, 4096.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from resacct.errors import ResacctError
from resacct.measurement.meta_op_cache import meta_calls_cached

__all__ = ["MetaModelFacts", "meta_model_facts", "EXPERT_COUNT_KEYS"]

#: the config keys transformers' mixtures of experts spell the routed expert count with
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _first(config: Any, *keys: str) -> Any:
    for key in keys:
        value = getattr(config, key, None)
        if value is not None:
            return value
    return None


@dataclass
class MetaModelFacts:
    """One config's model, built on meta: its counts and shapes (see the module doc)."""

    name: str
    source: str
    model_type: str
    model_class: str
    parameters: int
    parameter_tensors: int
    active_parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    positions: int
    experts: int = 0
    experts_per_token: int = 0
    #: resacct's closed form for the family (None: no family formula): the cross-check
    formula_parameters: int | None = None
    formula_active_parameters: int | None = None
    model: Any = field(default=None, repr=False)
    #: the config it was built from (:class:`~resacct.account.load.hf_models.HfConfigSpec`): shallower copies are built from it
    spec: Any = field(default=None, repr=False)
    _kv: dict[int, float] = field(default_factory=dict, repr=False)

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def largest_module_parameters(self) -> int:
        """DeepSpeed's ``largest_layer_params``: the most parameters one module holds directly (not its children)."""
        return max(sum(p.numel() for p in module.parameters(recurse=False)) for module in self.model.modules())

    def kv_cache_elements(self, tokens: int) -> int:
        """Elements the model's cache holds for one sequence of ``tokens`` tokens (a meta forward with ``use_cache``)."""
        if tokens not in self._kv:
            self._kv[tokens] = model_kv_cache_elements(self.model, tokens)
        return int(self._kv[tokens])

    def kv_cache_elements_per_token(self, tokens: int) -> float:
        """The cache of ``tokens`` tokens over ``tokens``: constant for full attention; sliding-window
        layers keep at most their window, so past it the figure falls with the context."""
        return self.kv_cache_elements(tokens) / tokens

    def step_flops(self, *, batch: int = 1, seq: int, layers: str = "auto") -> tuple[int, str]:
        """FlopCounterMode's forward and backward FLOPs of ``batch`` × ``seq`` tokens on meta (its own loss), and how
        the layers were traced: a stack the account samples (:func:`~resacct.account.trace.repeated_layers.layer_plan`,
        ``layers`` ``auto``, ``sampled`` or ``all``) at its sample depths, the FLOPs on the line through two of them
        and checked on the third; any other (or one whose FLOPs are not on a line) every layer."""
        from resacct.account.load.hf_models import build_hf_model, with_depth
        from resacct.account.peak.layer_segments import NotRepeating
        from resacct.account.trace.repeated_layers import extrapolate_dataclass, layer_plan, sampled_note

        plan = None if self.spec is None else layer_plan(self.spec, layers)
        if plan is not None and plan.sample:
            samples = [_meta_step_flops(build_hf_model(with_depth(self.spec, built), device="meta"), batch, seq) for built in plan.sample_layers()]
            try:  # the account's own rule for a whole number: the line through two depths, checked on the third
                return extrapolate_dataclass(samples, plan.depth, plan.prefix, plan.period), sampled_note(plan.depth, "the step", plan.prefix, plan.period)
            except NotRepeating as error:
                why = f"the step's FLOPs: {error}"
        else:
            why = None if plan is None else plan.why_whole
        whole = _meta_step_flops(self.model, batch, seq)
        return whole, f"all {self.layers} layers traced" + ("" if why is None else f": {why}")


def _meta_step_flops(model: Any, batch: int, seq: int) -> int:
    """FlopCounterMode's FLOPs of a forward and backward of ``model`` (built on meta) over ``batch`` × ``seq`` tokens, its own loss."""
    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
    from resacct.account.trace.step_measurements import trace_step_flops

    model.train()
    inputs = default_inputs(model, batch=batch, seq=seq, device="meta")
    try:
        return trace_step_flops(model, lambda: loss_of_output(call_model(model, inputs), "model")).step_flops
    finally:
        model.eval()


def model_kv_cache_elements(model: Any, tokens: int) -> int:
    """Elements ``model``'s own KV cache holds after a meta forward of one sequence of ``tokens`` tokens (``use_cache``)."""
    model.eval()
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    with torch.no_grad(), meta_calls_cached(model):  # each layer's calls the same: answered from the process's cache
        try:
            output = model(input_ids=ids, use_cache=True)
        except Exception as error:  # a model whose forward cannot run on meta
            raise ResacctError(f"{type(model).__name__}: its forward with use_cache could not run on the meta device "
                               f"({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''})") from None
    cache = getattr(output, "past_key_values", None)
    if cache is None:
        raise ResacctError(f"{type(model).__name__} returned no past_key_values: it keeps no KV cache resacct can count")
    tensors = kv_cache_tensors(cache)
    if not tensors:
        raise ResacctError(f"{type(model).__name__}'s cache ({type(cache).__name__}) holds no key/value tensors resacct can count")
    return sum(tensor.numel() for tensor in tensors)


def kv_cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The key and value tensors a transformers cache holds: a ``Cache``'s layers, or a legacy tuple of (key, value) per layer."""
    tensors = []
    for layer in getattr(cache, "layers", ()):
        tensors += [value for value in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(value, torch.Tensor)]
    if not tensors and isinstance(cache, (tuple, list)):
        tensors = [value for pair in cache for value in pair if isinstance(value, torch.Tensor)]
    return tensors


def _active_parameters(model: Any, experts: int, per_token: int) -> int:
    """Every parameter, the routed experts' banks counted k/E (see the module doc)."""
    total = 0.0
    for name, parameter in model.named_parameters():
        routed = experts and per_token and ".experts." in f".{name}" and parameter.dim() >= 1 and parameter.shape[0] == experts
        total += parameter.numel() * (per_token / experts if routed else 1)
    return round(total)


@lru_cache(maxsize=4)
def meta_model_facts(config: str) -> MetaModelFacts:
    """Build ``config`` (a shipped name or a config.json path) on meta and read its facts."""
    from resacct.account.load.hf_models import build_hf_model, load_hf_config, transformers_config
    from resacct.formulas.hf_formulas import architecture_of, predict_active_parameters, predict_parameters

    spec = load_hf_config(config)
    built = transformers_config(spec)
    model = build_hf_model(spec, device="meta")
    model.eval()
    parameters = list(model.parameters())
    text = getattr(built, "get_text_config", lambda: built)()
    heads = int(_first(text, "num_attention_heads", "n_head"))
    hidden = int(_first(text, "hidden_size", "n_embd", "n_embed"))
    split = (getattr(text, "qk_nope_head_dim", None), getattr(text, "qk_rope_head_dim", None))  # DeepSeek's MLA: a query head scores nope + rope
    head_dim = int(sum(split) if all(isinstance(part, int) for part in split) else _first(text, "head_dim") or hidden // heads)
    if getattr(text, "multi_query", False) and not getattr(text, "new_decoder_architecture", False):
        kv_heads = 1  # Falcon-7B: one key/value head (its num_kv_heads keeps the query count)
    else:
        kv_heads = _first(text, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    experts = int(_first(text, *EXPERT_COUNT_KEYS) or 0)
    per_token = int(_first(text, "num_experts_per_tok") or 0) if experts else 0
    architecture = architecture_of(built)
    return MetaModelFacts(
        name=spec.name, source=spec.source, model_type=spec.model_type, model_class=type(model).__name__,
        parameters=sum(p.numel() for p in parameters), parameter_tensors=len(parameters),
        active_parameters=_active_parameters(model, experts, per_token),
        layers=int(_first(text, "num_hidden_layers", "n_layer")), hidden=hidden, heads=heads, kv_heads=int(kv_heads), head_dim=head_dim,
        vocab=int(text.vocab_size), positions=int(_first(text, "max_position_embeddings", "n_positions", "seq_length") or 0),
        experts=experts, experts_per_token=per_token,
        formula_parameters=None if architecture is None else predict_parameters(architecture),
        formula_active_parameters=None if architecture is None else predict_active_parameters(architecture),
        model=model, spec=spec,
    )
