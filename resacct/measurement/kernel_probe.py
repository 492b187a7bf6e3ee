"""What a CPU matmul allocates inside itself on *this* CPU, measured by running it once: oneDNN's
scratchpad for 16-bit matmuls.

Where a CPU has bf16 (or fp16) matmul support in oneDNN — AMX or AVX-512 BF16 units, or oneDNN's
AVX-512 emulation — torch sends bf16/fp16 ``mm``/``addmm``/``bmm``/``baddbmm`` through oneDNN,
whose primitive allocates a scratchpad through the c10 CPU allocator while it runs and frees it
before returning. Its size comes from oneDNN's blocking heuristics for that CPU, shape, layout and
thread count: measured here on a 2-core Xeon with AMX (``benchmarks/onednn_scratchpad.py``),
18,048 to 136,192 bytes for small bf16 matmuls and 30,464 to 415,488 for fp16; under ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` (bf16 emulated) an fp32 accumulator of the
output, m·n·4 + 128 bytes; none on AVX2 (no oneDNN path). No formula covers every CPU, so the
prediction measures it: each distinct matmul (op, shapes, strides, dtypes, scalars, threads) runs
once for real on uninitialised tensors under the profiler's allocator record (torch's low-level
profiler calls: under 1 ms a probe), and the bytes it held above what it returns are kept (cached
for the process). A matmul over :data:`MAX_PROBE_BYTES` of operands or :data:`MAX_PROBE_FLOPS`
is not run: where oneDNN emulates bf16 (AVX-512 without bf16 units) an ``mm``/``addmm``'s
scratchpad is its fp32 accumulator, m·n·4 + 128 bytes (measured under
``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` from 16×64×256 to 4096×4096×4096, ``tests/test_kernel_probe.py``
checks it on every CPU that can emulate), counted as *estimated*; elsewhere the answer is None (the
caller says so) and the scratchpad stays unpredicted.

>>> import torch
>>> op = torch.ops.aten.mm.default
>>> matmul_scratchpad_bytes(op, (torch.empty(16, 64), torch.empty(64, 256)), {})   # float32: never probed
0
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

__all__ = ["PROBED_OPS", "MAX_PROBE_BYTES", "MAX_PROBE_FLOPS", "onednn_matmuls", "emulated_bf16", "fp32_accumulator_bytes", "matmul_scratchpad_bytes",
           "probe_counts"]

#: The matmul ops torch's CPU kernels send to oneDNN for 16-bit operands.
PROBED_OPS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"})
#: The most bytes (operands and output) and FLOPs a probe may cost; larger matmuls are not run.
MAX_PROBE_BYTES = 256 * 2**20
MAX_PROBE_FLOPS = 2e10
_SIXTEEN_BIT = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_probes = {"run": 0, "too large": 0, "cached": 0, "estimated": 0}  # "too large": not probed (too large, or this torch's profiler calls differ)
#: Where oneDNN emulates bf16, these ops' scratchpad is an fp32 accumulator of the output (m·n·4 + 128 bytes).
_ACCUMULATOR_OPS = frozenset({"aten.mm.default", "aten.addmm.default"})
ACCUMULATOR_EXTRA_BYTES = 128
_measured: dict[tuple, int] = {}  # signature -> bytes (this process)


def probe_counts() -> dict[str, int]:
    """How many matmuls were probed, found too large to probe, estimated (emulated bf16's fp32
    accumulator) or answered from the cache (this process)."""
    return dict(_probes)


@functools.cache
def onednn_matmuls(dtype: str) -> bool:
    """Whether this CPU's ``dtype`` ("bfloat16", "float16") matmuls go through oneDNN."""
    try:
        check = torch.ops.mkldnn._is_mkldnn_bf16_supported if dtype == "bfloat16" else torch.ops.mkldnn._is_mkldnn_fp16_supported
        return bool(torch.backends.mkldnn.is_available() and check())
    except (AttributeError, RuntimeError):
        return False


