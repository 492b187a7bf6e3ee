"""Meta tensors' aten ops answered from a cache: what a call returns (its outputs' shapes, strides and
dtypes, or which of its inputs it returns) worked out once per distinct call, then made directly.

Once ``torch._meta_registrations`` is imported (by ``FakeTensorMode`` or ``torch._dynamo``: every resacct
trace), the Meta kernel of many aten ops is torch's **Python** reference, not the C++ one — the dispatcher
dump of ``aten::mul.Tensor`` says ``Meta: registered at torch/_meta_registrations.py``, the C++ kernel
``(inactive)``. A multiply of two meta tensors then costs ~100-300 µs of Python and a foreach update of
a 4-layer Llama-7B's parameters ~15 ms (timed per op in a one-off probe), where making the output takes a
few µs. A training step of identical layers makes the same call (the same op, input shapes, strides,
dtypes and scalars) again in every layer: of the ~24,000 calls of Llama-2-70B's CUDA allocator pass
(:mod:`resacct.account.gpu.tracing.cuda_step`), 10,928 are answered from the cache (``python benchmarks/meta_op_cache.py``).

:class:`MetaOpCache` answers a call it has seen: the key is the op and every argument (a tensor by its
dtype, shape, strides, storage offset and flags; a number, string, dtype or device by its value), and
what the first call returned is kept only where it can be made again exactly —

- a new tensor (its own storage, at offset 0, as large as ``torch.empty_strided`` of its shape and strides
  makes it): made again with ``torch.empty_strided`` on ``meta``;
- an input returned (an in-place op's ``self``, an ``out=``): that input, by its position;
- ``None`` or a number: itself.

Never cached: a call made while another dispatch mode sits **below** the one asking (that mode would see
``empty_strided`` instead of the op: a FLOP counter or a tracker entered before the pass), a call with a tensor that is not a plain meta tensor (a CPU step counter's values matter), an
op outside ``aten``, an op tagged ``inplace_view``, ``dynamic_output_shape`` or ``data_dependent_output``, a
call whose inputs' metadata changed (``resize_``), an output that aliases an input without being it (a view)
or shares a storage with another output. Such a call runs its kernel each time, as before.

>>> import torch
>>> cache = MetaOpCache()
>>> a, b = torch.empty(2, 3, device="meta"), torch.empty(3, device="meta")
>>> first = cache.call(torch.ops.aten.mul.Tensor, (a, b), {})
>>> again = cache.call(torch.ops.aten.mul.Tensor, (a, b), {})
>>> (again.shape, again.stride(), again.dtype, again.device.type), (cache.hits, cache.misses)
((torch.Size([2, 3]), (3, 1), torch.float32, 'meta'), (1, 1))
>>> cache.call(torch.ops.aten.mul_.Tensor, (a, b), {}) is a and cache.call(torch.ops.aten.mul_.Tensor, (a, b), {}) is a
True
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, no_type_check

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["MetaOpCache", "MetaOpCacheMode", "MAX_ENTRIES", "shared_meta_cache", "meta_calls_cached"]

#: Entries kept before the cache starts afresh (a step of any depth needs a few thousand).
MAX_ENTRIES = 50_000

_NEVER_TAGS = tuple(getattr(torch.Tag, name) for name in ("inplace_view", "dynamic_output_shape", "data_dependent_output") if hasattr(torch.Tag, name))
_CONSTANTS = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Uncacheable(Exception):
    pass


# How an op is answered (:func:`_handling`): its kernel always; from the cache; or — an in-place foreach
# update (``aten::_foreach_add_``: returns nothing) over meta tensors — not run at all: it would write values
# meta tensors do not hold, and it makes and resizes nothing.
_RUN, _CACHE, _WRITES_VALUES_ONLY = "run", "cache", "writes values only"


class MetaOpCache:
    """Calls on meta tensors answered from what the same call returned before (module doc).
    ``hits`` and ``misses`` count the calls answered each way; ``passed`` those never cacheable."""

    def __init__(self) -> None:
        self.entries: dict[Any, Any] = {}
        #: the last call's key (None: a call not cacheable): whatever else depends only on the call (its FLOPs and bytes) may be kept by it
        self.last_key: Any = None
        self.hits = 0
        self.misses = 0
        self.passed = 0
        self._handling: dict[Any, str] = {}  # per op, asked once: _RUN, _CACHE or _WRITES_VALUES_ONLY

    @no_type_check  # per op of a traced step: the hints are all Any
    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)``, answered from the cache where this call was seen before."""
        self.last_key = None
        handling = self._handling.get(func)
        if handling is None:
            handling = self._handling[func] = _handling(func)
        if handling == _RUN or torch._C._len_torch_dispatch_stack():  # a mode below this one must see the op itself
            self.passed += 1
            return func(*args, **kwargs)
        flat = _flat_arguments(args, kwargs)
        if handling == _WRITES_VALUES_ONLY and all(not isinstance(value, torch.Tensor) or _plain_meta(value) for value in flat):
            self.hits += 1
            return None  # an in-place foreach update of meta tensors: no values to write, nothing made or resized
        try:  # the default dtype too: a factory op without a dtype, a float scalar with integers, take theirs from it
            key = (func, torch.get_default_dtype(), tuple(_key_of(value) for value in flat))
        except _Uncacheable:
            self.passed += 1
            return func(*args, **kwargs)
        entry = self.entries.get(key)
        self.last_key = key
        if entry:
            self.hits += 1
            return _made_again(entry, flat)
        out = func(*args, **kwargs)
        if entry is None:
            self.misses += 1
            if len(self.entries) >= MAX_ENTRIES:
                self.entries.clear()
            self.entries[key] = _entry_of(out, flat, key)
        else:
            self.passed += 1  # seen before, and what it returned cannot be made again
        return out


