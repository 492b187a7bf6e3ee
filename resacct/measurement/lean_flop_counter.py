"""A lean copy of FlopCounterMode's dispatch, for a trace whose every op pays it
(:mod:`resacct.account.trace.fake_pass`): the same ops run, the same FLOPs counted per module.

torch's ``_FlopCounterMode.__torch_dispatch__`` builds a set of 15 ops on every call, and for every op
without a FLOP formula (most of them: views, element-wise ops) enters the mode again and asks
``OpOverload.decompose``, which returns ``NotImplemented`` unless the op has a
``CompositeImplicitAutograd`` kernel. :func:`lean_flop_counter` makes the set once and asks the kernel
question once per op, entering the mode only where torch's would decompose. It applies only where
torch's dispatch is the source it was copied from (checked by its hash); elsewhere the counter is left alone.
"""

from __future__ import annotations

from typing import Any, no_type_check

import torch

__all__ = ["lean_flop_counter"]

#: sha256 (first 16 hex digits) of the source of torch's ``_FlopCounterMode.__torch_dispatch__`` that
#: :func:`lean_flop_counter` was written from — the same in torch 2.11, 2.13 and 2.14; another is left as it is.
_FLOP_DISPATCH_SOURCE = "0a179e9bbe15b91b"
_LEAN: list[Any] = []  # [the counter class with the lean mode] once made; [None] where this torch's dispatch is another


def lean_flop_counter(counter: Any) -> bool:
    """Make ``counter`` (a ``FlopCounterMode``, not entered) dispatch through a lean copy of its mode:
    the ops it skips in a set made once (torch makes it on every op), and an op without a formula
    entered into the mode again to decompose only when it has a ``CompositeImplicitAutograd`` kernel
    (what ``OpOverload.decompose`` looks for; torch enters and leaves the mode on every such op to
    learn it has none). The same ops run and the same FLOPs are counted, per module; False (counter
    unchanged) where this torch's ``_FlopCounterMode.__torch_dispatch__`` is not the one this was made from."""
    if not _LEAN:
        _LEAN.append(_lean_counter_class())
    if _LEAN[0] is None or type(counter).__name__ != "FlopCounterMode":
        return False
    counter.__class__ = _LEAN[0]
    return True


def _lean_counter_class() -> Any:
    import hashlib
    import inspect

    from torch.utils import flop_counter

    mode_class = getattr(flop_counter, "_FlopCounterMode", None)
    if mode_class is None or hashlib.sha256(inspect.getsource(mode_class.__torch_dispatch__).encode()).hexdigest()[:16] != _FLOP_DISPATCH_SOURCE:
        return None
    aten, implicit, device_query = torch.ops.aten, torch._C.DispatchKey.CompositeImplicitAutograd, torch.ops.prim.device.default
    skipped = frozenset({aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
                         aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
                         aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
                         aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
                         torch.ops.prim.layout.default})

    class LeanMode(mode_class):  # type: ignore[misc, valid-type]
        decomposes: dict[Any, bool] = {}

        @no_type_check  # per-op hot path: the tests' type-check hook would cost more than the op (docs/suite_time.md)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs if kwargs else {}
            if func in skipped:
                return NotImplemented
            if isinstance(func, torch._ops.HigherOrderOperator):
                return self._handle_higher_order_ops(func, types, args, kwargs)
            if func not in self.counter.flop_registry and func is not device_query:
                decomposes = self.decomposes.get(func)
                if decomposes is None:  # the op's kernels, once a trace (a registration in the trace is not seen)
                    decomposes = self.decomposes[func] = implicit in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit)
                if decomposes:
                    with self:
                        r = func.decompose(*args, **kwargs)
                        if r is not NotImplemented:
                            return r
            out = func(*args, **kwargs)
            return self.counter._count_flops(func._overloadpacket, out, args, kwargs)

    class LeanCounter(flop_counter.FlopCounterMode):  # type: ignore[misc]
        def __enter__(self) -> Any:
            super().__enter__()
            self.mode.__exit__(None, None, None)  # torch's mode, just pushed: the lean one instead
            self.mode = LeanMode(self)
            self.mode.decomposes = {}
            self.mode.__enter__()
            return self

    LeanCounter.__name__ = LeanCounter.__qualname__ = "FlopCounterMode"
    return LeanCounter
