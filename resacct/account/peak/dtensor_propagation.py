"""DTensor's sharding propagation, kept out of a traced step: the tensors it makes are not the step's.

Before a DTensor runs an op for the first time with given global specs, its ``ShardingPropagator``
works out the output's global shape, stride and dtype by running the op once on fake tensors of the
**global** shapes (``_propagate_tensor_meta_non_cached`` in torch ≥ 2.5, ``_propagate_tensor_meta``
in 2.4), then caches the answer (``lru_cache``, keyed by the op and the global specs — the same on
every rank). On a GPU that run is under a fresh ``FakeTensorMode`` and allocates nothing. In a
traced step it runs under the trace's own fake mode (torch ≥ 2.5 takes ``detect_fake_mode()``), so
a tracker above that mode saw its global-shape ``empty_strided`` calls as the step's allocations —
in the first step a process traced only, as the cache answers the later ones: the first traced rank
got other figures than the ranks after it (HF GPT-2, fsdp2, 4 ranks, the CUDA allocator model:
2.74 GB reserved traced first, 1.68 GB traced second; llama-2-7b on 8 ranks: 103.7 against 45.2 GB).

:func:`propagation_unrecorded` marks the propagation while a trace runs; the recording modes
(:class:`~resacct.account.peak.sharded.ShardedStorageTracker`, the CUDA pass's op costs) pass the ops
run inside it through unrecorded (:func:`propagating`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["propagating", "propagation_unrecorded", "dtensor_among"]

_state = threading.local()
_patch_lock = threading.Lock()
_patched_users = 0
_originals: dict[str, Any] = {}

#: the propagator's method that runs the op on fake tensors of the global shapes, newest torch first
_PROPAGATING_METHODS = ("_propagate_tensor_meta_non_cached", "_propagate_tensor_meta")


def dtensor_among(types: Any) -> bool:
    """Whether one of a dispatch's ``types`` is a DTensor — without importing DTensor's module (not imported: no DTensor
    exists; importing it costs seconds). Torch 2.4's lives in ``torch.distributed._tensor``: there the public module has no
    ``DTensor``, and asking it raised AttributeError inside autograd's engine, which aborted the process."""
    import sys

    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        dtensor = getattr(sys.modules.get(name), "DTensor", None)
        if dtensor is not None:
            return any(issubclass(kind, dtensor) for kind in types)
    return False


def propagating() -> bool:
    """Whether this thread is inside DTensor's sharding propagation (while :func:`propagation_unrecorded` is active)."""
    return getattr(_state, "depth", 0) > 0


def _propagator_class() -> Any:
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        try:
            from torch.distributed._tensor._sharding_prop import ShardingPropagator  # type: ignore[no-redef]  # torch 2.4
        except ImportError:
            return None
    return ShardingPropagator


def _marked(method: Any) -> Any:
    @functools.wraps(method)
    def run_marked(*args: Any, **kwargs: Any) -> Any:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return method(*args, **kwargs)
        finally:
            _state.depth -= 1

    return run_marked


@contextlib.contextmanager
def propagation_unrecorded() -> Iterator[None]:
    """While active, :func:`propagating` is true inside the propagator's fake run (see the module doc);
    nestable. Without torch.distributed's DTensor it does nothing."""
    global _patched_users
    propagator = _propagator_class()
    if propagator is None:
        yield
        return
    with _patch_lock:
        if _patched_users == 0:
            name = next((each for each in _PROPAGATING_METHODS if each in vars(propagator)), None)
            if name is not None:
                _originals[name] = vars(propagator)[name]
                setattr(propagator, name, _marked(_originals[name]))
        _patched_users += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patched_users -= 1
            if _patched_users == 0:
                for name, original in _originals.items():
                    setattr(propagator, name, original)
                _originals.clear()