def _handling(func: Any) -> str:
    """_RUN for an op outside aten, tagged as never cacheable, or returning a view of an input (a return
    that aliases an input without writing it: ``view``, ``t``, ``expand`` — cheap C++ kernels anyway);
    _WRITES_VALUES_ONLY for an in-place foreach update; else _CACHE."""
    if getattr(func, "namespace", None) != "aten" or any(tag in _NEVER_TAGS for tag in func.tags):
        return _RUN
    schema = func._schema
    if schema.name.startswith("aten::_foreach_") and schema.name.endswith("_") and not schema.returns:
        return _WRITES_VALUES_ONLY
    if any(ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns):
        return _RUN
    return _CACHE


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _flat_arguments(args: tuple, kwargs: dict) -> list:
    """The arguments, lists and tuples opened one level (an aten schema nests no deeper), kwargs' values by name."""
    flat: list[Any] = []
    for value in args:
        if isinstance(value, (list, tuple)):
            flat.append(len(value))
            flat.extend(value)
        else:
            flat.append(value)
    for name in sorted(kwargs):
        value = kwargs[name]
        flat.append(name)
        if isinstance(value, (list, tuple)):
            flat.append(len(value))
            flat.extend(value)
        else:
            flat.append(value)
    return flat


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _plain_meta(value: torch.Tensor) -> bool:
    return value.device.type == "meta" and value.layout is torch.strided and type(value) in (torch.Tensor, torch.nn.Parameter)


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _key_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if not _plain_meta(value):
            raise _Uncacheable
        return (value.dtype, tuple(value.shape), value.stride(), value.storage_offset(), value.requires_grad, value.is_conj(), value.is_neg())
    if isinstance(value, _CONSTANTS):
        return (type(value), value)
    raise _Uncacheable


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _entry_of(out: Any, flat_inputs: list, key: Any) -> Any:
    """What to make on a hit, or False (never answer this call from the cache)."""
    try:
        if tuple(_key_of(value) for value in flat_inputs) != key[2]:
            return False  # an input's shape, strides or flags changed (resize_, set_): run the kernel each time
    except _Uncacheable:
        return False
    leaves, spec = tree_flatten(out)
    input_storages = {_storage_id(value) for value in flat_inputs if isinstance(value, torch.Tensor)}
    made: list[Any] = []
    fresh_storages: set[int] = set()
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            position = next((index for index, value in enumerate(flat_inputs) if value is leaf), None)
            if position is not None:
                made.append(("input", position))
                continue
            storage = _storage_id(leaf)
            if (leaf.device.type != "meta" or type(leaf) is not torch.Tensor or leaf.layout is not torch.strided or leaf.storage_offset() != 0
                    or leaf.is_conj() or leaf.is_neg() or leaf.requires_grad or storage in input_storages or storage in fresh_storages
                    or leaf.untyped_storage().nbytes() != _empty_strided_nbytes(leaf)):
                return False
            fresh_storages.add(storage)
            made.append(("new", tuple(leaf.shape), leaf.stride(), leaf.dtype))
        elif isinstance(leaf, (int, float, bool, type(None))):
            made.append(("constant", leaf))
        else:
            return False
    return (spec, tuple(made))


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _made_again(entry: tuple, flat_inputs: list) -> Any:
    spec, made = entry
    leaves = []
    for how in made:
        if how[0] == "input":
            leaves.append(flat_inputs[how[1]])
        elif how[0] == "new":
            leaves.append(torch.empty_strided(how[1], how[2], dtype=how[3], device="meta"))
        else:
            leaves.append(how[1])
    return tree_unflatten(leaves, spec)


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _storage_id(tensor: torch.Tensor) -> int:
    """The storage's identity (its ``_cdata``: one number per storage, shared by its views)."""
    return tensor.untyped_storage()._cdata


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _empty_strided_nbytes(tensor: torch.Tensor) -> int:
    if any(size == 0 for size in tensor.shape):
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))) * tensor.element_size()


class MetaOpCacheMode(TorchDispatchMode):
    """A :class:`MetaOpCache` as a dispatch mode: entered **before** the modes that watch a pass
    (FlopCounterMode, a recorder), it sits under them and answers the calls they pass on, right
    where the meta kernels would run."""

    def __init__(self, cache: MetaOpCache | None = None) -> None:
        super().__init__()
        self.cache = MetaOpCache() if cache is None else cache

    @no_type_check  # per op
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.cache.call(func, args, kwargs or {})


@functools.cache
def shared_meta_cache() -> MetaOpCache:
    """One cache for the whole process: a call's answer depends only on its key (the op, the arguments'
    metadata, the default dtype), so every trace on meta may share what another made (MAX_ENTRIES bounds it)."""
    return MetaOpCache()


def meta_calls_cached(*things: Any) -> contextlib.AbstractContextManager:
    """A :class:`MetaOpCacheMode` over :func:`shared_meta_cache` where any of ``things`` (modules, tensors)
    is on the meta device — entered before a pass's own modes, it sits under them; else nothing."""
    for thing in things:
        tensors = [thing] if isinstance(thing, torch.Tensor) else [*thing.parameters(), *thing.buffers()] if isinstance(thing, torch.nn.Module) else []
        if any(tensor.device.type == "meta" for tensor in tensors):
            return MetaOpCacheMode(shared_meta_cache())
    return contextlib.nullcontext()
