"""benchmarks/verify_cores.py's table: each phase's mean busy cores from the samples inside it, and the
core-seconds it left idle (the script itself runs a whole verify: a benchmark, not a test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_modules import load_script


def _script():  # type: ignore[no-untyped-def]
    return load_script("benchmarks/verify_cores.py")


def test_each_phase_gets_the_samples_inside_it_and_its_idle_core_seconds() -> None:
    script = _script()
    started = 100.0
    samples = [(100.5, 1.0), (101.0, 1.0), (101.5, 2.0), (102.0, 2.0), (103.0, 1.5), (104.0, 0.5)]
    lines = script.table(4.5, {"start": 1.0, "in parallel": 2.0, "alone": 1.0}, samples, started, 2)
    rows = {line.split("  ")[0]: line.split() for line in lines[1:-1]}
    assert [float(value) for value in rows["start"][-3:]] == [1.0, 1.0, 1.0]  # 1 s at one busy core: 1 core-s idle
    assert [float(value) for value in rows["in parallel"][-3:]] == pytest.approx([2.0, 5.5 / 3, 2 * (2 - 5.5 / 3)], abs=0.06)
    assert [float(value) for value in rows["alone"][-3:]] == [1.0, 0.5, 1.5]
    assert lines[-1].split()[-4] == f"{1.0 + 2 * (2 - 5.5 / 3) + 1.5:.1f}"


def test_the_cpu_times_are_read_as_all_and_idle_jiffies() -> None:
    script = _script()
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat (not Linux)")
    total, idle = script._cpu_times()
    assert total > idle >= 0
