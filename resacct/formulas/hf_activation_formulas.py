"""Exact saved-activation bytes of one training forward (with its own next-token loss) of the
Hugging Face decoders resacct knows (:class:`~resacct.formulas.hf_formulas.HfArchitecture`: GPT-2, Llama —
grouped-query attention and untied heads included —, Mistral, Mixtral with transformers'
``batched_mm`` experts), term by term: which op keeps which tensor for backward. Storages are
counted once, as :func:`resacct.measurement.activations.record_saved_activations` counts them (a tensor two
ops save, or a view of one, is one term; the rotary cos/sin every layer shares is saved once).

Derived by recording ``saved_tensors_hooks`` on small models of **transformers 5.23.0** with
**torch 2.13** (CPU and meta) and reading their modeling source; checked against that
measurement at many shapes by ``resacct/specs/hf.claims.yaml`` (every claim measures now, so a
transformers or torch release that saves something else fails there with both numbers).

Notation: b batch, s sequence, T = b·s tokens, d hidden, h query heads, g key/value heads, e head
size, f MLP width, V vocabulary, E bytes per activation (4 float32, 2 bfloat16/float16), S the
LayerNorm statistics' bytes (E on CPU, 4 on meta), M the math attention's bytes (4: torch's math
``scaled_dot_product_attention`` upcasts 16-bit inputs on CPU and meta).

- **Llama / Mistral** layer: each RMSNorm (two) upcasts its input to float32 and saves it
  (4·T·d; the input itself in float32), its rsqrt (4·T) and the normalised x in E (E·T·d); the
  next projection saves ``weight · x`` (E·T·d). SwiGLU saves gate's output (SiLU input), SiLU's
  output, up's output and their product (down's input): 4·E·T·f. Attention, **eager**: q, k and v
  laid out for ``matmul`` (E·b·h·s·e each: ``repeat_kv`` copies k and v to all h heads), the
  float32 softmax (4·b·h·s²) and, in 16 bits, its E copy that weights·v keeps; o_proj's input
  (the merged heads: E·T·h·e). **sdpa on CPU** (the flash kernel, no dropout): q (E·b·h·s·e), k and
  v as given (E·b·g·s·e: transformers passes ``enable_gqa``), the output (E·b·h·s·e, laid out
  (b, s, h, e): o_proj's input is a view of it) and the float32 logsumexp (4·b·h·s); where torch's
  CPU dispatcher refuses the flash kernel (torch 2.8 for grouped-query attention: measured by
  :func:`~resacct.measurement.sdpa_choice.cpu_sdpa_kernel`) the math kernel's terms below. **sdpa on
  meta** (torch's math decomposition): q, k, v (h heads) and the softmax in M bytes, o_proj's
  input in E. The first layer also holds RoPE's cos and sin (E·s·e each, shape (1, s, e)), which
  every layer multiplies by and which are saved once. Attention dropout (p > 0) adds its mask and
  its output (E·b·h·s² each, M in the math kernel).
- **Mixtral** layer (``batched_mm`` experts, S = T·k token–expert pairs): the router saves its
  input (the norm's output: counted there), its float32 softmax (4·T·X for X experts), the top-k
  indices (int64, 8·T·k), the renormalising sum (4·T) and the renormalised weights (4·T·k); the
  experts the repeated tokens (E·S·d), **each pair's gathered weights** (E·S·2f·d for gate-up,
  E·S·d·f for down: why this kernel saves far more than the default loop), gate-up's output
  (E·S·2f; SiLU's input and ``up`` are views of it), SiLU's output and the product (E·S·f each),
  the per-pair routing weights (float32, 4·S) and down's output (E·S·d).
- **GPT-2** layer: LayerNorms (two) save the input (E·T·d), mean and rstd (2·S·T); c_attn and
  c_fc their input (the norm's output); **eager** attention q, kᵀ, v copies (E·b·h·s·e each),
  the softmax (E·b·h·s², no upcast), with dropout its mask and output (E·b·h·s² each), c_proj the
  merged heads (E·T·d); **sdpa** with dropout or on meta runs the math kernel (as eager, in M, and
  c_proj's input in E), without dropout on CPU the flash kernel (the qkv output 3·E·T·d, the output
  E·T·d that c_proj reads as a view, logsumexp 4·b·h·s); ``gelu_new`` (tanh form, elementwise)
  saves x, tanh, 0.5·x and 1 + tanh: 4·E·T·f; c_proj its input (E·T·f); residual dropout (p > 0)
  a mask of E·T·d after attention and after the MLP (CPU and meta dropout keeps its mask in the
  input's dtype; CUDA's fused kernel keeps bool).
- **The KV cache**: a training forward still builds transformers' ``DynamicCache`` (``use_cache``
  defaults to true), whose contiguous copies of k and v are what attention keeps. Two batch-1
  views change the bytes: eager GPT-2's q is then a view of the qkv output (3·E·T·d), and eager
  Llama with one key/value head keeps the cache's k and v (E·b·g·s·e) through ``repeat_kv``'s
  expand; and the loss's shifted labels are a view of the padded (1, s + 1) (8·(s + 1)).
- **Outside the layers**: token ids (int64, 8·T); GPT-2 also positions (8·s) and the embedding
  dropout mask (E·T·d); the final norm; the LM head's input (E·T·d); the loss upcasts the logits
  to float32 and keeps their log-softmax (4·T·V), the shifted labels (int64, 8·T) and a 0-dim
  float32 total weight.

>>> from resacct.formulas.hf_formulas import HfArchitecture
>>> tiny = HfArchitecture(family="llama", vocab=96, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, mlp=48, positions=64)
>>> predict_hf_saved_bytes(tiny, batch=2, seq=8, dtype="float32", attention="eager")     # measured: 83012
83012
>>> mha = HfArchitecture(family="llama", vocab=96, hidden=32, layers=2, heads=4, kv_heads=4, head_dim=8, mlp=48, positions=64)
>>> predict_hf_layer_saved_bytes(mha, batch=2, seq=8, dtype="float32", attention="sdpa", device_type="cpu", first=False)  # flash: measured 33152
33152
"""

