"""Conditions over the machine profile: a claim's ``when:`` (``{cpu_bf16_units: false}``).

Which profile fields a spec may name, what values each takes, whether a profile meets them, and
the words a skip uses (``cpu_bf16_matmul in [converted, emulated] (this machine: amx)``). The
profile itself is :mod:`resacct.measurement.machine_profile`.

>>> condition_value_problem("cpu_bf16_units", "no")
"cpu_bf16_units: expected true or false, got 'no'"
>>> condition_text("torch_threads", {"at_least": 2})
'torch_threads ≥ 2'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resacct.errors import ResacctError

__all__ = ["BF16_MATMUL_PATHS", "CONDITION_FIELDS", "condition_value_problem", "condition_holds", "condition_text", "unmet_conditions", "bf16_units_for", "with_derived_bf16_units"]

#: How a bfloat16 matmul runs on this CPU, slowest to fastest kind:
#: ``converted`` — no oneDNN bf16 path: ATen converts to float32 element by element (AVX2 and older);
#: ``emulated`` — oneDNN on AVX-512 without bf16 instructions (conversions in vector registers);
#: ``avx512_bf16`` — bf16 dot-product instructions (vdpbf16ps), no tile units;
#: ``amx`` — Intel AMX tile units; ``arm_bf16`` — Armv8.6 BF16 instructions.
BF16_MATMUL_PATHS = ("converted", "emulated", "avx512_bf16", "amx", "arm_bf16")

#: Profile fields a claim's ``when:`` may name, with their kind: ``bool``, ``int`` (a number,
#: or ``{at_least, at_most}``) or the tuple of allowed strings.
CONDITION_FIELDS: dict[str, Any] = {
    "os": ("linux", "darwin", "windows", "other"),
    "architecture": ("x86_64", "arm64", "other"),
    "cpu_vendor": ("intel", "amd", "apple", "arm", "unknown"),
    "cpu_isa": ("default", "avx2", "avx512", "sve128", "sve256", "sve512", "vsx", "zvector", "other"),
    "cpu_bf16_matmul": BF16_MATMUL_PATHS,
    "cpu_bf16_units": bool,
    "cpu_fp16_units": bool,
    "cpu_amx_units": bool,
    "gpu": bool,
    "physical_cores": int,
    "torch_threads": int,
}


def condition_value_problem(key: str, value: Any) -> str | None:
    """Why ``key: value`` cannot be a condition over the profile, or None when it can."""
    if key not in CONDITION_FIELDS:
        return f"unknown machine field {key!r}; known: {', '.join(CONDITION_FIELDS)}"
    kind = CONDITION_FIELDS[key]
    values = value if isinstance(value, list) else [value]
    if not values:
        return f"{key}: an empty list matches no machine"
    if kind is bool:
        if any(not isinstance(item, bool) for item in values):
            return f"{key}: expected true or false, got {value!r}"
    elif kind is int:
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"at_least", "at_most"})
            if unknown or not value:
                return f"{key}: a range takes at_least and/or at_most, got {value!r}"
            values = list(value.values())
        if any(isinstance(item, bool) or not isinstance(item, int) or item < 0 for item in values):
            return f"{key}: expected a whole number ≥ 0 (or {{at_least: n, at_most: m}}), got {value!r}"
    elif any(item not in kind for item in values):
        return f"{key}: expected one of {', '.join(kind)} (or a list of them), got {value!r}"
    return None


def condition_holds(profile: object, key: str, value: Any) -> bool:
    """Whether ``profile`` (a :class:`~resacct.measurement.machine_profile.MachineProfile`: any
    object with the :data:`CONDITION_FIELDS` attributes) meets ``key: value``."""
    actual = getattr(profile, key)
    if isinstance(value, dict):
        return value.get("at_least", actual) <= actual <= value.get("at_most", actual)
    return actual in value if isinstance(value, list) else actual == value


def condition_text(key: str, value: Any) -> str:
    """``cpu_bf16_units = false``, ``cpu_bf16_matmul in [converted, emulated]``, ``torch_threads ≥ 2``."""
    if isinstance(value, dict):
        parts = ([f"{key} ≥ {value['at_least']}"] if "at_least" in value else []) + ([f"{key} ≤ {value['at_most']}"] if "at_most" in value else [])
        return " and ".join(parts)
    if isinstance(value, list):
        return f"{key} in [{', '.join(_plain(item) for item in value)}]"
    return f"{key} = {_plain(value)}"


def _plain(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def unmet_conditions(profile: object, conditions: Mapping[str, Any]) -> list[str]:
    """The conditions this profile does not meet, each as ``wanted (this machine: actual)``."""
    return [f"{condition_text(key, value)} (this machine: {_plain(getattr(profile, key))})"
            for key, value in conditions.items() if not condition_holds(profile, key, value)]


def bf16_units_for(bf16_matmul: str) -> bool:
    """Whether a bf16 matmul that runs this way uses bf16 instructions (``cpu_bf16_units``)."""
    return bf16_matmul in ("avx512_bf16", "amx", "arm_bf16")


def with_derived_bf16_units(overrides: dict[str, Any]) -> dict[str, Any]:
    """``cpu_bf16_units`` follows ``cpu_bf16_matmul``: faking the path fakes the units with it, and
    a faked pair that contradicts itself (``converted`` with units) is refused."""
    if "cpu_bf16_matmul" not in overrides:
        if "cpu_bf16_units" in overrides:
            raise ResacctError("cpu_bf16_units follows cpu_bf16_matmul; fake cpu_bf16_matmul instead "
                               "(avx512_bf16, amx or arm_bf16 for units; converted or emulated for none)")
        return overrides
    units = bf16_units_for(overrides["cpu_bf16_matmul"])
    if overrides.get("cpu_bf16_units", units) != units:
        raise ResacctError(f"cpu_bf16_units {overrides['cpu_bf16_units']!r} contradicts cpu_bf16_matmul "
                           f"{overrides['cpu_bf16_matmul']!r} (that path has cpu_bf16_units {units!r})")
    return {**overrides, "cpu_bf16_units": units}
