"""resacct/measurement/meta_op_cache.py: a meta-tensor call answered from the cache returns what torch's
own meta kernel returns — the same shapes, strides, dtypes and storage sizes, the same inputs where an op
returns one — and the passes that use it (the CUDA allocator pass, the meta pass of an account) give the
same numbers, to the byte, as without it (torch's kernels on every call)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from resacct.account.gpu.tracing import allocation_trace
from resacct.measurement import meta_op_cache
from resacct.measurement.meta_op_cache import MetaOpCache, MetaOpCacheMode

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


def _described(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return (value.device.type, value.dtype, tuple(value.shape), value.stride(), value.storage_offset(), value.untyped_storage().nbytes())
    if isinstance(value, (tuple, list)):
        return type(value).__name__, [_described(item) for item in value]
    return value


CALLS = [
    (aten.mul.Tensor, lambda: ((_meta(4, 1, 3), _meta(5, 1)), {})),
    (aten.add.Tensor, lambda: ((_meta(8, 16), _meta(16)), {"alpha": 2})),
    (aten.add.Tensor, lambda: ((_meta(8, 16, dtype=torch.bfloat16), _meta(16)), {})),  # type promotion
    (aten.mm.default, lambda: ((_meta(8, 16), _meta(16, 4)), {})),
    (aten.mm.default, lambda: ((_meta(16, 8).t(), _meta(16, 4)), {})),  # a transposed input
    (aten.sum.dim_IntList, lambda: ((_meta(3, 5, 7), [1]), {"keepdim": True})),
    (aten.zeros_like.default, lambda: ((_meta(6, 4).t(),), {})),  # keeps the input's layout
    (aten.cat.default, lambda: (([_meta(2, 3), _meta(4, 3)],), {})),
    (aten.native_layer_norm.default, lambda: ((_meta(2, 5, 8), [8], _meta(8), _meta(8), 1e-5), {})),  # three outputs
    (aten.var_mean.correction, lambda: ((_meta(4, 6), [1]), {"correction": 1})),
    (aten._to_copy.default, lambda: ((_meta(3, 4),), {"dtype": torch.bfloat16})),
]


@pytest.mark.parametrize(("op", "arguments"), CALLS, ids=[f"{op}-{index}" for index, (op, _) in enumerate(CALLS)])
def test_a_call_answered_from_the_cache_is_what_the_kernel_returns(op, arguments) -> None:
    cache = MetaOpCache()
    args, kwargs = arguments()
    first = cache.call(op, args, kwargs)
    again = cache.call(op, *arguments())
    assert (cache.hits, cache.misses) == (1, 1)
    assert _described(again) == _described(first) == _described(op(*args, **kwargs))
    leaves = again if isinstance(again, (tuple, list)) else [again]
    storages = [leaf.untyped_storage()._cdata for leaf in leaves if isinstance(leaf, torch.Tensor)]
    assert len(set(storages)) == len(storages)  # each output its own storage, as the kernel makes them


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.lists(st.integers(1, 4), min_size=1, max_size=4),
       st.sampled_from([aten.mul.Tensor, aten.add.Tensor, aten.div.Tensor, aten.maximum.default]),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_broadcasting_calls_from_the_cache_equal_the_kernel(left, right, op, dtype) -> None:
    a, b = _meta(*left), _meta(*right, dtype=dtype)
    try:
        expected = op(a, b)
    except RuntimeError:  # shapes that do not broadcast: the kernel's error, from the cache too
        with pytest.raises(RuntimeError):
            MetaOpCache().call(op, (a, b), {})
        return
    cache = MetaOpCache()
    cache.call(op, (a, b), {})
    assert _described(cache.call(op, (_meta(*left), _meta(*right, dtype=dtype)), {})) == _described(expected) and cache.hits == 1


def test_an_in_place_op_returns_its_input_and_an_out_argument_is_returned() -> None:
    cache = MetaOpCache()
    a, b = _meta(4, 3), _meta(3)
    assert cache.call(aten.mul_.Tensor, (a, b), {}) is a
    other = _meta(4, 3)
    assert cache.call(aten.mul_.Tensor, (other, _meta(3)), {}) is other and cache.hits == 1
    out = _meta(4, 3)
    assert cache.call(aten.add.out, (a, b), {"out": out}) is out
    out_again = _meta(4, 3)
    assert cache.call(aten.add.out, (_meta(4, 3), _meta(3)), {"out": out_again}) is out_again and cache.hits == 2


def test_an_in_place_foreach_update_of_meta_tensors_is_not_run() -> None:
    cache = MetaOpCache()
    tensors = [_meta(3, 2), _meta(5)]
    assert cache.call(aten._foreach_mul_.Scalar, (tensors, 0.5), {}) is None
    assert cache.hits == 1 and [tuple(t.shape) for t in tensors] == [(3, 2), (5,)]
    cpu = [torch.ones(2)]  # values: run
    assert cache.call(aten._foreach_mul_.Scalar, (cpu, 0.5), {}) is None and cpu[0].tolist() == [0.5, 0.5] and cache.passed == 1


def test_views_resizes_and_values_are_never_answered_from_the_cache() -> None:
    cache = MetaOpCache()
    base = _meta(4, 6)
    views = [cache.call(aten.view.default, (base, [6, 4]), {}) for _ in range(2)]
    assert all(view.untyped_storage()._cdata == base.untyped_storage()._cdata for view in views) and cache.hits == 0
    grown = _meta(2)
    for size in (3, 5):  # resize_ changes its input: each call runs the kernel
        assert tuple(cache.call(aten.resize_.default, (grown, [size]), {}).shape) == (size,)
    cpu = torch.tensor([1.0, 2.0])
    assert [cache.call(aten.mul.Tensor, (cpu, cpu), {}).tolist() for _ in range(2)] == [[1.0, 4.0]] * 2
    assert cache.hits == 0


def test_the_cache_starts_afresh_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_op_cache, "MAX_ENTRIES", 2)
    cache = MetaOpCache()
    for size in (1, 2, 3):
        cache.call(aten.neg.default, (_meta(size),), {})
    assert len(cache.entries) == 1 and cache.misses == 3


class _NoCache(MetaOpCache):
    def call(self, func, args, kwargs):  # type: ignore[no-untyped-def]
        return func(*args, **kwargs)


def _small_hf_model(model_type: str, layers: int = 3) -> nn.Module:
    pytest.importorskip("transformers")
    from resacct.account.load.hf_models import build_hf_model
    from resacct.checks.hf import _small_spec

    spec = _small_spec(model_type, 64, layers, 4, 2 if model_type != "gpt2" else 4, 96, 160, 128, 4 if model_type == "mixtral" else 0,
                       2 if model_type == "mixtral" else 0)
    return build_hf_model(spec, device="meta").train()


@pytest.mark.parametrize(("model_type", "dtype", "attention"), [
    ("resacct-gpt", torch.float32, None),  # no transformers: every torch admitted runs this one
    ("gpt2", torch.float32, "efficient"),
    ("llama", torch.bfloat16, "flash"),
    pytest.param("mixtral", torch.float32, "efficient", marks=pytest.mark.slow),
])
def test_the_cuda_allocator_pass_predicts_the_same_with_and_without_the_cache(model_type, dtype, attention, monkeypatch) -> None:
    from resacct.account.gpu.tracing.cuda_step import cuda_adamw, predict_cuda_step_memory
    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output

    if model_type == "resacct-gpt":
        from resacct.measurement.activation_checkpointing import gpt_loss
        from resacct.training.gpt import build_gpt, get_gpt_config

        model = build_gpt(get_gpt_config("gpt-nano"), device="meta", seed=None)
        tokens = torch.zeros(2, 16, dtype=torch.long)
        inputs, loss = (tokens, tokens), lambda module, batch: gpt_loss(module, *batch)
    else:
        model = _small_hf_model(model_type).to(dtype)
        inputs = default_inputs(model, batch=2, seq=16, device="meta")
        loss = lambda module, batch: loss_of_output(call_model(module, batch), "model")  # noqa: E731
    made: list[MetaOpCache] = []
    monkeypatch.setattr(allocation_trace, "shared_meta_cache", lambda: made[0] if made else made.append(MetaOpCache()) or made[0])
    cached = predict_cuda_step_memory(model, inputs, loss, cuda_adamw, attention=attention)
    assert made[0].hits > made[0].misses > 0  # the layers' calls were answered from the cache
    misses = made[0].misses
    assert predict_cuda_step_memory(model, inputs, loss, cuda_adamw, attention=attention) == cached  # a second pass, the process's cache warm
    assert made[0].misses == misses  # every call answered by what the first pass made
    monkeypatch.setattr(allocation_trace, "shared_meta_cache", _NoCache)
    assert cached == predict_cuda_step_memory(model, inputs, loss, cuda_adamw, attention=attention)


def test_the_meta_pass_measures_the_same_with_and_without_the_cache(monkeypatch) -> None:
    import contextlib

    from resacct.account.load.model_io import call_model, default_inputs, loss_of_output
    from resacct.account.trace import step_measurements
    from resacct.measurement.meta_op_cache import meta_calls_cached

    model = _small_hf_model("llama")
    inputs = default_inputs(model, batch=2, seq=16, device="meta")
    loss = lambda module: loss_of_output(call_model(module, inputs), "model")  # noqa: E731
    modes: list = []
    monkeypatch.setattr(step_measurements, "meta_calls_cached", lambda *things: modes.append(meta_calls_cached(*things)) or modes[-1])
    hits_before = meta_op_cache.shared_meta_cache().hits
    cached = step_measurements.measure_step_once(model, loss, "bf16-fp32-master")
    assert isinstance(modes[0], MetaOpCacheMode) and meta_op_cache.shared_meta_cache().hits > hits_before  # the pass used the cache
    monkeypatch.setattr(step_measurements, "meta_calls_cached", lambda *things: contextlib.nullcontext())
    uncached = step_measurements.measure_step_once(model, loss, "bf16-fp32-master")
    assert cached.flops == uncached.flops and cached.state == uncached.state
    assert cached.saved.entries == uncached.saved.entries and cached.saved.activation_bytes == uncached.saved.activation_bytes > 0


def test_a_mode_below_the_cache_sees_every_op_itself() -> None:
    """Answered from the cache, an op would reach a dispatch mode entered before the pass as
    ``empty_strided``: under such a mode every call runs its kernel (and that mode sees the op)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    a, b = _meta(4, 8), _meta(8, 2)
    with Seen() as below, MetaOpCacheMode() as cached:
        for _ in range(3):
            torch.mm(a, b)
    assert below.ops == ["aten.mm.default"] * 3 and cached.cache.hits == 0
    with MetaOpCacheMode() as cached, Seen() as above:
        for _ in range(3):
            torch.mm(a, b)
    assert above.ops == ["aten.mm.default"] * 3 and cached.cache.hits == 2