from __future__ import annotations

from resacct.errors import ResacctError
from resacct.formulas.gpt_activation_formulas import SavedTerm, layer_norm_stats_bytes
from resacct.formulas.hf_formulas import HfArchitecture
from resacct.measurement.sdpa_choice import cpu_sdpa_kernel

__all__ = ["TRANSFORMERS_VERSION_DERIVED", "HF_ATTENTIONS", "attention_kernel", "hf_saved_terms", "hf_layer_saved_terms",
           "predict_hf_saved_bytes", "predict_hf_layer_saved_bytes"]

#: the transformers release the terms were derived from (checked against the installed one by the claims)
TRANSFORMERS_VERSION_DERIVED = "5.23.0"
HF_ATTENTIONS = ("eager", "sdpa")
_DEVICES = ("cpu", "meta")
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_ACTIVATIONS = {"gpt2": ("gelu_new",), "llama": ("silu",), "mixtral": ("silu",)}


def attention_kernel(a: HfArchitecture, attention: str, device_type: str, seq: int = 1, dtype: str = "float32") -> str:
    """Which attention code runs: ``eager`` (transformers' matmuls), ``flash`` (torch's CPU flash
    kernel: sdpa on CPU without attention dropout, where this torch's CPU dispatcher takes the heads
    and ``dtype``) or ``math`` (sdpa's decomposition: on meta, on CPU with dropout, which the flash
    kernel does not do, and on CPU where the dispatcher refuses the flash kernel — torch 2.8 does for
    grouped-query attention; :func:`resacct.measurement.sdpa_choice.cpu_sdpa_kernel` runs it once to see).

    >>> from resacct.formulas.hf_formulas import HfArchitecture
    >>> gpt2 = HfArchitecture(family="gpt2", vocab=96, hidden=32, layers=2, heads=4, kv_heads=4, head_dim=8, mlp=128, positions=64, attention_dropout=0.1)
    >>> attention_kernel(gpt2, "sdpa", "cpu"), attention_kernel(gpt2, "eager", "meta")
    ('math', 'eager')
    """
    if attention not in HF_ATTENTIONS:
        raise ResacctError(f"attention {attention!r}: expected one of {', '.join(HF_ATTENTIONS)}")
    if device_type not in _DEVICES:
        raise ResacctError(f"device {device_type!r}: resacct predicts Hugging Face activations on {' and '.join(_DEVICES)}; "
                           "expected one of them (CUDA kernels save other tensors)")
    if attention == "eager":
        return "eager"
    if device_type == "cpu" and a.attention_dropout == 0:
        if a.sliding_window is not None and seq >= a.sliding_window:  # a mask reaches the flash kernel (from seq = window on), which then keeps more
            raise ResacctError(f"seq {seq} is not shorter than the sliding window {a.sliding_window}: resacct predicts the CPU flash kernel "
                               f"without a mask only; expected seq < {a.sliding_window}, attention 'eager', or the meta device")
        return cpu_sdpa_kernel(heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, dtype=dtype)
    return "math"


