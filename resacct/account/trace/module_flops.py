"""FLOPs per module of a training step: torch's FlopCounterMode counts every op, and each op
counts under exactly **one** module — the module whose forward made it.

FlopCounterMode's own ``ModuleTracker`` keeps a module "running" in backward from the gradient of
its outputs until the gradient of its *positional* tensor inputs is complete: for a module called
with keyword arguments only (transformers' ``self_attn(hidden_states=…)``) until the whole backward
ends, for modules fed one tensor (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``)
until the last sibling's backward is done. Its backward counts overlap, and a module's count less
its children's was negative (llama-3-8b, batch 1 × seq 128: ``model.layers.0.self_attn`` −18.8
GFLOPs in backward, ``model.layers.31.self_attn`` 3.46 TFLOPs — layers 0 to 30's backward too).

:class:`ModuleAttribution` takes that tracker's place in the counter (:func:`module_flop_counter`):
an op counts under the innermost module whose forward is running (the forward, or a checkpoint's
recomputation in backward); in backward under the innermost module that was running when the
forward made the autograd node now running (``torch._C._current_autograd_node()``, matched by its
sequence number: the forward numbers nodes in order, and every module entry and exit notes the
next number); outside every module :data:`OUTSIDE_SCOPE`. The counter's per-module counts are then
each module's own, they sum to its total, and :func:`inclusive_by_module` adds up subtrees.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, no_type_check

import torch
from torch import nn

from resacct.errors import ResacctError
from resacct.measurement.activation_recording import MODEL_SCOPE, OUTSIDE_SCOPE

__all__ = ["ModuleAttribution", "module_flop_counter", "module_flops", "in_tree_order", "inclusive_by_module", "tree_order"]

_NO_FORWARD = 2**64 - 1  # the sequence number of nodes no forward made (AccumulateGrad, the graph's root)


class ModuleAttribution:
    """The module each op belongs to, as FlopCounterMode's ``mod_tracker`` (``parents``:
    ``{"Global", that module's path}``; paths as ``model.named_modules()`` names them, the root
    :data:`MODEL_SCOPE`)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack: list[str] = [OUTSIDE_SCOPE]
        self.sequence_numbers: list[int] = []  # the next node's number at each module entry and exit, in order
        self.scopes: list[str] = []  # the module running from then on
        self.handles: list[Any] = []
        self.thread = threading.get_ident()

    @property
    @no_type_check  # per op (9,818 checks): its set is made here of scope()'s checked str (docs/suite_time.md, session 7)
    def parents(self) -> set[str]:
        return {"Global", self.scope()}

    def scope(self) -> str:
        if len(self.stack) > 1:
            return self.stack[-1]  # a forward, or a checkpoint's recomputation
        node = torch._C._current_autograd_node()
        number = _NO_FORWARD if node is None else node._sequence_nr()
        index = bisect.bisect_right(self.sequence_numbers, number) - 1
        return self.scopes[index] if number != _NO_FORWARD and index >= 0 else OUTSIDE_SCOPE

    @no_type_check  # per module forward (15,360 checks): no argument to check, returns None (docs/suite_time.md, session 7)
    def _note(self) -> None:
        if threading.get_ident() == self.thread:  # sequence numbers are per thread: the forward's
            self.sequence_numbers.append(torch.autograd._get_sequence_nr())
            self.scopes.append(self.stack[-1])

    def _enter(self, name: str) -> Callable[..., None]:
        @no_type_check  # decorated anew at every call of the function around it: the hook's cost, not a check (docs/suite_time.md)
        def hook(module: nn.Module, args: Any) -> None:
            self.stack.append(name or MODEL_SCOPE)
            self._note()

        return hook

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()
        self._note()

    def __enter__(self) -> ModuleAttribution:
        self.thread = threading.get_ident()
        self._note()
        for name, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def module_flop_counter(model: nn.Module, custom_mapping: Mapping[Any, Any] | None = None) -> Any:
    """A ``FlopCounterMode`` whose ``get_flop_counts()`` are per module of ``model``, each op under
    one module (:class:`ModuleAttribution`) — beside ``"Global"``, the total."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=dict(custom_mapping or {}))
    if not hasattr(counter, "mod_tracker"):
        raise ResacctError(f"torch {torch.__version__}'s FlopCounterMode has no mod_tracker; expected torch >= 2.4")
    counter.mod_tracker = ModuleAttribution(model)
    return counter


def module_flops(flop_counts: Mapping[str, Mapping[Any, int]]) -> dict[str, int]:
    """A :func:`module_flop_counter`'s ``get_flop_counts()`` → FLOPs per module path, the total ("Global") apart."""
    return {name: int(sum(per_op.values())) for name, per_op in flop_counts.items() if name != "Global"}


def tree_order(name: str) -> tuple[tuple[int, int | str], ...]:
    """A module path's place in a stable order: the model first, indices numerically
    (``layers.2`` before ``layers.10``)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in ("" if name == MODEL_SCOPE else name).split("."))


def in_tree_order(flops_by_module: Mapping[str, int]) -> dict[str, int]:
    """The modules with FLOPs, in :func:`tree_order` (FlopCounterMode's own order follows a set's hashing)."""
    return {name: flops_by_module[name] for name in sorted(flops_by_module, key=tree_order) if flops_by_module[name]}


def inclusive_by_module(exclusive_flops: Mapping[str, int]) -> dict[str, int]:
    """Each module's own FLOPs (``exclusive_flops``) → with its descendants': every count added to
    its path's every prefix (each a module) and to :data:`MODEL_SCOPE` — :data:`OUTSIDE_SCOPE` is
    under no module. A module's figure is its own plus its children's.

    >>> inclusive_by_module({"(model)": 1, "layers.0.mlp": 4, "head": 3, "(loss)": 2})
    {'(model)': 8, '(loss)': 2, 'head': 3, 'layers': 4, 'layers.0': 4, 'layers.0.mlp': 4}
    """
    totals: dict[str, int] = defaultdict(int)
    for name, flops in exclusive_flops.items():
        totals[name] += flops
        if name in (MODEL_SCOPE, OUTSIDE_SCOPE):
            continue
        parts = name.split(".")
        for depth in range(1, len(parts)):
            totals[".".join(parts[:depth])] += flops
        totals[MODEL_SCOPE] += flops
    return {name: totals[name] for name in sorted(totals, key=tree_order)}
