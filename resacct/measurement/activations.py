"""Measuring activation memory: what autograd saves, per module; what the allocator holds; and
activation checkpointing over segments of layers. The names live in two modules, all importable
from here: recording in :mod:`resacct.measurement.activation_recording`, checkpointing (formulas and
measurements) and gradient accumulation in :mod:`resacct.measurement.activation_checkpointing`.

- :func:`record_saved_activations` — every tensor autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), deduplicated by storage, each attributed to
  the module whose forward saved it (a module stack kept by forward pre/post hooks).
  Saved parameters (a Linear keeps its weight) are flagged apart: they are not activations.
- :func:`trace_allocations` — the CPU allocator's own record of every allocation and free in a
  block (``torch.profiler`` with ``profile_memory=True``): bytes held at the end and the peak,
  both relative to the start. It sees what saved-tensor hooks cannot: kernel temporaries, the
  optimizer's scratch tensors, and what ``checkpoint`` keeps.
- :func:`run_in_segments` / :func:`gpt_loss` — a forward with
  ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` over k segments of the layers.

Storages are told apart by ``untyped_storage().data_ptr()``; on the meta device, where every
pointer is 0, by the storage object's identity — so a GPT-2-sized forward can be measured there
without allocating.

>>> import torch
>>> layer = torch.nn.Linear(3, 2)
>>> with record_saved_activations(layer) as saved:
...     y = layer(torch.ones(4, 3, requires_grad=True))
>>> saved.activation_bytes, saved.parameter_bytes  # the input x (4×3 float32); the weight (2×3)
(48, 24)
>>> segment_bounds(layers=16, segments=4)
[(0, 4), (4, 8), (8, 12), (12, 16)]
"""

from __future__ import annotations

from resacct.measurement.activation_checkpointing import (
    WRAPPED_SCALAR_BYTES,
    CheckpointPoint,
    GradAccumulation,
    best_segment_count,
    gpt_forward,
    gpt_loss,
    measure_checkpointing,
    measure_grad_accumulation,
    predict_gpt_held_after_forward_bytes,
    predict_gpt_recompute_flops,
    predict_gpt_step_peak_bytes,
    rng_state_bytes,
    run_in_segments,
    segment_bounds,
)
from resacct.measurement.activation_recording import (
    MODEL_SCOPE,
    OUTSIDE_SCOPE,
    AllocationTrace,
    SavedActivation,
    SavedActivations,
    module_stack,
    record_saved_activations,
    trace_allocations,
)

from resacct.measurement import activation_recording
from resacct.measurement import activation_checkpointing

__all__ = [*activation_recording.__all__, *activation_checkpointing.__all__]  # every name of both parts, re-exported