def _check(a: HfArchitecture, batch: int, seq: int, dtype: str) -> int:
    for label, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{label} {value!r}: expected a whole number ≥ 1")
    if dtype not in _ELEMENT_BYTES:
        raise ResacctError(f"dtype {dtype!r}: expected one of {', '.join(_ELEMENT_BYTES)}")
    if a.activation not in _ACTIVATIONS[a.family]:
        raise ResacctError(f"activation {a.activation!r}: resacct's {a.family} activation formula knows {', '.join(_ACTIVATIONS[a.family])}")
    if a.family == "gpt2" and a.heads * a.head_dim != a.hidden:
        raise ResacctError(f"GPT-2 with {a.heads} heads of {a.head_dim} ≠ hidden {a.hidden}: expected heads · head size = hidden")
    return _ELEMENT_BYTES[dtype]


def _attention_terms(module: str, a: HfArchitecture, b: int, s: int, element: int, kernel: str) -> list[SavedTerm]:
    """What the attention core saves (projections' inputs excluded), per kernel."""
    h, g, e = a.heads, a.kv_heads, a.head_dim
    head_bytes = b * h * s * e  # elements of q (or of k, v on all h heads)
    scores = b * h * s * s
    dropout = a.attention_dropout > 0
    if kernel == "flash":
        first = (SavedTerm(module, "qkv projection output (q is a view of it)", 3 * head_bytes * element) if a.family == "gpt2"
                 else SavedTerm(module, "q (b·h·s·e, after RoPE)", head_bytes * element))
        return [
            first,
            SavedTerm(module, f"k and v: the KV cache's copies ({g} heads: sdpa's own grouped-query attention)", 2 * b * g * s * e * element),
            SavedTerm(module, "output, laid out (b, s, h, e): the output projection's input is a view", head_bytes * element),
            SavedTerm(module, "logsumexp (b·h·s, float32)", b * h * s * 4),
        ]
    math_bytes = 4 if kernel == "math" else element  # the math kernel upcasts 16-bit inputs
    upcast_softmax = a.family != "gpt2" and kernel == "eager"  # Llama's eager softmax runs in float32
    # eager GPT-2 at batch 1: q (1, h, s, e), a view of the qkv output, reshapes for bmm without a copy
    q_view = kernel == "eager" and a.family == "gpt2" and b == 1
    # eager Llama with one key/value head at batch 1: repeat_kv's expand reshapes as a view (head stride 0), so
    # matmul keeps the KV cache's copies of k and v themselves (b·g·s·e)
    kv_heads = g if kernel == "eager" and a.family != "gpt2" and b == 1 and g == 1 else h
    terms = [
        SavedTerm(module, "qkv projection output (batch 1: q is a view of it)", 3 * head_bytes * element) if q_view
        else SavedTerm(module, "q laid out for matmul", head_bytes * math_bytes),
        SavedTerm(module, f"k laid out for matmul ({kv_heads} heads)", b * kv_heads * s * e * math_bytes),
        SavedTerm(module, "softmax output (b·h·s²)" + (", float32" if upcast_softmax or math_bytes == 4 else ""),
                  scores * (4 if upcast_softmax else math_bytes)),
    ]
    if upcast_softmax and element != 4 and not dropout:
        terms.append(SavedTerm(module, "softmax cast back to the model's dtype (weights·v keeps it)", scores * element))
    if dropout:
        terms += [SavedTerm(module, "attention-dropout mask", scores * math_bytes),
                  SavedTerm(module, "attention-dropout output (weights·v keeps it)", scores * math_bytes)]
    terms.append(SavedTerm(module, f"v laid out for matmul ({kv_heads} heads)", b * kv_heads * s * e * math_bytes))
    return terms


