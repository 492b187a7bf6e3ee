"""``resacct machine``: this machine as the claims see it — the profile a spec's ``when:`` is decided on.

The profile is what torch and oneDNN will actually use here: ``ONEDNN_MAX_CPU_ISA`` and
``ATEN_CPU_CAPABILITY`` change it (``ONEDNN_MAX_CPU_ISA=AVX2 resacct machine`` shows a CPU with AMX
as one that converts bf16), and ``RESACCT_FAKE_MACHINE`` overrides fields for testing.
"""

from __future__ import annotations

import argparse

from resacct.cli.output import add_json_flag, emit

__all__ = ["register"]

_LABELS = {
    "cpu_model": "CPU", "cpu_vendor": "vendor", "architecture": "architecture", "os": "OS",
    "cpu_isa": "ISA ATen dispatches to", "onednn_max_isa": "oneDNN cap (ONEDNN_MAX_CPU_ISA)",
    "cpu_flags_bf16": "bf16 instructions on the chip", "cpu_bf16_matmul": "bf16 matmul runs as",
    "cpu_bf16_units": "bf16 units in use", "cpu_fp16_units": "fp16 units in use", "cpu_amx_units": "AMX tile units in use",
    "physical_cores": "physical cores", "logical_cores": "logical CPUs", "torch_threads": "torch threads",
    "load_average_start": "load average (1 min)", "gpu": "CUDA GPU", "gpu_name": "GPU", "gpu_compute_capability": "compute capability",
    "gpu_memory_bytes": "GPU memory", "gpu_driver": "driver",
}


def _value_text(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "gpu_memory_bytes" and isinstance(value, int):
        return f"{value:,} bytes ({value / 2**30:.1f} GiB)"
    if value in ("", None):
        return "—" if key != "onednn_max_isa" else "none"
    return str(value)


def _run_machine(args: argparse.Namespace) -> int:
    from resacct.measurement.machine_profile import CONDITION_FIELDS, this_machine

    profile = this_machine()
    fields = profile.to_dict()
    lines = [profile.summary(), ""]
    for key, label in _LABELS.items():
        if key.startswith("gpu_") and not profile.gpu:
            continue
        marker = "  *" if key in CONDITION_FIELDS else ""
        lines.append(f"  {label:<32} {_value_text(key, fields[key])}{marker}")
    if profile.faked:
        lines.append(f"  FAKED by RESACCT_FAKE_MACHINE: {', '.join(profile.faked)}")
    lines += ["", "* may be used in a claim's when:, e.g. when: {cpu_bf16_units: false} or when: {cpu_bf16_matmul: [converted, emulated]}"]
    return emit(args, {"machine": fields, "condition_fields": list(CONDITION_FIELDS)}, "\n".join(lines))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("machine", help="this machine as the claims see it: CPU, ISA in use, bf16 units, threads, load, GPU",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="examples:\n  resacct machine\n  ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 resacct machine --json")
    add_json_flag(parser)
    parser.set_defaults(run=_run_machine)
