"""Inference memory: the weights in their storage format, and the key/value cache.

Every attention layer keeps, for each sequence and each token it has seen, one key and one value
vector per **key/value head** (grouped-query attention shares each of them among h/g query heads;
multi-query attention has g = 1):

    KV-cache bytes = 2 (k and v) × batch × tokens × layers × kv_heads × head_dim × bytes per element

A transformers ``generate`` loop holds ``prompt + new_tokens − 1`` tokens at its end: the last
token it samples is returned, never fed through the model (claim
``generate-dynamic-cache-holds-prompt-plus-new-minus-one``, measured on a real loop).

Weights by format (:data:`WEIGHT_FORMAT_BITS`): 32, 16, 8 or 4 bits per parameter; NF4 with double
quantisation is QLoRA's 4.127 bits (Dettmers et al. 2023, §3: a 32-bit constant per block of 64
becomes an 8-bit one, with a 32-bit constant per 256 of those: 4 + 8/64 + 32/(64·256)). The scales
of int8/int4 weight-only schemes (one per output channel or per group) are not counted.

>>> kv_cache_bytes(batch=1, tokens=4096, layers=32, kv_heads=8, head_dim=128, element_bytes=2)   # Llama-3-8B, bf16
536870912
>>> kv_cache_bytes(batch=1, tokens=4096, layers=32, kv_heads=32, head_dim=128, element_bytes=2)  # Llama-2-7B (no GQA): 4×
2147483648
>>> generate_cache_tokens(prompt=10, new_tokens=5)
14
>>> weight_bytes(7e9, "int4") / 1e9, weight_bytes(7e9, "bf16") / 1e9
(3.5, 14.0)
>>> memory = inference_memory(parameters=8.03e9, layers=32, kv_heads=8, head_dim=128, batch=8, context=8192,
...                           weight_format="bf16", kv_format="bf16", device_memory_bytes=80e9)
>>> round(memory.kv_cache_bytes / 1e9, 2), memory.fits, memory.largest_batch, memory.largest_context
(8.59, True, 59, 60977)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resacct.errors import ResacctError

__all__ = ["WEIGHT_FORMAT_BITS", "KV_FORMAT_BYTES", "kv_cache_bytes", "kv_cache_bytes_per_token", "generate_cache_tokens", "weight_bytes",
           "InferenceMemory", "inference_memory"]

#: Bits per parameter of each weight format (NF4: QLoRA's double-quantised 4.127 bits, constants included).
WEIGHT_FORMAT_BITS: dict[str, float] = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0, "fp8": 8.0, "int8": 8.0, "int4": 4.0,
                                        "nf4": 4.0 + 8 / 64 + 32 / (64 * 256)}

#: Bytes per cached key or value element.
KV_FORMAT_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}

_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8", "float8_e4m3fn": "fp8"}


def _whole(name: str, value: object, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ResacctError(f"{name} {value!r}: expected a whole number ≥ {least}")
    return value


def _format(name: str, text: str, table: dict[str, float] | dict[str, int]) -> str:
    key = _ALIASES.get(str(text).strip().lower(), str(text).strip().lower())
    if key not in table:
        raise ResacctError(f"{name} {text!r}: expected one of {', '.join(table)}")
    return key


def kv_cache_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """Bytes one token of one sequence adds to the cache: 2 · layers · kv_heads · head_dim · element bytes."""
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("element_bytes", element_bytes)):
        _whole(name, value)
    return 2 * layers * kv_heads * head_dim * element_bytes


def kv_cache_bytes(*, batch: int, tokens: int, layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """Bytes of the keys and values of ``batch`` sequences of ``tokens`` tokens (see the module doc)."""
    return _whole("batch", batch) * _whole("tokens", tokens, 0) * kv_cache_bytes_per_token(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, element_bytes=element_bytes)


def generate_cache_tokens(*, prompt: int, new_tokens: int) -> int:
    """Tokens a transformers ``generate`` loop's cache holds when it returns: the prompt and every
    generated token but the last (sampled from the final logits, never fed back)."""
    return _whole("prompt", prompt) + _whole("new_tokens", new_tokens) - 1


def weight_bytes(parameters: float, weight_format: str) -> float:
    """Bytes of ``parameters`` weights stored in ``weight_format`` (:data:`WEIGHT_FORMAT_BITS`)."""
    if isinstance(parameters, bool) or not isinstance(parameters, (int, float)) or not math.isfinite(parameters) or parameters <= 0:
        raise ResacctError(f"parameters {parameters!r}: expected a number > 0 such as 7e9")
    return parameters * WEIGHT_FORMAT_BITS[_format("weight format", weight_format, WEIGHT_FORMAT_BITS)] / 8


@dataclass(frozen=True)
class InferenceMemory:
    """Weights + KV cache of a batch at a context length on one device, and what fits."""

    parameters: float
    weight_format: str
    kv_format: str
    batch: int
    context: int
    weight_bytes: float
    kv_cache_bytes_per_token: float  # whole for 2·L·g·e·bytes; a model's own cache past a sliding window averages
    device_memory_bytes: float
    reserved_bytes: float

    @property
    def kv_cache_bytes(self) -> int:
        return round(self.batch * self.context * self.kv_cache_bytes_per_token)

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_cache_bytes

    @property
    def room_bytes(self) -> float:
        """What the device leaves for the cache once the weights and the reserve are in."""
        return self.device_memory_bytes - self.reserved_bytes - self.weight_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.reserved_bytes <= self.device_memory_bytes

    @property
    def largest_batch(self) -> int:
        """The most sequences of ``context`` tokens whose cache fits beside the weights (0: none)."""
        return max(0, math.floor(self.room_bytes / (self.context * self.kv_cache_bytes_per_token)))

    @property
    def largest_context(self) -> int:
        """The most tokens per sequence for ``batch`` sequences (0: the weights leave no room)."""
        return max(0, math.floor(self.room_bytes / (self.batch * self.kv_cache_bytes_per_token)))


def inference_memory(*, parameters: float, layers: int, kv_heads: int, head_dim: int, batch: int, context: int, weight_format: str = "bf16",
                     kv_format: str = "bf16", device_memory_bytes: float = math.inf, reserved_bytes: float = 0.0,
                     kv_cache_elements_per_token: float | None = None) -> InferenceMemory:
    """Weights in ``weight_format`` plus the KV cache of ``batch`` × ``context`` tokens in ``kv_format``.
    ``kv_cache_elements_per_token``: the cache's elements per token as the model itself keeps them
    (:mod:`resacct.account.load.meta_facts`: sliding windows, DeepSeek's latent cache) instead of 2·layers·kv_heads·head_dim."""
    kv = _format("KV-cache format", kv_format, KV_FORMAT_BYTES)
    if not device_memory_bytes > 0:
        raise ResacctError(f"device memory {device_memory_bytes!r} bytes: expected a number > 0")
    if not (math.isfinite(reserved_bytes) and reserved_bytes >= 0):
        raise ResacctError(f"reserved memory {reserved_bytes!r} bytes: expected 0 or more")
    if kv_cache_elements_per_token is not None:
        if not (math.isfinite(kv_cache_elements_per_token) and kv_cache_elements_per_token > 0):
            raise ResacctError(f"KV-cache elements per token {kv_cache_elements_per_token!r}: expected a number > 0")
        per_token: float = kv_cache_elements_per_token * KV_FORMAT_BYTES[kv]
    else:
        per_token = kv_cache_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=head_dim, element_bytes=KV_FORMAT_BYTES[kv])
    return InferenceMemory(parameters=float(parameters), weight_format=_format("weight format", weight_format, WEIGHT_FORMAT_BITS), kv_format=kv,
                           batch=_whole("batch", batch), context=_whole("context", context), weight_bytes=weight_bytes(parameters, weight_format),
                           kv_cache_bytes_per_token=per_token, device_memory_bytes=float(device_memory_bytes), reserved_bytes=float(reserved_bytes))