def _rms_norm(p: str, tokens: int, d: int, element: int) -> list[SavedTerm]:
    return [SavedTerm(p, "input upcast to float32", 4 * tokens * d), SavedTerm(p, "rsqrt of the mean square (float32)", 4 * tokens),
            SavedTerm(p, "normalised x in the model's dtype (weight · x keeps it)", element * tokens * d)]


def _layer_norm(p: str, tokens: int, d: int, element: int, stats: int) -> list[SavedTerm]:
    return [SavedTerm(p, "input", element * tokens * d), SavedTerm(p, "mean and rstd", 2 * tokens * stats)]


def hf_layer_saved_terms(a: HfArchitecture, batch: int, seq: int, *, dtype: str = "float32", attention: str = "sdpa", device_type: str = "meta",
                         layer: int = 0) -> tuple[SavedTerm, ...]:
    """The terms one decoder layer saves (``layer`` 0 also holds the rotary cos/sin all share)."""
    element = _check(a, batch, seq, dtype)
    kernel = attention_kernel(a, attention, device_type, seq, dtype)
    b, s, d, f = batch, seq, a.hidden, a.mlp
    tokens = b * s
    x = element * tokens * d
    if a.family == "gpt2":
        stats = layer_norm_stats_bytes(element, device_type)
        p = f"transformer.h.{layer}"
        residual_mask = [SavedTerm(f"{p}.attn.resid_dropout", "residual-dropout mask", x)] if a.residual_dropout > 0 else []
        return tuple([
            *_layer_norm(f"{p}.ln_1", tokens, d, element, stats),
            SavedTerm(f"{p}.attn.c_attn", "input (ln_1's output)", x),
            *_attention_terms(f"{p}.attn", a, b, s, element, kernel),
            *([] if kernel == "flash" else [SavedTerm(f"{p}.attn.c_proj", "input (heads merged: a copy)", x)]),
            *residual_mask,
            *_layer_norm(f"{p}.ln_2", tokens, d, element, stats),
            SavedTerm(f"{p}.mlp.c_fc", "input (ln_2's output)", x),
            SavedTerm(f"{p}.mlp.act", "gelu_new: x, tanh(…), 0.5·x and 1 + tanh(…)", 4 * element * tokens * f),
            SavedTerm(f"{p}.mlp.c_proj", "input (the activation's output)", element * tokens * f),
            *([SavedTerm(f"{p}.mlp.dropout", "residual-dropout mask", x)] if a.residual_dropout > 0 else []),
        ])
    p = f"model.layers.{layer}"
    h, e = a.heads, a.head_dim
    terms = [*_rms_norm(f"{p}.input_layernorm", tokens, d, element), SavedTerm(f"{p}.self_attn.q_proj", "input (weight · normalised x)", x)]
    if layer == 0:
        terms.append(SavedTerm(f"{p}.self_attn", "rotary cos and sin ((1, s, e) each; shared by every layer, saved once)", 2 * s * e * element))
    terms += _attention_terms(f"{p}.self_attn", a, b, s, element, kernel)
    if kernel != "flash":
        terms.append(SavedTerm(f"{p}.self_attn.o_proj", "input (heads merged: a copy)", element * tokens * h * e))
    terms += [*_rms_norm(f"{p}.post_attention_layernorm", tokens, d, element)]
    if a.family == "mixtral":
        pairs, k, width = tokens * a.experts_per_token, a.experts_per_token, element
        terms += [
            SavedTerm(f"{p}.mlp.gate", "input (weight · normalised x)", x),
            SavedTerm(f"{p}.mlp.gate", "router softmax (float32, T·experts)", 4 * tokens * a.experts),
            SavedTerm(f"{p}.mlp.gate", "top-k indices (int64)", 8 * tokens * k),
            SavedTerm(f"{p}.mlp.gate", "sum of the top-k probabilities (float32)", 4 * tokens),
            SavedTerm(f"{p}.mlp.gate", "renormalised top-k weights (float32)", 4 * tokens * k),
            SavedTerm(f"{p}.mlp.experts", "tokens repeated k times", width * pairs * d),
            SavedTerm(f"{p}.mlp.experts", "gate-up weights gathered per pair (S·2f·d)", width * pairs * 2 * f * d),
            SavedTerm(f"{p}.mlp.experts.act_fn", "gate-up output (SiLU's input and up are views)", width * pairs * 2 * f),
            SavedTerm(f"{p}.mlp.experts", "SiLU output", width * pairs * f),
            SavedTerm(f"{p}.mlp.experts", "SiLU · up (down's input)", width * pairs * f),
            SavedTerm(f"{p}.mlp.experts", "down weights gathered per pair (S·d·f)", width * pairs * d * f),
            SavedTerm(f"{p}.mlp.experts", "routing weight per pair (float32)", 4 * pairs),
            SavedTerm(f"{p}.mlp.experts", "down output (weighted by the routing weight)", width * pairs * d),
        ]
    else:
        wide = element * tokens * f
        terms += [
            SavedTerm(f"{p}.mlp.gate_proj", "input (weight · normalised x)", x),
            SavedTerm(f"{p}.mlp.act_fn", "SiLU input (gate's output)", wide),
            SavedTerm(f"{p}.mlp", "SiLU output and up's output (their product keeps both)", 2 * wide),
            SavedTerm(f"{p}.mlp.down_proj", "input (SiLU · up)", wide),
        ]
    return tuple(terms)


