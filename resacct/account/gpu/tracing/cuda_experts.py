"""A mixture of experts as a CUDA board runs it: the experts **grouped by expert** (transformers'
``grouped_mm``), whatever resacct built the model with.

transformers picks ``grouped_mm`` when nothing is asked (``PreTrainedModel.get_correct_experts_implementation``:
no implementation requested → ``grouped_mm`` where ``torch._grouped_mm`` can dispatch, sm80 and later on
torch ≥ 2.9). resacct builds Mixtral with ``batched_mm`` (its training formulas model that path), which
gathers a copy of the expert weights for every (token, expert) pair — ``gate_up_proj[expert_ids]``, kept
for backward in a training step: at a 4096-token prefill of Mixtral-8x7B 2980.60 GB "allocated", where the
weights are 93.41 GB. The ``--device`` answers (``account``, ``fit``, ``lora``, ``infer``) run the rows
grouped by expert instead (:mod:`resacct.account.load.moe_routing`'s dropless forward, transformers' own
``grouped_mm_experts_forward`` with its grouped matmul by transformers' fallback op, whose autograd rule
saves the rows and the weights, never a copy of them): T·k rows, as the board's kernel holds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["grouped_experts", "group_experts", "experts_as_on_cuda", "GROUPED_EXPERTS_NOTE"]

#: what the ``--device`` answers print for a model whose experts they ran grouped
GROUPED_EXPERTS_NOTE = ("grouped by expert, as transformers runs them on a CUDA board (grouped_mm, its default): "
                        "T·k rows, no copy of the expert weights per (token, expert) as resacct's batched_mm build makes")


def _experts_owner(model: Any) -> Any:
    """The outermost transformers model in ``model`` (a peft or master-weights wrapper's inner one too)
    whose experts run ``batched_mm``; None where there is none."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(type(module), "set_experts_implementation") and getattr(config, "_experts_implementation", None) == "batched_mm":
            return module
    return None


def group_experts(model: Any) -> str | None:
    """Switch ``model``'s ``batched_mm`` experts, in place, to the grouped forward (module docstring):
    :data:`GROUPED_EXPERTS_NOTE`, or None for a model without experts or with another implementation."""
    owner = _experts_owner(model)
    if owner is None:
        return None
    from resacct.account.load.moe_routing import register_dropless_experts

    owner.set_experts_implementation(register_dropless_experts())
    return GROUPED_EXPERTS_NOTE


def grouped_experts(model: Any) -> Any:
    """``model`` after :func:`group_experts` (the same object)."""
    group_experts(model)
    return model


@contextlib.contextmanager
def experts_as_on_cuda(model: Any) -> Iterator[str | None]:
    """Within the block, ``model``'s ``batched_mm`` experts run grouped (:func:`grouped_experts`), and
    ``batched_mm`` again after it (the caller's model is left as it was: ``fit``'s search keeps using it).
    Yields :data:`GROUPED_EXPERTS_NOTE`, or None for a model with no ``batched_mm`` experts."""
    owner = _experts_owner(model)
    if owner is None:
        yield None
        return
    group_experts(owner)
    try:
        yield GROUPED_EXPERTS_NOTE
    finally:
        owner.set_experts_implementation("batched_mm")
