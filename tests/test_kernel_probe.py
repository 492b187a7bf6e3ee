"""oneDNN's matmul scratchpad, measured once per matmul on this CPU (resacct.measurement.kernel_probe):
the probe's answer on fake operands equals what the CPU allocator holds above the output while the
real op runs, measured here by torch.profiler's own recording — on whatever CPU runs the test (AMX
and AVX-512 BF16: a scratchpad; oneDNN's AVX-512 emulation: an fp32 accumulator; AVX2: none)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from resacct.measurement import kernel_probe
from resacct.measurement.memory_timeline import allocator_recording

MATMULS = [
    ("aten.mm.default", lambda d: (torch.empty(16, 64, dtype=d), torch.empty(64, 256, dtype=d))),
    ("aten.mm.default", lambda d: (torch.empty(64, 512, dtype=d), torch.empty(128, 512, dtype=d).t())),
    ("aten.addmm.default", lambda d: (torch.empty(256, dtype=d), torch.empty(32, 64, dtype=d), torch.empty(256, 64, dtype=d).t())),
    ("aten.bmm.default", lambda d: (torch.empty(4, 16, 32, dtype=d), torch.empty(4, 32, 16, dtype=d))),
]


def _allocator_transient_bytes(func, args) -> int:
    """The most bytes the CPU allocator held above what ``func(*args)`` leaves (its output)."""
    with allocator_recording() as (_, events):
        out = func(*args)
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    held = most = 0
    for event in memory:
        held += event.nbytes()
        most = max(most, held)
    del out
    return most - held


def _op(name: str):
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


@pytest.mark.slow  # the first probe pays oneDNN's and the profiler's start (about 2 s)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("name", "make"), MATMULS, ids=[f"{name}-{i}" for i, (name, _) in enumerate(MATMULS)])
def test_the_probe_on_fake_operands_equals_the_allocator_on_real_ones(name, make, dtype):
    func = _op(name)
    with FakeTensorMode():
        fake = make(dtype)
        predicted = kernel_probe.matmul_scratchpad_bytes(func, fake, {})
    measured = _allocator_transient_bytes(func, make(dtype))
    assert predicted == measured
    if not kernel_probe.onednn_matmuls(str(dtype).removeprefix("torch.")):
        assert predicted == 0  # no oneDNN path for this dtype here: nothing to probe


def test_float32_and_other_ops_are_never_probed():
    before = kernel_probe.probe_counts()
    assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, (torch.empty(4, 4), torch.empty(4, 4)), {}) == 0
    assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.add.Tensor, (torch.empty(4, dtype=torch.bfloat16),) * 2, {}) == 0
    assert kernel_probe.probe_counts() == before


def test_a_matmul_too_large_to_probe_is_none_and_counted(monkeypatch):
    monkeypatch.setattr(kernel_probe, "onednn_matmuls", lambda dtype: True)  # as on a CPU with bf16 units
    before = kernel_probe.probe_counts()["too large"]
    with FakeTensorMode():  # 2·8192·8192·8192 FLOPs, 384 MiB of operands: never run
        args = (torch.empty(8192, 8192, dtype=torch.bfloat16), torch.empty(8192, 8192, dtype=torch.bfloat16))
        assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, args, {}) is None
    assert kernel_probe.probe_counts()["too large"] == before + 1


def test_no_probe_runs_inside_another_profilers_record(monkeypatch):
    monkeypatch.setattr(kernel_probe, "onednn_matmuls", lambda dtype: True)
    args = (torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(5, 7, dtype=torch.bfloat16))
    with allocator_recording():
        assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, args, {}) is None


def test_a_torch_whose_profiler_calls_differ_leaves_the_matmul_unprobed_not_the_prediction_broken(monkeypatch):
    monkeypatch.setattr(kernel_probe, "onednn_matmuls", lambda dtype: True)

    def differs(*args):
        raise TypeError("ProfilerConfig(): incompatible constructor arguments")

    monkeypatch.setattr(kernel_probe, "_probe", differs)
    args = (torch.empty(3, 11, dtype=torch.bfloat16), torch.empty(11, 13, dtype=torch.bfloat16))
    before = kernel_probe.probe_counts()["too large"]
    assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, args, {}) is None
    assert kernel_probe.probe_counts()["too large"] == before + 1


def test_where_onednn_emulates_bf16_a_matmul_too_large_to_probe_gets_its_fp32_accumulator(monkeypatch):
    monkeypatch.setattr(kernel_probe, "onednn_matmuls", lambda dtype: True)
    monkeypatch.setattr(kernel_probe, "emulated_bf16", lambda: True)
    before = kernel_probe.probe_counts()
    with FakeTensorMode():
        big = (torch.empty(8192, 8192, dtype=torch.bfloat16), torch.empty(8192, 4096, dtype=torch.bfloat16))
        assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.mm.default, big, {}) == 8192 * 4096 * 4 + 128
        batched = (torch.empty(64, 2048, 2048, dtype=torch.bfloat16), torch.empty(64, 2048, 2048, dtype=torch.bfloat16))
        assert kernel_probe.matmul_scratchpad_bytes(torch.ops.aten.bmm.default, batched, {}) is None  # not measured: left out
    after = kernel_probe.probe_counts()
    assert (after["estimated"] - before["estimated"], after["too large"] - before["too large"]) == (1, 1)


_EMULATED = """
import json, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from resacct.measurement import kernel_probe as kp
rows = []
for m, k, n in [(16, 64, 256), (512, 1024, 4096)]:
    with FakeTensorMode():
        args = (torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16))
        rows.append([kp.matmul_scratchpad_bytes(torch.ops.aten.mm.default, args, {}), kp.fp32_accumulator_bytes(list(args))])
print(json.dumps({"emulated": kp.emulated_bf16(), "rows": rows}))
"""


@pytest.mark.slow
def test_the_fp32_accumulator_is_what_emulated_bf16_matmuls_allocate_on_this_cpu():
    """Under ONEDNN_MAX_CPU_ISA=AVX512_CORE (a CPU with AVX-512 but no bf16 units), the probe of a
    real bf16 mm equals m·n·4 + 128 — the estimate used where a matmul is too large to probe."""
    import json
    import os
    import subprocess
    import sys

    from resacct.measurement.machine_profile import this_machine

    if this_machine().cpu_bf16_matmul not in ("amx", "avx512_bf16", "emulated"):
        pytest.skip(f"oneDNN cannot emulate bf16 here (bf16 matmul: {this_machine().cpu_bf16_matmul}; it needs AVX-512)")
    done = subprocess.run([sys.executable, "-c", _EMULATED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["emulated"] is True
    assert all(probed == estimated for probed, estimated in answer["rows"]), answer["rows"]
