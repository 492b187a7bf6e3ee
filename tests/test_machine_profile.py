"""The machine profile: detection on Linux x86, Linux ARM, macOS and Windows from faked inputs,
the oneDNN / ATen caps honoured, the fake-machine override, and ``resacct machine``."""

from __future__ import annotations

import json

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.measurement import machine_profile
from resacct.measurement.machine_profile import (
    DetectionInputs,
    GpuProfile,
    condition_holds,
    condition_value_problem,
    profile_from,
    unmet_conditions,
)

SAPPHIRE_RAPIDS = """processor : 0
vendor_id : GenuineIntel
model name : Intel(R) Xeon(R) Platinum 8480+
physical id : 0
core id : 0
flags : fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16
processor : 1
physical id : 0
core id : 0
processor : 2
physical id : 0
core id : 1
"""
ZEN5 = """vendor_id : AuthenticAMD
model name : AMD EPYC 9B45 128-Core Processor
flags : fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16
"""
SKYLAKE = """vendor_id : GenuineIntel
model name : Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags : fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl
"""
HASWELL = """vendor_id : GenuineIntel
model name : Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz
flags : fpu sse2 avx avx2 fma
"""
GRAVITON3 = """processor : 0
BogoMIPS : 2100.00
Features : fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve bf16 i8mm
CPU implementer : 0x41
CPU part : 0xd40
"""
GRAVITON2 = """processor : 0
Features : fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer : 0x41
CPU part : 0xd0c
"""


def linux_x86(cpuinfo: str, **extra) -> DetectionInputs:
    fields = {"torch_cpu_capability": "AVX512", "torch_threads": 4, "logical_cores": 4, "load_average": 0.5, **extra}
    return DetectionInputs(system="Linux", machine="x86_64", cpuinfo_text=cpuinfo, **fields)


