"""One generated token's forward traced on meta tensors: the ops ``infer --device`` prices a decode step by.

``generate`` runs a decode step as one forward of one token a sequence, reading the KV cache the earlier
positions left: its own ops (the cache's ``cat`` per layer, one position's rotary, attention of one query
to the whole context) — not the prefill's. :func:`trace_decode_ops` builds that cache with a forward of
``context`` tokens on meta (nothing is allocated; only its shapes matter), then records every aten op of
the next token's forward with its FLOPs and bytes (:class:`~resacct.account.gpu.tracing.op_costs.OpCosts`), sdpa
routed to the board's CUDA kernel as the prefill's trace routes it. ``tests/test_decode_trace.py`` checks
the traced FLOPs against torch's FlopCounterMode over a real decode step on the CPU.

The board's recorder (``tools/gpu_record_serve.py``) runs its decode steps through :func:`serving_forward`
too, so a record's decode times are of this very forward.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from resacct.errors import ResacctError

__all__ = ["serving_forward", "cache_of", "trace_decode_ops"]


def serving_forward(model: Any, tokens: Any, cache: Any = None) -> Any:
    """One forward as ``generate`` runs it: the cache kept, the last position's logits only (transformers 5.24 calls
    the cache argument ``cache``, earlier ones ``past_key_values``; a model without ``logits_to_keep``: every position's)."""
    parameters = inspect.signature(model.forward).parameters
    given = {} if cache is None else {"cache" if "cache" in parameters else "past_key_values": cache}
    if "logits_to_keep" in parameters:
        given["logits_to_keep"] = 1
    return model(input_ids=tokens, use_cache=True, **given)


def cache_of(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    for name in ("cache", "past_key_values"):
        found = output.get(name) if hasattr(output, "get") else getattr(output, name, None)
        if found is not None:
            return found
    raise ResacctError(f"the forward returned no KV cache (fields: {', '.join(output.keys()) if hasattr(output, 'keys') else type(output).__name__})")


def trace_decode_ops(model: Any, *, batch: int, context: int, kernel: str | None, capability: tuple[int, int] | None = None) -> list[Any]:
    """Every aten op of the forward that generates token ``context + 1`` for ``batch`` sequences (``model`` on meta, in
    eval mode), each an :class:`~resacct.account.gpu.tracing.op_costs.OpCost`. ``kernel``: CUDA's sdpa kernel (``"flash"`` or
    ``"efficient"``; a mask moves flash to the efficient kernel, as the prefill's trace does), None: sdpa's own choice."""
    from resacct.account.gpu.tracing.cuda_step import sdpa_routing
    from resacct.account.gpu.tracing.op_costs import OpCosts
    from resacct.measurement.meta_op_cache import meta_calls_cached

    if batch < 1 or context < 1:
        raise ResacctError(f"batch {batch}, context {context}: expected at least one sequence of at least one token")
    if any(tensor.device.type != "meta" for tensor in model.parameters()):
        raise ResacctError("trace_decode_ops: expected a model on the meta device (prefill_model builds one)")
    with torch.no_grad(), meta_calls_cached(model):
        prefilled = cache_of(serving_forward(model, torch.zeros(batch, context, dtype=torch.long, device="meta")))
    token = torch.zeros(batch, 1, dtype=torch.long, device="meta")

    def attempt(routed: str | None) -> list[Any]:
        cache = copy.deepcopy(prefilled)  # each attempt from the same cache: a refused one may have grown a layer's
        routing = sdpa_routing(routed, capability)
        costs = OpCosts()
        with meta_calls_cached(model), torch.no_grad(), routing, costs:  # the cache under the counter: every op still counted
            serving_forward(model, token, cache)
        return costs.ops

    try:
        return attempt(kernel)
    except ResacctError as error:
        if "mask" in str(error) and kernel == "flash":
            return attempt("efficient")
        raise
