"""Fine-tuning memory with LoRA (Hu et al. 2021) and QLoRA (Dettmers et al. 2023), as ``peft`` runs it.

A LoRA adapter on a linear layer ``in → out`` adds A (r × in) and B (out × r): r·(in + out)
trainable parameters, two tensors. The base model is frozen: it holds its weights and nothing
else — no gradients, no optimizer state. What a step with torch.optim.AdamW holds:

- **frozen base**: every base parameter in its format (bf16: 2 bytes); QLoRA stores the
  linear layers of the blocks in NF4 with double quantisation, 4 + 8/64 + 32/(64·256) = 4.127
  bits per weight (QLoRA §3), and keeps embeddings, norms and the LM head in bf16 (transformers'
  bitsandbytes integration leaves the output layer unquantised);
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

from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import HfArchitecture, predict_parameters

__all__ = ["LORA_TARGETS", "BASE_FORMAT_BITS", "NF4_DOUBLE_QUANT_BITS", "target_shapes", "lora_adapter_parameters", "lora_adapter_tensors",
           "quantized_linear_parameters", "LoraMemory", "lora_training_memory"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: QLoRA §3: NF4 (4 bits) + a double-quantised constant per block of 64 (8/64) + a float32 constant per 256 of those.
NF4_DOUBLE_QUANT_BITS = 4 + 8 / 64 + 32 / (64 * 256)

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
        base_bytes = quantized * NF4_DOUBLE_QUANT_BITS / 8 + (base - quantized) * 2
    else:
        base_bytes = base * BASE_FORMAT_BITS[base_format] / 8
    return LoraMemory(base_parameters=base, base_format=base_format, base_bytes=float(base_bytes),
                      adapter_parameters=lora_adapter_parameters(a, rank=rank, targets=targets),
                      adapter_tensors=lora_adapter_tensors(a, targets=targets), adapter_element_bytes=4)