def matmul_scratchpad_bytes(func: Any, args: Any, kwargs: Any) -> int | None:
    """Bytes ``func`` (an aten matmul overload) allocates and frees inside itself on this CPU for
    operands shaped as ``args`` (real or fake tensors): 0 when it cannot go through oneDNN (not a
    :data:`PROBED_OPS` op, not 16-bit, no oneDNN path for the dtype), the fp32 accumulator when too
    large to probe where oneDNN emulates bf16 (``mm``/``addmm``), None when too large otherwise or
    when a profiler is already recording (a probe would land in its record)."""
    if str(func) not in PROBED_OPS:
        return 0
    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    dtype = _SIXTEEN_BIT.get(tensors[0].dtype) if tensors else None
    if dtype is None or any(tensor.dtype != tensors[0].dtype or tensor.device.type != "cpu" for tensor in tensors) or not onednn_matmuls(dtype):
        return 0
    key = (str(func), tuple(_signature(value) for value in args), tuple(sorted((k, _signature(v)) for k, v in kwargs.items())),
           torch.get_num_threads())
    if key in _measured:
        _probes["cached"] += 1
        return _measured[key]
    output_bytes = _output_bytes(tensors)
    if sum(tensor.numel() * tensor.element_size() for tensor in tensors) + output_bytes > MAX_PROBE_BYTES or _flops(tensors) > MAX_PROBE_FLOPS:
        if dtype == "bfloat16" and str(func) in _ACCUMULATOR_OPS and emulated_bf16():
            _probes["estimated"] += 1
            return fp32_accumulator_bytes(tensors)
        _probes["too large"] += 1
        return None
    if torch._C._autograd._profiler_enabled():
        return None
    try:
        _measured[key] = _probe(func, args, kwargs)
    except (AttributeError, TypeError, RuntimeError):  # a torch whose low-level profiler calls differ: unprobed, said so
        _probes["too large"] += 1
        return None
    _probes["run"] += 1
    return _measured[key]



@functools.cache
def emulated_bf16() -> bool:
    """Whether this CPU's oneDNN emulates bf16 matmuls (AVX-512 without bf16 units, or capped to
    AVX512_CORE): the real hardware's answer, not a faked profile's."""
    from resacct.measurement.machine_profile import gather_detection_inputs, profile_from

    try:
        return profile_from(gather_detection_inputs()).cpu_bf16_matmul == "emulated"
    except (OSError, ValueError, RuntimeError):
        return False


def fp32_accumulator_bytes(tensors: list[torch.Tensor]) -> int:
    """An ``mm``/``addmm``'s fp32 accumulator where oneDNN emulates bf16: m·n·4 + 128 bytes."""
    left, right = tensors[-2], tensors[-1]
    return left.shape[0] * right.shape[-1] * 4 + ACCUMULATOR_EXTRA_BYTES


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), tuple(value.stride()), str(value.dtype))
    return repr(value)


def _output_bytes(tensors: list[torch.Tensor]) -> int:
    left, right = tensors[-2], tensors[-1]
    rows = left.shape[:-1].numel()
    return rows * right.shape[-1] * left.element_size()


def _flops(tensors: list[torch.Tensor]) -> float:
    left, right = tensors[-2], tensors[-1]
    return 2.0 * left.numel() * right.shape[-1]


def _probe(func: Any, args: Any, kwargs: Any) -> int:
    """Run ``func`` once on real, uninitialised tensors of ``args``' layouts; the most bytes the
    allocator held above its end (the output stays, the scratchpad is gone)."""
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig
    from torch.utils._python_dispatch import _disable_current_modes

    from resacct.measurement.native_stderr import kineto_start_stop_lines_dropped

    config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
    with _disable_current_modes(), _unfaked():
        real = [torch.empty_strided(value.shape, value.stride(), dtype=value.dtype) if isinstance(value, torch.Tensor) else value for value in args]
        with kineto_start_stop_lines_dropped():  # kineto's "profiler_start" line on file descriptor 2, nothing else
            torch.autograd._prepare_profiler(config, {ProfilerActivity.CPU})
            torch.autograd._enable_profiler(config, {ProfilerActivity.CPU})
        try:
            with torch.no_grad():
                out = func(*real, **kwargs)
        finally:
            with kineto_start_stop_lines_dropped():
                result = torch.autograd._disable_profiler()
        del out, real
    held = most = 0
    for event in sorted((e for e in result.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        held += event.nbytes()
        most = max(most, held)
    return most - held


def _unfaked() -> Any:
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    return unset_fake_temporarily()
