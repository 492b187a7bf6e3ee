"""The machine a claim runs on, measured once per run: one typed profile.

A claim whose truth depends on the hardware (bf16 units, ISA, threads, GPU or not, OS) declares
that in its spec (``when: {cpu_bf16_units: false}``) and is decided against this profile. The
profile is what torch and oneDNN will *actually use*, not what the chip could do:
``ONEDNN_MAX_CPU_ISA`` (or its old name ``DNNL_MAX_CPU_ISA``) caps oneDNN's kernels and
``ATEN_CPU_CAPABILITY`` caps ATen's, so ``ONEDNN_MAX_CPU_ISA=AVX2`` makes a CPU with AMX compute
bf16 matmuls through conversions, and its profile says so.

Detection is a pure function of :class:`DetectionInputs` (``/proc/cpuinfo`` text, macOS
``sysctl`` values, the environment, torch's own CPU queries), so Linux x86, Linux ARM and macOS
are all tested on any machine by faking those inputs:

>>> inputs = DetectionInputs(system="Linux", machine="x86_64", environ={"ONEDNN_MAX_CPU_ISA": "AVX2"},
...     cpuinfo_text="model name : Example CPU\\nflags : avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile\\n",
...     torch_cpu_capability="AVX512", torch_threads=2, logical_cores=2)
>>> profile = profile_from(inputs)
>>> profile.cpu_bf16_matmul, profile.cpu_bf16_units, profile.cpu_flags_bf16
('converted', False, True)

``RESACCT_FAKE_MACHINE`` (a JSON object of profile fields) overrides the detected values, for
testing the other kind of machine's claims; a faked profile says so in every report.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError
from resacct.measurement.machine_conditions import (
    BF16_MATMUL_PATHS,
    CONDITION_FIELDS,
    bf16_units_for,
    condition_holds,
    condition_text,
    condition_value_problem,
    unmet_conditions,
    with_derived_bf16_units,
)

__all__ = ["DetectionInputs", "GpuProfile", "MachineProfile", "condition_value_problem", "condition_holds", "unmet_conditions", "load_average_now", "CONDITION_FIELDS", "BF16_MATMUL_PATHS", "ONEDNN_ISA_LEVELS",
           "FAKE_MACHINE_VARIABLE", "gather_detection_inputs", "profile_from", "this_machine", "condition_text"]

FAKE_MACHINE_VARIABLE = "RESACCT_FAKE_MACHINE"

#: oneDNN's ISA names from least to most capable (``ONEDNN_MAX_CPU_ISA`` takes one of them;
#: ``ALL``/``DEFAULT`` mean no cap). Aliases of the AVX10 era map to their AVX-512 names.
ONEDNN_ISA_LEVELS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                     "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16")
_ONEDNN_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                   "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16", "AVX512_MIC": "AVX2", "AVX512_MIC_4OPS": "AVX2"}

_AVX512_CORE_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


@dataclass(frozen=True)
class GpuProfile:
    name: str
    compute_capability: str
    memory_bytes: int
    driver: str


@dataclass(frozen=True)
class DetectionInputs:
    """What detection reads, gathered by :func:`gather_detection_inputs` or faked in tests."""

    system: str  # platform.system(): Linux, Darwin, Windows
    machine: str  # platform.machine(): x86_64, AMD64, aarch64, arm64
    cpuinfo_text: str = ""  # /proc/cpuinfo ('' where there is none)
    sysctl: Mapping[str, str] = field(default_factory=dict)  # macOS: machdep.cpu.brand_string, hw.optional.arm.FEAT_BF16, …
    environ: Mapping[str, str] = field(default_factory=dict)
    torch_cpu_capability: str = "DEFAULT"  # torch.backends.cpu.get_cpu_capability(): honours ATEN_CPU_CAPABILITY
    torch_flags: frozenset[str] = frozenset()  # torch's own cpuinfo queries that said yes (avx512_bf16, amx_tile, amx_fp16 …)
    mkldnn_bf16_supported: bool | None = None  # torch.ops.mkldnn._is_mkldnn_bf16_supported(): honours ONEDNN_MAX_CPU_ISA
    torch_threads: int = 1
    logical_cores: int = 1
    load_average: float | None = None  # 1-minute load average now
    processor: str = ""  # platform.processor(), the last resort for a model name
    gpu: GpuProfile | None = None


@dataclass(frozen=True)
class MachineProfile:
    """One machine as torch will use it. Fields named in :data:`CONDITION_FIELDS` may be used in
    a claim's ``when:``."""

    os: str  # linux, darwin, windows
    architecture: str  # x86_64, arm64
    cpu_vendor: str  # intel, amd, apple, arm, unknown
    cpu_model: str
    cpu_isa: str  # the vector ISA ATen dispatches to: avx512, avx2, default, sve256, …
    onednn_max_isa: str  # the cap set by ONEDNN_MAX_CPU_ISA ('' = none)
    cpu_flags_bf16: bool  # the chip has bf16 instructions, whether or not a cap hides them
    cpu_bf16_matmul: str  # one of BF16_MATMUL_PATHS
    cpu_bf16_units: bool  # bf16 instructions that torch's matmul uses (avx512_bf16, amx, arm_bf16)
    cpu_fp16_units: bool
    cpu_amx_units: bool
    physical_cores: int
    logical_cores: int
    torch_threads: int
    load_average_start: float | None
    gpu: bool
    gpu_name: str = ""
    gpu_compute_capability: str = ""
    gpu_memory_bytes: int = 0
    gpu_driver: str = ""
    faked: tuple[str, ...] = ()  # fields overridden by RESACCT_FAKE_MACHINE

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["faked"] = list(self.faked)
        return record

    def summary(self) -> str:
        """One line: ``Intel(R) Xeon(R) … · x86_64 linux · ISA avx512 · bf16 matmul: amx · 2 cores, 2 torch threads · load 0.4``."""
        load = "?" if self.load_average_start is None else f"{self.load_average_start:.1f}"
        cap = f" (ONEDNN_MAX_CPU_ISA={self.onednn_max_isa})" if self.onednn_max_isa else ""
        gpu = f" · GPU {self.gpu_name} (sm {self.gpu_compute_capability}, {self.gpu_memory_bytes / 2**30:.0f} GiB)" if self.gpu else " · no GPU"
        faked = f" · FAKED: {', '.join(self.faked)}" if self.faked else ""
        return (f"{self.cpu_model} · {self.architecture} {self.os} · ISA {self.cpu_isa} · bf16 matmul: {self.cpu_bf16_matmul}{cap}"
                f" · {self.physical_cores} cores, {self.torch_threads} torch threads · load {load}{gpu}{faked}")