@pytest.mark.parametrize(
    ("inputs", "bf16_matmul", "bf16_units", "amx", "vendor"),
    [
        (linux_x86(SAPPHIRE_RAPIDS), "amx", True, True, "intel"),
        (linux_x86(ZEN5), "avx512_bf16", True, False, "amd"),
        (linux_x86(SKYLAKE), "emulated", False, False, "intel"),
        (linux_x86(HASWELL), "converted", False, False, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"}), "converted", False, False, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}), "avx512_bf16", True, False, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, environ={"DNNL_MAX_CPU_ISA": "AVX512_CORE"}), "emulated", False, False, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "AVX10_1_512_AMX"}), "amx", True, True, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "ALL"}), "amx", True, True, "intel"),
        (linux_x86(SAPPHIRE_RAPIDS, mkldnn_bf16_supported=False), "converted", False, True, "intel"),  # torch says no: no oneDNN path
        (DetectionInputs(system="Linux", machine="aarch64", cpuinfo_text=GRAVITON3), "arm_bf16", True, False, "arm"),
        (DetectionInputs(system="Linux", machine="aarch64", cpuinfo_text=GRAVITON2), "converted", False, False, "arm"),
        (DetectionInputs(system="Darwin", machine="arm64", sysctl={"machdep.cpu.brand_string": "Apple M2 Pro", "hw.optional.arm.FEAT_BF16": "1",
                                                                    "hw.optional.arm.FEAT_FP16": "1", "hw.physicalcpu": "10"}),
         "arm_bf16", True, False, "apple"),
        (DetectionInputs(system="Darwin", machine="arm64", sysctl={"machdep.cpu.brand_string": "Apple M1", "hw.optional.arm.FEAT_BF16": "0"}),
         "converted", False, False, "apple"),
        (DetectionInputs(system="Darwin", machine="x86_64", sysctl={"machdep.cpu.brand_string": "Intel(R) Core(TM) i9-9880H",
                                                                     "machdep.cpu.features": "FPU SSE2 AVX1.0"}),
         "converted", False, False, "intel"),
        # Windows: no /proc, no sysctl: torch's own cpuinfo queries are the flags
        (DetectionInputs(system="Windows", machine="AMD64", processor="Intel64 Family 6 Model 143 Stepping 8, GenuineIntel",
                         torch_flags=frozenset({"avx512_bf16", "amx_tile"})), "converted", False, True, "intel"),
    ],
    ids=["spr-amx", "zen5", "skylake", "haswell", "spr-capped-avx2", "spr-capped-avx512-bf16", "spr-dnnl-avx512-core", "avx10-alias",
         "cap-all", "torch-says-no", "graviton3", "graviton2", "mac-m2", "mac-m1", "mac-intel", "windows"],
)
def test_detection_from_faked_inputs(inputs, bf16_matmul, bf16_units, amx, vendor):
    profile = profile_from(inputs)
    assert (profile.cpu_bf16_matmul, profile.cpu_bf16_units, profile.cpu_amx_units, profile.cpu_vendor) == (bf16_matmul, bf16_units, amx, vendor)


def test_the_profile_names_the_model_cores_os_and_cap():
    profile = profile_from(linux_x86(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"}))
    assert profile.cpu_model == "Intel(R) Xeon(R) Platinum 8480+" and profile.physical_cores == 2 and profile.logical_cores == 4
    assert (profile.os, profile.architecture, profile.cpu_isa, profile.onednn_max_isa) == ("linux", "x86_64", "avx512", "AVX2")
    assert profile.cpu_flags_bf16 is True and profile.cpu_bf16_units is False  # the chip has them; the cap hides them
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in profile.summary() and "bf16 matmul: converted" in profile.summary()
    mac = profile_from(DetectionInputs(system="Darwin", machine="arm64", sysctl={"machdep.cpu.brand_string": "Apple M2", "hw.physicalcpu": "8"}))
    assert (mac.cpu_model, mac.physical_cores, mac.os, mac.architecture) == ("Apple M2", 8, "darwin", "arm64")
    graviton = profile_from(DetectionInputs(system="Linux", machine="aarch64", cpuinfo_text=GRAVITON3, logical_cores=4))
    assert graviton.cpu_model == "Arm implementer 0x41 part 0xd40" and graviton.cpu_fp16_units is True


def test_aten_capability_is_reported_as_torch_says():
    assert profile_from(linux_x86(HASWELL, torch_cpu_capability="AVX2")).cpu_isa == "avx2"
    assert profile_from(linux_x86(HASWELL, torch_cpu_capability="DEFAULT")).cpu_isa == "default"
    assert profile_from(linux_x86(HASWELL, torch_cpu_capability="SOMETHING NEW")).cpu_isa == "other"


def test_a_gpu_is_part_of_the_profile():
    gpu = GpuProfile(name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_bytes=85_520_809_984, driver="CUDA driver 12.8")
    profile = profile_from(linux_x86(SAPPHIRE_RAPIDS, gpu=gpu))
    assert profile.gpu and profile.gpu_compute_capability == "9.0" and profile.gpu_memory_bytes == 85_520_809_984
    assert "GPU NVIDIA H100 80GB HBM3 (sm 9.0, 80 GiB)" in profile.summary()


def test_this_machine_is_read_for_real():
    import torch

    profile = machine_profile.this_machine()
    assert profile.torch_threads >= 1 and profile.physical_cores >= 1 and profile.cpu_model
    assert profile.cpu_isa == torch.backends.cpu.get_cpu_capability().lower() or profile.cpu_isa == "other"
    assert profile.gpu == torch.cuda.is_available()


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("cpu_bf16_unitz", True, "unknown machine field 'cpu_bf16_unitz'"),
        ("cpu_bf16_units", "no", "cpu_bf16_units: expected true or false, got 'no'"),
        ("cpu_bf16_matmul", "tiles", "expected one of converted, emulated, avx512_bf16, amx, arm_bf16"),
        ("cpu_bf16_matmul", [], "an empty list matches no machine"),
        ("torch_threads", {"at_leest": 2}, "a range takes at_least and/or at_most"),
        ("torch_threads", -1, "expected a whole number ≥ 0"),
        ("torch_threads", True, "expected a whole number ≥ 0"),
    ],
)
def test_a_bad_condition_says_what_is_allowed(key, value, problem):
    assert problem in condition_value_problem(key, value)


def test_conditions_match_values_lists_and_ranges():
    profile = profile_from(linux_x86(SAPPHIRE_RAPIDS))
    assert condition_holds(profile, "cpu_bf16_matmul", ["amx", "avx512_bf16"]) and not condition_holds(profile, "cpu_bf16_units", False)
    assert condition_holds(profile, "torch_threads", {"at_least": 2, "at_most": 8}) and not condition_holds(profile, "torch_threads", {"at_least": 8})
    assert unmet_conditions(profile, {"cpu_bf16_matmul": ["converted", "emulated"], "os": "linux"}) == [
        "cpu_bf16_matmul in [converted, emulated] (this machine: amx)"]


def test_a_faked_machine_says_so_and_refuses_nonsense(monkeypatch):
    machine_profile.this_machine.cache_clear()
    try:
        monkeypatch.setenv(machine_profile.FAKE_MACHINE_VARIABLE, json.dumps({"cpu_bf16_matmul": "converted", "cpu_bf16_units": False}))
        profile = machine_profile.this_machine()
        assert profile.cpu_bf16_matmul == "converted" and profile.faked == ("cpu_bf16_matmul", "cpu_bf16_units")
        assert "FAKED: cpu_bf16_matmul, cpu_bf16_units" in profile.summary()
        for text, problem in (("{", "is not JSON"), ("[1]", "must be a JSON object"), ('{"cores": 2}', "unknown profile field 'cores'"),
                              ('{"torch_threads": "two"}', "torch_threads: expected a whole number"),
                              ('{"cpu_model": 5}', "cpu_model: expected str, got 5"),
                              ('{"cpu_bf16_units": true}', "cpu_bf16_units follows cpu_bf16_matmul; fake cpu_bf16_matmul instead"),
                              ('{"cpu_bf16_matmul": "converted", "cpu_bf16_units": true}', "contradicts cpu_bf16_matmul 'converted'")):
            machine_profile.this_machine.cache_clear()
            monkeypatch.setenv(machine_profile.FAKE_MACHINE_VARIABLE, text)
            with pytest.raises(ResacctError, match=problem):
                machine_profile.this_machine()
    finally:
        machine_profile.this_machine.cache_clear()


def test_faking_the_bf16_path_fakes_the_units_with_it(monkeypatch):
    """cpu_bf16_units is derived from cpu_bf16_matmul: a fake of the path alone cannot leave the
    units of the real machine behind (an AMX machine faked as 'converted' has no units)."""
    for path, units in (("converted", False), ("emulated", False), ("amx", True), ("avx512_bf16", True)):
        machine_profile.this_machine.cache_clear()
        try:
            monkeypatch.setenv(machine_profile.FAKE_MACHINE_VARIABLE, json.dumps({"cpu_bf16_matmul": path}))
            profile = machine_profile.this_machine()
            assert (profile.cpu_bf16_matmul, profile.cpu_bf16_units) == (path, units)
            assert profile.faked == ("cpu_bf16_matmul", "cpu_bf16_units")
        finally:
            machine_profile.this_machine.cache_clear()


def test_the_machine_command_prints_the_profile_and_json(capsys):
    assert main(["machine"]) == 0
    out = capsys.readouterr().out
    assert "bf16 matmul runs as" in out and "torch threads" in out and "when:" in out
    assert main(["machine", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    assert set(fields["condition_fields"]) >= {"cpu_bf16_units", "cpu_bf16_matmul", "torch_threads", "gpu", "os"}
    assert fields["machine"]["cpu_model"] == machine_profile.this_machine().cpu_model


def test_a_bad_fake_machine_is_one_line_and_exit_2(monkeypatch, capsys):
    machine_profile.this_machine.cache_clear()
    monkeypatch.setenv(machine_profile.FAKE_MACHINE_VARIABLE, '{"gpu": "yes"}')
    try:
        assert main(["machine"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("resacct machine: error: RESACCT_FAKE_MACHINE: gpu: expected true or false") and err.count("\n") == 1
    finally:
        machine_profile.this_machine.cache_clear()
