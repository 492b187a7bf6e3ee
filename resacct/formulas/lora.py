"""Fine-tuning memory with LoRA (Hu et al. 2021) and QLoRA (Dettmers et al. 2023), as ``peft`` runs it.

A LoRA adapter on a linear layer ``in → out`` adds A (r × in) and B (out × r): r·(in + out)
trainable parameters, two tensors. The base model is frozen: it holds its weights and nothing
else — no gradients, no optimizer state. What a step with torch.optim.AdamW holds:

- **frozen base**: every base parameter in its format (bf16: 2 bytes); QLoRA stores the
  linear layers of the blocks in NF4 with double quantisation, 4 + 8/64 + 32/(64·256) = 4.127
  bits per weight (QLoRA §3), plus bitsandbytes' 1,092 bytes of float32 constants per layer, and
  keeps embeddings, norms and the LM head in bf16 (transformers' bitsandbytes integration leaves the
  output layer unquantised);
- **adapters**: ``peft`` keeps them in float32 over a 16-bit base (``autocast_adapter_dtype=True``,
  its default): 4 bytes per adapter parameter, and 4 for its gradient;
- **AdamW state**: exp_avg and exp_avg_sq in the adapters' dtype (8 bytes per adapter parameter)
  and torch's float32 ``step`` counter per adapter tensor (4 bytes each).

QLoRA's paged optimizer moves that state to CPU memory only when the GPU runs short (NVIDIA
unified memory): it changes the peak under spikes, not these bytes.

Targets (the module names of transformers' Llama): q_proj d → h·e, k_proj and v_proj d → g·e,
o_proj h·e → d, gate_proj and up_proj d → f, down_proj f → d; ``all-linear`` is all seven
(peft's shorthand; the LM head is never a target).

>>> from resacct.formulas.hf_formulas import HfArchitecture
>>> llama7b = HfArchitecture(family="llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, mlp=11008, positions=4096)
>>> lora_adapter_parameters(llama7b, rank=16, targets=("q_proj", "v_proj"))      # 32 layers × 2 × 16·(4096 + 4096)
8388608
>>> m = lora_training_memory(llama7b, rank=16, targets=("q_proj", "v_proj"), base_format="bf16")
>>> round(m.base_bytes / 1e9, 2), round(m.adapter_bytes / 1e6, 1), round(m.optimizer_state_bytes / 1e6, 1), round(m.state_bytes / 1e9, 2)
(13.48, 33.6, 67.1, 13.61)
>>> round(lora_training_memory(llama7b, rank=64, targets=("all-linear",), base_format="nf4").base_bytes / 1e9, 2)   # QLoRA
3.87
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import no_type_check

from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import HfArchitecture, predict_parameters

__all__ = ["LORA_TARGETS", "BASE_FORMAT_BITS", "NF4_DOUBLE_QUANT_BITS", "NF4_CONSTANT_BYTES_PER_LINEAR", "target_shapes", "lora_adapter_parameters",
           "lora_adapter_tensors", "quantized_linear_parameters", "quantized_linear_layers", "LoraMemory", "lora_training_memory", "LoraStepFlops", "lora_step_flops", "LoraSavedTerm", "lora_saved_terms",
           "predict_lora_saved_bytes"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: QLoRA (Dettmers et al. 2023, "Double Quantization"; its section number not read here): NF4 (4 bits) + a double-quantised constant per block of 64 (8/64) + a float32 constant per 256 of those.
NF4_DOUBLE_QUANT_BITS = 4 + 8 / 64 + 32 / (64 * 256)

#: Bytes bitsandbytes keeps per NF4 layer beside its weights (bitsandbytes/functional.py, quantize_4bit
#: with compress_statistics): the float32 NF4 code (16 entries), the float32 code of the nested
#: quantisation (256 entries) and the absmax mean (one float32) — 1,092 bytes, measured by the claim
#: ``qlora-4bit-base-frozen-bytes`` on bitsandbytes 0.50.2.
NF4_CONSTANT_BYTES_PER_LINEAR = (16 + 256) * 4 + 4

#: Bits per frozen base parameter (nf4: the blocks' linear layers only; the rest bf16).
BASE_FORMAT_BITS = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0, "nf4": NF4_DOUBLE_QUANT_BITS}


def target_shapes(a: HfArchitecture) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer a LoRA adapter can target in one Llama-family block."""
    if a.family != "llama":
        raise ResacctError(f"LoRA targets of a {a.family!r} model: resacct knows Llama-family blocks (llama, mistral)")
    d, q, kv, f = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.mlp
    return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d), "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}