def _outside_terms(a: HfArchitecture, batch: int, seq: int, element: int, device_type: str) -> tuple[list[SavedTerm], list[SavedTerm]]:
    tokens, d = batch * seq, a.hidden
    x = element * tokens * d
    loss = [SavedTerm("(model)", "log-softmax of the float32 logits (T·V)", 4 * tokens * a.vocab),
            # labels are padded with -100 to s + 1 and shifted: at batch 1 a view of the padded (1, s + 1), else a copy
            SavedTerm("(model)", "shifted labels (int64)", 8 * (seq + 1 if batch == 1 else tokens)), SavedTerm("(model)", "total weight (0-dim float32)", 4)]
    if a.family == "gpt2":
        stats = layer_norm_stats_bytes(element, device_type)
        before = [SavedTerm("transformer.wte", "token ids (int64)", 8 * tokens), SavedTerm("transformer.wpe", "positions (int64, (1, s))", 8 * seq)]
        if a.embedding_dropout > 0:
            before.append(SavedTerm("transformer.drop", "embedding-dropout mask", x))
        return before, [*_layer_norm("transformer.ln_f", tokens, d, element, stats), SavedTerm("lm_head", "input (ln_f's output)", x), *loss]
    before = [SavedTerm("model.embed_tokens", "token ids (int64)", 8 * tokens)]
    return before, [*_rms_norm("model.norm", tokens, d, element), SavedTerm("lm_head", "input (weight · normalised x)", x), *loss]


def hf_saved_terms(a: HfArchitecture, batch: int, seq: int, *, dtype: str = "float32", attention: str = "sdpa",
                   device_type: str = "meta") -> tuple[SavedTerm, ...]:
    """Every tensor one forward with its next-token loss saves, parameters excluded, in order."""
    element = _check(a, batch, seq, dtype)
    before, after = _outside_terms(a, batch, seq, element, device_type)
    layers = [term for layer in range(a.layers)
              for term in hf_layer_saved_terms(a, batch, seq, dtype=dtype, attention=attention, device_type=device_type, layer=layer)]
    return (*before, *layers, *after)


def predict_hf_saved_bytes(a: HfArchitecture, batch: int, seq: int, *, dtype: str = "float32", attention: str = "sdpa", device_type: str = "meta") -> int:
    """Bytes of every distinct storage one forward with its loss saves (see :func:`hf_saved_terms`)."""
    return sum(term.bytes for term in hf_saved_terms(a, batch, seq, dtype=dtype, attention=attention, device_type=device_type))


def predict_hf_layer_saved_bytes(a: HfArchitecture, batch: int, seq: int, *, dtype: str = "float32", attention: str = "sdpa",
                                 device_type: str = "meta", first: bool = True) -> int:
    """Bytes one layer saves: the first (``first=True``, RoPE's shared cos/sin included) or any other."""
    terms = hf_layer_saved_terms(a, batch, seq, dtype=dtype, attention=attention, device_type=device_type, layer=0 if first else 1)
    return sum(term.bytes for term in terms)