def test_the_default_dtype_is_part_of_the_key() -> None:
    """A factory op without a dtype takes the default dtype: the same call under another default is another call."""
    cache = MetaOpCache()
    made = cache.call(aten.empty.memory_format, ([3],), {"device": torch.device("meta")})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        again = cache.call(aten.empty.memory_format, ([3],), {"device": torch.device("meta")})
    finally:
        torch.set_default_dtype(previous)
    assert (made.dtype, again.dtype) == (torch.float32, torch.float64) and cache.hits == 0


def test_the_process_cache_is_shared_and_used_only_on_meta() -> None:
    from resacct.measurement.meta_op_cache import meta_calls_cached, shared_meta_cache

    assert shared_meta_cache() is shared_meta_cache()
    on_meta, on_cpu = nn.Linear(4, 4, device="meta"), nn.Linear(4, 4)
    with meta_calls_cached(on_cpu, _meta(2)) as mode:
        assert isinstance(mode, MetaOpCacheMode) and mode.cache is shared_meta_cache()
    with meta_calls_cached(on_meta) as mode:
        assert isinstance(mode, MetaOpCacheMode)
    with meta_calls_cached(on_cpu, torch.ones(2)) as mode:
        assert mode is None  # nullcontext: nothing on meta


def test_the_kv_cache_counted_on_meta_is_the_same_with_and_without_the_cache(monkeypatch) -> None:
    import contextlib

    from resacct.account.load import meta_facts

    model = _small_hf_model("llama")
    cached = meta_facts.model_kv_cache_elements(model, 24)
    monkeypatch.setattr(meta_facts, "meta_calls_cached", lambda *things: contextlib.nullcontext())
    assert cached == meta_facts.model_kv_cache_elements(model, 24) == 3 * 2 * 24 * 2 * (64 // 4)  # layers · (k, v) · tokens · kv heads · head size