def _targets(targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    chosen = tuple(LORA_TARGETS) if "all-linear" in targets else tuple(dict.fromkeys(targets))
    unknown = [t for t in chosen if t not in LORA_TARGETS]
    if unknown or not chosen:
        raise ResacctError(f"LoRA targets {list(targets)!r}: expected some of {', '.join(LORA_TARGETS)}, or all-linear")
    return chosen


def _rank(rank: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ResacctError(f"LoRA rank {rank!r}: expected a whole number ≥ 1 (16 is common)")
    return rank


def lora_adapter_parameters(a: HfArchitecture, *, rank: int, targets: tuple[str, ...] | list[str]) -> int:
    """Trainable parameters: layers × Σ over targets of r·(in + out)."""
    shapes = target_shapes(a)
    return a.layers * sum(_rank(rank) * sum(shapes[t]) for t in _targets(targets))


def lora_adapter_tensors(a: HfArchitecture, *, targets: tuple[str, ...] | list[str]) -> int:
    """Trainable tensors (A and B per target per layer): one AdamW step counter each."""
    target_shapes(a)
    return 2 * a.layers * len(_targets(targets))


def quantized_linear_parameters(a: HfArchitecture) -> int:
    """Weights of the blocks' linear layers (what QLoRA stores in NF4): layers × (attention
    projections + 3·d·f); biases, norms, embeddings and the LM head stay in 16 bits."""
    return a.layers * sum(i * o for i, o in target_shapes(a).values())


def quantized_linear_layers(a: HfArchitecture) -> int:
    """The blocks' linear layers QLoRA quantises: 7 per Llama block (q, k, v, o, gate, up, down)."""
    return a.layers * len(target_shapes(a))


@dataclass(frozen=True)
class LoraMemory:
    """Bytes of a LoRA training step's state (see the module doc); activations apart."""

    base_parameters: int
    base_format: str
    base_bytes: float
    adapter_parameters: int
    adapter_tensors: int
    adapter_element_bytes: int

    @property
    def adapter_bytes(self) -> int:
        return self.adapter_parameters * self.adapter_element_bytes

    @property
    def gradient_bytes(self) -> int:
        """Gradients of the adapters only: the frozen base gets none."""
        return self.adapter_parameters * self.adapter_element_bytes

    @property
    def optimizer_state_bytes(self) -> int:
        """AdamW's two moments in the adapters' dtype and a float32 step counter per tensor."""
        return 2 * self.adapter_parameters * self.adapter_element_bytes + 4 * self.adapter_tensors

    @property
    def state_bytes(self) -> float:
        return self.base_bytes + self.adapter_bytes + self.gradient_bytes + self.optimizer_state_bytes


def lora_training_memory(a: HfArchitecture, *, rank: int, targets: tuple[str, ...] | list[str], base_format: str = "bf16") -> LoraMemory:
    """The state of a LoRA (or, with ``base_format="nf4"``, QLoRA) step with AdamW, as peft keeps it."""
    if base_format not in BASE_FORMAT_BITS:
        raise ResacctError(f"base format {base_format!r}: expected one of {', '.join(BASE_FORMAT_BITS)}")
    base = predict_parameters(a)
    if base_format == "nf4":
        quantized = quantized_linear_parameters(a)
        base_bytes = quantized * NF4_DOUBLE_QUANT_BITS / 8 + quantized_linear_layers(a) * NF4_CONSTANT_BYTES_PER_LINEAR + (base - quantized) * 2
    else:
        base_bytes = base * BASE_FORMAT_BITS[base_format] / 8
    return LoraMemory(base_parameters=base, base_format=base_format, base_bytes=float(base_bytes),
                      adapter_parameters=lora_adapter_parameters(a, rank=rank, targets=targets),
                      adapter_tensors=lora_adapter_tensors(a, targets=targets), adapter_element_bytes=4)


# ── one LoRA training step: FLOPs and saved activations ─────────────────────────────────────────
# Which tensors need a gradient decides both. The base is frozen and so are the embeddings, so the
# first layer's input needs none: only what an adapter's output flows into does. Every adapter
# adds to the residual stream, so from the second layer on everything needs a gradient.

_ATTENTION_IN = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class LoraSavedTerm:
    """One tensor a LoRA forward keeps for backward: the module saving it, what it is, its bytes
    (as :class:`resacct.formulas.gpt_activation_formulas.SavedTerm`, kept here without torch: the
    ``lora`` command is napkin math)."""

    module: str
    what: str
    bytes: int


def _gradient_flow(chosen: tuple[str, ...], first: bool) -> dict[str, bool]:
    """Which tensors of one layer need a gradient: the layer's input, q, k, v (after their
    projections and adapters), the attention scores and output, the residual after attention,
    gate's and up's outputs and down's input."""
    x = not first
    q, k, v = (x or name in chosen for name in _ATTENTION_IN)
    attention = q or k or v
    residual = x or attention or "o_proj" in chosen
    gate, up = residual or "gate_proj" in chosen, residual or "up_proj" in chosen
    return {"input": x, "q": q, "k": k, "v": v, "scores": q or k, "attention": attention, "residual": residual, "gate": gate, "up": up,
            "down_input": gate or up}


@no_type_check  # per adapter (17,732 checks): target and flow come from _targets, target_shapes and _gradient_flow, all checked (docs/suite_time.md, session 7)
def _target_input_needs_gradient(target: str, flow: dict[str, bool]) -> bool:
    return {"o_proj": flow["attention"], "gate_proj": flow["residual"], "up_proj": flow["residual"],
            "down_proj": flow["down_input"]}.get(target, flow["input"])


def _steps(batch: int, seq: int) -> None:
    for label, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{label} {value!r}: expected a whole number ≥ 1")


def _attention(attention: str) -> str:
    if attention not in ("sdpa", "eager"):
        raise ResacctError(f"attention {attention!r}: expected sdpa (the fused kernel) or eager (transformers' matmuls)")
    return attention


@dataclass(frozen=True)
class LoraStepFlops:
    """Matmul FLOPs of one LoRA step (what FlopCounterMode counts), forward and backward by part."""

    forward_by_part: dict[str, int]
    backward_by_part: dict[str, int]

    @property
    def forward_flops(self) -> int:
        return sum(self.forward_by_part.values())

    @property
    def backward_flops(self) -> int:
        return sum(self.backward_by_part.values())

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops


def lora_step_flops(a: HfArchitecture, *, rank: int, targets: tuple[str, ...] | list[str], batch: int, seq: int,
                    attention: str = "sdpa") -> LoraStepFlops:
    """Matmul FLOPs of one forward and backward of a LoRA model (T = batch·seq tokens).

    Forward: the full model's (2·T per weight, 4·b·h·s²·e attention per layer, the LM head) plus
    each adapter's 2·T·r·(in + out). Backward, derived from which tensors need a gradient:

    - a frozen linear layer computes only its input's gradient, 2·T·in·out, and only when its input
      needs one — never the first layer's q, k, v projections (their input comes from the frozen
      embedding), nor anything of the first layer before its first adapter;
    - an adapter: B's weight and input gradients (2·2·T·r·out), A's weight gradient (2·T·in·r), A's
      input gradient (2·T·in·r) when its input needs one;
    - attention: a fused kernel (``sdpa``) computes all four of its backward matmuls (8·b·h·s²·e)
      once any of q, k, v needs a gradient; ``eager`` attention 2·b·h·s²·e for each of the
      gradients of q, k (q·kᵀ), the scores and v (weights·v) that is needed;
    - the frozen LM head its input's gradient, 2·T·d·V.

    So a step costs about 4·N·T (2/3 of full fine-tuning's 6·N·T: no weight gradients of the base).

    >>> tiny = HfArchitecture(family="llama", vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=96, positions=64)
    >>> f = lora_step_flops(tiny, rank=4, targets=("q_proj", "v_proj"), batch=2, seq=16)
    >>> f.forward_flops, f.backward_flops       # measured with FlopCounterMode on a peft step: the same
    (4833280, 4653056)
    """
    _steps(batch, seq)
    shapes, chosen, r = target_shapes(a), _targets(targets), _rank(rank)
    kernel = _attention(attention)
    tokens, d, heads, e = batch * seq, a.hidden, a.heads, a.head_dim
    score_matmul = 2 * batch * heads * seq * seq * e  # one of attention's matmuls (q·kᵀ or weights·v, all s² scores)
    forward = {"base projections": a.layers * 2 * tokens * sum(i * o for i, o in shapes.values()),
               "attention scores and values": a.layers * 2 * score_matmul, "LM head": 2 * tokens * d * a.vocab,
               "adapters": a.layers * sum(2 * tokens * r * sum(shapes[t]) for t in chosen)}
    backward = {"base projections (input gradients)": 0, "attention": 0, "LM head (input gradient)": 2 * tokens * d * a.vocab, "adapters": 0}
    for layer in range(a.layers):
        flow = _gradient_flow(chosen, layer == 0)
        backward["base projections (input gradients)"] += sum(2 * tokens * i * o for t, (i, o) in shapes.items()
                                                              if _target_input_needs_gradient(t, flow))
        if kernel == "sdpa":
            backward["attention"] += 4 * score_matmul if flow["attention"] else 0
        else:
            backward["attention"] += score_matmul * sum(flow[name] for name in ("q", "k", "scores", "v"))
        for t in chosen:
            i, o = shapes[t]
            backward["adapters"] += 4 * tokens * r * o + 2 * tokens * i * r * (2 if _target_input_needs_gradient(t, flow) else 1)
    return LoraStepFlops(forward_by_part=forward, backward_by_part=backward)


def _adapter_terms(p: str, target: str, a: HfArchitecture, tokens: int, rank: int, element: int, dropout: float, needs_gradient: bool,
                   shared: set[str], kernel: str, attention_saved: bool) -> list[LoraSavedTerm]:
    """What one adapter saves: A's input (float32), B's input (A's output, float32)."""
    inputs = target_shapes(a)[target][0]
    module = f"{p}.{'self_attn' if target in (*_ATTENTION_IN, 'o_proj') else 'mlp'}.{target}"
    terms = [LoraSavedTerm(f"{module}.lora_B", "A's output (float32, T·r)", 4 * tokens * rank)]
    if dropout > 0:
        mask = [LoraSavedTerm(f"{module}.lora_dropout", "dropout mask (float32)", 4 * tokens * inputs)] if needs_gradient else []
        return [*mask, LoraSavedTerm(f"{module}.lora_A", "dropout output (float32)", 4 * tokens * inputs), *terms]
    if element != 4:
        return [LoraSavedTerm(f"{module}.lora_A", "input cast to float32 (a copy per adapter)", 4 * tokens * inputs), *terms]
    # float32 model: the adapters read the layer's tensor itself; q, k, v share one, gate and up another
    group = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(target, target)
    if group in shared or (target == "o_proj" and kernel == "flash" and attention_saved):  # o_proj's input: a view of sdpa's saved output
        return terms
    shared.add(group)
    return [LoraSavedTerm(f"{module}.lora_A", "input (float32: no copy)", 4 * tokens * inputs), *terms]


def _norm_terms(p: str, tokens: int, d: int) -> list[LoraSavedTerm]:
    """A frozen RMSNorm whose input needs a gradient: its float32 input and rsqrt; weight·x keeps the weight only."""
    return [LoraSavedTerm(p, "input upcast to float32", 4 * tokens * d), LoraSavedTerm(p, "rsqrt of the mean square (float32)", 4 * tokens)]


def _attention_core_terms(p: str, a: HfArchitecture, batch: int, seq: int, element: int, kernel: str, flow: dict[str, bool]) -> list[LoraSavedTerm]:
    h, g, e = a.heads, a.kv_heads, a.head_dim
    q_bytes, scores = batch * h * seq * e * element, batch * h * seq * seq
    if kernel == "flash":  # the kernel's node keeps q, k, v, output and logsumexp once any input needs a gradient
        return [LoraSavedTerm(p, "q, output (b·h·s·e each)", 2 * q_bytes), LoraSavedTerm(p, f"k and v ({g} heads)", 2 * batch * g * seq * e * element),
                LoraSavedTerm(p, "logsumexp (float32)", 4 * batch * h * seq)] if flow["attention"] else []
    kv = g if batch == 1 and g == 1 else h  # repeat_kv's expand at batch 1 with one head is a view
    terms = [LoraSavedTerm(p, "q (q·kᵀ keeps it for k's gradient)", q_bytes)] if flow["k"] else []
    terms += [LoraSavedTerm(p, f"k on {kv} heads (for q's gradient)", batch * kv * seq * e * element)] if flow["q"] else []
    if element == 4:
        terms += [LoraSavedTerm(p, "softmax output (float32)", 4 * scores)] if flow["scores"] or flow["v"] else []
    else:
        terms += [LoraSavedTerm(p, "softmax output (float32)", 4 * scores)] if flow["scores"] else []
        terms += [LoraSavedTerm(p, "softmax cast back (weights·v keeps it for v's gradient)", element * scores)] if flow["v"] else []
    terms += [LoraSavedTerm(p, f"v on {kv} heads (for the weights' gradient)", batch * kv * seq * e * element)] if flow["scores"] else []
    return terms


def _layer_adapter_terms(names: tuple[str, ...], *, chosen: tuple[str, ...], p: str, a: HfArchitecture, tokens: int, rank: int, element: int,
                         dropout: float, flow: dict[str, bool], shared: set[str], kernel: str) -> list[LoraSavedTerm]:
    """What the adapters of layer ``p`` on ``names`` (those of them ``chosen``) save. A module-level function (a
    ``functools.partial`` per layer in :func:`lora_saved_terms`), not a def in its loop: the type-checking hook
    decorates it once (docs/suite_time.md, session 7)."""
    return [term for t in names if t in chosen for term in _adapter_terms(p, t, a, tokens, rank, element, dropout,
                                                                          _target_input_needs_gradient(t, flow), shared, kernel, flow["attention"])]


def lora_saved_terms(a: HfArchitecture, *, rank: int, targets: tuple[str, ...] | list[str], batch: int, seq: int, dtype: str = "bfloat16",
                     attention: str = "sdpa", dropout: float = 0.0) -> tuple[LoraSavedTerm, ...]:
    """Every tensor one forward of a peft LoRA model with its next-token loss saves on the CPU
    (parameters excluded), as :func:`resacct.formulas.hf_activation_formulas.hf_saved_terms` for
    full fine-tuning — less what frozen weights need not keep, plus the adapters':

    - a frozen linear layer keeps no input (its weight gets no gradient); a frozen norm keeps its
      float32 input and rsqrt but not the normalised x; the embedding keeps no token ids;
    - nothing is kept before the first adapter of the first layer (see :func:`lora_step_flops`);
      SiLU keeps its input when gate's output needs a gradient, the product each factor when the
      other one needs one; attention's matmuls likewise (eager), sdpa's node all or nothing;
    - each adapter: A its float32 input — over a 16-bit base a **copy per adapter** (peft casts the
      input to the adapters' dtype), over a float32 base the layer's tensor itself (q, k, v share
      one; o_proj's is sdpa's saved output) —, with LoRA dropout its mask and output instead; B
      A's output (4·T·r).

    >>> tiny = HfArchitecture(family="llama", vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=96, positions=64)
    >>> predict_lora_saved_bytes(tiny, rank=4, targets=("q_proj", "v_proj"), batch=2, seq=16)   # measured on a peft step: the same
    148228
    """
    _steps(batch, seq)
    chosen, r = _targets(targets), _rank(rank)
    element = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype)
    if element is None:
        raise ResacctError(f"dtype {dtype!r}: expected float32, bfloat16 or float16")
    if not 0 <= dropout < 1:
        raise ResacctError(f"LoRA dropout {dropout!r}: expected a probability in [0, 1)")
    if a.attention_dropout > 0:
        raise ResacctError(f"attention dropout {a.attention_dropout}: resacct predicts LoRA's saved tensors without it; expected 0")
    kernel = "flash" if _attention(attention) == "sdpa" else "eager"  # sdpa on the CPU without dropout: the flash kernel
    if kernel == "flash" and a.sliding_window is not None and seq >= a.sliding_window:
        raise ResacctError(f"seq {seq} is not shorter than the sliding window {a.sliding_window}: resacct predicts the flash kernel without "
                           f"a mask only; expected seq < {a.sliding_window}, or attention 'eager'")
    tokens, d, f = batch * seq, a.hidden, a.mlp
    terms: list[LoraSavedTerm] = []
    rotary_saved = False
    for layer in range(a.layers):
        p, flow, shared = f"model.layers.{layer}", _gradient_flow(chosen, layer == 0), set[str]()
        adapters = functools.partial(_layer_adapter_terms, chosen=chosen, p=p, a=a, tokens=tokens, rank=r, element=element, dropout=dropout,
                                     flow=flow, shared=shared, kernel=kernel)
        terms += _norm_terms(f"{p}.input_layernorm", tokens, d) if flow["input"] else []
        terms += adapters(_ATTENTION_IN)
        if (flow["q"] or flow["k"]) and not rotary_saved:  # q·cos and rotate(q)·sin keep cos and sin, shared by every layer
            rotary_saved = True
            terms.append(LoraSavedTerm(f"{p}.self_attn", "rotary cos and sin (shared, saved once)", 2 * seq * a.head_dim * element))
        terms += _attention_core_terms(f"{p}.self_attn", a, batch, seq, element, kernel, flow)
        terms += adapters(("o_proj",))
        terms += _norm_terms(f"{p}.post_attention_layernorm", tokens, d) if flow["residual"] else []
        wide = element * tokens * f
        terms += [LoraSavedTerm(f"{p}.mlp.act_fn", "SiLU input (gate's output)", wide)] if flow["gate"] else []
        terms += [LoraSavedTerm(f"{p}.mlp", "SiLU output (the product keeps it for up's gradient)", wide)] if flow["up"] else []
        terms += [LoraSavedTerm(f"{p}.mlp", "up's output (the product keeps it for SiLU's gradient)", wide)] if flow["gate"] else []
        terms += adapters(("gate_proj", "up_proj", "down_proj"))
    labels = 8 * (seq + 1 if batch == 1 else tokens)  # at batch 1 a view of the padded (1, s + 1)
    terms += [*_norm_terms("model.norm", tokens, d), LoraSavedTerm("(model)", "log-softmax of the float32 logits (T·V)", 4 * tokens * a.vocab),
              LoraSavedTerm("(model)", "shifted labels (int64)", labels), LoraSavedTerm("(model)", "total weight (0-dim float32)", 4)]
    return tuple(terms)


def predict_lora_saved_bytes(a: HfArchitecture, *, rank: int, targets: tuple[str, ...] | list[str], batch: int, seq: int, dtype: str = "bfloat16",
                             attention: str = "sdpa", dropout: float = 0.0) -> int:
    """Bytes of every distinct storage one LoRA forward with its loss saves (:func:`lora_saved_terms`)."""
    return sum(t.bytes for t in lora_saved_terms(a, rank=rank, targets=targets, batch=batch, seq=seq, dtype=dtype, attention=attention, dropout=dropout))