def _cpuinfo_fields(text: str) -> dict[str, str]:
    """The first value of each ``key : value`` line of /proc/cpuinfo (keys lower-cased)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip().lower() not in fields:
            fields[key.strip().lower()] = value.strip()
    return fields


def _physical_cores(text: str, sysctl: Mapping[str, str], logical: int) -> int:
    pairs, physical_id = set(), ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "physical id":
            physical_id = value.strip()
        elif key == "core id":
            pairs.add((physical_id, value.strip()))
    if pairs:
        return len(pairs)
    if sysctl.get("hw.physicalcpu", "").strip().isdigit():
        return int(sysctl["hw.physicalcpu"])
    return logical


def _onednn_cap(environ: Mapping[str, str]) -> str:
    raw = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if raw in ("", "ALL", "DEFAULT"):
        return ""
    return _ONEDNN_ALIASES.get(raw, raw)


def _allows(cap: str, level: str) -> bool:
    """Whether oneDNN capped at ``cap`` may still use ``level`` (an unknown cap name caps nothing:
    oneDNN ignores a value it does not know)."""
    if not cap or cap not in ONEDNN_ISA_LEVELS:
        return True
    return ONEDNN_ISA_LEVELS.index(cap) >= ONEDNN_ISA_LEVELS.index(level)


def _architecture(machine: str) -> str:
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if machine in ("aarch64", "arm64", "armv8", "armv9"):
        return "arm64"
    return "other"


def _vendor(cpuinfo: Mapping[str, str], model: str, architecture: str, system: str) -> str:
    vendor_id = cpuinfo.get("vendor_id", "")
    text = f"{vendor_id} {model}".lower()
    if "intel" in text:
        return "intel"
    if "amd" in text or "authenticamd" in text:
        return "amd"
    if "apple" in text or (system == "Darwin" and architecture == "arm64"):
        return "apple"
    if architecture == "arm64":
        return "arm"
    return "unknown"


def _x86_flags(inputs: DetectionInputs) -> set[str]:
    flags = set(_cpuinfo_fields(inputs.cpuinfo_text).get("flags", "").lower().split())
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):  # Intel Macs: AVX512BW AVX512DQ …
        flags |= {word.lower().replace(".", "_") for word in inputs.sysctl.get(key, "").split()}
    return flags | set(inputs.torch_flags)


def _arm_features(inputs: DetectionInputs) -> set[str]:
    features = set(_cpuinfo_fields(inputs.cpuinfo_text).get("features", "").lower().split())
    for key, feature in (("hw.optional.arm.FEAT_BF16", "bf16"), ("hw.optional.arm.FEAT_FP16", "asimdhp")):
        if inputs.sysctl.get(key, "").strip() == "1":
            features.add(feature)
    return features


def _cpu_isa(capability: str) -> str:
    name = capability.strip().lower().replace(" ", "_")
    return name if name in CONDITION_FIELDS["cpu_isa"] else "other"


def _model_name(inputs: DetectionInputs, cpuinfo: Mapping[str, str]) -> str:
    for key in ("model name", "hardware", "processor"):
        value = cpuinfo.get(key, "")
        if value and not value.isdigit():
            return value
    if inputs.sysctl.get("machdep.cpu.brand_string"):
        return inputs.sysctl["machdep.cpu.brand_string"].strip()
    if cpuinfo.get("cpu implementer"):
        return f"Arm implementer {cpuinfo['cpu implementer']} part {cpuinfo.get('cpu part', '?')}"
    return inputs.processor or inputs.machine or "unknown CPU"


def profile_from(inputs: DetectionInputs) -> MachineProfile:
    """The profile of the machine these inputs describe (pure: no I/O)."""
    cpuinfo = _cpuinfo_fields(inputs.cpuinfo_text)
    architecture = _architecture(inputs.machine)
    model = _model_name(inputs, cpuinfo)
    cap = _onednn_cap(inputs.environ)
    if architecture == "arm64":
        features = _arm_features(inputs)
        flags_bf16 = "bf16" in features
        bf16_path = "arm_bf16" if flags_bf16 else "converted"
        fp16_units = bool(features & {"asimdhp", "fphp"})
        amx_units = False
    else:
        flags = _x86_flags(inputs)
        flags_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
        if not _AVX512_CORE_FLAGS <= flags or not _allows(cap, "AVX512_CORE") or inputs.mkldnn_bf16_supported is False:
            bf16_path = "converted"
        elif "amx_bf16" in flags and _allows(cap, "AVX512_CORE_AMX"):
            bf16_path = "amx"
        elif "avx512_bf16" in flags and _allows(cap, "AVX512_CORE_BF16"):
            bf16_path = "avx512_bf16"
        else:
            bf16_path = "emulated"
        fp16_units = ("avx512_fp16" in flags and _allows(cap, "AVX512_CORE_FP16")) or ("amx_fp16" in flags and _allows(cap, "AVX512_CORE_AMX_FP16"))
        amx_units = bool(flags & {"amx_tile", "amx_bf16"}) and _allows(cap, "AVX512_CORE_AMX")
    system = inputs.system.lower()
    gpu = inputs.gpu
    return MachineProfile(
        os=system if system in ("linux", "darwin", "windows") else "other",
        architecture=architecture,
        cpu_vendor=_vendor(cpuinfo, model, architecture, inputs.system),
        cpu_model=model,
        cpu_isa=_cpu_isa(inputs.torch_cpu_capability),
        onednn_max_isa=cap,
        cpu_flags_bf16=flags_bf16,
        cpu_bf16_matmul=bf16_path,
        cpu_bf16_units=bf16_units_for(bf16_path),
        cpu_fp16_units=fp16_units,
        cpu_amx_units=amx_units,
        physical_cores=_physical_cores(inputs.cpuinfo_text, inputs.sysctl, inputs.logical_cores),
        logical_cores=inputs.logical_cores,
        torch_threads=inputs.torch_threads,
        load_average_start=inputs.load_average,
        gpu=gpu is not None,
        gpu_name=gpu.name if gpu else "",
        gpu_compute_capability=gpu.compute_capability if gpu else "",
        gpu_memory_bytes=gpu.memory_bytes if gpu else 0,
        gpu_driver=gpu.driver if gpu else "",
    )


# ---------------------------------------------------------------------------------------------
# Reading the real machine


_SYSCTL_KEYS = ("machdep.cpu.brand_string", "machdep.cpu.features", "machdep.cpu.leaf7_features", "hw.physicalcpu",
                "hw.optional.arm.FEAT_BF16", "hw.optional.arm.FEAT_FP16")
_TORCH_FLAG_QUERIES = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported",
                       "amx_fp16": "_is_amx_fp16_supported", "avx512_vnni": "_is_avx512_vnni_supported"}


def _read_sysctl() -> dict[str, str]:
    values: dict[str, str] = {}
    for key in _SYSCTL_KEYS:
        try:
            done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=False)
        except (OSError, subprocess.SubprocessError):
            return values
        if done.returncode == 0:
            values[key] = done.stdout.strip()
    return values


def _torch_flags() -> frozenset[str]:
    import torch

    found = set()
    for flag, query in _TORCH_FLAG_QUERIES.items():
        function = getattr(torch.cpu, query, None) or getattr(torch._C._cpu, query, None)
        try:
            if function is not None and function():
                found.add(flag)
        except Exception:  # an old torch without the query, or one that raises on this CPU: the cpuinfo flags decide
            continue
    return frozenset(found)


def _gpu() -> GpuProfile | None:
    import torch

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    driver = ""
    get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get_driver is not None:
        try:
            version = int(get_driver())
            driver = f"CUDA driver {version // 1000}.{version % 1000 // 10}"
        except Exception:  # driver query unavailable: the runtime version still says something
            driver = ""
    runtime = f"CUDA runtime {torch.version.cuda}" if torch.version.cuda else ""
    return GpuProfile(name=properties.name, compute_capability=f"{properties.major}.{properties.minor}",
                      memory_bytes=int(properties.total_memory), driver=", ".join(part for part in (driver, runtime) if part))


def load_average_now() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # Windows has no load average
        return None


def gather_detection_inputs() -> DetectionInputs:
    """Read this machine: /proc/cpuinfo on Linux, sysctl on macOS, torch's CPU queries everywhere."""
    import torch

    system = platform.system()
    cpuinfo = ""
    if system == "Linux":
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    try:
        mkldnn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # a torch built without oneDNN: no oneDNN bf16 path at all
        mkldnn_bf16 = None if platform.machine().lower() in ("aarch64", "arm64") else False
    return DetectionInputs(
        system=system, machine=platform.machine(), cpuinfo_text=cpuinfo,
        sysctl=_read_sysctl() if system == "Darwin" else {},
        environ={key: value for key, value in os.environ.items() if key in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")},
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(), torch_flags=_torch_flags(),
        mkldnn_bf16_supported=mkldnn_bf16, torch_threads=torch.get_num_threads(), logical_cores=os.cpu_count() or 1,
        load_average=load_average_now(), processor=platform.processor(), gpu=_gpu(),
    )


def _faked(profile: MachineProfile, text: str) -> MachineProfile:
    from resacct.measurement.fake_machine import read_fake_machine

    overrides = read_fake_machine(text, FAKE_MACHINE_VARIABLE)
    names = {item.name for item in dataclasses.fields(MachineProfile)} - {"faked"}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ResacctError(f"{FAKE_MACHINE_VARIABLE}: unknown profile field {unknown[0]!r}; known: {', '.join(sorted(names))}")
    for key, value in overrides.items():
        problem = condition_value_problem(key, value) if key in CONDITION_FIELDS else None
        current = getattr(profile, key)
        if problem is None and current is not None and type(value) is not type(current) and not (isinstance(current, float) and type(value) is int):
            problem = f"{key}: expected {type(current).__name__}, got {value!r}"
        if problem is None and isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value < math.inf:
            problem = f"{key}: expected a finite number ≥ 0 (a count, bytes or a load), got {value!r}"
        if problem:
            raise ResacctError(f"{FAKE_MACHINE_VARIABLE}: {problem}")
    try:
        overrides = with_derived_bf16_units(overrides)
    except ResacctError as error:
        raise ResacctError(f"{FAKE_MACHINE_VARIABLE}: {error}") from None
    return dataclasses.replace(profile, **overrides, faked=tuple(sorted(overrides)))


@functools.cache
def this_machine() -> MachineProfile:
    """This machine's profile, detected once per process (``RESACCT_FAKE_MACHINE`` applied)."""
    profile = profile_from(gather_detection_inputs())
    fake = os.environ.get(FAKE_MACHINE_VARIABLE, "").strip()
    return _faked(profile, fake) if fake else profile
